// An MPI wrapper, loaded with LD_PRELOAD into any MPI program (tripod train under mpirun), that
// times one size of all-reduce where the program makes it and where a calibration would:
//   - every MPI_Iallreduce of TRIPOD_TIMER_BYTES bytes (default 524288), from its call to the
//     MPI_Test or MPI_Wait that completes it, on this rank's CLOCK_MONOTONIC (one clock for all
//     ranks of a machine, so that bench/collective_drift.py can line the ranks' calls up);
//   - the same call alone, in place on MPI_COMM_WORLD after a barrier, 300 times (median) right
//     after MPI_Init and again right before MPI_Finalize: in the same process, on the buffer it
//     used first and on a new one.
// Each rank writes TRIPOD_TIMER_OUT.RANK (default mpi_call_timer.RANK): a line
// "isolated START_US END_US END_NEW_BUFFER_US", then "ENTRY_S DONE_S" per call.
// Completions through MPI_Testall, MPI_Waitany and the like are not seen (tripod does not use them).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Call {
  double entry, done;
};

int rank = -1;
long bytes = 524288;
std::vector<float> first;     // the buffer of the first isolated timing, kept for the last
std::vector<Call> calls;
std::unordered_map<MPI_Request, size_t> outstanding;  // timed requests not yet completed -> their call
double isolated[3] = {0, 0, 0};

// The median time of an in-place all-reduce of `buf` alone after a barrier, in microseconds.
double time_alone(std::vector<float>& buf) {
  std::vector<double> t;
  for (int i = 0; i < 300; ++i) {
    PMPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    MPI_Request q;
    PMPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q);
    PMPI_Wait(&q, MPI_STATUS_IGNORE);
    t.push_back(now() - t0);
  }
  std::nth_element(t.begin(), t.begin() + 150, t.end());
  return 1e6 * t[150];
}

void started() {
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (const char* b = std::getenv("TRIPOD_TIMER_BYTES")) bytes = std::atol(b);
  first.assign(static_cast<size_t>(bytes / 4), 1.f);
  isolated[0] = time_alone(first);
}

void completed(MPI_Request before, int done) {
  if (!done) return;
  auto it = outstanding.find(before);
  if (it == outstanding.end()) return;
  calls[it->second].done = now();
  outstanding.erase(it);
}

}  // namespace

extern "C" {

int MPI_Init(int* argc, char*** argv) {
  const int rc = PMPI_Init(argc, argv);
  started();
  return rc;
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  const int rc = PMPI_Init_thread(argc, argv, required, provided);
  started();
  return rc;
}

int MPI_Iallreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* req) {
  const double t = now();
  const int rc = PMPI_Iallreduce(send, recv, count, type, op, comm, req);
  int size = 0;
  MPI_Type_size(type, &size);
  if (static_cast<long>(count) * size == bytes) {
    outstanding[*req] = calls.size();
    calls.push_back({t, 0});
  }
  return rc;
}

int MPI_Test(MPI_Request* req, int* flag, MPI_Status* status) {
  const MPI_Request before = *req;
  const int rc = PMPI_Test(req, flag, status);
  completed(before, *flag);
  return rc;
}

int MPI_Wait(MPI_Request* req, MPI_Status* status) {
  const MPI_Request before = *req;
  const int rc = PMPI_Wait(req, status);
  completed(before, 1);
  return rc;
}

int MPI_Finalize() {
  isolated[1] = time_alone(first);
  std::vector<float> fresh(first.size(), 1.f);
  isolated[2] = time_alone(fresh);
  const char* prefix = std::getenv("TRIPOD_TIMER_OUT");
  const std::string path = std::string(prefix ? prefix : "mpi_call_timer") + "." + std::to_string(rank);
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fprintf(f, "isolated %.2f %.2f %.2f\n", isolated[0], isolated[1], isolated[2]);
    for (const Call& c : calls) std::fprintf(f, "%.9f %.9f\n", c.entry, c.done);
    std::fclose(f);
  }
  return PMPI_Finalize();
}

}  // extern "C"
