// The Open MPI side of the shm comparison: MPI_Allreduce (float sum) timed exactly as
// bench_all_reduce.cpp times cohort. Build and run by hand:
//
//   mpicxx -O2 bench/shm/mpi_all_reduce.cpp -o /tmp/mpi_all_reduce
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,vader
//          /tmp/mpi_all_reduce [--sizes 4,1024,...] [--reps 7]
#define OMPI_SKIP_MPICXX 1  // the C API only: the C++ bindings warn under -Wextra
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1, reps = 7;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  std::vector<std::size_t> sizes = {4, 1024, 65536, 1 << 20, 16 << 20, 64 << 20};
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      for (const char* s = argv[++i]; *s;) {
        char* end = nullptr;
        sizes.push_back(std::strtoull(s, &end, 10));
        s = *end == ',' ? end + 1 : end;
      }
    }
  }
  if (rank == 0) std::printf("# MPI_Allreduce float sum, P=%d: bytes median_us min_us max_us algbw busbw\n", p);
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> x(n, 1.0f), y(n);
    for (int i = 0; i < 3; ++i) MPI_Allreduce(x.data(), y.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(x.data(), y.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double one = MPI_Wtime() - t0;
    MPI_Bcast(&one, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    const int iters = std::clamp(static_cast<int>(0.05 / std::max(one, 1e-7)), 3, 200000);
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int i = 0; i < iters; ++i)
        MPI_Allreduce(x.data(), y.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      us.push_back((MPI_Wtime() - t0) * 1e6 / iters);
    }
    if (rank == 0) {
      std::sort(us.begin(), us.end());
      const double med = us[us.size() / 2], algbw = static_cast<double>(n * sizeof(float)) / med / 1e3;
      std::printf("%10zu %12.3f %12.3f %12.3f %9.3f %9.3f\n", n * sizeof(float), med, us.front(),
                  us.back(), algbw, algbw * 2.0 * (p - 1) / p);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
