// Numbers for people.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace tripod {

// "1h02m", "3m05s", "12s" ("?" for a negative or NaN time).
inline std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace tripod
