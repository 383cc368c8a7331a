// The flight recorder: a ring of this rank's last N communication operations (what, on which
// communicator, with whom, how many bytes, in which pipeline action or phase, when, and how far it
// got), written to <output_dir>/flight/rank_NNNNN.json when a wait times out, when a stop signal
// arrives, or on request, so that `tripod trace diagnose` can name the rank a hung job waits for.
// RecordingComm wraps any Communicator (MPI or NCCL) and records into it; it also injects the
// communication faults of the tests (DebugOptions::comm_fault).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/debug_options.h"
#include "parallel/comm/communicator.h"

namespace tripod {

enum class FlightKind : uint8_t { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier, Send, Recv, AllToAll };
// Enqueued: posted, not yet waited on. Waiting: this rank is blocked in its wait. Completed.
// Failed: its wait ended in an error (a timeout).
enum class FlightState : uint8_t { Enqueued, Waiting, Completed, Failed };

const char* flight_kind_name(FlightKind k);  // "all-reduce", "reduce-scatter", ..., "send", "recv", "all-to-all"
const char* flight_state_name(FlightState s);  // "enqueued", "waiting", "completed", "failed"

// One operation. Sequence numbers count per communicator for collectives (every member issues the
// same collectives in the same order, so #k on one rank matches #k on the others) and per
// (communicator, direction, peer, tag) for point-to-point (the k-th send with a tag to a peer
// matches the peer's k-th receive with that tag from us).
struct FlightEntry {
  uint64_t id = 0;   // order on this rank
  uint64_t seq = 0;  // see above
  int comm = -1;     // index into the recorder's communicators
  FlightKind kind = FlightKind::AllReduce;
  FlightState state = FlightState::Enqueued;
  int peer = -1;  // world rank of the peer (send/recv), of the root (broadcast); -1 otherwise
  int tag = -1;
  int64_t bytes = 0;
  int64_t step = 0;
  char phase[24] = {};  // "F7.1", "B6.0", "dp-reduce", "optimizer", "eval", ...
  double t_enqueue = 0, t_start = 0, t_end = 0;  // Unix seconds; start: when this rank began waiting
};

// The communicators the entries refer to, by name and world ranks.
struct FlightComm {
  std::string name;
  std::vector<int> world_ranks;
};

class FlightRecorder {
 public:
  // `capacity` operations are kept (the oldest dropped); `dump_dir` ("" = none) receives
  // rank_NNNNN.json files.
  FlightRecorder(int world_rank, int world_size, size_t capacity, std::string dump_dir);

  int world_rank() const { return rank_; }
  int world_size() const { return world_size_; }
  size_t capacity() const { return ring_.size(); }
  const std::string& dump_dir() const { return dump_dir_; }

  // Registers a communicator; returns its index for record().
  int add_comm(std::string name, std::vector<int> world_ranks);

  // What the next operations belong to: a step and a phase (copied, at most 23 characters).
  void set_step(int64_t step);
  int64_t step() const { return step_; }
  void set_phase(const char* phase);
  const char* phase() const { return phase_; }

  // Records a new operation (state Enqueued); returns its id.
  uint64_t record(int comm, FlightKind kind, int peer, int tag, int64_t bytes);
  // Moves operation `id` on (when it is still in the ring).
  void mark(uint64_t id, FlightState state);

  // Every entry still held, oldest first.
  std::vector<FlightEntry> entries() const;
  // The ring as JSON: rank, world_size, reason, time, capacity, recorded, comms, entries.
  nlohmann::json to_json(const std::string& reason) const;
  // Writes dump_dir/rank_NNNNN.json (atomically: a temporary file renamed); returns its path, or
  // "" when there is no dump_dir or the write failed (a dump never throws: it runs on error paths).
  std::string dump(const std::string& reason) const;

 private:
  FlightEntry* find(uint64_t id);

  int rank_, world_size_;
  std::string dump_dir_;
  mutable std::mutex mu_;  // the NCCL watchdog thread may dump while the main thread records
  std::vector<FlightEntry> ring_;
  uint64_t next_id_ = 0;
  std::vector<FlightComm> comms_;
  std::vector<uint64_t> coll_seq_;  // per communicator
  std::map<std::tuple<int, int, int, int>, uint64_t> p2p_seq_;  // (comm, send?, peer, tag)
  int64_t step_ = 0;
  char phase_[24] = {};
};

// Sets the recorder's phase for a scope and restores the previous one (a null recorder: nothing).
class FlightPhase {
 public:
  FlightPhase(FlightRecorder* rec, const char* phase);
  ~FlightPhase();
  FlightPhase(const FlightPhase&) = delete;
  FlightPhase& operator=(const FlightPhase&) = delete;

 private:
  FlightRecorder* rec_;
  char saved_[24] = {};
};

// A Communicator that records every operation of `inner` into `rec` (communicators of one rank
// are not recorded: nothing can hang there) and injects `fault` when it names this world rank.
class RecordingComm final : public Communicator {
 public:
  RecordingComm(std::unique_ptr<Communicator> inner, std::shared_ptr<FlightRecorder> rec, std::vector<int> world_ranks,
                CommFault fault = {});

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                    std::span<const int64_t> recv_counts) override;

  std::unique_ptr<CommRequest> iall_reduce(Tensor& t) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> iall_gather(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(Tensor& t, int peer, int tag) override;

  Communicator& inner() { return *inner_; }

 private:
  // Whether the fault drops this operation (and sleeps first when it is a sleep).
  bool inject(FlightKind kind);
  // Runs a blocking operation as recorded: Waiting, then Completed or Failed.
  template <class F> void blocking(FlightKind kind, int peer, int64_t bytes, F&& run);
  std::unique_ptr<CommRequest> wrap(uint64_t id, std::unique_ptr<CommRequest> inner);

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<FlightRecorder> rec_;
  std::vector<int> world_ranks_;
  CommFault fault_;
  int comm_ = -1;
  bool fault_done_ = false;
};

// The Unix time now, in seconds.
double flight_now();

}  // namespace tripod
