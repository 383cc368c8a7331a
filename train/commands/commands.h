// The subcommands of the tripod executable. Each registers its options on the CLI and returns
// the function that runs it (returning the exit status).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace tripod {

using CommandFn = std::function<int()>;

CommandFn add_train_command(CLI::App& app);
CommandFn add_schedule_command(CLI::App& app);
CommandFn add_trace_command(CLI::App& app);
CommandFn add_data_command(CLI::App& app);
CommandFn add_report_command(CLI::App& app);
CommandFn add_eval_command(CLI::App& app);
CommandFn add_generate_command(CLI::App& app);
CommandFn add_ckpt_command(CLI::App& app);
CommandFn add_plan_command(CLI::App& app);
CommandFn add_calibrate_command(CLI::App& app);

}  // namespace tripod
