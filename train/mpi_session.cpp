// Local rank from the launcher's environment; what every MPI command does before its grid exists.
#include "train/mpi_session.h"

#include <cstdlib>
#include <initializer_list>

namespace tripod {

int MpiSession::local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

}  // namespace tripod
