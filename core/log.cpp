// Logging setup.
#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace tripod {

const char* launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return v;
  return nullptr;
}

void init_logging(int rank, int world_size, bool verbose) {
  auto logger = std::make_shared<spdlog::logger>(
      "tripod", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (world_size > 1)
    logger->set_pattern(fmt::format("[%H:%M:%S] [rank {}] %^%l%$: %v", rank));
  else
    logger->set_pattern("[%H:%M:%S] %^%l%$: %v");
  auto level = verbose ? spdlog::level::debug : spdlog::level::info;
  if (rank != 0 && !verbose) level = spdlog::level::warn;
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

}  // namespace tripod
