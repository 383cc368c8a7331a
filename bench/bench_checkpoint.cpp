// Checkpoint throughput on the CPU: saving (snapshot to host memory, HDF5 write, fsync, atomic
// commit) and loading (read, CRC32C check, reshard-assemble, copy into the model) of a GPT with
// d_model 768 and its Adam state, against writing (+ fsync) and reading the same number of bytes
// with plain sequential POSIX I/O on the same disk in the same run. Reads come right after the
// writes in both cases (page cache warm for both); where /proc/sys/vm/drop_caches is writable
// (root) both are measured cold too, after sync + dropping the page cache. Median of the
// repeats. Usage: bench_checkpoint [--layers N] [--repeats R] [--dir D]
#include <fcntl.h>
#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "checkpoint/reshard.h"
#include "core/log.h"
#include "train/runtime.h"
#include "train/trainer.h"
#include "kernels/op.h"

using namespace tripod;
namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// sync + drop the page cache; false where not permitted.
bool drop_caches() {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0) return false;
  bool ok = ::write(fd, "3", 1) == 1;
  ::close(fd);
  return ok;
}

double read_file(const std::string& path, int64_t bytes) {
  std::vector<char> buf(64 << 20);
  double t0 = now();
  int fd = ::open(path.c_str(), O_RDONLY);
  int64_t got = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) got += n;
  ::close(fd);
  TRIPOD_CHECK(got == bytes, "read back {} of {} bytes", got, bytes);
  return now() - t0;
}

// Plain sequential I/O of `bytes` in 64 MiB writes / reads: (write + fsync seconds, read seconds).
std::pair<double, double> plain_io(const std::string& path, int64_t bytes) {
  const size_t chunk = 64 << 20;
  std::vector<char> buf(chunk, 1);
  double t0 = now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TRIPOD_CHECK(fd >= 0, "open {}", path);
  for (int64_t left = bytes; left > 0;) {
    ssize_t n = ::write(fd, buf.data(), std::min<int64_t>(left, chunk));
    TRIPOD_CHECK(n > 0, "write {}", path);
    left -= n;
  }
  TRIPOD_CHECK(::fsync(fd) == 0, "fsync");
  ::close(fd);
  const double tw = now() - t0;
  return {tw, read_file(path, bytes)};
}

}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  MPI_Init(&argc, &argv);
  init_logging(0, 1);
  spdlog::set_level(spdlog::level::warn);
  int layers = 4, repeats = 3;
  std::string dir = "bench_checkpoint_tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--layers")) layers = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  Config one_rank;  // (dp, pp, tp) = (1, 1, 1) on the CPU
  one_rank.parallel.dp = 1;
  Runtime rt = make_runtime(one_rank);
  Ops* ops = rt.ops.get();
  ParallelContext& par = rt.par;
  Config cfg;
  cfg.model = {.n_layers = layers, .n_heads = 12, .d_model = 768, .ffn_hidden = 0, .seq_len = 1024,
               .max_positions = 0, .vocab_size = 16384};
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 1;
  cfg.train.steps = 1;
  cfg.train.output_dir = "";
  cfg.train.trace = false;
  cfg.data.synthetic = true;
  validate_layout(cfg, 1);
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 1);
  Trainer t(cfg, *ops, par, &data);
  fs::remove_all(dir);
  CheckpointSaver saver(dir, /*keep=*/1, /*async=*/false, *par.world);

  std::vector<double> save_s, load_s, write_s, read_s, cold_load_s, cold_read_s;
  bool cold = true;
  int64_t bytes = 0, file_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    double t0 = now();
    Snapshot snap = take_snapshot(t.registry(), *ops, t.optimizer_state(), par.coords, false);
    bytes = snap.bytes();
    saver.save(r + 1, std::move(snap), nlohmann::json{{"iteration", r + 1}});
    save_s.push_back(now() - t0);
    const std::string ck = (fs::path(dir) / iter_dir_name(r + 1)).string();
    file_bytes = static_cast<int64_t>(fs::file_size(fs::path(ck) / "pp00_tp00_dp00.h5"));
    t0 = now();
    load_checkpoint(ck, t.registry(), *ops, t.optimizer_state(), *par.world);
    load_s.push_back(now() - t0);
    const std::string plain = (fs::path(dir) / "plain.bin").string();
    auto [w, rd] = plain_io(plain, bytes);
    write_s.push_back(w);
    read_s.push_back(rd);
    if (cold && (cold = drop_caches())) {
      t0 = now();
      load_checkpoint(ck, t.registry(), *ops, t.optimizer_state(), *par.world);
      cold_load_s.push_back(now() - t0);
      drop_caches();
      cold_read_s.push_back(read_file(plain, bytes));
    }
    fs::remove(plain);
  }
  fs::remove_all(dir);
  const double gb = bytes / 1e9;
  fmt::print("checkpoint of GPT d_model 768, {} layers, vocab 16384: {:.1f} M parameters, values + Adam m, v = "
             "{:.0f} MB (HDF5 file {:.0f} MB); median of {} repeats, directory {}\n",
             layers, t.registry().flat_size() / 1e6, bytes / 1e6, file_bytes / 1e6, repeats, dir);
  fmt::print("{:<10} {:>12} {:>10} {:>16} {:>10} {:>8}\n", "", "tripod (s)", "GB/s", "plain I/O (s)", "GB/s", "ratio");
  fmt::print("{:<10} {:>12.3f} {:>10.2f} {:>16.3f} {:>10.2f} {:>7.0f}%\n", "save", median(save_s), gb / median(save_s),
             median(write_s), gb / median(write_s), 100 * median(write_s) / median(save_s));
  fmt::print("{:<10} {:>12.3f} {:>10.2f} {:>16.3f} {:>10.2f} {:>7.0f}%\n", "load warm", median(load_s), gb / median(load_s),
             median(read_s), gb / median(read_s), 100 * median(read_s) / median(load_s));
  if (cold)
    fmt::print("{:<10} {:>12.3f} {:>10.2f} {:>16.3f} {:>10.2f} {:>7.0f}%\n", "load cold", median(cold_load_s),
               gb / median(cold_load_s), median(cold_read_s), gb / median(cold_read_s),
               100 * median(cold_read_s) / median(cold_load_s));
  else
    fmt::print("load cold: not measured (dropping the page cache needs root)\n");
  fmt::print("save: snapshot to host memory + HDF5 write + fsync + commit; plain: write + fsync. load: open + index "
             "(HDF5 attributes) + CRC32C of every piece in the file's mapping + copy into the model; plain: read into "
             "a reused buffer. ratio = plain time / tripod time.\n");
  MPI_Finalize();
  return 0;
}
