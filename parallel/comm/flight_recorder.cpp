// The flight recorder's ring, its JSON dump, and the communicator wrapper that fills it.
#include "parallel/comm/flight_recorder.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tripod {

namespace {

void copy_phase(char (&dst)[24], const char* src) {
  const size_t n = src ? std::min(std::strlen(src), sizeof(dst) - 1) : 0;
  if (n) std::memcpy(dst, src, n);
  dst[n] = '\0';
}

// A request that was never posted (a fault dropped it): wait() returns at once.
class NullRequest final : public CommRequest {
 public:
  void wait() override {}
};

// Marks its operation Waiting while wait() blocks, then Completed (or Failed when wait throws).
class RecordedRequest final : public CommRequest {
 public:
  RecordedRequest(std::unique_ptr<CommRequest> inner, std::shared_ptr<FlightRecorder> rec, uint64_t id)
      : inner_(std::move(inner)), rec_(std::move(rec)), id_(id) {}
  void wait() override {
    if (done_) return;
    rec_->mark(id_, FlightState::Waiting);
    try {
      inner_->wait();
    } catch (...) {
      rec_->mark(id_, FlightState::Failed);
      throw;
    }
    rec_->mark(id_, FlightState::Completed);
    done_ = true;
  }
  void progress() override {
    if (!done_) inner_->progress();
  }

 private:
  std::unique_ptr<CommRequest> inner_;
  std::shared_ptr<FlightRecorder> rec_;
  uint64_t id_;
  bool done_ = false;
};

}  // namespace

double flight_now() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

const char* flight_kind_name(FlightKind k) {
  switch (k) {
    case FlightKind::AllReduce: return "all-reduce";
    case FlightKind::ReduceScatter: return "reduce-scatter";
    case FlightKind::AllGather: return "all-gather";
    case FlightKind::Broadcast: return "broadcast";
    case FlightKind::Barrier: return "barrier";
    case FlightKind::Send: return "send";
    case FlightKind::Recv: return "recv";
    case FlightKind::AllToAll: return "all-to-all";
  }
  return "?";
}

const char* flight_state_name(FlightState s) {
  switch (s) {
    case FlightState::Enqueued: return "enqueued";
    case FlightState::Waiting: return "waiting";
    case FlightState::Completed: return "completed";
    case FlightState::Failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int world_rank, int world_size, size_t capacity, std::string dump_dir)
    : rank_(world_rank), world_size_(world_size), dump_dir_(std::move(dump_dir)), ring_(std::max<size_t>(capacity, 1)) {}

int FlightRecorder::add_comm(std::string name, std::vector<int> world_ranks) {
  std::lock_guard lock(mu_);
  comms_.push_back({std::move(name), std::move(world_ranks)});
  coll_seq_.push_back(0);
  return static_cast<int>(comms_.size()) - 1;
}

void FlightRecorder::set_step(int64_t step) {
  std::lock_guard lock(mu_);
  step_ = step;
}

void FlightRecorder::set_phase(const char* phase) {
  std::lock_guard lock(mu_);
  copy_phase(phase_, phase);
}

uint64_t FlightRecorder::record(int comm, FlightKind kind, int peer, int tag, int64_t bytes) {
  const double now = flight_now();
  std::lock_guard lock(mu_);
  FlightEntry& e = ring_[next_id_ % ring_.size()];
  e.id = next_id_++;
  if (kind == FlightKind::Send || kind == FlightKind::Recv)
    e.seq = p2p_seq_[{comm, kind == FlightKind::Send, peer, tag}]++;
  else
    e.seq = coll_seq_[comm]++;
  e.comm = comm;
  e.kind = kind;
  e.state = FlightState::Enqueued;
  e.peer = peer;
  e.tag = tag;
  e.bytes = bytes;
  e.step = step_;
  std::memcpy(e.phase, phase_, sizeof(e.phase));
  e.t_enqueue = now;
  e.t_start = e.t_end = 0;
  return e.id;
}

FlightEntry* FlightRecorder::find(uint64_t id) {
  FlightEntry& e = ring_[id % ring_.size()];
  return e.id == id && id < next_id_ ? &e : nullptr;
}

void FlightRecorder::mark(uint64_t id, FlightState state) {
  const double now = flight_now();
  std::lock_guard lock(mu_);
  FlightEntry* e = find(id);
  if (!e) return;  // overwritten: the ring went round while it was in flight
  e->state = state;
  if (state == FlightState::Waiting) e->t_start = now;
  if (state == FlightState::Completed || state == FlightState::Failed) {
    if (e->t_start == 0) e->t_start = now;
    e->t_end = now;
  }
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mu_);
  std::vector<FlightEntry> out;
  const uint64_t n = std::min<uint64_t>(next_id_, ring_.size());
  for (uint64_t id = next_id_ - n; id < next_id_; ++id) out.push_back(ring_[id % ring_.size()]);
  return out;
}

nlohmann::json FlightRecorder::to_json(const std::string& reason) const {
  using nlohmann::json;
  std::vector<FlightEntry> es = entries();
  json comms = json::array();
  {
    std::lock_guard lock(mu_);
    for (const FlightComm& c : comms_) comms.push_back({{"name", c.name}, {"world_ranks", c.world_ranks}});
  }
  json list = json::array();
  for (const FlightEntry& e : es) {
    json j = {{"id", e.id},
              {"seq", e.seq},
              {"comm", e.comm},
              {"kind", flight_kind_name(e.kind)},
              {"state", flight_state_name(e.state)},
              {"bytes", e.bytes},
              {"step", e.step},
              {"phase", e.phase},
              {"t_enqueue", e.t_enqueue},
              {"t_start", e.t_start},
              {"t_end", e.t_end}};
    if (e.peer >= 0) j["peer"] = e.peer;
    if (e.tag >= 0) j["tag"] = e.tag;
    list.push_back(std::move(j));
  }
  return {{"rank", rank_},   {"world_size", world_size_}, {"reason", reason},       {"time", flight_now()},
          {"capacity", ring_.size()}, {"recorded", es.empty() ? 0 : es.back().id + 1}, {"comms", comms},
          {"entries", list}};
}

std::string FlightRecorder::dump(const std::string& reason) const {
  if (dump_dir_.empty()) return "";
  try {
    namespace fs = std::filesystem;
    fs::create_directories(dump_dir_);
    const fs::path path = fs::path(dump_dir_) / fmt::format("rank_{:05d}.json", rank_);
    const fs::path tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp);
      out << to_json(reason).dump(1) << '\n';
      if (!out.good()) return "";
    }
    fs::rename(tmp, path);
    return path.string();
  } catch (const std::exception&) {
    return "";
  }
}

FlightPhase::FlightPhase(FlightRecorder* rec, const char* phase) : rec_(rec) {
  if (!rec_) return;
  copy_phase(saved_, rec_->phase());
  rec_->set_phase(phase);
}

FlightPhase::~FlightPhase() {
  if (rec_) rec_->set_phase(saved_);
}

// ---- RecordingComm ------------------------------------------------------------------------------

RecordingComm::RecordingComm(std::unique_ptr<Communicator> inner, std::shared_ptr<FlightRecorder> rec,
                             std::vector<int> world_ranks, CommFault fault)
    : inner_(std::move(inner)), rec_(std::move(rec)), world_ranks_(std::move(world_ranks)), fault_(fault) {
  comm_ = rec_->add_comm(inner_->name(), world_ranks_);
  if (fault_.rank != rec_->world_rank()) fault_.kind = CommFault::Kind::None;
}

bool RecordingComm::inject(FlightKind kind) {
  using K = CommFault::Kind;
  if (fault_.kind == K::None || rec_->step() < fault_.step) return false;
  switch (fault_.kind) {
    case K::None: return false;
    case K::StopSend: return kind == FlightKind::Send && inner_->name() == "pp";
    case K::SkipAllReduce:
      return inner_->name() == "dp" && (kind == FlightKind::AllReduce || kind == FlightKind::ReduceScatter) &&
             rec_->step() == fault_.step;
    case K::Sleep:
      if (fault_done_ || rec_->step() != fault_.step) return false;
      fault_done_ = true;
      {
        timespec ts{static_cast<time_t>(fault_.sleep_s), 0};
        while (nanosleep(&ts, &ts) != 0) {
        }
      }
      return false;
  }
  return false;
}

template <class F> void RecordingComm::blocking(FlightKind kind, int peer, int64_t bytes, F&& run) {
  if (inner_->size() == 1) return run();
  if (inject(kind)) return;
  const uint64_t id = rec_->record(comm_, kind, peer, -1, bytes);
  rec_->mark(id, FlightState::Waiting);
  try {
    run();
  } catch (...) {
    rec_->mark(id, FlightState::Failed);
    throw;
  }
  rec_->mark(id, FlightState::Completed);
  bytes_sent_ = inner_->bytes_sent();
}

std::unique_ptr<CommRequest> RecordingComm::wrap(uint64_t id, std::unique_ptr<CommRequest> inner) {
  bytes_sent_ = inner_->bytes_sent();
  return std::make_unique<RecordedRequest>(std::move(inner), rec_, id);
}

void RecordingComm::all_reduce(Tensor& t, ReduceOp op) {
  blocking(FlightKind::AllReduce, -1, static_cast<int64_t>(t.nbytes()), [&] { inner_->all_reduce(t, op); });
}

void RecordingComm::reduce_scatter(const Tensor& in, Tensor& out) {
  blocking(FlightKind::ReduceScatter, -1, static_cast<int64_t>(in.nbytes()), [&] { inner_->reduce_scatter(in, out); });
}

void RecordingComm::all_gather(const Tensor& in, Tensor& out) {
  blocking(FlightKind::AllGather, -1, static_cast<int64_t>(out.nbytes()), [&] { inner_->all_gather(in, out); });
}

void RecordingComm::broadcast(Tensor& t, int root) {
  blocking(FlightKind::Broadcast, world_ranks_.at(root), static_cast<int64_t>(t.nbytes()),
           [&] { inner_->broadcast(t, root); });
}

void RecordingComm::barrier() {
  blocking(FlightKind::Barrier, -1, 0, [&] { inner_->barrier(); });
}

void RecordingComm::all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                                 std::span<const int64_t> recv_counts) {
  int64_t sent = 0;
  for (int64_t c : send_counts) sent += c;
  blocking(FlightKind::AllToAll, -1, sent * static_cast<int64_t>(dtype_size(in.dtype())),
           [&] { inner_->all_to_all_v(in, send_counts, out, recv_counts); });
}

std::unique_ptr<CommRequest> RecordingComm::iall_reduce(Tensor& t) {
  if (inner_->size() == 1) return inner_->iall_reduce(t);
  if (inject(FlightKind::AllReduce)) return std::make_unique<NullRequest>();
  const uint64_t id = rec_->record(comm_, FlightKind::AllReduce, -1, -1, static_cast<int64_t>(t.nbytes()));
  return wrap(id, inner_->iall_reduce(t));
}

std::unique_ptr<CommRequest> RecordingComm::ireduce_scatter(const Tensor& in, Tensor& out) {
  if (inner_->size() == 1) return inner_->ireduce_scatter(in, out);
  if (inject(FlightKind::ReduceScatter)) return std::make_unique<NullRequest>();
  const uint64_t id = rec_->record(comm_, FlightKind::ReduceScatter, -1, -1, static_cast<int64_t>(in.nbytes()));
  return wrap(id, inner_->ireduce_scatter(in, out));
}

std::unique_ptr<CommRequest> RecordingComm::iall_gather(const Tensor& in, Tensor& out) {
  if (inner_->size() == 1) return inner_->iall_gather(in, out);
  if (inject(FlightKind::AllGather)) return std::make_unique<NullRequest>();
  const uint64_t id = rec_->record(comm_, FlightKind::AllGather, -1, -1, static_cast<int64_t>(out.nbytes()));
  return wrap(id, inner_->iall_gather(in, out));
}

std::unique_ptr<CommRequest> RecordingComm::isend(const Tensor& t, int peer, int tag) {
  if (inject(FlightKind::Send)) return std::make_unique<NullRequest>();
  const uint64_t id = rec_->record(comm_, FlightKind::Send, world_ranks_.at(peer), tag, static_cast<int64_t>(t.nbytes()));
  return wrap(id, inner_->isend(t, peer, tag));
}

std::unique_ptr<CommRequest> RecordingComm::irecv(Tensor& t, int peer, int tag) {
  if (inject(FlightKind::Recv)) return std::make_unique<NullRequest>();
  const uint64_t id = rec_->record(comm_, FlightKind::Recv, world_ranks_.at(peer), tag, static_cast<int64_t>(t.nbytes()));
  return wrap(id, inner_->irecv(t, peer, tag));
}

}  // namespace tripod
