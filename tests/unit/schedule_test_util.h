// Helpers shared by the schedule tests: a rank's actions as text (and input_error, tests/input_error.h).
#pragma once

#include <string>
#include <vector>

#include "input_error.h"
#include "parallel/pipeline/action.h"

namespace tripod::test {

inline std::string join(const std::vector<Action>& list) {
  std::string s;
  for (const Action& a : list) {
    if (!s.empty()) s += ' ';
    s += a.str();
  }
  return s;
}

}  // namespace tripod::test
