// Errors: exceptions that carry [file:line] and context, turned into exit codes only in main.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tripod {

// A failure inside tripod (a bug, a failed system call, a CUDA error): exit status 1.
class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& what)
      : std::runtime_error(fmt::format("[{}:{}] {}", strip(file), line, what)) {}

 private:
  static const char* strip(const char* file) {
    // Keep the path below the repository root: ".../tripod/kernels/cpu/x.cpp" -> "kernels/cpu/x.cpp".
    std::string_view f(file);
    for (const char* top : {"/core/", "/kernels/", "/parallel/", "/model/", "/data/", "/checkpoint/",
                            "/train/", "/tests/", "/bench/"}) {
      auto pos = f.rfind(top);
      if (pos != std::string_view::npos) return file + pos + 1;
    }
    return file;
  }
};

// Bad configuration or input from the user: exit status 2. The message names the key, file or
// value at fault and what would be valid; main prints it as "error: <message>".
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tripod

#define TRIPOD_CHECK(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      throw ::tripod::Error(__FILE__, __LINE__, "check failed: " #cond ": " + fmt::format(__VA_ARGS__)); \
  } while (0)

#define TRIPOD_FAIL(...) throw ::tripod::Error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))

// For user-facing input errors.
#define TRIPOD_INPUT_CHECK(cond, ...)                                  \
  do {                                                                 \
    if (!(cond)) [[unlikely]]                                          \
      throw ::tripod::InputError(fmt::format(__VA_ARGS__));            \
  } while (0)
