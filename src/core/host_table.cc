// core/host_table.cc — the host table (host_table.h).
#include "core/host_table.h"

#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "shoal/error.h"

namespace shoal::core {

std::string encode_host_table(const std::vector<std::string>& ids) {
  std::unordered_map<std::string, size_t> index;
  std::string names, ranks;
  size_t run_host = 0, run = 0;
  auto end_run = [&] {
    if (run == 0) return;
    if (!ranks.empty()) ranks += ' ';
    ranks += std::to_string(run_host);
    if (run > 1) ranks += '*' + std::to_string(run);
  };
  for (const auto& id : ids) {
    auto [it, fresh] = index.emplace(id, index.size());
    if (fresh) {
      if (!names.empty()) names += ' ';
      names += id;
    }
    if (run > 0 && it->second == run_host) {
      ++run;
      continue;
    }
    end_run();
    run_host = it->second;
    run = 1;
  }
  end_run();
  return names + "\n" + ranks;
}

std::vector<std::string> decode_host_table(const std::string& text, int size) {
  auto bad = [&](const std::string& why) {
    return InternalError("the host table in the store (key 'hosts') " + why + "; it should hold " +
                         std::to_string(size) + " ranks");
  };
  const size_t nl = text.find('\n');
  if (nl == std::string::npos) throw bad("has no line of ranks");
  std::vector<std::string> names;
  std::istringstream head(text.substr(0, nl));
  for (std::string id; head >> id;) names.push_back(id);
  std::vector<std::string> ids;
  ids.reserve(static_cast<size_t>(size));
  std::istringstream body(text.substr(nl + 1));
  for (std::string run; body >> run;) {
    size_t k = 0, count = 1, used = 0;
    try {
      k = std::stoul(run, &used);
      if (used < run.size()) {
        if (run[used] != '*') throw std::invalid_argument(run);
        const std::string tail = run.substr(used + 1);
        count = std::stoul(tail, &used);
        if (used != tail.size() || count == 0) throw std::invalid_argument(run);
      }
    } catch (const std::logic_error&) {
      throw bad("has a malformed entry '" + run + "'");
    }
    if (run[0] == '-' || k >= names.size()) throw bad("names host " + run + " of " + std::to_string(names.size()));
    if (count > static_cast<size_t>(size) - ids.size()) throw bad("holds more than " + std::to_string(size) + " ranks");
    ids.insert(ids.end(), count, names[k]);
  }
  if (static_cast<int>(ids.size()) != size) throw bad("holds " + std::to_string(ids.size()) + " ranks");
  return ids;
}

void join_host_table(Store& store, int size, Store& addrs, const std::function<int(int)>& addr_rank) {
  if (store.add("joined", 1) != size) return;
  std::vector<std::string> keys(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) keys[static_cast<size_t>(i)] = "addr/" + std::to_string(addr_rank(i));
  const std::vector<Bytes> lines = addrs.multi_get(keys);
  std::vector<std::string> ids(lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    std::istringstream in(std::string(lines[i].begin(), lines[i].end()));
    std::string host, port, hostname;
    if (!(in >> host >> port >> hostname >> ids[i])) {
      throw InternalError("the address of rank " + std::to_string(i) + " in the store ('" + keys[i] +
                          "') has no host id");
    }
  }
  const std::string table = encode_host_table(ids);
  store.set("hosts", Bytes(table.begin(), table.end()));
}

std::vector<std::string> read_host_table(Store& store, int size) {
  return decode_host_table(store.get_str("hosts"), size);
}

}  // namespace shoal::core
