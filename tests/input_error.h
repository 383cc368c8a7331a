// The InputError a call throws, for tests of bad input.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace tripod::test {

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

// The InputError message `fn` throws, failing the test when it throws none or when the message
// lacks one of `parts`.
template <class Fn>
std::string expect_input_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no InputError";
  } catch (const InputError& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    return msg;
  }
  return "";
}

}  // namespace tripod::test
