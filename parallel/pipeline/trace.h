// The measured timeline: a per-rank recorder of what each rank did when (forward, backward,
// send, receive, gradient reduction, optimizer step), written to RUN_DIR/trace/rank_<R>.jsonl,
// and the merge of those files into RUN_DIR/trace.json (Chrome trace event format, for Perfetto
// or chrome://tracing) and RUN_DIR/trace.svg (a Gantt chart with each rank's measured idle
// fraction beside the ideal one the simulator gives for the same schedule).
//
// File format, one JSON object per line. A session (one run of the program) starts with a header
//   {"tripod_trace":1,"rank":R,"world":W,"coords":{"tp":..,"dp":..,"pp":..},"origin_unix_us":..,
//    "schedule":{"kind":"1f1b","pp":P,"vp":V,"placement":"loop","microbatches":M,"actions":["F0.0",...]}}
// ("actions": this rank's pipeline rank's list), followed by events
//   {"step":S,"name":"F3.1","cat":"forward","mb":3,"chunk":1,"ts":12.5,"dur":830.25}
// with ts and dur in microseconds from the session's origin (set just after a barrier on every
// rank, so the ranks' clocks line up). A resumed run appends a new session; merge reads the last.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/grid.h"
#include "parallel/pipeline/action.h"
#include "parallel/pipeline/svg.h"

namespace tripod {

class Communicator;

enum class TraceCategory : uint8_t { Forward, Backward, Send, Recv, Reduce, Optimizer, Other };
std::string_view trace_category_name(TraceCategory c);  // "forward", ...

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

// Per rank (world rank, in order), what the merge measured and what the simulator predicts.
struct TraceRankSummary {
  int rank = 0;
  Coords coords;
  int events = 0;
  double measured_idle = 0;  // mean over the steps used (see steps_used) of 1 - compute/window
  double ideal_idle = -1;    // the simulator's bubble for this rank's pipeline rank; -1 if unknown
};
struct TraceSummary {
  std::string kind;
  int pp = 1, vp = 1, microbatches = 1;
  int64_t steps = 0;          // steps with pipeline events
  int64_t steps_used = 0;     // steps averaged (all but the first when there are several)
  int64_t drawn_step = -1;    // the step drawn in trace.svg
  double mean_forward_us = 0, mean_backward_us = 0;  // costs given to the simulator
  std::vector<TraceRankSummary> ranks;
  std::string json_path, svg_path;
};

// One event of a rank's file.
struct TraceEvent {
  int64_t step;
  std::string name, cat;
  int mb, chunk;
  double ts, dur;  // us
};

// One rank's file: its last session.
struct RankTrace {
  std::string path;
  nlohmann::json header;
  std::vector<TraceEvent> events;
};

// The ranks of the latest run and what the merge found in them: summary.ranks[i] describes
// ranks[i] (world rank order).
struct MergedTrace {
  TraceSummary summary;
  std::vector<RankTrace> ranks;
};

// Reads RUN_DIR/trace/rank_*.jsonl, by the rank in the file name. InputError naming the directory
// or file:line at fault.
std::map<int, RankTrace> read_traces(const std::string& run_dir);
// Pure: the latest run's ranks (files of ranks beyond its world are older runs'), the schedule
// rebuilt from the headers, each rank's measured idle and the simulator's ideal. InputError
// naming the file whose header disagrees.
MergedTrace merge_rank_traces(const std::map<int, RankTrace>& files);
// trace.json's text: Chrome trace event format, one process per rank.
std::string render_trace_json(const MergedTrace& merged);
// trace.svg's chart: the last step drawn, every event, in ms from the step's first event.
GanttChart trace_chart(const MergedTrace& merged);

// The writer: read_traces, merge_rank_traces, then RUN_DIR/trace.json and RUN_DIR/trace.svg.
TraceSummary merge_traces(const std::string& run_dir);

}  // namespace tripod
