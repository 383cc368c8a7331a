// Verifying a checkpoint (`tripod ckpt verify`): every piece read and checked against its CRC32C,
// and every element of every global tensor stored exactly once, per state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tripod {

struct VerifyResult {
  std::string dir;                    // the checkpoint (iter_NNNNNNN) that was checked
  std::vector<std::string> problems;  // empty: the checkpoint is whole
  int64_t files = 0, datasets = 0, tensors = 0;
  int64_t bytes = 0;             // f32 bytes of the pieces read and checked
  bool optimizer_state = false;  // Adam's m and v (and master weights when saved) were required too
  bool ok() const { return problems.empty(); }
};

// Checks the checkpoint `dir` (an iter_NNNNNNN directory, see resolve_checkpoint). Each file is
// indexed and each piece read separately, so one damaged file does not hide the others' problems;
// then, per tensor and state, every element must be stored exactly once (values always; m and v
// with the optimizer; master where any piece of it was saved). Throws InputError only when the
// checkpoint cannot be opened at all (metadata.json missing or invalid, a listed file missing or
// of another size); every other problem is returned, one line each, naming the file or tensor.
VerifyResult verify_checkpoint(const std::string& dir);

}  // namespace tripod
