// `tripod calibrate --out FILE.toml [--device cpu|cuda] [--base H.toml] [--model F.toml] [--repeats R]`:
// measures this machine's kernels and (under mpirun) its collectives into a hardware file for `tripod plan`.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/log.h"
#include "core/output_path.h"
#include "plan/calibrate.h"
#include "train/commands/commands.h"
#include "train/mpi_session.h"
#include "train/runtime.h"

namespace tripod {

namespace {

struct CalibrateOptions {
  std::string out, device = "cpu", base, name, model;
  std::vector<int> micro_batches = {1, 2, 4, 8};
  int repeats = 5;
  bool force = false;
};

int run_calibrate(const CalibrateOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), false);
  Hardware hw;
  Runtime rt;
  Config config;  // --model's
  try {
    if (!o.model.empty()) config = load_config(o.model, {}, ConfigUse{.training = false, .data = false});
    for (int b : o.micro_batches) TRIPOD_INPUT_CHECK(b >= 1, "--micro-batches {}: must be positive", b);
    const std::optional<Device> device = parse_enum<Device>(o.device);
    TRIPOD_INPUT_CHECK(device, "--device {}: must be cpu or cuda", o.device);
    // --out, before minutes of measuring. Only rank 0 writes it (its folder may exist on its node
    // alone): rank 0 checks, and every rank learns the outcome, so all exit together.
    std::string why;
    if (mpi.rank() == 0) {
      try {
        TRIPOD_INPUT_CHECK(o.force || !std::filesystem::exists(o.out), "--out {} exists (pass --force to replace it)",
                           o.out);
        check_output_file(o.out, "--out");
      } catch (const InputError& e) {
        why = e.what();
      }
    }
    int bad = !why.empty();
    MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
    TRIPOD_INPUT_CHECK(!bad, "{}", why);  // printed by rank 0
    TRIPOD_INPUT_CHECK(o.repeats >= 1, "--repeats {}: must be at least 1", o.repeats);
    TRIPOD_INPUT_CHECK(*device == Device::CPU || !o.base.empty(),
                       "--device cuda needs --base (a datasheet file such as configs/hardware/h100_sxm.toml) for "
                       "what calibration does not measure: memory, the inter-node network");
    if (!o.base.empty()) {
      hw = load_hardware(o.base);
    } else {
      // A CPU "node": the ranks of this run share its memory and cores.
      hw.memory_capacity = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE) / mpi.size();
      hw.gpus_per_node = mpi.size();
      hw.overlap_dp = false;  // MPI progresses non-blocking collectives only inside MPI calls
    }
    hw.name = o.name.empty() ? fmt::format("calibrated {} ({} ranks)", o.device, mpi.size()) : o.name;
    // A (1, n, 1) grid: its world communicator is NCCL's when each rank has its own GPU.
    Config cfg;
    cfg.train.device = *device;
    cfg.parallel.dp = mpi.size();
    rt = make_runtime(cfg);
  } catch (const InputError& e) {
    rethrow_agreed(e);
  }
  Ops* ops = rt.ops.get();
  ParallelContext& par = rt.par;
  const Ops::DeviceInfo info = ops->device_info();
  CalibrateGrid grid = o.model.empty() ? default_grid(ops->device(), info)
                                       : model_grid(ops->device(), config.model, mpi.size(), o.micro_batches,
                                                    static_cast<int64_t>(config.parallel.bucket_mb * (1 << 20)), info);
  grid.repeats = o.repeats;
  spdlog::info("calibrating {} GEMM shapes, {} attention calls, {} memory-bound calls{}", grid.gemm.size(),
               grid.attention.size(), grid.elementwise.size(),
               mpi.size() > 1 ? fmt::format(", collectives over {} ranks", mpi.size()) : "");
  calibrate(*ops, par.world.get(), grid, hw);
  // A GPU's memory is its own, not the --base file's (a base of another model of GPU).
  if (ops->device() == Device::CUDA && info.memory_bytes > 0) hw.memory_capacity = static_cast<double>(info.memory_bytes);
  if (mpi.rank() == 0) {
    const std::string tmp = o.out + ".tmp";
    {
      std::ofstream f(tmp);
      f << fmt::format("# written by tripod calibrate: medians of {} timings per point, each looping the call for at "
                       "least {:g} ms;\n# {}\n",
                       o.repeats, 1e3 * grid.min_time_s,
                       o.model.empty() ? fmt::format("sizes that fill the device (last-level cache {} MiB, memory {:.1f} GiB)",
                                                     info.cache_bytes >> 20, info.memory_bytes / double(1 << 30))
                                       : fmt::format("the shapes of {} at micro-batches {}", o.model,
                                                     fmt::join(o.micro_batches, ",")))
        << hardware_to_toml(hw);
      TRIPOD_CHECK(f.good(), "cannot write {}", tmp);
    }
    std::filesystem::rename(tmp, o.out);
    fmt::print("{}: peak {:.1f} GFLOP/s, elementwise {:.1f} GB/s, {} GEMM, {} attention, {} collective points\n", o.out,
               hw.peak_flops / 1e9, hw.memory_bandwidth / 1e9, hw.gemm.size(), hw.attention.size(),
               hw.collectives.size());
  }
  return 0;
}

}  // namespace

CommandFn add_calibrate_command(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  CLI::App* sub = app.add_subcommand("calibrate", "Measure this machine's GEMM, attention, elementwise and "
                                                  "(under mpirun) collective speeds into a hardware file");
  sub->add_option("--out", o->out, "Hardware file to write (TOML)")->required();
  sub->add_option("--device", o->device, "cpu (OpenBLAS, MPI) or cuda (cuBLASLt, cuDNN, NCCL)");
  sub->add_option("--base", o->base, "Hardware file whose unmeasured fields (memory, network) to keep");
  sub->add_option("--name", o->name, "Name written into the file");
  sub->add_option("--model", o->model, "Measure exactly this config's shapes (GEMMs, attention, memory-bound ops, "
                                       "for tp up to the ranks and each --micro-batches) instead of the sizes that "
                                       "fill the device");
  sub->add_option("--micro-batches", o->micro_batches, "Micro-batch sizes for --model (default 1 2 4 8)")->delimiter(',');
  sub->add_option("--repeats", o->repeats, "Timings per point (the median is kept; default 5)");
  sub->add_flag("--force", o->force, "Replace --out if it exists");
  return [o] { return run_calibrate(*o); };
}

}  // namespace tripod
