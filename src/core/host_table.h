// core/host_table.h — which host each rank of a communicator runs on, kept
// in the store as one value that every rank reads with one request.
//
// Each rank, once its address is in the store, counts itself in under
// "joined"; the rank that completes the count reads every member's address
// in one MULTI_GET and sets "hosts". A rank's first collective reads the
// table (CommunicatorImpl::topology): one GET of a few bytes per host,
// where reading every address would be n requests per rank, n² in all.
// Pure functions and store calls; no state.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shoal/store.h"

namespace shoal::core {

// "<distinct id> <distinct id> ...\n<runs>": each run "<index>" or
// "<index>*<count>", the host of the next rank or ranks, so that a job of H
// hosts with consecutive ranks on each takes H short runs (host ids hold no
// whitespace: addresses are published space-separated).
std::string encode_host_table(const std::vector<std::string>& ids);
// The host id of each of `size` ranks; InternalError when `text` is not a
// table of `size` ranks.
std::vector<std::string> decode_host_table(const std::string& text, int size);

// Counts this rank in (after its address is in `addrs`); the last of `size`
// ranks reads every member's address, "addr/<addr_rank(i)>" in `addrs`, and
// sets "hosts" in `store`.
void join_host_table(Store& store, int size, Store& addrs, const std::function<int(int)>& addr_rank);
// The table (blocks, within the store's timeout, until every rank has joined).
std::vector<std::string> read_host_table(Store& store, int size);

}  // namespace shoal::core
