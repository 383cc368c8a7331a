// Errors: exceptions that carry [file:line] and context, turned into exit codes only in main.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tripod {

// A failure inside tripod (a bug, a failed system call, a CUDA error): exit status 1. main prints
// it with the rank in front (under MPI), or, when `shared` (every rank fails the same way
// together, e.g. a diverged run), once from rank 0 like a shared InputError.
class Error : public std::runtime_error {
 public:
  Error(const char* file, int line, const std::string& what, bool shared = false)
      : std::runtime_error(fmt::format("[{}:{}] {}", strip(file), line, what)), shared_(shared) {}
  bool shared() const { return shared_; }

 private:
  static const char* strip(const char* file) {
    // Keep the path below the repository root: ".../tripod/kernels/cpu/x.cpp" -> "kernels/cpu/x.cpp".
    std::string_view f(file);
    for (const char* top : {"/core/", "/kernels/", "/parallel/", "/model/", "/data/", "/checkpoint/", "/config/",
                            "/train/", "/plan/", "/tests/", "/bench/"}) {
      auto pos = f.rfind(top);
      if (pos != std::string_view::npos) return file + pos + 1;
    }
    return file;
  }
  bool shared_;
};

// Bad configuration or input from the user: exit status 2. The message names the key, file or
// value at fault and what would be valid; main prints it as "error: <message>", once per run:
// - Shared (the default): every rank reads the same input and fails the same way; world rank 0
//   prints it. Another rank that still runs a moment later (rank 0 did not fail) prints it with
//   its rank, so it is never lost.
// - Rank: this rank's own input (its shard file, a node-local file): printed at once, with the rank.
// - Elsewhere: a collective check that another rank reports (see reported_elsewhere()).
// - Agreed: every rank throws it at the same point, before any rank waits on another (the setup
//   of an MPI command: its options, config and inputs): world rank 0 prints it, and every rank
//   finalizes MPI and exits 2, so the launcher reports nothing more.
class InputError : public std::runtime_error {
 public:
  enum class Scope { Shared, Rank, Elsewhere, Agreed };
  explicit InputError(const std::string& what, Scope scope = Scope::Shared)
      : std::runtime_error(what), scope_(scope) {}
  static InputError reported_elsewhere() { return InputError("", Scope::Elsewhere); }
  Scope scope() const { return scope_; }

 private:
  Scope scope_;
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
