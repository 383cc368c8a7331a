// TensorBoard event files: scalars written as TensorFlow `Event` records (train/tensorboard_event.proto)
// in TFRecord framing, which TensorBoard (and anything reading TFRecords) reads.
//
// A file is a sequence of records, each
//   u64 length (little-endian) | u32 masked_crc32c(length bytes) | data | u32 masked_crc32c(data)
// where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (CRC32C of checkpoint/crc32c.h).
// The first record is an Event with file_version "brain.Event:2"; each later one holds a Summary of
// (tag, simple_value) scalars at one step. Example: add_scalars(10, {{"lm loss", 4.2}}) appends
//   Event{wall_time: 1764247200.5, step: 10, summary: {value: [{tag: "lm loss", simple_value: 4.2f}]}}.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tripod {

// CRC32C of `n` bytes, rotated right by 15 bits plus 0xa282ead8: TFRecord's masked checksum (a CRC of
// data that itself holds CRCs is then not degenerate).
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord: `data` with its length, the length's masked CRC and the data's masked CRC.
std::string tfrecord_frame(std::string_view data);

using Scalar = std::pair<std::string, double>;  // (tag, value); written as a 32-bit float

class TensorBoardWriter {
 public:
  // Creates `dir` when missing and a new file in it, events.out.tfevents.<unix seconds>.<host>
  // (".<pid>" appended when that name is taken: a file is never appended to), holding the version
  // record. A folder that cannot be created or written is an InputError naming `key` (the config key).
  explicit TensorBoardWriter(const std::string& dir, const std::string& key = "train.tensorboard_dir");
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one event at `step` holding `scalars`, stamped with the current wall-clock time.
  // Buffered: flush() hands it to the operating system.
  void add_scalars(int64_t step, const std::vector<Scalar>& scalars);
  // Writes what is buffered to the file, so that a process killed afterwards keeps it.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event_bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tripod
