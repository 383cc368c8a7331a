// Printing and parsing pipeline actions.
#include "parallel/pipeline/action.h"

#include <fmt/format.h>

#include <charconv>

namespace tripod {

char action_letter(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return 'F';
    case ActionKind::Backward: return 'B';
    case ActionKind::Input: return 'I';
    case ActionKind::Weight: return 'W';
  }
  return '?';
}

std::string Action::str() const { return fmt::format("{}{}.{}", action_letter(kind), mb, chunk); }

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A non-negative decimal integer made only of digits (no sign, no spaces), below 2^31.
std::optional<int> parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.front() == '-' || s.front() == '+') return std::nullopt;
  return v;
}

}  // namespace

std::optional<Action> parse_action(std::string_view text) {
  std::string_view s = trim(text);
  if (s.size() < 2) return std::nullopt;
  Action a;
  switch (s[0]) {
    case 'F': a.kind = ActionKind::Forward; break;
    case 'B': a.kind = ActionKind::Backward; break;
    case 'I': a.kind = ActionKind::Input; break;
    case 'W': a.kind = ActionKind::Weight; break;
    default: return std::nullopt;
  }
  s.remove_prefix(1);
  auto dot = s.find('.');
  auto mb = parse_index(s.substr(0, dot));
  if (!mb) return std::nullopt;
  a.mb = *mb;
  if (dot != std::string_view::npos) {
    auto chunk = parse_index(s.substr(dot + 1));
    if (!chunk) return std::nullopt;
    a.chunk = *chunk;
  }
  return a;
}

std::string Schedule::where(int rank) const {
  if (source.empty() || rank >= static_cast<int>(source_lines.size())) return fmt::format("rank {}", rank);
  return fmt::format("rank {} ({}:{})", rank, source, source_lines[rank]);
}

}  // namespace tripod
