// What every libFuzzer harness shares: a private scratch directory, and the rule that only
// tripod's own errors may escape a reader (anything else aborts, which libFuzzer reports).
#pragma once

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tripod::fuzz {

// No log lines: they would cost more than the input.
inline const bool quiet_logs = [] {
  spdlog::set_level(spdlog::level::off);
  return true;
}();

// A directory of this process's own (in memory when /dev/shm exists), removed at exit.
inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::error_code ec;
    const auto top = std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                                   : std::filesystem::temp_directory_path();
    return top / ("tripod-fuzz-" + std::to_string(::getpid()));
  }();
  static const bool made = [] {
    std::filesystem::create_directories(dir);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    });
    return true;
  }();
  (void)made;
  return dir;
}

inline std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = (scratch() / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

// Runs `f`; tripod's InputError (bad input, the expected outcome) is swallowed. Any other
// exception escaping a reader is a finding: abort so that libFuzzer saves the input.
template <class F> void expect_only_input_errors(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "finding: a reader let a non-tripod error escape: %s\n", e.what());
    std::abort();
  }
}

}  // namespace tripod::fuzz
