// The GPipe, 1F1B and interleaved 1F1B schedules, and the CSV format of custom schedules.
#include "parallel/pipeline/schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tripod {

std::vector<Action> gpipe_actions(int pp, int microbatches, int rank) {
  std::vector<Action> out;
  out.reserve(2 * static_cast<size_t>(microbatches));
  for (int m = 0; m < microbatches; ++m) out.push_back(F(m));
  for (int m = 0; m < microbatches; ++m) out.push_back(B(m));
  return out;
}

std::vector<Action> one_f_one_b_actions(int pp, int microbatches, int rank) {
  const int warmup = std::min(pp - rank - 1, microbatches);
  std::vector<Action> out;
  out.reserve(2 * static_cast<size_t>(microbatches));
  for (int m = 0; m < warmup; ++m) out.push_back(F(m));
  // Steady state: the forward of micro-batch warmup+i, then the backward of micro-batch i.
  for (int i = 0; i + warmup < microbatches; ++i) {
    out.push_back(F(warmup + i));
    out.push_back(B(i));
  }
  for (int m = microbatches - warmup; m < microbatches; ++m) out.push_back(B(m));
  return out;
}

std::vector<Action> interleaved_actions(int pp, int vp, int microbatches, int rank) {
  TRIPOD_CHECK(microbatches % pp == 0, "interleaved schedule: m={} pp={}", microbatches, pp);
  const int total = microbatches * vp;
  // Iteration k (forward or backward) -> micro-batch and chunk; see the header.
  auto mb_of = [&](int k) { return (k / (pp * vp)) * pp + k % pp; };
  auto chunk_of = [&](int k, bool forward) {
    int c = (k / pp) % vp;
    return forward ? c : vp - 1 - c;
  };
  const int warmup = std::min(2 * (pp - rank - 1) + (vp - 1) * pp, total);
  std::vector<Action> out;
  out.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) out.push_back(F(mb_of(k), chunk_of(k, true)));
  for (int i = 0; i + warmup < total; ++i) {
    int k = warmup + i;
    out.push_back(F(mb_of(k), chunk_of(k, true)));
    out.push_back(B(mb_of(i), chunk_of(i, false)));
  }
  for (int k = total - warmup; k < total; ++k) out.push_back(B(mb_of(k), chunk_of(k, false)));
  return out;
}

Schedule build_schedule(std::string_view kind, int pp, int vp, int microbatches) {
  const std::optional<ScheduleKind> k = parse_enum<ScheduleKind>(kind);
  TRIPOD_INPUT_CHECK(k, "schedule kind '{}' is unknown (valid: gpipe, 1f1b, interleaved)", kind);
  return build_schedule(*k, pp, vp, microbatches);
}

Schedule build_schedule(ScheduleKind kind, int pp, int vp, int microbatches) {
  const std::string_view name = enum_name(kind);
  TRIPOD_INPUT_CHECK(pp >= 1, "pp = {}: the pipeline needs at least 1 stage", pp);
  TRIPOD_INPUT_CHECK(vp >= 1, "vp = {}: each pipeline rank needs at least 1 model chunk", vp);
  TRIPOD_INPUT_CHECK(microbatches >= 1, "microbatches = {}: a step needs at least 1 micro-batch", microbatches);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * vp * microbatches <= kMaxSchedulePairs,
                     "pp = {} x vp = {} x microbatches = {} is too large (at most {} micro-batch/stage pairs)", pp,
                     vp, microbatches, kMaxSchedulePairs);
  if (kind != ScheduleKind::Interleaved) {
    TRIPOD_INPUT_CHECK(vp == 1, "vp = {}: the {} schedule runs one model chunk per rank; use vp = 1 or the interleaved "
                       "schedule", vp, name);
  } else {
    TRIPOD_INPUT_CHECK(vp >= 2, "vp = 1: the interleaved schedule needs vp >= 2 model chunks per rank (with one "
                       "chunk use the 1f1b schedule)");
    TRIPOD_INPUT_CHECK(microbatches % pp == 0,
                       "microbatches = {} is not a multiple of pp = {}: the interleaved schedule runs micro-batches "
                       "in groups of pp (use a multiple of {}, e.g. {} or {})",
                       microbatches, pp, pp, std::max(1, microbatches / pp) * pp, (std::max(1, microbatches / pp) + 1) * pp);
  }
  Schedule s;
  s.kind = std::string(name);
  s.pp = pp;
  s.vp = vp;
  s.microbatches = microbatches;
  for (int r = 0; r < pp; ++r) {
    switch (kind) {
      case ScheduleKind::GPipe: s.ranks.push_back(gpipe_actions(pp, microbatches, r)); break;
      case ScheduleKind::OneFOneB: s.ranks.push_back(one_f_one_b_actions(pp, microbatches, r)); break;
      case ScheduleKind::Interleaved: s.ranks.push_back(interleaved_actions(pp, vp, microbatches, r)); break;
    }
  }
  return s;
}

Schedule forward_only_schedule(int pp, int vp, int microbatches) {
  TRIPOD_INPUT_CHECK(pp >= 1 && vp >= 1 && microbatches >= 1,
                     "forward-only schedule: pp = {}, vp = {}, microbatches = {}: each must be at least 1", pp, vp,
                     microbatches);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * vp * microbatches <= kMaxSchedulePairs,
                     "pp = {} x vp = {} x microbatches = {} is too large (at most {} micro-batch/stage pairs)", pp,
                     vp, microbatches, kMaxSchedulePairs);
  Schedule s;
  s.kind = "forward";
  s.forward_only = true;
  s.pp = pp;
  s.vp = vp;
  s.microbatches = microbatches;
  for (int r = 0; r < pp; ++r) {
    std::vector<Action>& list = s.ranks.emplace_back();
    for (int c = 0; c < vp; ++c)
      for (int mb = 0; mb < microbatches; ++mb) list.push_back(F(mb, c));
  }
  return s;
}

Schedule parse_schedule_csv(std::string_view text, const std::string& source) {
  Schedule s;
  s.kind = "custom";
  s.source = source;
  int max_mb = -1, max_chunk = -1;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#') continue;
    std::vector<Action> row;
    size_t cpos = 0;
    while (cpos <= line.size()) {
      size_t comma = line.find(',', cpos);
      std::string_view cell = line.substr(cpos, comma == std::string_view::npos ? std::string_view::npos : comma - cpos);
      cpos = comma == std::string_view::npos ? line.size() + 1 : comma + 1;
      if (cell.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      auto a = parse_action(cell);
      if (!a) {
        size_t b = cell.find_first_not_of(" \t\r"), e = cell.find_last_not_of(" \t\r");
        throw InputError(fmt::format("{}:{}: '{}' is not an action: expected F<micro-batch>.<chunk> or "
                                     "B<micro-batch>.<chunk>, e.g. F3.1",
                                     source, line_no, cell.substr(b, e - b + 1)));
      }
      max_mb = std::max(max_mb, a->mb);
      max_chunk = std::max(max_chunk, a->chunk);
      row.push_back(*a);
    }
    s.ranks.push_back(std::move(row));
    s.source_lines.push_back(line_no);
  }
  TRIPOD_INPUT_CHECK(!s.ranks.empty(), "{}: no schedule rows (expected one line of actions per pipeline rank)", source);
  TRIPOD_INPUT_CHECK(max_mb >= 0, "{}: no actions in any row", source);
  s.pp = static_cast<int>(s.ranks.size());
  s.vp = max_chunk + 1;
  s.microbatches = max_mb + 1;
  TRIPOD_INPUT_CHECK(static_cast<long long>(s.pp) * s.vp * s.microbatches <= kMaxSchedulePairs,
                     "{}: {} ranks x {} chunks x {} micro-batches is too large (at most {} micro-batch/stage pairs)",
                     source, s.pp, s.vp, s.microbatches, kMaxSchedulePairs);
  return s;
}

Schedule load_schedule_csv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(in.good(), "{}: cannot read the schedule file ({})", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  TRIPOD_INPUT_CHECK(!in.bad(), "{}: error while reading the schedule file", path);
  return parse_schedule_csv(ss.str(), path);
}

std::string schedule_csv(const Schedule& s) {
  std::string out = fmt::format("# tripod pipeline schedule: {}, pp={} vp={} microbatches={}; one line per rank\n",
                                s.kind, s.pp, s.vp, s.microbatches);
  for (const auto& row : s.ranks) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) out += ",";
      out += row[i].str();
    }
    out += "\n";
  }
  return out;
}

void check_schedule_shape(const Schedule& s, int pp, int vp, int microbatches, const std::string& what) {
  TRIPOD_INPUT_CHECK(s.pp == pp && s.vp == vp && s.microbatches == microbatches,
                     "{}: the schedule is for pp = {}, vp = {}, microbatches = {}, but this run has pp = {}, vp = {}, "
                     "microbatches = {}",
                     what, s.pp, s.vp, s.microbatches, pp, vp, microbatches);
}

}  // namespace tripod
