// TensorBoard event files: Event protobufs in TFRecord framing.
#include "train/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "checkpoint/crc32c.h"
#include "core/error.h"
#include "train/tensorboard_event.pb.h"

namespace fs = std::filesystem;

namespace tripod {

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || !buf[0]) return "localhost";
  return buf;
}

}  // namespace

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  char len[8];
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out.append(len, 8);
  put_u32(out, masked_crc32c(len, 8));
  out.append(data);
  put_u32(out, masked_crc32c(data.data(), data.size()));
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, const std::string& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::error_code ec_dir;
  TRIPOD_INPUT_CHECK(fs::is_directory(dir, ec_dir), "{} = {}: cannot create the folder ({})", key, dir,
                     ec ? ec.message() : "a file of that name exists");
  const double now = unix_seconds();
  const std::string base = (fs::path(dir) / fmt::format("events.out.tfevents.{}.{}", static_cast<int64_t>(now),
                                                        host_name())).string();
  // O_EXCL: a run never appends to (or truncates) another run's file; a name taken by a run that
  // started in the same second on this host gets this process's id.
  int fd = -1;
  for (const std::string& candidate : {base, fmt::format("{}.{}", base, ::getpid())}) {
    fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST) {
      path_ = candidate;
      break;
    }
  }
  TRIPOD_INPUT_CHECK(fd >= 0, "{} = {}: cannot create {} ({})", key, dir, path_.empty() ? base : path_,
                     std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  TRIPOD_CHECK(file_, "fdopen {}: {}", path_, std::strerror(errno));
  tb::Event version;
  version.set_wall_time(now);
  version.set_step(0);
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<Scalar>& scalars) {
  tb::Event e;
  e.set_wall_time(unix_seconds());
  e.set_step(step);
  tb::Summary* s = e.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    tb::SummaryValue* v = s->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(e.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& event_bytes) {
  const std::string rec = tfrecord_frame(event_bytes);
  TRIPOD_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(), "writing {}: {}", path_,
               std::strerror(errno));
}

void TensorBoardWriter::flush() {
  TRIPOD_CHECK(std::fflush(file_) == 0, "writing {}: {}", path_, std::strerror(errno));
}

}  // namespace tripod
