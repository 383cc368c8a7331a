// Logging through spdlog: rank 0 logs at info, other ranks only warnings and errors.
#pragma once

#include <spdlog/spdlog.h>

namespace tripod {

// Sets up the default logger on stderr with the rank in every line. `verbose` lowers the
// level to debug. Safe to call again (e.g. once the rank is known).
void init_logging(int rank, int world_size, bool verbose = false);

// This process's world rank as the launcher (mpirun, Slurm, PMI) puts it in the environment,
// readable before MPI is initialized; null when no launcher did.
const char* launcher_rank();

}  // namespace tripod
