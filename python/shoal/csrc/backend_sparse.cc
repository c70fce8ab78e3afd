// backend_sparse.cc — all_reduce of sparse COO tensors (nn.Embedding(sparse=True)
// gradients), as Gloo offers it: sum only, on the CPU.
//
// Never densified: each rank coalesces its tensor (summing its own duplicate
// indices), the ranks gather every rank's (nnz, shape) and then its indices
// and values (two allgatherv), and each rank builds the same sum: the
// gathered entries, in rank order, coalesced. The result replaces the
// caller's tensor (its nnz changes), as with Gloo. The steps run one after
// the other where the Issuer hands the call to the core, so the call keeps
// its place in the group's order.
#include <functional>
#include <string>
#include <vector>

#include "backend.h"
#include "call.h"
#include "shoal/error.h"

namespace shoal::torch_adapter {
namespace {

// What every rank's tensor must agree on, and its nnz.
constexpr int kMeta = 5;  // nnz, sparse_dim, dense_dim, dtype, hash of the sizes

int64_t sizes_hash(at::IntArrayRef sizes) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t s : sizes) h = (h ^ static_cast<uint64_t>(s)) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ShoalBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  Call c(*this, "allreduce", c10d::OpType::ALLREDUCE, opts);
  c.one("tensors", tensors);
  at::Tensor t = tensors[0];
  if (!t.defined()) c.fail("tensor", "undefined tensor");
  if (t.layout() != at::kSparse) c.fail("tensor", "allreduce_sparse takes a sparse COO tensor, got " + c10::str(t.layout()));
  if (!t.device().is_cpu()) c.fail("tensor", "sparse tensors are reduced on the CPU only; this one is on " + t.device().str());
  if (opts.reduceOp != c10d::ReduceOp::SUM) {
    c.fail("op", "a sparse all_reduce sums (the only op defined for sparse tensors, as with Gloo)");
  }
  const at::Tensor local = t.coalesce();
  const int64_t sparse_dim = local.sparse_dim();
  const at::Tensor indices = local._indices().contiguous();  // [sparse_dim, nnz] int64
  const at::Tensor values = local._values().contiguous();    // [nnz, dense sizes...]
  std::vector<int64_t> meta = {local._nnz(), sparse_dim, local.dense_dim(), static_cast<int64_t>(t.scalar_type()),
                               sizes_hash(t.sizes())};
  const int W = getSize(), me = getRank();
  c.profile({t});
  return c.launch({t}, [=](Communicator& comm, const OpOptions& oo) mutable {
    std::vector<int64_t> all(static_cast<size_t>(W) * kMeta);
    comm.allgather(meta.data(), all.data(), kMeta, DataType::kInt64, oo)->wait();
    for (int r = 0; r < W; ++r) {
      for (int k = 1; k < kMeta; ++k) {
        if (all[r * kMeta + k] != meta[k]) {
          throw shoal::InvalidArgument(
              "shoal rank " + std::to_string(me) + ": allreduce: tensor: rank " + std::to_string(r) +
              "'s sparse tensor differs from this rank's in " +
              (k == 1 ? "sparse_dim" : k == 2 ? "dense_dim" : k == 3 ? "dtype" : "size") +
              " (every rank must pass a tensor of the same shape and dtype)");
        }
      }
    }
    int64_t row_elems = 1;  // elements per entry (the dense dimensions)
    for (int64_t d = 1; d < values.dim(); ++d) row_elems *= values.size(d);
    std::vector<size_t> idx_counts(W), val_counts(W);
    int64_t total = 0;
    for (int r = 0; r < W; ++r) {
      const int64_t nnz = all[r * kMeta];
      idx_counts[r] = static_cast<size_t>(nnz * sparse_dim);
      val_counts[r] = static_cast<size_t>(nnz * row_elems) * values.element_size();
      total += nnz;
    }
    at::Tensor idx = at::empty({total * sparse_dim}, indices.options());
    std::vector<int64_t> vshape = values.sizes().vec();
    vshape[0] = total;
    at::Tensor vals = at::empty(vshape, values.options());
    comm.allgatherv(indices.data_ptr(), idx.data_ptr(), idx_counts, {}, DataType::kInt64, oo)->wait();
    comm.allgatherv(values.data_ptr(), vals.data_ptr(), val_counts, {}, DataType::kUInt8, oo)->wait();
    // Rank r's indices arrived as its [sparse_dim, nnz_r] block: side by side.
    std::vector<at::Tensor> blocks;
    int64_t off = 0;
    for (int r = 0; r < W; ++r) {
      const int64_t nnz = all[r * kMeta];
      blocks.push_back(idx.narrow(0, off * sparse_dim, nnz * sparse_dim).view({sparse_dim, nnz}));
      off += nnz;
    }
    at::Tensor sum = at::sparse_coo_tensor(at::cat(blocks, 1), vals, t.sizes()).coalesce();
    t.copy_(sum);
    return std::vector<WorkPtr>{};
  });
}

}  // namespace shoal::torch_adapter
