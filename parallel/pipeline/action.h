// Pipeline actions and schedules as data: an action is {F|B, micro-batch, model chunk}, printed
// "F3.1" (forward of micro-batch 3 on the rank's local chunk 1); a schedule is, per pipeline rank,
// the list of actions it runs, in order.
//
// Chunks and virtual stages: the model is cut into pp*vp virtual stages; local chunk c of
// pipeline rank r is virtual stage c*pp + r (see model/gpt.h). Example pp=2, vp=2: rank 0 holds
// stages 0 and 2, rank 1 holds stages 1 and 3; F5.1 on rank 0 is micro-batch 5 through stage 2.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tripod {

enum class ActionKind : uint8_t { Forward, Backward };

struct Action {
  ActionKind kind = ActionKind::Forward;
  int mb = 0;     // micro-batch, 0..microbatches-1
  int chunk = 0;  // local model chunk, 0..vp-1

  bool forward() const { return kind == ActionKind::Forward; }
  std::string str() const;  // "F3.1"
  bool operator==(const Action&) const = default;
};

inline Action F(int mb, int chunk = 0) { return {ActionKind::Forward, mb, chunk}; }
inline Action B(int mb, int chunk = 0) { return {ActionKind::Backward, mb, chunk}; }

// "F3.1" -> F(3, 1); "B2" -> B(2, 0) (the chunk may be left out when it is 0). Surrounding
// whitespace is ignored. nullopt when `text` is not an action.
std::optional<Action> parse_action(std::string_view text);

struct Schedule {
  std::string kind;  // "gpipe", "1f1b", "interleaved", "forward", or "custom" (loaded from a file)
  int pp = 1, vp = 1, microbatches = 1;
  // Forwards only (evaluation): every F, no B; the validator then refuses any B.
  bool forward_only = false;
  std::vector<std::vector<Action>> ranks;  // ranks[r]: pipeline rank r's actions, in order

  // Where a loaded schedule came from, for error messages: the file and each rank's line.
  std::string source;
  std::vector<int> source_lines;

  int num_stages() const { return pp * vp; }
  int stage(int rank, int chunk) const { return chunk * pp + rank; }
  int rank_of_stage(int stage) const { return stage % pp; }
  int chunk_of_stage(int stage) const { return stage / pp; }
  // "rank 1", or "rank 1 (my.csv:3)" for a loaded schedule: how errors name a rank.
  std::string where(int rank) const;
};

}  // namespace tripod
