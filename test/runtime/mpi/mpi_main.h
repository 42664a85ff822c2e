//===- mpi_main.h - main() of the gtest suites that run under mpirun ------===//
//
// Every rank runs every test; the run fails when any rank fails. Ranks other
// than 0 print their failures with their rank (gtest's printer is rank 0's
// alone, so the output is not repeated N times).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_TEST_MPI_MAIN_H
#define PLANRT_TEST_MPI_MAIN_H

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace planrt_test {

/// This process's rank in MPI_COMM_WORLD.
inline int worldRank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
public:
  explicit RankFailurePrinter(int rank) : rank(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult &r) override {
    if (r.failed())
      std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank,
                   r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.message());
  }

private:
  int rank;
};

/// Runs the suite `name` on exactly `ranks` MPI ranks.
inline int runMpiTests(int argc, char **argv, int ranks, const char *name) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != ranks) {
    if (rank == 0)
      std::fprintf(stderr, "%s must run on %d ranks\n", name, ranks);
    MPI_Finalize();
    return 1;
  }
  if (rank != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rank == 0)
    std::fprintf(stderr, "%s: failures on some rank\n", name);
  MPI_Finalize();
  return any;
}

} // namespace planrt_test

#endif
