// Helpers shared by the schedule tests: a rank's actions as text, and the InputError a call throws.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
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

// The InputError message `fn` throws, or "" when it throws none.
template <class Fn>
std::string input_error(Fn&& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace tripod::test
