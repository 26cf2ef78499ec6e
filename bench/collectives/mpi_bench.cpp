// cohort-bench-mpi: Open MPI's collectives, timed with cohort-bench's method and output.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl self,vader
//       cohort-bench-mpi --sizes 4,1K,64K,1M,16M,64M
//
// The options, the measuring code (driver.hpp, measure.hpp), the checks and the output are
// cohort-bench's, so that the two programs measure alike; see cohort_bench.cpp for the method.
// What differs is the call, the group (MPI_COMM_WORLD; the barrier is MPI_Barrier, the max
// over ranks MPI_Allreduce(MPI_MAX)) and the transport, which mpirun's --mca options choose
// (hence no --transport here):
//
//   all_reduce      MPI_Allreduce            reduce_scatter  MPI_Reduce_scatter_block
//   all_gather      MPI_Allgather            broadcast       MPI_Bcast (in place)
//
// f32, f64 and i32 are MPI_FLOAT, MPI_DOUBLE and MPI_INT32_T with the built-in ops. fp16 and
// bf16, which MPI 3.1 lacks, travel as MPI_UINT16_T and reduce through user-defined ops that
// accumulate in fp32 and round once per combination, as cohort does. MPI has no avg: it is
// MPI_SUM followed by one division by P on each rank, inside the timed call.
// The C API only: the deprecated C++ bindings add nothing here but warnings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

#include "driver.hpp"

namespace cohort::bench {
namespace {

constexpr const char* program = "cohort-bench-mpi";

/// MPI_COMM_WORLD as the timing loop sees it (models `rank_group`).
class mpi_group {
 public:
  explicit mpi_group(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }
  void barrier() { MPI_Barrier(comm_); }
  void max_over_ranks(std::span<double> v) {
    MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_MAX, comm_);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

/// The MPI datatype that carries `T` (16-bit floats as their bits).
template <element T>
MPI_Datatype mpi_type_of() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else return MPI_UINT16_T;
}

/// The op MPI combines with: avg sums (the division follows the call).
template <class Op>
using combining_op_t = std::conditional_t<std::is_same_v<Op, ops::avg_t>, ops::sum_t, Op>;

/// An MPI user function: inout[i] = op(in[i], inout[i]), accumulated in accumulator_t<T>.
template <element T, class Op>
void combine_user(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  const Op op{};
  for (int i = 0; i < *len; ++i) b[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

/// The MPI op for `Op` over `T`: built in where MPI has one, else user-defined (and freed).
template <element T, class Op>
class mpi_reduction {
 public:
  mpi_reduction() {
    using combining = combining_op_t<Op>;
    if constexpr (std::is_same_v<T, fp16> || std::is_same_v<T, bf16>) {
      MPI_Op_create(&combine_user<T, combining>, /*commute=*/1, &op_);
      user_defined_ = true;
    } else if constexpr (std::is_same_v<combining, ops::sum_t>) op_ = MPI_SUM;
    else if constexpr (std::is_same_v<combining, ops::prod_t>) op_ = MPI_PROD;
    else if constexpr (std::is_same_v<combining, ops::min_t>) op_ = MPI_MIN;
    else op_ = MPI_MAX;
  }
  mpi_reduction(const mpi_reduction&) = delete;
  mpi_reduction& operator=(const mpi_reduction&) = delete;
  ~mpi_reduction() {
    if (user_defined_) MPI_Op_free(&op_);
  }
  MPI_Op get() const { return op_; }

 private:
  MPI_Op op_ = MPI_OP_NULL;
  bool user_defined_ = false;
};

/// Calls the MPI collective for `o.op` once, with the buffers `shape_of` describes.
template <element T, class Op>
void call_collective(const mpi_group& g, const options& o, const Op& op,
                     const mpi_reduction<T, Op>& reduction, std::span<const T> in,
                     std::span<T> out) {
  const MPI_Datatype type = mpi_type_of<T>();
  const int in_count = static_cast<int>(in.size()), out_count = static_cast<int>(out.size());
  switch (o.op) {
    case collective::all_reduce:
      MPI_Allreduce(in.data(), out.data(), out_count, type, reduction.get(), MPI_COMM_WORLD);
      break;
    case collective::reduce_scatter:
      MPI_Reduce_scatter_block(in.data(), out.data(), out_count, type, reduction.get(),
                               MPI_COMM_WORLD);
      break;
    case collective::all_gather:
      MPI_Allgather(in.data(), in_count, type, out.data(), in_count, type, MPI_COMM_WORLD);
      break;
    case collective::broadcast:
      MPI_Bcast(out.data(), out_count, type, o.root, MPI_COMM_WORLD);
      break;
  }
  if constexpr (finalizing_reduction_for<Op, T>) {
    if (reduces(o.op))
      for (T& x : out) x = narrow<T>(op.finalize(widen(x), g.size()));
  }
}

/// "Open MPI v4.1.4 pml=ob1 btl=self,vader": the library and the transport mpirun chose.
std::string describe_transport() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, static_cast<std::size_t>(length));
  text = text.substr(0, text.find_first_of(",\n"));
  for (const char* name : {"pml", "btl"})
    if (const char* value = std::getenv(("OMPI_MCA_" + std::string(name)).c_str()))
      text += " " + std::string(name) + "=" + value;
  return text;
}

/// The whole run on this rank; returns the exit status.
int run(const options& o) {
  mpi_group group(MPI_COMM_WORLD);
  if (o.ranks > 0 && o.ranks != group.size())
    throw usage_error("--ranks " + std::to_string(o.ranks) + " but mpirun started " +
                      std::to_string(group.size()));
  if (o.root >= group.size())
    throw usage_error("--root " + std::to_string(o.root) + " is not a rank of " +
                      std::to_string(group.size()));
  run_info run{program, describe_transport(), "mpirun", group.size(), describe_host(), {}};
  if (group.rank() == 0) run.ceiling = measure_memcpy(o.sizes.back());
  group.barrier();

  std::optional<reporter> rep;
  if (group.rank() == 0) rep.emplace(stdout, o, run);
  const int failed = visit_types(o, [&]<element T, class Op>(const Op& op) {
    const mpi_reduction<T, Op> reduction;
    auto invoke = [&](std::span<const T> in, std::span<T> out) {
      call_collective(group, o, op, reduction, in, out);
    };
    return run_benchmark<T>(group, o, op, invoke, rep ? &*rep : nullptr);
  });
  return failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  using namespace cohort::bench;
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  try {
    // Every rank parses the same arguments, so every rank takes the same branch here.
    const options o = parse_options(argc, argv, /*with_transport=*/false);
    if (o.help) {
      if (rank == 0) std::fputs(usage(program, /*with_transport=*/false).c_str(), stdout);
    } else {
      status = run(o);
    }
  } catch (const usage_error& e) {
    if (rank == 0) std::fprintf(stderr, "%s: %s (see %s --help)\n", program, e.what(), program);
    status = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
