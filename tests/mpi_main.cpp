// GoogleTest main for tests that use MPI: one process (singleton MPI) or many under mpirun.
// Rank 0 prints progress; other ranks print only their failed assertions, tagged with the rank.
// Every rank exits with the same status (failed anywhere = failed).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  tripod::select_cpu_blas_kernels(argv);
  int provided = 0;
  tripod::set_mpi_defaults();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rank == 0 && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any;
}
