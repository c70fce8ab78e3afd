// allgather_shared_timed.cc — allgather on the arena with one copy
// (allgather_shared_cma) or two (allgather_shared), whichever rank 0 has
// measured faster for the size (arena/copy_choice.h). Every rank follows
// the proposals rank 0 made in the round before (HostArena::agreed_copies),
// so all run the same algorithm.
#include <chrono>

#include "collectives/algorithms.h"
#include "collectives/arena/shared_rounds.h"

namespace shoal::coll {

void allgather_shared_timed(Ctx& c, const Args& a) {
  if (c.size() == 1) return allgather_shared(c, a);
  auto& arena = reading_arena_of(c, Coll::kAllgather, "shared_timed");
  const size_t block = a.count * a.elem();
  const bool single = arena::CopyChoice::single(arena.agreed_copies(), block);
  const bool timing = arena.rank() == 0;  // only rank 0's times decide
  const auto t0 = timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (single) {
    allgather_shared_cma(c, a);
  } else {
    allgather_shared(c, a);
  }
  if (timing) {
    const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
    arena.copies().note(block, single, dt.count());
  }
}

}  // namespace shoal::coll
