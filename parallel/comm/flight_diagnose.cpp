// Flight-recorder dumps read back, and the hang diagnosis over them.
//
// The diagnosis: each rank's "blocked" operation is the one it was waiting in when it dumped (state
// waiting, or failed after a timeout). For a collective, the members of its communicator that have
// no entry with that sequence number never entered it; for a receive (send), the peer that has no
// matching send (receive) with that tag and sequence number never posted it. Those ranks are what
// the blocked rank waits for. A rank waited for that is not blocked itself (or left no dump) is
// where the hang starts. When every rank waited for is blocked too (a cycle: each waits for
// another), the wait that comes first in a step's order (pipeline messages by micro-batch, forward
// before backward; then the embedding and data-parallel reductions; the grad-norm all-reduce; the
// optimizer) is the one whose counterpart went missing: the rank it waits for is named.
#include "parallel/comm/flight_diagnose.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline/action.h"

namespace tripod {

namespace {

using nlohmann::json;

std::optional<FlightKind> kind_of(const std::string& s) {
  for (auto k : {FlightKind::AllReduce, FlightKind::ReduceScatter, FlightKind::AllGather, FlightKind::Broadcast,
                 FlightKind::Barrier, FlightKind::Send, FlightKind::Recv, FlightKind::AllToAll})
    if (s == flight_kind_name(k)) return k;
  return std::nullopt;
}

std::optional<FlightState> state_of(const std::string& s) {
  for (auto k : {FlightState::Enqueued, FlightState::Waiting, FlightState::Completed, FlightState::Failed})
    if (s == flight_state_name(k)) return k;
  return std::nullopt;
}

bool p2p(FlightKind k) { return k == FlightKind::Send || k == FlightKind::Recv; }

// Where an operation's phase sits in a step (see the file comment); smaller comes first.
std::tuple<int64_t, int, int, int, int> step_order(const FlightOp& op) {
  if (auto a = parse_action(op.phase)) return {op.step, 1, a->mb, a->forward() ? 0 : 1, a->forward() ? a->chunk : -a->chunk};
  static const std::map<std::string, int> later = {{"embedding-sync", 2}, {"dp-reduce", 3}, {"grad-norm", 4},
                                                   {"optimizer", 5},      {"eval", 6},      {"checkpoint", 7}};
  auto it = later.find(op.phase);
  return {op.step, it == later.end() ? 0 : it->second, 0, 0, 0};
}

struct Rank {
  const FlightRing* ring = nullptr;
  const FlightOp* blocked = nullptr;         // the operation it waits in
  const FlightOp* last_completed = nullptr;  // its latest completed operation
};

const FlightComm* comm_of(const FlightRing& r, int index) {
  return index >= 0 && index < static_cast<int>(r.comms.size()) ? &r.comms[index] : nullptr;
}

// The index of the communicator of `ring` that is `c` (same name and world ranks), or -1.
int same_comm(const FlightRing& ring, const FlightComm& c) {
  for (size_t i = 0; i < ring.comms.size(); ++i)
    if (ring.comms[i].name == c.name && ring.comms[i].world_ranks == c.world_ranks) return static_cast<int>(i);
  return -1;
}

// "all-reduce #12 of dp (F3.0, step 5)" / "recv of F3.0 from rank 2 (pp, tag 7, #4, step 5)".
std::string describe(const FlightRing& ring, const FlightOp& op) {
  const FlightComm* c = comm_of(ring, op.comm);
  const std::string cname = c ? c->name : "?";
  if (p2p(op.kind))
    return fmt::format("{} of {} {} rank {} ({} group, tag {}, #{}, step {})", flight_kind_name(op.kind),
                       op.phase.empty() ? "a message" : op.phase, op.kind == FlightKind::Send ? "to" : "from", op.peer,
                       cname, op.tag, op.seq, op.step);
  return fmt::format("{} #{} of the {} group ({}step {})", flight_kind_name(op.kind), op.seq, cname,
                     op.phase.empty() ? "" : op.phase + ", ", op.step);
}

json op_json(const FlightRing& ring, const FlightOp& op) {
  const FlightComm* c = comm_of(ring, op.comm);
  json j = {{"kind", flight_kind_name(op.kind)}, {"state", flight_state_name(op.state)},
            {"comm", c ? c->name : ""},          {"group", c ? c->world_ranks : std::vector<int>{}},
            {"seq", op.seq},                     {"step", op.step},
            {"phase", op.phase},                 {"bytes", op.bytes},
            {"text", describe(ring, op)}};
  if (op.peer >= 0) j["peer"] = op.peer;
  if (op.tag >= 0) j["tag"] = op.tag;
  return j;
}

// Whether `ring` holds the counterpart of `op` (recorded on `from`): the same collective, or the
// matching send/receive. A counterpart older than everything `ring` still holds on that
// communicator counts as found (the ring went round past it).
bool has_counterpart(const FlightRing& from, const FlightOp& op, const FlightRing& ring) {
  const FlightComm* c = comm_of(from, op.comm);
  if (!c) return true;
  const int ci = same_comm(ring, *c);
  if (ci < 0) return false;
  const FlightKind want = op.kind == FlightKind::Send ? FlightKind::Recv
                          : op.kind == FlightKind::Recv ? FlightKind::Send
                                                        : op.kind;
  bool any_older_gone = false;
  for (const FlightOp& o : ring.ops) {
    if (o.comm != ci) continue;
    if (p2p(op.kind)) {
      if (o.kind != want || o.peer != from.rank || o.tag != op.tag) continue;
    } else if (p2p(o.kind)) {
      continue;
    }
    if (o.seq == op.seq && o.kind == want) return true;
    if (o.seq > op.seq) any_older_gone = true;
  }
  // Entries with a larger sequence number but none with this one: dropped from the ring.
  return any_older_gone && ring.ops.size() > 0 && ring.ops.front().id > 0;
}

}  // namespace

FlightRing parse_flight_ring(const json& j, const std::string& origin) {
  FlightRing r;
  try {
    TRIPOD_INPUT_CHECK(j.is_object(), "{}: not a flight-recorder dump (a JSON object)", origin);
    r.rank = j.at("rank").get<int>();
    r.world_size = j.at("world_size").get<int>();
    TRIPOD_INPUT_CHECK(r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size,
                       "{}: rank {} outside a world of {}", origin, r.rank, r.world_size);
    r.reason = j.value("reason", "");
    r.time = j.value("time", 0.0);
    for (const json& c : j.at("comms")) r.comms.push_back({c.at("name").get<std::string>(), c.at("world_ranks").get<std::vector<int>>()});
    for (const json& e : j.at("entries")) {
      FlightOp op;
      op.id = e.at("id").get<uint64_t>();
      op.seq = e.at("seq").get<uint64_t>();
      op.comm = e.at("comm").get<int>();
      TRIPOD_INPUT_CHECK(op.comm >= 0 && op.comm < static_cast<int>(r.comms.size()),
                         "{}: entry {} names communicator {} of {}", origin, op.id, op.comm, r.comms.size());
      auto k = kind_of(e.at("kind").get<std::string>());
      auto s = state_of(e.at("state").get<std::string>());
      TRIPOD_INPUT_CHECK(k && s, "{}: entry {} has kind '{}' and state '{}'", origin, op.id,
                         e.at("kind").get<std::string>(), e.at("state").get<std::string>());
      op.kind = *k;
      op.state = *s;
      op.peer = e.value("peer", -1);
      op.tag = e.value("tag", -1);
      op.bytes = e.value("bytes", int64_t{0});
      op.step = e.value("step", int64_t{0});
      op.phase = e.value("phase", "");
      op.t_enqueue = e.value("t_enqueue", 0.0);
      op.t_start = e.value("t_start", 0.0);
      op.t_end = e.value("t_end", 0.0);
      r.ops.push_back(std::move(op));
    }
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a flight-recorder dump: {}", origin, e.what()));
  }
  std::sort(r.ops.begin(), r.ops.end(), [](const FlightOp& a, const FlightOp& b) { return a.id < b.id; });
  return r;
}

std::vector<FlightRing> read_flight_rings(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(run_dir) / "flight";
  std::vector<FlightRing> out;
  std::error_code ec;
  TRIPOD_INPUT_CHECK(fs::is_directory(dir, ec), "{}: no flight-recorder dumps (the folder does not exist; they are "
                     "written when a communication times out or a stop signal arrives, with "
                     "parallel.flight_recorder_size > 0)", dir.string());
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank_", 0) != 0 || e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    TRIPOD_INPUT_CHECK(!j.is_discarded(), "{}: not valid JSON", e.path().string());
    out.push_back(parse_flight_ring(j, e.path().string()));
  }
  TRIPOD_INPUT_CHECK(!out.empty(), "{}: no rank_*.json flight-recorder dumps in it", dir.string());
  std::sort(out.begin(), out.end(), [](const FlightRing& a, const FlightRing& b) { return a.rank < b.rank; });
  return out;
}

FlightDiagnosis diagnose_flight(const std::vector<FlightRing>& rings, int world_size) {
  for (const FlightRing& r : rings) world_size = std::max(world_size, r.world_size);
  std::vector<Rank> ranks(std::max(world_size, 1));
  for (const FlightRing& r : rings) {
    if (r.rank < 0 || r.rank >= world_size) continue;
    Rank& k = ranks[r.rank];
    k.ring = &r;
    for (const FlightOp& op : r.ops) {
      if (op.state == FlightState::Waiting || op.state == FlightState::Failed) k.blocked = &op;
      if (op.state == FlightState::Completed && (!k.last_completed || op.t_end >= k.last_completed->t_end))
        k.last_completed = &op;
    }
  }
  FlightDiagnosis d;
  json missing = json::array(), blocked = json::array();
  for (int r = 0; r < world_size; ++r)
    if (!ranks[r].ring) missing.push_back(r);

  // What each blocked rank waits for.
  std::map<int, std::vector<int>> waits;  // blocked rank -> ranks it waits for
  // Collectives grouped: (comm name, group, kind, seq) -> members blocked in it.
  std::map<std::tuple<std::string, std::vector<int>, int, uint64_t>, std::vector<int>> collectives;
  for (int r = 0; r < world_size; ++r) {
    const Rank& k = ranks[r];
    if (!k.blocked) continue;
    const FlightOp& op = *k.blocked;
    const FlightComm* c = comm_of(*k.ring, op.comm);
    std::vector<int> want;
    if (p2p(op.kind)) {
      if (op.peer >= 0 && op.peer < world_size &&
          (!ranks[op.peer].ring || !has_counterpart(*k.ring, op, *ranks[op.peer].ring)))
        want.push_back(op.peer);
    } else if (c) {
      for (int m : c->world_ranks)
        if (m != r && m >= 0 && m < world_size && (!ranks[m].ring || !has_counterpart(*k.ring, op, *ranks[m].ring)))
          want.push_back(m);
      collectives[{c->name, c->world_ranks, static_cast<int>(op.kind), op.seq}].push_back(r);
    }
    waits[r] = want;
    json b = {{"rank", r}, {"op", op_json(*k.ring, op)}, {"waiting_for", want}};
    blocked.push_back(std::move(b));
  }

  // Where the hang starts: ranks waited for that are not blocked (or left no dump); else, in a
  // cycle, the rank waited for by the wait that comes first in the step.
  std::set<int> roots;
  for (const auto& [r, want] : waits)
    for (int w : want)
      if (!ranks[w].blocked) roots.insert(w);
  std::optional<int> victim;
  if (roots.empty()) {
    for (const auto& [r, want] : waits) {
      if (want.empty()) continue;
      const FlightOp& op = *ranks[r].blocked;
      if (!victim || std::make_tuple(step_order(op), op.t_start) <
                         std::make_tuple(step_order(*ranks[*victim].blocked), ranks[*victim].blocked->t_start))
        victim = r;
    }
    if (victim) roots.insert(waits[*victim].front());
  }

  auto state_of_rank = [&](int r) -> std::string {
    const Rank& k = ranks[r];
    if (!k.ring) return fmt::format("rank {} left no flight record (dead, or stuck outside communication)", r);
    std::string last = k.last_completed ? "; it last completed " + describe(*k.ring, *k.last_completed) : "";
    if (k.blocked) return fmt::format("rank {} is blocked in {}{}", r, describe(*k.ring, *k.blocked), last);
    return fmt::format("rank {} is not blocked in communication{}", r, last);
  };

  // The lines: one per blocked collective (who entered it, who did not), one per blocked
  // point-to-point operation, then the rank where the hang starts.
  std::set<int> told;
  for (const auto& [key, members] : collectives) {
    const auto& [name, group, kind, seq] = key;
    const Rank& first = ranks[members.front()];
    std::vector<int> entered, absent;
    for (int m : group) {
      bool in = std::find(members.begin(), members.end(), m) != members.end() ||
                (ranks[m].ring && has_counterpart(*first.ring, *first.blocked, *ranks[m].ring));
      (in ? entered : absent).push_back(m);
    }
    std::string line = fmt::format("{} group (ranks {}): {} #{} ({}step {}) entered by {}", name,
                                   fmt::join(group, ","), flight_kind_name(static_cast<FlightKind>(kind)), seq,
                                   first.blocked->phase.empty() ? "" : first.blocked->phase + ", ",
                                   first.blocked->step, fmt::join(entered, ","));
    for (int a : absent) {
      line += "; " + state_of_rank(a);
      told.insert(a);
    }
    if (absent.empty()) line += "; every member entered it (still in transfer)";
    d.lines.push_back(line);
  }
  for (const auto& [r, want] : waits) {
    const FlightOp& op = *ranks[r].blocked;
    if (!p2p(op.kind)) continue;
    std::string line = fmt::format("rank {} is blocked in {}", r, describe(*ranks[r].ring, op));
    if (want.empty()) {
      line += fmt::format("; rank {} posted the matching {} (still in transfer)", op.peer,
                          op.kind == FlightKind::Recv ? "send" : "recv");
    } else {
      line += fmt::format("; rank {} never posted the matching {}", op.peer, op.kind == FlightKind::Recv ? "send" : "recv");
      if (!told.count(op.peer)) {
        line += "; " + state_of_rank(op.peer);
        told.insert(op.peer);
      }
    }
    d.lines.push_back(line);
  }
  json culprits = json::array();
  for (int c : roots) {
    json j = {{"rank", c}, {"state", !ranks[c].ring ? "no-record" : ranks[c].blocked ? "blocked" : "not-blocked"}};
    if (ranks[c].ring && ranks[c].blocked) j["blocked_in"] = op_json(*ranks[c].ring, *ranks[c].blocked);
    if (ranks[c].ring && ranks[c].last_completed) j["last_completed"] = op_json(*ranks[c].ring, *ranks[c].last_completed);
    std::vector<int> waiting;
    for (const auto& [r, want] : waits)
      if (std::find(want.begin(), want.end(), c) != want.end()) waiting.push_back(r);
    j["waited_for_by"] = waiting;
    culprits.push_back(std::move(j));
    std::string why;
    if (victim)
      why = fmt::format(" (a cycle of waits: rank {} waits in {}, the earliest of them in the step, for rank {})",
                        *victim, describe(*ranks[*victim].ring, *ranks[*victim].blocked), c);
    d.lines.push_back(fmt::format("the hang starts at rank {}, which ranks {} wait for: {}{}", c, fmt::join(waiting, ","),
                                  state_of_rank(c), why));
  }
  if (waits.empty())
    d.lines.push_back(fmt::format("no rank of the {} that left a flight record is blocked in communication",
                                  rings.size()));
  if (!missing.empty()) d.lines.push_back(fmt::format("no flight record from rank(s) {}", missing.dump()));
  std::set<std::string> reasons;
  for (const FlightRing& r : rings) reasons.insert(r.reason);
  d.json = {{"world_size", world_size}, {"recorded", rings.size()}, {"missing", missing},
            {"reasons", reasons},       {"blocked", blocked},         {"culprits", culprits},
            {"lines", d.lines}};
  return d;
}

}  // namespace tripod
