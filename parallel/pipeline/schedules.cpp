// The GPipe, 1F1B and interleaved 1F1B schedules, and the CSV format of custom schedules.
#include "parallel/pipeline/schedules.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "parallel/pipeline/zero_bubble.h"

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

Placement default_placement(ScheduleKind kind) {
  return kind == ScheduleKind::Zbv || kind == ScheduleKind::DualPipeV ? Placement::V : Placement::Loop;
}

void check_schedule_kind(ScheduleKind kind, int pp, int vp, int m, Placement placement, const ScheduleSettingNames& n) {
  const std::string_view name = enum_name(kind);
  TRIPOD_INPUT_CHECK(pp >= 1, "{} = {}: the pipeline needs at least 1 stage", n.pp, pp);
  TRIPOD_INPUT_CHECK(vp >= 1, "{} = {}: each pipeline rank needs at least 1 model chunk", n.vp, vp);
  TRIPOD_INPUT_CHECK(m >= 1, "{} = {}: a step needs at least 1 micro-batch", n.microbatches, m);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * vp * m <= kMaxSchedulePairs,
                     "{} = {} x {} = {} x {} = {} is too large (at most {} micro-batch/stage pairs)", n.pp, pp, n.vp,
                     vp, n.microbatches, m, kMaxSchedulePairs);
  switch (kind) {
    case ScheduleKind::Zbv:
    case ScheduleKind::DualPipeV:
      TRIPOD_INPUT_CHECK(placement == Placement::V && vp == 2,
                         "{} = \"{}\" places 2 model chunks per rank in a V (chunk 0 of rank r is stage r, chunk 1 is "
                         "stage 2pp-1-r): set {} = \"v\" and {} = 2 (got {} = \"{}\", {} = {})",
                         n.schedule, name, n.placement, n.vp, n.placement, enum_name(placement), n.vp, vp);
      TRIPOD_INPUT_CHECK(kind != ScheduleKind::DualPipeV || m >= 2 * pp,
                         "{} = {}: the dualpipev schedule needs at least 2*pp = {} micro-batches (one per virtual "
                         "stage)", n.microbatches, m, 2 * pp);
      break;
    case ScheduleKind::Interleaved:
      TRIPOD_INPUT_CHECK(placement == Placement::Loop,
                         "{} = \"v\" with {} = \"interleaved\": interleaving loops the stages round the ranks (use "
                         "{} = \"loop\", or the V placement's schedules zbv and dualpipev)",
                         n.placement, n.schedule, n.placement);
      TRIPOD_INPUT_CHECK(vp >= 2, "{} = \"interleaved\" with {} = {}: the interleaved schedule needs {} >= 2 model "
                         "chunks per rank (with one chunk use 1f1b)", n.schedule, n.vp, vp, n.vp);
      TRIPOD_INPUT_CHECK(m % pp == 0,
                         "{} = {} is not a multiple of {} = {}: the interleaved schedule runs micro-batches in groups "
                         "of pp (use a multiple of {}, e.g. {} or {})",
                         n.microbatches, m, n.pp, pp, pp, std::max(1, m / pp) * pp, (std::max(1, m / pp) + 1) * pp);
      break;
    case ScheduleKind::Auto:
      TRIPOD_INPUT_CHECK(placement == Placement::Loop || vp == 2,
                         "{} = \"v\" puts exactly 2 model chunks on each pipeline rank: set {} = 2 (got {})",
                         n.placement, n.vp, vp);
      break;
    default:
      TRIPOD_INPUT_CHECK(placement == Placement::Loop,
                         "{} = \"v\" with {} = \"{}\": the V placement's schedules are zbv, dualpipev and auto "
                         "(each with {} = 2)", n.placement, n.schedule, name, n.vp);
      TRIPOD_INPUT_CHECK(vp == 1,
                         "{} = \"{}\" with {} = {}: it runs one model chunk per rank (use {} = 1, or interleaved with "
                         "{} > 1, or zbv/dualpipev with {} = \"v\" and {} = 2)",
                         n.schedule, name, n.vp, vp, n.vp, n.vp, n.placement, n.vp);
  }
}

ScheduleKind parse_schedule_kind(std::string_view name, std::string_view what) {
  const std::optional<ScheduleKind> kind = parse_choice<ScheduleKind>(name);
  TRIPOD_INPUT_CHECK(kind.has_value(), "{} '{}' is unknown (valid: {})", what, name, enum_choices<ScheduleKind>());
  return *kind;
}

Schedule build_schedule(std::string_view kind, int pp, int vp, int microbatches, std::optional<Placement> placement) {
  return build_schedule(parse_schedule_kind(kind), pp, vp, microbatches, placement);
}

Schedule build_schedule(ScheduleKind kind, int pp, int vp, int microbatches, std::optional<Placement> placement) {
  TRIPOD_CHECK(static_cast<size_t>(kind) < choice_count<ScheduleKind>(), "build_schedule of a {} schedule",
               enum_name(kind));
  const Placement where = placement.value_or(default_placement(kind));
  check_schedule_kind(kind, pp, vp, microbatches, where);
  switch (kind) {
    case ScheduleKind::ZbH1: return zb_h1_schedule(pp, microbatches);
    case ScheduleKind::ZbH2: return zb_h2_schedule(pp, microbatches);
    case ScheduleKind::Zbv: return zbv_schedule(pp, microbatches);
    case ScheduleKind::DualPipeV: return dualpipev_schedule(pp, microbatches);
    case ScheduleKind::Auto: return auto_schedule(pp, vp, where, microbatches, StageCosts{}, 0, 0).schedule;
    default: break;
  }
  Schedule s;
  s.kind = kind;
  s.pp = pp;
  s.vp = vp;
  s.microbatches = microbatches;
  for (int r = 0; r < pp; ++r) {
    if (kind == ScheduleKind::GPipe)
      s.ranks.push_back(gpipe_actions(pp, microbatches, r));
    else if (kind == ScheduleKind::OneFOneB)
      s.ranks.push_back(one_f_one_b_actions(pp, microbatches, r));
    else
      s.ranks.push_back(interleaved_actions(pp, vp, microbatches, r));
  }
  return s;
}

Schedule forward_only_schedule(int pp, int vp, int microbatches, Placement placement) {
  TRIPOD_INPUT_CHECK(pp >= 1 && vp >= 1 && microbatches >= 1,
                     "forward-only schedule: pp = {}, vp = {}, microbatches = {}: each must be at least 1", pp, vp,
                     microbatches);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * vp * microbatches <= kMaxSchedulePairs,
                     "pp = {} x vp = {} x microbatches = {} is too large (at most {} micro-batch/stage pairs)", pp,
                     vp, microbatches, kMaxSchedulePairs);
  check_placement(placement, vp);
  Schedule s;
  s.kind = ScheduleKind::Forward;
  s.forward_only = true;
  s.placement = placement;
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

std::optional<ScheduleCsvFormat> parse_csv_format(std::string_view name) {
  if (name == "auto") return ScheduleCsvFormat::Auto;
  if (name == "tripod") return ScheduleCsvFormat::Tripod;
  if (name == "pytorch") return ScheduleCsvFormat::PyTorch;
  return std::nullopt;
}

namespace {

std::string_view trim_cell(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string_view::npos ? std::string_view{} : s.substr(b, e - b + 1);
}

// A PyTorch action cell: <stage><F|I|W|B><micro-batch>. The virtual stage goes in `chunk` until
// the placement is known.
std::optional<Action> parse_pytorch_action(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0 || i > 9 || i + 1 >= s.size() || s.size() - i - 1 > 9) return std::nullopt;
  std::string letter(1, s[i]);
  std::string stage_mb = std::string(s.substr(i + 1)) + "." + std::string(s.substr(0, i));
  auto a = parse_action(letter + stage_mb);  // reuses the index checks: "F<mb>.<stage>"
  return a;
}

}  // namespace

Schedule parse_schedule_csv(std::string_view text, const std::string& source, ScheduleCsvFormat format) {
  Schedule s;
  s.kind = ScheduleKind::Custom;
  s.source = source;
  int max_mb = -1, max_chunk = -1;
  int line_no = 0, placement_line = 0;
  std::optional<Placement> placement;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#') continue;
    const int rank = static_cast<int>(s.ranks.size());
    if (line.substr(first).starts_with("placement")) {
      std::string_view rest = trim_cell(line.substr(first + 9));
      if (!rest.empty() && (rest[0] == '=' || rest[0] == ':')) rest = trim_cell(rest.substr(1));
      if (!rest.empty() && rest.front() == '"' && rest.back() == '"' && rest.size() >= 2)
        rest = rest.substr(1, rest.size() - 2);
      auto p = parse_placement(rest);
      TRIPOD_INPUT_CHECK(p.has_value(), "{}:{}: placement '{}' is unknown (valid: loop, v)", source, line_no, rest);
      TRIPOD_INPUT_CHECK(rank == 0, "{}:{}: the placement line goes before the rank rows", source, line_no);
      TRIPOD_INPUT_CHECK(!placement, "{}:{}: a second placement line (the first is line {})", source, line_no,
                         placement_line);
      placement = p;
      placement_line = line_no;
      continue;
    }
    std::vector<Action> row;
    size_t cpos = 0;
    while (cpos <= line.size()) {
      size_t comma = line.find(',', cpos);
      std::string_view cell =
          trim_cell(line.substr(cpos, comma == std::string_view::npos ? std::string_view::npos : comma - cpos));
      cpos = comma == std::string_view::npos ? line.size() + 1 : comma + 1;
      if (cell.empty()) continue;
      if (format == ScheduleCsvFormat::Auto)
        format = cell[0] >= '0' && cell[0] <= '9' ? ScheduleCsvFormat::PyTorch : ScheduleCsvFormat::Tripod;
      std::optional<Action> a;
      if (format == ScheduleCsvFormat::PyTorch) {
        a = parse_pytorch_action(cell);
        if (!a) {
          size_t i = 0;
          while (i < cell.size() && cell[i] >= '0' && cell[i] <= '9') ++i;
          const std::string_view op = cell.substr(i);
          const bool comm = op.starts_with("SEND") || op.starts_with("RECV") || op.starts_with("UNSHARD") ||
                            op.starts_with("RESHARD") || op.starts_with("REDUCE_GRAD");
          throw InputError(fmt::format(
              "{}:{} (rank {}): '{}' is not a compute action of PyTorch's compute_only format: expected "
              "<stage><F|I|W|B><micro-batch>, e.g. 0F1 or 1W0{}",
              source, line_no, rank, cell,
              comm ? " (communication and resharding actions are not taken: tripod plans its own messages)" : ""));
        }
      } else {
        a = parse_action(cell);
        TRIPOD_INPUT_CHECK(a.has_value(),
                           "{}:{} (rank {}): '{}' is not an action: expected F, B, I or W, then <micro-batch>.<chunk>, "
                           "e.g. F3.1 or W2.0",
                           source, line_no, rank, cell);
      }
      max_mb = std::max(max_mb, a->mb);
      max_chunk = std::max(max_chunk, a->chunk);  // PyTorch: the largest stage
      row.push_back(*a);
    }
    s.ranks.push_back(std::move(row));
    s.source_lines.push_back(line_no);
  }
  TRIPOD_INPUT_CHECK(!s.ranks.empty(), "{}: no schedule rows (expected one line of actions per pipeline rank)", source);
  TRIPOD_INPUT_CHECK(max_mb >= 0, "{}: no actions in any row", source);
  s.pp = static_cast<int>(s.ranks.size());
  s.microbatches = max_mb + 1;
  if (format == ScheduleCsvFormat::PyTorch) {
    TRIPOD_INPUT_CHECK(!placement, "{}:{}: a placement line in a PyTorch-format schedule (its stages say where they "
                       "are)", source, placement_line);
    const int S = max_chunk + 1;
    TRIPOD_INPUT_CHECK(S % s.pp == 0,
                       "{}: stages 0..{} on {} ranks: each rank must hold the same number of stages", source, S - 1,
                       s.pp);
    s.vp = S / s.pp;
    TRIPOD_INPUT_CHECK(static_cast<long long>(s.pp) * s.vp * s.microbatches <= kMaxSchedulePairs,
                       "{}: {} ranks x {} stages x {} micro-batches is too large (at most {} micro-batch/stage pairs)",
                       source, s.pp, S, s.microbatches, kMaxSchedulePairs);
    // Loop if every stage is where the loop placement puts it, else V if it fits.
    auto fits = [&](Placement p) {
      if (p == Placement::V && s.vp != 2) return false;
      for (int r = 0; r < s.pp; ++r)
        for (const Action& a : s.ranks[r])
          if (placement_rank(p, s.pp, a.chunk) != r) return false;
      return true;
    };
    if (fits(Placement::Loop)) s.placement = Placement::Loop;
    else if (fits(Placement::V)) s.placement = Placement::V;
    else {
      // Name the first action where the loop placement puts its stage elsewhere.
      for (int r = 0; r < s.pp; ++r)
        for (const Action& a : s.ranks[r])
          if (placement_rank(Placement::Loop, s.pp, a.chunk) != r &&
              (s.vp != 2 || placement_rank(Placement::V, s.pp, a.chunk) != r))
            throw InputError(fmt::format(
                "{}:{} (rank {}): {}{}{}: stage {} is not on rank {} in the loop placement (rank r holds stages r, "
                "r+{}, ...){}",
                source, s.source_lines[r], r, a.chunk, action_letter(a.kind), a.mb, a.chunk, r, s.pp,
                s.vp == 2 ? fmt::format(" nor in the v placement (rank r holds stages r and {}-r)", 2 * s.pp - 1)
                          : ""));
      throw InputError(fmt::format("{}: the stages on the rows fit neither the loop nor the v placement (each row "
                                   "mixes the two)",
                                   source));
    }
    for (auto& row : s.ranks)
      for (Action& a : row) a.chunk = placement_chunk(s.placement, s.pp, a.chunk);
    return s;
  }
  s.vp = max_chunk + 1;
  s.placement = placement.value_or(Placement::Loop);
  if (s.placement == Placement::V) {
    for (int r = 0; r < s.pp; ++r)
      for (const Action& a : s.ranks[r])
        TRIPOD_INPUT_CHECK(a.chunk < 2,
                           "{}:{} (rank {}): {}: chunk {}, but placement v (line {}) puts exactly 2 model chunks, 0 "
                           "and 1, on each rank",
                           source, s.source_lines[r], r, a.str(), a.chunk, placement_line);
    TRIPOD_INPUT_CHECK(s.vp == 2,
                       "{}:{}: placement v puts 2 model chunks on each rank (vp = 2), but no action uses chunk 1 (vp = "
                       "1); use the loop placement for one chunk per rank",
                       source, placement_line);
  }
  TRIPOD_INPUT_CHECK(static_cast<long long>(s.pp) * s.vp * s.microbatches <= kMaxSchedulePairs,
                     "{}: {} ranks x {} chunks x {} micro-batches is too large (at most {} micro-batch/stage pairs)",
                     source, s.pp, s.vp, s.microbatches, kMaxSchedulePairs);
  return s;
}

Schedule load_schedule_csv(const std::string& path, ScheduleCsvFormat format) {
  std::ifstream in(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(in.good(), "{}: cannot read the schedule file ({})", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  TRIPOD_INPUT_CHECK(!in.bad(), "{}: error while reading the schedule file", path);
  return parse_schedule_csv(ss.str(), path, format);
}

std::string schedule_csv(const Schedule& s) {
  std::string out = fmt::format("# tripod pipeline schedule: {}, pp={} vp={} microbatches={}; one line per rank\n",
                                enum_name(s.kind), s.pp, s.vp, s.microbatches);
  if (s.placement == Placement::V) out += "placement = v\n";
  for (const auto& row : s.ranks) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) out += ",";
      out += row[i].str();
    }
    out += "\n";
  }
  return out;
}

std::string schedule_csv_pytorch(const Schedule& s) {
  std::string out;
  for (int r = 0; r < static_cast<int>(s.ranks.size()); ++r) {
    const auto& row = s.ranks[r];
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) out += ",";
      out += fmt::format("{}{}{}", s.stage(r, row[i].chunk), action_letter(row[i].kind), row[i].mb);
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
