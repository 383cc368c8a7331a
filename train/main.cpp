// tripod: one executable, subcommands. Errors become exit codes here and nowhere else:
// 2 for bad configuration or input (one "error:" line naming the key or file), 1 for the rest.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "core/error.h"
#include "core/version.h"
#include "kernels/op.h"
#include "train/commands/commands.h"

int main(int argc, char** argv) {
  using namespace tripod;
  select_cpu_blas_kernels(argv);
  CLI::App app{"tripod " TRIPOD_VERSION ": GPT pretraining with 3D parallelism (data, pipeline, tensor)"};
  app.set_version_flag("--version", TRIPOD_VERSION);
  app.require_subcommand(1);
  std::vector<CommandFn> commands;
  commands.push_back(add_train_command(app));
  commands.push_back(add_schedule_command(app));
  commands.push_back(add_trace_command(app));
  commands.push_back(add_data_command(app));
  commands.push_back(add_report_command(app));
  commands.push_back(add_eval_command(app));
  commands.push_back(add_generate_command(app));
  commands.push_back(add_ckpt_command(app));
  commands.push_back(add_plan_command(app));
  commands.push_back(add_calibrate_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "error: {} (see tripod --help)\n", e.what());
    return 2;
  }
  auto subs = app.get_subcommands();
  auto all = app.get_subcommands({});
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i]->parsed()) continue;
    try {
      return commands[i]();
    } catch (const InputError& e) {
      // An empty message: another rank reports the error (collective checks, e.g. checkpoint loads).
      if (*e.what()) fmt::print(stderr, "error: {}\n", e.what());
      std::fflush(stderr);
      std::_Exit(2);  // other ranks may be waiting on this one; the launcher ends them
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  return 2;
}
