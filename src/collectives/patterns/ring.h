// collectives/patterns/ring.h — ring neighbours and the block each rank
// sends and receives at each step of ring reduce-scatter / allgather.
// Pure functions; unit-tested in tests/cpp/test_patterns.cc.
#pragma once

namespace shoal::coll::patterns {

inline int mod(int a, int n) { return ((a % n) + n) % n; }
inline int ring_next(int rank, int size) { return mod(rank + 1, size); }
inline int ring_prev(int rank, int size) { return mod(rank - 1, size); }

// Reduce-scatter, step s in [0, size-1): rank sends block rs_send_block and
// receives (and reduces into) rs_recv_block. After the last step, rank holds
// the fully reduced block rs_owned_block.
inline int rs_send_block(int rank, int size, int s) { return mod(rank - s, size); }
inline int rs_recv_block(int rank, int size, int s) { return mod(rank - s - 1, size); }
inline int rs_owned_block(int rank, int size) { return mod(rank + 1, size); }

// Allgather after reduce-scatter, step s: send the block received at step s-1
// (the owned block at s = 0), receive block ag_recv_block.
inline int ag_send_block(int rank, int size, int s) { return mod(rank + 1 - s, size); }
inline int ag_recv_block(int rank, int size, int s) { return mod(rank - s, size); }

}  // namespace shoal::coll::patterns
