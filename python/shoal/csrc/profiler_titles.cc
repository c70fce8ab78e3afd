// profiler_titles.cc — the names of the backend's torch profiler events:
// "shoal:all_reduce", as the built-in backends name theirs ("gloo:all_reduce");
// torch's suite and trace tools look for these.
#include <mutex>
#include <set>
#include <string>

#include "backend.h"

namespace shoal::torch_adapter {
namespace {

struct Title {
  c10d::OpType type;
  const char* op;
};

// The one table: each c10d operation type the backend issues, and the
// collective it names (as torch's own backends spell it).
constexpr Title kTitles[] = {
    {c10d::OpType::BROADCAST, "broadcast"},
    {c10d::OpType::ALLREDUCE, "all_reduce"},
    {c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced"},
    {c10d::OpType::REDUCE, "reduce"},
    {c10d::OpType::ALLGATHER, "all_gather"},
    {c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor"},
    {c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced"},
    {c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced"},
    {c10d::OpType::GATHER, "gather"},
    {c10d::OpType::SCATTER, "scatter"},
    {c10d::OpType::REDUCE_SCATTER, "reduce_scatter"},
    {c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor"},
#if SHOAL_TORCH_AT_LEAST(12)
    {c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, "reduce_scatter_tensor_coalesced"},
#endif
    {c10d::OpType::ALLTOALL_BASE, "all_to_all"},
    {c10d::OpType::ALLTOALL, "all_to_all"},
    {c10d::OpType::SEND, "send"},
    {c10d::OpType::RECV, "recv"},
    {c10d::OpType::RECVANYSOURCE, "recvAnySource"},
    {c10d::OpType::BARRIER, "barrier"},
};

const char* profiled_op(c10d::OpType type) {
  for (const Title& t : kTitles) {
    if (t.type == type) return t.op;
  }
  return "unknown";
}

}  // namespace

// The strings live as long as the process: the profiler keeps the pointer
// past the work and the backend. One per backend name and type, so the set
// stays small.
const char* profiling_title(const std::string& backend, c10d::OpType type) {
  static std::mutex mu;
  static auto* titles = new std::set<std::string>();  // never freed: see above
  std::lock_guard<std::mutex> g(mu);
  return titles->insert(backend + ":" + profiled_op(type)).first->c_str();
}

}  // namespace shoal::torch_adapter
