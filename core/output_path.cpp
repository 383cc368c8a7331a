// Output-path checks: existence, kind and write permission of the target and its folder.
#include "core/output_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace fs = std::filesystem;

namespace tripod {

namespace {

std::string named(const std::string& path, const std::string& what) {
  return what.empty() ? path : what + " " + path;
}

// InputError unless `dir` (existing) is a folder this process may create entries in.
void check_writable_folder(const fs::path& dir, const std::string& path, const std::string& what) {
  std::error_code ec;
  TRIPOD_INPUT_CHECK(fs::is_directory(dir, ec), "{}: cannot write there: {} is a file, not a folder",
                     named(path, what), dir.string());
  // W_OK on the folder: creating, renaming and removing entries in it (EROFS on a read-only mount).
  TRIPOD_INPUT_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "{}: cannot write there: folder {} is not writable ({})",
                     named(path, what), dir.string(), std::strerror(errno));
}

}  // namespace

void check_output_file(const std::string& path, const std::string& what) {
  TRIPOD_INPUT_CHECK(!path.empty(), "{}: the output path is empty", what.empty() ? "output" : what);
  std::error_code ec;
  TRIPOD_INPUT_CHECK(!fs::is_directory(path, ec), "{}: is a folder; a file is written there", named(path, what));
  const fs::path parent = fs::absolute(fs::path(path), ec).parent_path();
  TRIPOD_INPUT_CHECK(fs::exists(parent, ec), "{}: cannot write there: folder {} does not exist", named(path, what),
                     parent.string());
  check_writable_folder(parent, path, what);
}

void check_output_dir(const std::string& path, const std::string& what) {
  TRIPOD_INPUT_CHECK(!path.empty(), "{}: the output path is empty", what.empty() ? "output" : what);
  std::error_code ec;
  const fs::path p = fs::absolute(fs::path(path), ec);
  if (fs::exists(p, ec)) {
    TRIPOD_INPUT_CHECK(fs::is_directory(p, ec), "{}: is a file; a folder is written there", named(path, what));
    check_writable_folder(p, path, what);
    return;
  }
  // The nearest existing ancestor: where the missing folders would be created.
  fs::path at = p.parent_path();
  while (!at.empty() && !fs::exists(at, ec) && at != at.root_path()) at = at.parent_path();
  check_writable_folder(at, path, what);
}

}  // namespace tripod
