// The measured timeline: a per-rank recorder of what each rank did when (forward, backward,
// send, receive, gradient reduction, optimizer step, and the context-parallel attention's
// exchanges inside a forward or backward), written to RUN_DIR/trace/rank_<R>.jsonl.
// report/trace_merge.h merges the files into RUN_DIR/trace.json and trace.svg.
//
// File format, one JSON object per line. A session (one run of the program) starts with a header
//   {"tripod_trace":1,"rank":R,"world":W,"coords":{"tp":..,"dp":..,"pp":..,"cp":..},"origin_unix_us":..,
//    "schedule":{"kind":"1f1b","pp":P,"vp":V,"placement":"loop","microbatches":M,"actions":["F0.0",...]}}
// ("actions": this rank's pipeline rank's list; files of older versions lack "cp", read as 0),
// followed by events
//   {"step":S,"name":"F3.1","cat":"forward","mb":3,"chunk":1,"ts":12.5,"dur":830.25}
// with ts and dur in microseconds from the session's origin (set just after a barrier on every
// rank, so the ranks' clocks line up). A resumed run appends a new session; merge reads the last.
// Events of category "cp" (parallel/context_parallel/attention.h) lie inside the forward or
// backward event of their micro-batch: the time that rank spent exchanging keys and values (and
// their gradients) with its CP group instead of computing.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/grid.h"
#include "parallel/pipeline/action.h"

namespace tripod {

class Communicator;

// ContextParallel: the cp attention's exchanges (nested in a Forward or Backward span).
enum class TraceCategory : uint8_t { Forward, Backward, Send, Recv, Reduce, Optimizer, ContextParallel, Other };
std::string_view trace_category_name(TraceCategory c);  // "forward", ..., "cp", "other"

class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  // A disabled recorder: spans cost one branch and record nothing.
  TraceRecorder() = default;
  // Appends to RUN_DIR/trace/rank_<rank>.jsonl (creating the folder): the header now, events at
  // each flush(). `schedule` is the run's pipeline schedule (its row `coords.pp` is written).
  TraceRecorder(const std::string& run_dir, int rank, int world, Coords coords, const Schedule& schedule);
  ~TraceRecorder();
  TraceRecorder(const TraceRecorder&) = delete;
  TraceRecorder& operator=(const TraceRecorder&) = delete;

  bool enabled() const { return file_ != nullptr; }
  // Makes time 0 now and writes the header. Call on every rank right after a barrier (e.g.
  // world->barrier()), or pass the communicator to have it done here.
  void start(Communicator* world = nullptr);
  // The training step the following events belong to.
  void set_step(int64_t step) { step_ = step; }

  // Records [construction, destruction) of a span as one event.
  class Span {
   public:
    Span() = default;
    Span(Span&& o) noexcept : rec_(o.rec_), name_(std::move(o.name_)), cat_(o.cat_), mb_(o.mb_), chunk_(o.chunk_),
                               start_(o.start_) { o.rec_ = nullptr; }
    Span& operator=(Span&&) = delete;
    ~Span() { end(); }
    // Ends the span now (idempotent).
    void end();

   private:
    friend class TraceRecorder;
    TraceRecorder* rec_ = nullptr;
    std::string name_;
    TraceCategory cat_ = TraceCategory::Other;
    int mb_ = -1, chunk_ = -1;
    Clock::time_point start_;
  };
  Span span(std::string_view name, TraceCategory cat, int mb = -1, int chunk = -1) {
    Span s;
    if (!enabled()) return s;
    s.rec_ = this;
    s.name_ = name;
    s.cat_ = cat;
    s.mb_ = mb;
    s.chunk_ = chunk;
    s.start_ = Clock::now();
    return s;
  }
  void record(std::string_view name, TraceCategory cat, int mb, int chunk, Clock::time_point start,
              Clock::time_point end);

  // Appends the buffered events to the file (call once per step, outside the timed region).
  void flush();
  size_t buffered() const { return events_.size(); }

 private:
  struct Event {
    int64_t step;
    std::string name;
    TraceCategory cat;
    int mb, chunk;
    int64_t start_ns, dur_ns;
  };
  std::string path_;
  std::string header_;
  std::FILE* file_ = nullptr;
  Clock::time_point origin_ = Clock::now();
  int64_t step_ = 0;
  std::vector<Event> events_;
};

}  // namespace tripod
