// Output paths the user names on the command line, checked before any work is done: a path that
// cannot be written is an InputError (exit 2) naming the option, the path and why, never an I/O
// failure after minutes of work or a half-written output.
#pragma once

#include <string>

namespace tripod {

// A file written at `path` (created, or replaced by a rename within its folder): its folder
// exists, is a folder and is writable, and `path` is not a folder. `what` names the option
// ("--out"); empty for a positional argument.
void check_output_file(const std::string& path, const std::string& what);

// A folder created at `path` together with any missing parents: the nearest existing ancestor is
// a writable folder, and `path`, when it exists, is a folder. Whether an existing folder may be
// used is the caller's rule.
void check_output_dir(const std::string& path, const std::string& what);

}  // namespace tripod
