// Where the virtual stages of a pipeline live: the one mapping stage <-> (pipeline rank, local
// chunk) that the schedules, the validator, the simulator and (through them) the model build,
// checkpoints, memory plan and trace use.
//
//  - Loop (Megatron-LM's interleaving): local chunk c of rank r is virtual stage c*pp + r. The
//    stages go round the ranks vp times; with vp = 1 it is the plain pipeline.
//  - V (the zero-bubble paper's ZB-V, DeepSeek's DualPipeV): vp = 2; chunk 0 of rank r is stage
//    r and chunk 1 is stage 2*pp-1-r. The stages go down the ranks and back up, so rank pp-1
//    holds two consecutive stages and rank 0 holds the first stage and the last (the loss).
// Example pp=3: loop puts stages (0,3) (1,4) (2,5) on ranks 0, 1, 2; V puts (0,5) (1,4) (2,3).
#pragma once

#include <optional>
#include <string_view>

#include "core/enum_names.h"
#include "core/error.h"

namespace tripod {

enum class Placement : unsigned char { Loop, V };
template <> struct EnumNames<Placement> {
  static constexpr std::array<std::string_view, 2> names{"loop", "v"};
};

inline const char* placement_name(Placement p) { return p == Placement::V ? "v" : "loop"; }
inline std::optional<Placement> parse_placement(std::string_view s) {
  if (s == "loop") return Placement::Loop;
  if (s == "v") return Placement::V;
  return std::nullopt;
}

// Throws InputError unless `placement` can hold vp chunks per rank (V needs exactly 2).
inline void check_placement(Placement placement, int vp) {
  TRIPOD_INPUT_CHECK(placement != Placement::V || vp == 2,
                     "placement v puts exactly 2 model chunks on each pipeline rank (vp = 2), not vp = {}", vp);
}

// Virtual stage of local chunk `chunk` on pipeline rank `rank`.
inline int placement_stage(Placement p, int pp, int rank, int chunk) {
  if (p == Placement::V) return chunk == 0 ? rank : 2 * pp - 1 - rank;
  return chunk * pp + rank;
}
// The pipeline rank that holds virtual stage `stage`.
inline int placement_rank(Placement p, int pp, int stage) {
  if (p == Placement::V) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}
// The local chunk of virtual stage `stage` on its rank.
inline int placement_chunk(Placement p, int pp, int stage) { return p == Placement::V ? (stage < pp ? 0 : 1) : stage / pp; }

}  // namespace tripod
