// A minimal shoal program: every rank contributes its rank number and all of
// them get the sum. Run with a launcher that sets RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, e.g. for two local ranks:
//   RANK=0 WORLD_SIZE=2 MASTER_PORT=29500 build/bin/example-allreduce &
//   RANK=1 WORLD_SIZE=2 MASTER_PORT=29500 build/bin/example-allreduce
#include <cstdio>
#include <vector>

#include "shoal/communicator.h"

int main() {
  auto comm = shoal::Communicator::from_env();
  std::vector<float> grad(1 << 20, static_cast<float>(comm->rank()));
  // Asynchronous: returns at once; wait() rethrows any error (PeerLost, Timeout, ...).
  auto work = comm->allreduce(grad.data(), grad.data(), grad.size(), shoal::DataType::kFloat32,
                              shoal::ReduceOp::kAvg);
  work->wait();
  std::printf("rank %d of %d: grad[0] = %g\n", comm->rank(), comm->size(), grad[0]);
}
