// shoal-trace/trace_analysis.cc — reading dumps and telling what went wrong.
#include "trace_analysis.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace shoal::trace {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::string signature_of(const json& j) {
  std::ostringstream o;
  const std::string op = j.value("op", "?");
  o << op << "(count=" << j.value("count", uint64_t{0}) << ", " << j.value("dtype", "?");
  if (j.contains("redop")) o << ", " << j["redop"].get<std::string>();
  if (j.contains("root")) o << ", root=" << j["root"].get<int>();
  o << ")";
  return o.str();
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i) o << ", ";
    o << ranks[i];
    if (j > i + 1) {
      o << "-" << ranks[j];
    } else if (j == i + 1) {
      o << ", " << ranks[j];
    }
    i = j + 1;
  }
  o << "]";
  return o.str();
}

// What rank `d` was doing, from its own dump: "in allreduce seq 4" or
// "idle after seq 3".
std::string whereabouts(const Progress& p) {
  if (p.started > p.ended) return "in " + p.op + " seq " + std::to_string(p.started);
  if (p.ended == 0) return "no collective yet";
  return "idle after seq " + std::to_string(p.ended);
}

// The freshest record of `rank` among the dumps of the others.
std::optional<Progress> record_of(const std::vector<Dump>& dumps, int rank) {
  std::optional<Progress> best;
  for (const auto& d : dumps) {
    if (rank >= static_cast<int>(d.progress.size()) || !d.progress[static_cast<size_t>(rank)]) continue;
    const Progress& p = *d.progress[static_cast<size_t>(rank)];
    if (!best || std::tie(p.ended, p.started, p.issued) > std::tie(best->ended, best->started, best->issued)) best = p;
  }
  return best;
}

std::string whereabouts(const Dump& d) {
  if (d.started > d.ended) {
    auto it = d.collectives.find(d.started);
    std::string op = it != d.collectives.end() ? it->second.op : std::string("a collective");
    return "in " + op + " seq " + std::to_string(d.started);
  }
  if (d.ended == 0) return "no collective yet";
  auto it = d.collectives.find(d.ended);
  if (it != d.collectives.end() && it->second.state == "failed") {
    return "failed in " + it->second.op + " seq " + std::to_string(d.ended);
  }
  return "idle after seq " + std::to_string(d.ended);
}

}  // namespace

Dump read_dump(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  Dump d;
  d.path = path;
  std::string line;
  int lineno = 0;
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": not JSON: " + e.what());
    }
    try {
      if (j.contains("shoal_trace")) {
        header = true;
        d.comm = j.at("comm").get<std::string>();
        d.name = j.value("name", "");
        d.rank = j.at("rank").get<int>();
        d.size = j.at("size").get<int>();
        d.reason = j.value("reason", "");
        d.error = j.value("error", "");
        d.host = j.value("host", "");
        d.time_us = j.value("time_us", int64_t{0});
        d.issued = j.value("issued", uint64_t{0});
        d.started = j.value("started", uint64_t{0});
        d.ended = j.value("ended", uint64_t{0});
        if (j.contains("progress")) {
          for (const auto& p : j["progress"]) {
            if (p.is_null()) {
              d.progress.emplace_back();
              continue;
            }
            d.progress.push_back(Progress{p.at("issued").get<uint64_t>(), p.at("started").get<uint64_t>(),
                                          p.at("ended").get<uint64_t>(), p.value("op", "")});
          }
        }
        continue;
      }
      Entry e;
      e.seq = j.at("seq").get<uint64_t>();
      e.op = j.at("op").get<std::string>();
      e.signature = signature_of(j);
      e.state = j.at("state").get<std::string>();
      e.algo = j.value("algo", "");
      e.error = j.value("error", "");
      e.peers = j.value("peers", std::vector<int>{});
      e.peer = j.value("peer", -1);
      e.tag = j.value("tag", int64_t{-1});
      e.started_us = j.value("started_us", int64_t{0});
      e.ended_us = j.value("ended_us", int64_t{0});
      if (e.op == "send" || e.op == "recv") {
        d.p2p.push_back(std::move(e));
      } else {
        d.collectives[e.seq] = std::move(e);
      }
    } catch (const json::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": " + e.what());
    }
  }
  if (!header) throw std::runtime_error(path + ": no shoal_trace header line (not a shoal flight-recorder dump?)");
  return d;
}

std::map<std::string, std::vector<Dump>> read_dumps(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    if (fs::is_directory(p)) {
      for (const auto& ent : fs::directory_iterator(p)) {
        const std::string name = ent.path().filename().string();
        if (name.rfind("shoal-trace-", 0) == 0 && name.size() > 6 && name.substr(name.size() - 6) == ".jsonl") {
          files.push_back(ent.path().string());
        }
      }
    } else {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, std::vector<Dump>> out;
  for (const auto& f : files) {
    Dump d = read_dump(f);
    out[d.comm].push_back(std::move(d));
  }
  for (auto& [comm, ds] : out) {
    std::sort(ds.begin(), ds.end(), [](const Dump& a, const Dump& b) { return a.rank < b.rank; });
  }
  return out;
}

bool SeqReport::complete() const {
  // Ranks without a dump say nothing either way.
  return not_joined.empty() && !mismatch() && states.size() == 1 && states.count("done");
}

Analysis analyze(const std::vector<Dump>& dumps) {
  Analysis a;
  if (dumps.empty()) return a;
  a.comm = dumps[0].comm;
  a.name = dumps[0].name;
  for (const auto& d : dumps) {
    a.size = std::max(a.size, d.size);
    a.ranks_with_dumps.push_back(d.rank);
  }
  std::map<int, const Dump*> by_rank;
  for (const auto& d : dumps) by_rank[d.rank] = &d;
  std::vector<uint64_t> seqs;
  for (const auto& d : dumps) {
    for (const auto& [s, e] : d.collectives) seqs.push_back(s);
  }
  std::sort(seqs.begin(), seqs.end());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  for (uint64_t s : seqs) {
    SeqReport r;
    r.seq = s;
    std::map<std::string, std::vector<int>> sigs;
    for (int rank = 0; rank < a.size; ++rank) {
      auto it = by_rank.find(rank);
      if (it == by_rank.end()) {
        // No dump: what the others read of its progress, if anything.
        auto p = record_of(dumps, rank);
        if (p && s > p->issued) {
          r.not_joined.push_back(rank);
          r.not_joined_detail[rank] = "no dump; its progress record: last issued seq " + std::to_string(p->issued) +
                                      ", " + whereabouts(*p);
        } else {
          r.unknown.push_back(rank);
        }
        continue;
      }
      const Dump& d = *it->second;
      auto e = d.collectives.find(s);
      if (e != d.collectives.end()) {
        r.states[e->second.state].push_back(rank);
        sigs[e->second.signature].push_back(rank);
        continue;
      }
      if (s > d.issued) {
        r.not_joined.push_back(rank);
        r.not_joined_detail[rank] = "last issued seq " + std::to_string(d.issued) + ", " + whereabouts(d);
      } else {
        r.unknown.push_back(rank);  // issued, but no longer in its ring
      }
    }
    size_t best = 0;
    for (const auto& [sig, ranks] : sigs) {
      if (ranks.size() > best) {
        best = ranks.size();
        r.signature = sig;
      }
    }
    if (sigs.size() > 1) r.signatures = std::move(sigs);
    a.seqs.push_back(std::move(r));
  }
  return a;
}

std::string render(const Analysis& a, const std::vector<Dump>& dumps, bool all, bool* problems) {
  std::ostringstream o;
  *problems = false;
  o << "communicator " << a.name << " (id " << a.comm << "), " << a.size << " ranks; dumps from ranks "
    << ranks_text(a.ranks_with_dumps);
  std::vector<int> missing;
  for (int r = 0; r < a.size; ++r) {
    if (!std::count(a.ranks_with_dumps.begin(), a.ranks_with_dumps.end(), r)) missing.push_back(r);
  }
  if (!missing.empty()) o << "; no dump from ranks " << ranks_text(missing);
  o << "\n";
  for (const auto& d : dumps) {
    o << "  rank " << d.rank << " (" << d.host << "): dumped on " << d.reason << "; issued up to seq " << d.issued
      << ", " << whereabouts(d);
    if (!d.error.empty()) o << "; error: " << d.error;
    o << "\n";
  }
  const SeqReport* first = nullptr;
  for (const auto& r : a.seqs) {
    const bool ok = r.complete();
    if (!ok && !first) first = &r;
    if (ok && !all) continue;
    if (!ok) *problems = true;
    o << "seq " << r.seq << " " << r.signature << ":";
    const char* sep = " ";
    if (!r.not_joined.empty()) {
      o << sep << "not joined by ranks " << ranks_text(r.not_joined) << " (";
      bool firstd = true;
      for (const auto& [rank, why] : r.not_joined_detail) {
        o << (firstd ? "" : "; ") << "rank " << rank << ": " << why;
        firstd = false;
      }
      o << ")";
      sep = "; ";
    }
    if (r.mismatch()) {
      o << sep << "MISMATCH:";
      bool firsts = true;
      for (const auto& [sig, ranks] : r.signatures) {
        o << (firsts ? " " : ", ") << "ranks " << ranks_text(ranks) << " run " << sig;
        firsts = false;
      }
      sep = "; ";
    }
    for (const char* st : {"running", "failed", "queued", "done"}) {
      auto it = r.states.find(st);
      if (it == r.states.end()) continue;
      o << sep << st << " on ranks " << ranks_text(it->second);
      sep = "; ";
    }
    if (!r.unknown.empty()) o << sep << "unknown on ranks " << ranks_text(r.unknown);
    o << "\n";
  }
  std::vector<std::string> pending;
  for (const auto& d : dumps) {
    for (const auto& e : d.p2p) {
      if (e.state == "done") continue;
      pending.push_back("rank " + std::to_string(d.rank) + ": " + e.op + (e.op == "send" ? " to " : " from ") +
                        (e.peer < 0 ? std::string("any") : std::to_string(e.peer)) + " tag " +
                        std::to_string(e.tag) + " " + e.state);
    }
  }
  if (!pending.empty()) {
    *problems = true;
    o << "sends/receives not done:";
    for (const auto& p : pending) o << "\n  " << p;
    o << "\n";
  }
  if (first) {
    o << "first collective not completed everywhere: seq " << first->seq << " " << first->signature;
    if (!first->not_joined.empty()) o << "; ranks that did not join it: " << ranks_text(first->not_joined);
    if (first->mismatch()) o << "; the ranks disagree about what it is";
    o << "\n";
  } else if (pending.empty()) {
    o << "every recorded collective completed on every rank\n";
  }
  return o.str();
}

}  // namespace shoal::trace
