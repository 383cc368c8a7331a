// The merge of the ranks' trace files (parallel/pipeline/trace.h has the recorder and the file
// format) into RUN_DIR/trace.json (Chrome trace event format, for Perfetto or chrome://tracing)
// and RUN_DIR/trace.svg (a Gantt chart with each rank's measured idle fraction beside the ideal
// one the simulator gives for the same schedule): pure functions over what was read, and a thin
// writer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "parallel/grid.h"
#include "parallel/pipeline/action.h"
#include "parallel/pipeline/trace.h"
#include "report/svg.h"

namespace tripod {

// Per rank (world rank, in order), what the merge measured and what the simulator predicts.
struct TraceRankSummary {
  int rank = 0;
  Coords coords;
  int events = 0;
  double measured_idle = 0;  // mean over the steps used (see steps_used) of 1 - compute/window
  double ideal_idle = -1;    // the simulator's bubble for this rank's pipeline rank; -1 if unknown
  // The context-parallel attention's exchanges (events of category "cp", inside the forward and
  // backward events): their time per step (mean over the steps used) and its share of the
  // rank's forward/backward time.
  double cp_us_per_step = 0, cp_fraction = 0;
};
struct TraceSummary {
  ScheduleKind kind = ScheduleKind::Custom;
  int pp = 1, vp = 1, microbatches = 1;
  int cp = 1;                 // the context-parallel size: 1 + the largest cp coordinate
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
// A rank's place on the grid, as trace.json, trace.svg and the report name it: "pp 1, dp 0, tp 1",
// with "cp C" before tp when the run has cp > 1.
std::string rank_coords_label(const Coords& c, int cp);
// trace.json's text: Chrome trace event format, one process per rank, named "rank R (pp .., dp ..,
// [cp ..,] tp ..)".
std::string render_trace_json(const MergedTrace& merged);
// trace.svg's chart: the last step drawn, every event, in ms from the step's first event.
GanttChart trace_chart(const MergedTrace& merged);

// The writer: read_traces, merge_rank_traces, then RUN_DIR/trace.json and RUN_DIR/trace.svg.
TraceSummary merge_traces(const std::string& run_dir);

}  // namespace tripod
