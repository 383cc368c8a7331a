// Pipeline actions and schedules as data: an action is {F|B|I|W, micro-batch, model chunk},
// printed "F3.1" (forward of micro-batch 3 on the rank's local chunk 1); a schedule is, per
// pipeline rank, the list of actions it runs, in order.
//
// The backward of a (micro-batch, chunk) is either one B, or split in two (the zero-bubble
// schedules, Qi et al. 2023): I computes the gradient with respect to the chunk's input (what the
// previous stage waits for) and keeps what the weight gradients need; W, any time later, computes
// the weight gradients from it. B = I then W at once.
//
// Chunks and virtual stages: the model is cut into pp*vp virtual stages, placed on the ranks by
// the schedule's placement (parallel/pipeline/placement.h). With the default loop placement local
// chunk c of pipeline rank r is virtual stage c*pp + r (see model/gpt.h). Example pp=2, vp=2:
// rank 0 holds stages 0 and 2, rank 1 holds stages 1 and 3; F5.1 on rank 0 is micro-batch 5
// through stage 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/enum_names.h"
#include "parallel/pipeline/placement.h"

namespace tripod {

// Forward; Backward (input and weight gradients together); Input (input gradient only, "I");
// Weight (weight gradients only, "W").
enum class ActionKind : uint8_t { Forward, Backward, Input, Weight };
inline constexpr int kActionKinds = 4;

// The letter an action kind prints as: F, B, I or W.
char action_letter(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::Forward;
  int mb = 0;     // micro-batch, 0..microbatches-1
  int chunk = 0;  // local model chunk, 0..vp-1

  bool forward() const { return kind == ActionKind::Forward; }
  // B or I: computes the input gradient, which goes to the previous stage.
  bool input_grad() const { return kind == ActionKind::Backward || kind == ActionKind::Input; }
  // B or W: computes the weight gradients (the chunk's last such action makes them final).
  bool weight_grad() const { return kind == ActionKind::Backward || kind == ActionKind::Weight; }
  std::string str() const;  // "F3.1"
  bool operator==(const Action&) const = default;
};

inline Action F(int mb, int chunk = 0) { return {ActionKind::Forward, mb, chunk}; }
inline Action B(int mb, int chunk = 0) { return {ActionKind::Backward, mb, chunk}; }
inline Action I(int mb, int chunk = 0) { return {ActionKind::Input, mb, chunk}; }
inline Action W(int mb, int chunk = 0) { return {ActionKind::Weight, mb, chunk}; }

// "F3.1" -> F(3, 1); "B2" -> B(2, 0) (the chunk may be left out when it is 0); "I3.1", "W3.1"
// likewise. Surrounding whitespace is ignored. nullopt when `text` is not an action.
std::optional<Action> parse_action(std::string_view text);

// What made a schedule: the builders a user chooses by name (parallel.schedule, tripod schedule
// --kind), then the forward-only schedule of evaluation and a schedule loaded from a file.
enum class ScheduleKind : uint8_t { GPipe, OneFOneB, Interleaved, ZbH1, ZbH2, Zbv, DualPipeV, Auto, Forward, Custom };
template <> struct EnumNames<ScheduleKind> {
  static constexpr std::array<std::string_view, 10> names{"gpipe", "1f1b",      "interleaved", "zb-h1", "zb-h2",
                                                          "zbv",   "dualpipev", "auto",        "forward", "custom"};
  static constexpr size_t choices = 8;  // forward and custom are not chosen by name
};

struct Schedule {
  ScheduleKind kind = ScheduleKind::Custom;
  int pp = 1, vp = 1, microbatches = 1;
  Placement placement = Placement::Loop;  // where the virtual stages live (placement.h)
  // Forwards only (evaluation): every F, no B; the validator then refuses any B.
  bool forward_only = false;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: pipeline rank r's actions, in order

  // Where a loaded schedule came from, for error messages: the file and each rank's line.
  std::string source;
  std::vector<int> source_lines;

  int num_stages() const { return pp * vp; }
  int stage(int rank, int chunk) const { return placement_stage(placement, pp, rank, chunk); }
  int rank_of_stage(int stage) const { return placement_rank(placement, pp, stage); }
  int chunk_of_stage(int stage) const { return placement_chunk(placement, pp, stage); }
  // "rank 1", or "rank 1 (my.csv:3)" for a loaded schedule: how errors name a rank.
  std::string where(int rank) const;
};

}  // namespace tripod
