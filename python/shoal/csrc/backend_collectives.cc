// backend_collectives.cc — every c10d collective mapped onto shoal::Communicator.
//
// Each call: (1) checks every argument on the calling thread, naming it,
// before anything is queued; (2) stages tensors shoal cannot use directly
// (non-contiguous ones, lists that must be one buffer); (3) queues one shoal
// operation (sometimes a few) and returns a ShoalWork that completes when
// they have, after copying results into the caller's tensors.
//
// Lists of tensors (allgather/gather/scatter/reduce_scatter/alltoall with
// lists, and the *_coalesced ops) are flattened into one contiguous buffer and
// moved with ONE shoal collective, then unflattened at completion: one
// sequence number, one fingerprint check, one round of latency. Lists whose
// tensors differ in size use the v-variants (allgatherv, reduce_scatterv,
// alltoallv).
//
// Element types: reductions need a type shoal's kernels know (float16,
// bfloat16, float32, float64, int8, uint8, int32, int64, bool; complex as
// pairs of reals for sum/avg/premul_sum). Data movement takes any dtype: types
// shoal does not know travel as bytes.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "backend.h"
#include "call.h"

namespace shoal::torch_adapter {

// ---------------------------------------------------------------- reductions

c10::intrusive_ptr<c10d::Work> ShoalBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse) {
    return allreduce_sparse(tensors, opts);
  }
  Call c(*this, "allreduce", c10d::OpType::ALLREDUCE, opts);
  c.one("tensors", tensors);
  const at::Tensor& t = tensors[0];
  c.tensor("tensor", t);
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensor", t, op);
  if (c.device() && t.is_contiguous() &&
      static_cast<size_t>(t.numel()) * t.element_size() > c.device()->chunk_bytes) {
    return c.launch_pipelined_allreduce(t, e, op);
  }
  at::Tensor b = c.inout(t, "tensor");
  return c.launch({t}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.allreduce(b.data_ptr(), b.data_ptr(), e.count(b), e.dt, op, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  Call c(*this, "allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, opts);
  if (tensors.empty()) c.fail("tensors", "empty list");
  for (size_t i = 0; i < tensors.size(); ++i) {
    c.like(idx("tensors", i), tensors[i], "tensors[0]", tensors[0]);
    c.writable(idx("tensors", i), tensors[i]);
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensors[0]", tensors[0], op);
  at::Tensor flat = c.pack(tensors, tensors[0]);
  std::vector<at::Tensor> outs = tensors;
  c.unpack(flat, outs);
  return c.launch(tensors, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.allreduce(flat.data_ptr(), flat.data_ptr(), e.count(flat), e.dt, op, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  Call c(*this, "reduce", c10d::OpType::REDUCE, opts);
  const at::Tensor& t = c.rooted_one(tensors, opts.rootRank, opts.rootTensor);
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("tensor", t, op);
  at::Tensor b = c.inout(t, "tensor");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({t}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.reduce(b.data_ptr(), b.data_ptr(), e.count(b), e.dt, op, root, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  if (input.numel() != output.numel() * getSize()) {
    c.fail("input", "has " + std::to_string(input.numel()) + " elements, expected group size (" +
                        std::to_string(getSize()) + ") x output's " + std::to_string(output.numel()));
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("input", input, op);
  // The output may be a view into the input (its own block): shoal's
  // reduce-scatter cannot run in place, so the input is copied then.
  c.profile({input});
  at::Tensor in = c.in(output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : input);
  at::Tensor out = c.out(output, "output");
  return c.launch({output}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{
        comm.reduce_scatter(in.data_ptr(), out.data_ptr(), e.count(out), e.dt, op, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter", c10d::OpType::REDUCE_SCATTER, opts);
  c.one("output_tensors", outputs);
  c.list_len("input_tensor_lists", inputs.size(), 1, "one list per process");
  const at::Tensor& o = outputs[0];
  c.tensor("output", o);
  auto& in = inputs[0];
  const bool even = c.per_rank_list("input_list", in, "output", o);
  if (in[getRank()].numel() != o.numel()) {
    c.fail("output", "has " + std::to_string(o.numel()) + " elements but this rank's input_list entry has " +
                         std::to_string(in[getRank()].numel()));
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("output", o, op);
  c.profile(in);
  at::Tensor send = c.pack(in, o);
  at::Tensor out = c.out(o, "output");
  std::vector<size_t> counts;
  for (auto& t : in) counts.push_back(e.count(t));
  return c.launch({o}, [=](Communicator& comm, const OpOptions& oo) {
    if (even) {
      return std::vector<WorkPtr>{
          comm.reduce_scatter(send.data_ptr(), out.data_ptr(), e.count(out), e.dt, op, oo)};
    }
    return std::vector<WorkPtr>{comm.reduce_scatterv(send.data_ptr(), out.data_ptr(), counts, e.dt, op, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  Call c(*this, "reduce_scatter_tensor_coalesced", kReduceScatterCoalescedOp, opts);
  if (inputs.empty()) c.fail("inputs", "empty list");
  c.list_len("outputs", outputs.size(), inputs.size(), "one output per input");
  const int W = getSize();
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("inputs", i), inputs[i], "inputs[0]", inputs[0]);
    c.like(idx("outputs", i), outputs[i], "inputs[0]", inputs[0]);
    c.writable(idx("outputs", i), outputs[i]);
    if (inputs[i].numel() != outputs[i].numel() * W) {
      c.fail(idx("inputs", i), "has " + std::to_string(inputs[i].numel()) + " elements, expected group size (" +
                                   std::to_string(W) + ") x outputs[" + std::to_string(i) + "]'s " +
                                   std::to_string(outputs[i].numel()));
    }
    S += outputs[i].numel();
  }
  ReduceOp op = c.reduce_op(opts.reduceOp);
  Elem e = c.reduce_elem("inputs[0]", inputs[0], op);
  c.profile(inputs);
  // send: for each rank r, the r-th block of every input, in list order.
  at::Tensor send = c.scratch(S * W, inputs[0]);
  {
    int64_t off = 0;
    for (int r = 0; r < W; ++r) {
      for (auto& t : inputs) {
        const int64_t n = t.numel() / W;
        c.put(send.narrow(0, off, n), t.reshape({-1}).narrow(0, r * n, n));
        off += n;
      }
    }
  }
  at::Tensor recv = c.scratch(S, inputs[0]);
  std::vector<at::Tensor> outs = outputs;
  c.unpack(recv, outs);
  return c.launch(outputs, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{
        comm.reduce_scatter(send.data_ptr(), recv.data_ptr(), e.count(recv), e.dt, op, oo)};
  });
}

// ---------------------------------------------------------------- data movement

c10::intrusive_ptr<c10d::Work> ShoalBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  Call c(*this, "broadcast", c10d::OpType::BROADCAST, opts);
  const at::Tensor& t = c.rooted_one(tensors, opts.rootRank, opts.rootTensor);
  Elem e = c.move_elem(t);
  at::Tensor b = getRank() == opts.rootRank ? c.in(t) : c.out(t, "tensor");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({t}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.broadcast(b.data_ptr(), e.count(b), e.dt, root, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_into_tensor", c10d::OpType::_ALLGATHER_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  if (output.numel() != input.numel() * getSize()) {
    c.fail("output", "has " + std::to_string(output.numel()) + " elements, expected group size (" +
                         std::to_string(getSize()) + ") x input's " + std::to_string(input.numel()));
  }
  Elem e = c.move_elem(input);
  c.profile({input});
  at::Tensor out = c.out(output, "output");
  // In place when the input is this rank's block of the output.
  const bool in_place = !c.device() && output.is_contiguous() && output.is_alias_of(input) && input.is_contiguous();
  at::Tensor in = in_place ? input : c.in(input);
  return c.launch({output}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.allgather(in.data_ptr(), out.data_ptr(), e.count(in), e.dt, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather", c10d::OpType::ALLGATHER, opts);
  c.one("input_tensors", inputs);
  c.list_len("output_tensor_lists", outputs.size(), 1, "one list per process");
  const at::Tensor& t = inputs[0];
  c.tensor("input", t);
  auto& outs = outputs[0];
  const bool even = c.per_rank_list("output_list", outs, "input", t);
  for (size_t r = 0; r < outs.size(); ++r) c.writable(idx("output_list", r), outs[r]);
  if (outs[getRank()].numel() != t.numel()) {
    c.fail(idx("output_list", getRank()), "has " + std::to_string(outs[getRank()].numel()) +
                                              " elements, but this rank's input has " + std::to_string(t.numel()));
  }
  Elem e = c.move_elem(t);
  c.profile({t});
  at::Tensor in = c.in(t);
  int64_t total = 0;
  std::vector<size_t> counts;
  for (auto& o : outs) {
    counts.push_back(e.count(o));
    total += o.numel();
  }
  at::Tensor recv = c.scratch(total, t);
  std::vector<at::Tensor> dst = outs;
  c.unpack(recv, dst);
  return c.launch(outs, [=](Communicator& comm, const OpOptions& oo) {
    if (even) {
      return std::vector<WorkPtr>{comm.allgather(in.data_ptr(), recv.data_ptr(), e.count(in), e.dt, oo)};
    }
    return std::vector<WorkPtr>{comm.allgatherv(in.data_ptr(), recv.data_ptr(), counts, {}, e.dt, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, opts);
  if (inputs.empty()) c.fail("input_tensor_list", "empty list");
  const int W = getSize();
  c.list_len("output_tensor_lists", outputs.size(), W, "one list per rank of the group");
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("input_tensor_list", i), inputs[i], "input_tensor_list[0]", inputs[0]);
    S += inputs[i].numel();
  }
  std::vector<at::Tensor> flat_outs;
  for (int r = 0; r < W; ++r) {
    c.list_len(idx("output_tensor_lists", r), outputs[r].size(), inputs.size(), "one tensor per input");
    for (size_t i = 0; i < inputs.size(); ++i) {
      c.like(idx("output_tensor_lists", r, i), outputs[r][i], "input_tensor_list[0]", inputs[0], inputs[i].numel());
      c.writable(idx("output_tensor_lists", r, i), outputs[r][i]);
      flat_outs.push_back(outputs[r][i]);
    }
  }
  Elem e = c.move_elem(inputs[0]);
  c.profile(inputs);
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(S * W, inputs[0]);
  c.unpack(recv, flat_outs);
  return c.launch(flat_outs, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.allgather(send.data_ptr(), recv.data_ptr(), e.count(send), e.dt, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  Call c(*this, "allgather_into_tensor_coalesced", c10d::OpType::COALESCED, opts);
  if (inputs.empty()) c.fail("inputs", "empty list");
  c.list_len("outputs", outputs.size(), inputs.size(), "one output per input");
  const int W = getSize();
  int64_t S = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.like(idx("inputs", i), inputs[i], "inputs[0]", inputs[0]);
    c.like(idx("outputs", i), outputs[i], "inputs[0]", inputs[0], inputs[i].numel() * W);
    c.writable(idx("outputs", i), outputs[i]);
    S += inputs[i].numel();
  }
  Elem e = c.move_elem(inputs[0]);
  c.profile(inputs);
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(S * W, inputs[0]);
  std::vector<at::Tensor> outs = outputs;
  const int64_t SS = S;
  c.on_success([outs, recv, W, SS] {
    int64_t off = 0;  // offset of input i inside one rank's block
    for (auto o : outs) {
      const int64_t n = o.numel() / W;
      at::Tensor blocks = recv.view({W, SS}).narrow(1, off, n);  // [W, n]
      if (o.is_contiguous()) {
        o.view({W, n}).copy_(blocks, /*non_blocking=*/true);
      } else {
        o.copy_(blocks.reshape(o.sizes()), /*non_blocking=*/true);
      }
      off += n;
    }
  }, outs);
  return c.launch(outputs, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.allgather(send.data_ptr(), recv.data_ptr(), e.count(send), e.dt, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  Call c(*this, "gather", c10d::OpType::GATHER, opts);
  c.root(opts.rootRank);
  c.one("input_tensors", inputs);
  const at::Tensor& t = inputs[0];
  c.tensor("input", t);
  const bool is_root = getRank() == opts.rootRank;
  std::vector<at::Tensor> dst;
  if (is_root) {
    c.list_len("gather_list", outputs.size(), 1, "one list on the root");
    dst = outputs[0];
    c.list_len("gather_list", dst.size(), getSize(), "one tensor per rank of the group");
    for (size_t r = 0; r < dst.size(); ++r) {
      c.like(idx("gather_list", r), dst[r], "input", t, t.numel());
      c.writable(idx("gather_list", r), dst[r]);
    }
  }
  Elem e = c.move_elem(t);
  c.profile({t});
  at::Tensor in = c.in(t);
  at::Tensor recv;
  if (is_root) {
    recv = c.scratch(t.numel() * getSize(), t);
    c.unpack(recv, dst);
  }
  const int root = static_cast<int>(opts.rootRank);
  return c.launch(dst, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.gather(in.data_ptr(), recv.defined() ? recv.data_ptr() : nullptr,
                                            e.count(in), e.dt, root, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  Call c(*this, "scatter", c10d::OpType::SCATTER, opts);
  c.root(opts.rootRank);
  c.one("output_tensors", outputs);
  const at::Tensor& o = outputs[0];
  c.tensor("output", o);
  const bool is_root = getRank() == opts.rootRank;
  at::Tensor send;
  if (is_root) {
    c.list_len("scatter_list", inputs.size(), 1, "one list on the root");
    auto& src = inputs[0];
    c.list_len("scatter_list", src.size(), getSize(), "one tensor per rank of the group");
    for (size_t r = 0; r < src.size(); ++r) c.like(idx("scatter_list", r), src[r], "output", o, o.numel());
    send = c.pack(src, o);
    c.profile(src);
  } else {
    c.profile({});
  }
  Elem e = c.move_elem(o);
  at::Tensor out = c.out(o, "output");
  const int root = static_cast<int>(opts.rootRank);
  return c.launch({o}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.scatter(send.defined() ? send.data_ptr() : nullptr, out.data_ptr(),
                                             e.count(out), e.dt, root, oo)};
  });
}

namespace {

// Element counts per rank for alltoall_base's split sizes (rows of dim 0).
std::vector<size_t> split_counts(const Call& c, const char* arg, const at::Tensor& t,
                                 const std::vector<int64_t>& splits, int W, const Elem& e) {
  std::vector<size_t> counts(W);
  if (t.dim() == 0) c.fail(arg, "a 0-dim tensor cannot be split");
  const int64_t rows = t.size(0);
  int64_t row = 1;
  for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
  if (splits.empty()) {
    if (rows % W != 0) {
      c.fail(arg, "dim 0 (" + std::to_string(rows) + ") does not split equally into " + std::to_string(W) +
                      " ranks; pass split sizes");
    }
    for (int r = 0; r < W; ++r) counts[r] = e.count(rows / W * row);
    return counts;
  }
  const std::string sarg = std::string(arg) + "_split_sizes";
  if (splits.size() != static_cast<size_t>(W)) {
    c.fail(sarg, "has " + std::to_string(splits.size()) + " entries, expected one per rank (" + std::to_string(W) + ")");
  }
  int64_t sum = 0;
  for (int r = 0; r < W; ++r) {
    if (splits[r] < 0) c.fail(sarg, "entry " + std::to_string(r) + " is negative (" + std::to_string(splits[r]) + ")");
    sum += splits[r];
    counts[r] = e.count(splits[r] * row);
  }
  if (sum != rows) {
    c.fail(sarg, "sums to " + std::to_string(sum) + " but " + arg + " has " + std::to_string(rows) + " rows (dim 0)");
  }
  return counts;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ShoalBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_split_sizes,
                                                           std::vector<int64_t>& input_split_sizes,
                                                           const c10d::AllToAllOptions& opts) {
  Call c(*this, "alltoall_base", c10d::OpType::ALLTOALL_BASE, opts);
  c.tensor("input", input);
  c.like("output", output, "input", input);
  const int W = getSize();
  Elem e = c.move_elem(input);
  c.profile({input});
  if (output_split_sizes.empty() && input_split_sizes.empty()) {
    if (input.numel() % W != 0) {
      c.fail("input", std::to_string(input.numel()) + " elements do not split equally into " + std::to_string(W) +
                          " ranks; pass split sizes");
    }
    if (output.numel() != input.numel()) {
      c.fail("output", "has " + std::to_string(output.numel()) + " elements, expected " +
                           std::to_string(input.numel()) + " like the input (equal splits)");
    }
    at::Tensor in = c.in(output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : input);
    at::Tensor out = c.out(output, "output");
    return c.launch({output}, [=](Communicator& comm, const OpOptions& oo) {
      return std::vector<WorkPtr>{comm.alltoall(in.data_ptr(), out.data_ptr(), e.count(in) / W, e.dt, oo)};
    });
  }
  std::vector<size_t> sc = split_counts(c, "input", input, input_split_sizes, W, e);
  std::vector<size_t> rc = split_counts(c, "output", output, output_split_sizes, W, e);
  at::Tensor in = c.in(output.is_alias_of(input) ? input.clone(at::MemoryFormat::Contiguous) : input);
  at::Tensor out = c.out(output, "output");
  return c.launch({output}, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.alltoallv(in.data_ptr(), sc, {}, out.data_ptr(), rc, {}, e.dt, oo)};
  });
}

c10::intrusive_ptr<c10d::Work> ShoalBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  Call c(*this, "alltoall", c10d::OpType::ALLTOALL, opts);
  const int W = getSize();
  c.list_len("input_tensor_list", inputs.size(), W, "one tensor per rank of the group");
  c.list_len("output_tensor_list", outputs.size(), W, "one tensor per rank of the group");
  for (int r = 0; r < W; ++r) {
    c.like(idx("input_tensor_list", r), inputs[r], "input_tensor_list[0]", inputs[0]);
    c.like(idx("output_tensor_list", r), outputs[r], "input_tensor_list[0]", inputs[0]);
    c.writable(idx("output_tensor_list", r), outputs[r]);
  }
  Elem e = c.move_elem(inputs[0]);
  std::vector<size_t> sc, rc;
  int64_t total = 0;
  for (int r = 0; r < W; ++r) {
    sc.push_back(e.count(inputs[r]));
    rc.push_back(e.count(outputs[r]));
    total += outputs[r].numel();
  }
  if (sc[getRank()] != rc[getRank()]) {
    c.fail(idx("output_tensor_list", getRank()), "has " + std::to_string(outputs[getRank()].numel()) +
                                                     " elements but this rank sends itself " +
                                                     std::to_string(inputs[getRank()].numel()));
  }
  c.profile(inputs);
  at::Tensor send = c.pack(inputs, inputs[0]);
  at::Tensor recv = c.scratch(total, inputs[0]);
  std::vector<at::Tensor> dst = outputs;
  c.unpack(recv, dst);
  return c.launch(outputs, [=](Communicator& comm, const OpOptions& oo) {
    return std::vector<WorkPtr>{comm.alltoallv(send.data_ptr(), sc, {}, recv.data_ptr(), rc, {}, e.dt, oo)};
  });
}

}  // namespace shoal::torch_adapter
