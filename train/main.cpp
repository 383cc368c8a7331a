// tripod: one executable, subcommands. Errors become exit codes here and nowhere else:
// 2 for bad configuration or input (one "error:" line naming the key or file), 1 for the rest.
#include <fmt/format.h>

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/version.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_deadline.h"
#include "train/commands/commands.h"

namespace {

// This process's world rank and size when it runs under MPI (else 0 and 1).
std::pair<int, int> world_rank_size() {
  int initialized = 0, finalized = 0, rank = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  return {rank, size};
}

// Prints the one "error:" line of the run (see InputError's scopes) and exits without unwinding
// further: other ranks may be waiting on this one; the launcher ends them. An error every rank
// agreed on (their setup) finalizes MPI first: no rank waits on another there.
[[noreturn]] void report_and_exit(const std::exception& e, tripod::InputError::Scope scope, int status) {
  using Scope = tripod::InputError::Scope;
  const auto [rank, size] = world_rank_size();
  if (scope == Scope::Agreed) {
    if (rank == 0) fmt::print(stderr, "error: {}\n", e.what());
    std::fflush(stderr);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
      tripod::MpiDeadline deadline("MPI_Finalize", tripod::MpiDeadline::kMinLimitS);
      MPI_Finalize();
    }
    std::exit(status);
  }
  if (size == 1 || (scope == Scope::Shared && rank == 0)) {
    fmt::print(stderr, "error: {}\n", e.what());
  } else if (scope == Scope::Shared) {
    // Rank 0 meets the same error and reports it; the launcher ends this process when it exits.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    fmt::print(stderr, "error: rank {}: {}\n", rank, e.what());
  } else if (scope == Scope::Rank) {
    fmt::print(stderr, "error: rank {}: {}\n", rank, e.what());
  }
  std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace

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
  // CLI11 calls a word that is no subcommand a missing subcommand: name the word instead.
  CLI::App* at = &app;
  for (int i = 1; i < argc && argv[i][0] != '-' && !at->get_subcommands({}).empty(); ++i) {
    CLI::App* next = nullptr;
    std::string valid;
    for (CLI::App* s : at->get_subcommands({})) {
      if (s->check_name(argv[i])) next = s;
      valid += (valid.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) {
      fmt::print(stderr, "error: unknown command '{}' (valid: {}; see tripod --help)\n", argv[i], valid);
      return 2;
    }
    at = next;
  }
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
  auto all = app.get_subcommands({});
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i]->parsed()) continue;
    try {
      return commands[i]();
    } catch (const InputError& e) {
      report_and_exit(e, e.scope(), 2);
    } catch (const Error& e) {
      report_and_exit(e, e.shared() ? InputError::Scope::Shared : InputError::Scope::Rank, 1);
    } catch (const std::exception& e) {
      report_and_exit(e, InputError::Scope::Rank, 1);  // a failure is this rank's own
    }
  }
  return 2;
}
