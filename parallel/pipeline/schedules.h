// Pipeline schedules built by pure functions (GPipe, 1F1B, interleaved 1F1B; the zero-bubble ones
// in zero_bubble.h) or loaded from a CSV file (tripod's format or PyTorch pipelining's). Nothing
// here computes or communicates; parallel/pipeline/plan.h checks them.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.h"
#include "parallel/pipeline/action.h"

namespace tripod {

// The most (micro-batch, virtual stage) pairs a schedule may have: bounds what validating and
// simulating one costs (a few hundred MB at most).
inline constexpr long long kMaxSchedulePairs = 4'000'000;

// GPipe: all forwards, then all backwards, micro-batches in order on every rank.
std::vector<Action> gpipe_actions(int pp, int microbatches, int rank);

// 1F1B (PipeDream-flush): rank r runs min(pp-r-1, m) warm-up forwards, then alternates one
// forward and one backward, then runs the remaining backwards. It holds at most min(pp-r, m)
// micro-batches' activations.
std::vector<Action> one_f_one_b_actions(int pp, int microbatches, int rank);

// Interleaved 1F1B over vp chunks per rank (Megatron-LM's schedule). Forward iteration k
// (0..vp*m-1) runs micro-batch group*pp + k%pp on chunk (k/pp)%vp, with group = k/(pp*vp): pp
// micro-batches go through chunk 0, the same pp through chunk 1, ..., then the next pp
// micro-batches. Backward iteration k visits the same micro-batch on chunk vp-1-(k/pp)%vp.
// Rank r warms up with min(2*(pp-r-1) + (vp-1)*pp, vp*m) forwards, then alternates one forward
// and one backward, then drains the backwards. Needs vp >= 2 and m a multiple of pp.
// Worked example pp=2, vp=2, m=2, rank 0: F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0.
std::vector<Action> interleaved_actions(int pp, int vp, int microbatches, int rank);

// Forward-only (evaluation): each rank runs all forwards of its chunk 0 in micro-batch order,
// then all of chunk 1, and so on, with the same point-to-point messages as training. Makespan
// vp*m + pp - 1 forwards, bubble (pp-1)/(vp*m+pp-1); a rank holds at most m received inputs.
// Worked example pp=2, vp=2, m=2, rank 1: F0.0 F1.0 F0.1 F1.1.
// Under the V placement (vp = 2) the same order runs down the ranks through chunk 0 and back up
// through chunk 1.
Schedule forward_only_schedule(int pp, int vp, int microbatches, Placement placement = Placement::Loop);

// What a schedule kind needs of the pipeline, the one statement of these rules (read by the
// config, tripod schedule, the builders and the planner): zbv and dualpipev place 2 chunks per
// rank in a V (placement v, vp = 2; dualpipev m >= 2pp); interleaved loops vp >= 2 chunks round
// the ranks (placement loop, m a multiple of pp); auto takes either placement (v with vp = 2);
// the others run one chunk per rank on the loop placement. `names` are the caller's names of the
// settings ("parallel.vp", "--vp"), so the InputError speaks the user's language.
struct ScheduleSettingNames {
  std::string_view schedule = "schedule", pp = "pp", vp = "vp", placement = "placement",
                   microbatches = "microbatches";
};
void check_schedule_kind(ScheduleKind kind, int pp, int vp, int microbatches, Placement placement,
                         const ScheduleSettingNames& names = {});
// The placement a kind runs on when none is chosen (v for zbv and dualpipev, loop otherwise), and
// the chunks per rank that placement takes when none are chosen (2 on v, 1 on loop).
Placement default_placement(ScheduleKind kind);
inline int default_vp(Placement placement) { return placement == Placement::V ? 2 : 1; }

// The schedule of every rank for `kind` ("auto" is built for unit F = I = W costs: auto_schedule
// in zero_bubble.h takes measured ones). The placement is default_placement(kind) unless given.
// Sizes check_schedule_kind refuses (and pp, vp, m < 1, or too many pairs) throw InputError.
Schedule build_schedule(ScheduleKind kind, int pp, int vp, int microbatches,
                        std::optional<Placement> placement = std::nullopt);
// The same for a kind named by a user ("zbv"; InputError listing the kinds when it is none).
Schedule build_schedule(std::string_view kind, int pp, int vp, int microbatches,
                        std::optional<Placement> placement = std::nullopt);
ScheduleKind parse_schedule_kind(std::string_view name, std::string_view what = "schedule kind");

// The CSV formats of a custom schedule.
//
// tripod's (written by schedule_csv()):
//   - one line per pipeline rank, in rank order (the first line is rank 0);
//   - on each line, that rank's actions in execution order, separated by commas: F<mb>.<chunk>,
//     B<mb>.<chunk>, I<mb>.<chunk> or W<mb>.<chunk> (".<chunk>" may be left out for chunk 0);
//     spaces and empty cells are ignored, so rows padded by a spreadsheet load as they are;
//   - blank lines and lines starting with '#' are ignored;
//   - a line `placement = v` (or `placement = loop`, the default) before the rows sets the
//     placement (placement.h).
// pp is the number of rows, vp the largest chunk + 1, microbatches the largest micro-batch + 1.
// Example (pp=2, m=2, 1F1B):
//   F0.0, F1.0, B0.0, B1.0
//   F0.0, B0.0, F1.0, B1.0
//
// PyTorch pipelining's "compute_only" format (torch.distributed.pipelining, _load_csv/_dump_csv;
// what torchtitan reads and writes): one row per rank, in rank order, each cell an action
// <stage><F|I|W|B><micro-batch> naming the virtual stage itself (e.g. 0F1, 1I0, 1W0), an empty
// cell an idle step (ignored here). The placement follows from the stages on each row: loop
// (row r holds stages r, r+pp, ...) or V (row r holds stages r and 2pp-1-r).
//
// Auto-detected from the first action cell (a digit first: PyTorch's). A cell that is not an
// action throws InputError naming `source`, the line, the rank and the cell. The result is not
// validated (validate_schedule() does that, naming the line of the rank at fault).
enum class ScheduleCsvFormat : unsigned char { Auto, Tripod, PyTorch };
std::optional<ScheduleCsvFormat> parse_csv_format(std::string_view name);  // "auto", "tripod", "pytorch"
Schedule parse_schedule_csv(std::string_view text, const std::string& source,
                            ScheduleCsvFormat format = ScheduleCsvFormat::Auto);
// Reads and parses a CSV schedule file (InputError naming the path when it cannot be read).
Schedule load_schedule_csv(const std::string& path, ScheduleCsvFormat format = ScheduleCsvFormat::Auto);
// The schedule in tripod's CSV format, with a comment line saying what it is (and its placement
// line when it is V).
std::string schedule_csv(const Schedule& schedule);
// The schedule in PyTorch's compute_only CSV format (no comment: PyTorch would read it as a row).
std::string schedule_csv_pytorch(const Schedule& schedule);

// Throws InputError naming the numbers unless the schedule was built for this pipeline
// (`what` names the caller's setting, e.g. "parallel.schedule_file").
void check_schedule_shape(const Schedule& schedule, int pp, int vp, int microbatches, const std::string& what);

}  // namespace tripod
