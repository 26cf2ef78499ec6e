/// @file
/// Rank discovery: where this process sits in the job, read from its launcher's environment.
///
/// Launchers in order of precedence (the first whose rank variable is set wins), and what is
/// read under each: rank and size; local rank and local size; job id.
///
/// - cohort-run: COHORT_RANK, COHORT_SIZE; COHORT_LOCAL_RANK, COHORT_LOCAL_SIZE; COHORT_JOB_ID.
/// - torchrun: RANK, WORLD_SIZE; LOCAL_RANK, LOCAL_WORLD_SIZE; TORCHELASTIC_RUN_ID unless it is
///   "none", else MASTER_ADDR_MASTER_PORT.
/// - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE; OMPI_COMM_WORLD_LOCAL_RANK, _LOCAL_SIZE;
///   OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE (mpirun 4.1 sets both to the same number).
/// - MPICH/PMI: PMI_RANK, PMI_SIZE; MPI_LOCALRANKID, MPI_LOCALNRANKS; PMI_KVSNAME, PMI_KVS or
///   PMI_JOBID, else "ppid" and the parent's pid.
/// - Slurm: SLURM_PROCID, SLURM_NTASKS; SLURM_LOCALID and the count at index SLURM_NODEID of
///   SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE ("2(x3),1"), else SLURM_NTASKS_PER_NODE;
///   SLURM_JOB_ID "." SLURM_STEP_ID.
///
/// A variable set to the empty string counts as unset. MASTER_ADDR and MASTER_PORT are read under
/// every launcher. COHORT_JOB_ID, when set, overrides the job id of every launcher. Without a
/// launcher the process is rank 0 of 1 with a job id made from its pid. Where a launcher does not
/// say which ranks share the host, local_rank = 0 and local_size = 1 (every peer is remote).
///
/// Under MPICH's Hydra without PMI_KVSNAME the job id is the pid of the local hydra_pmi_proxy:
/// right on one host, different per host on several (set COHORT_JOB_ID there).
#pragma once

#include <cohort/core/error.hpp>

#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace cohort {

/// The launcher a `launch_info` was read from.
enum class launcher { explicit_args, cohort_run, torchrun, open_mpi, pmi, slurm };

/// A short, stable name of `l` for logs, e.g. "open-mpi"; it has no spaces.
constexpr std::string_view launcher_name(launcher l) noexcept {
  switch (l) {
    case launcher::explicit_args: return "explicit";
    case launcher::cohort_run: return "cohort-run";
    case launcher::torchrun: return "torchrun";
    case launcher::open_mpi: return "open-mpi";
    case launcher::pmi: return "pmi";
    case launcher::slurm: return "slurm";
  }
  return "unknown";
}

/// Where this process sits in the job.
///
/// After a successful read: 0 <= rank < size, 0 <= local_rank < local_size <= size, and job_id
/// is 1 to 128 characters of [A-Za-z0-9_.-]. "Local" ranks share this host.
struct launch_info {
  int rank = 0;               ///< This process among all ranks.
  int size = 1;               ///< The number of ranks in the job.
  int local_rank = 0;         ///< This process among the ranks on its host.
  int local_size = 1;         ///< The number of ranks on this host.
  std::string master_addr{};  ///< MASTER_ADDR; empty when the launcher gives none.
  int master_port = 0;        ///< MASTER_PORT; 0 when the launcher gives none.
  std::string job_id{};  ///< Same on every rank of one job, differs between jobs; file-name safe.
  launcher source = launcher::explicit_args;  ///< Where the numbers came from.
};

/// Looks up one environment variable like `std::getenv`: its value, or nullptr when unset.
using getenv_function = std::function<const char*(const char*)>;

namespace detail {

/// The longest job id kept as given; longer launcher ids are shortened with a hash.
inline constexpr std::size_t max_job_id_length = 128;

/// True when `id` can be a job id as it is: 1 to 128 characters of [A-Za-z0-9_.-].
constexpr bool valid_job_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > max_job_id_length) return false;
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// Makes a launcher's id file-name safe: other characters become '_'; an id over the limit
/// keeps its head and ends in a hash of the whole, so that long ids stay distinct.
inline std::string sanitize_job_id(std::string_view raw) {
  std::string id(raw);
  for (char& c : id) {
    if (!valid_job_id(std::string_view(&c, 1))) c = '_';
  }
  if (id.size() <= max_job_id_length) return id;
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a
  for (char c : raw) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  id.resize(max_job_id_length - 17);
  id += '-';
  for (int shift = 60; shift >= 0; shift -= 4) id += "0123456789abcdef"[(hash >> shift) & 15];
  return id;
}

/// The count of node `node` in Slurm's compressed per-node list ("2(x3),1" is 2,2,2,1).
inline std::optional<int> slurm_tasks_on_node(std::string_view list, int node) {
  const char* p = list.data();
  const char* end = p + list.size();
  while (p != end) {
    int count = 0, repeat = 1;
    auto r = std::from_chars(p, end, count);
    if (r.ec != std::errc{} || count < 1) return std::nullopt;
    p = r.ptr;
    if (end - p >= 2 && p[0] == '(' && p[1] == 'x') {
      r = std::from_chars(p + 2, end, repeat);
      if (r.ec != std::errc{} || repeat < 1 || r.ptr == end || *r.ptr != ')') return std::nullopt;
      p = r.ptr + 1;
    }
    if (node < repeat) return count;
    node -= repeat;
    if (p == end || *p != ',') return std::nullopt;
    ++p;
  }
  return std::nullopt;
}

/// The variables of one launcher, in order of precedence; Slurm derives its local size.
struct launcher_variables {
  launcher source;
  const char *rank, *size, *local_rank, *local_size;
};
inline constexpr launcher_variables launcher_table[] = {
    {launcher::cohort_run, "COHORT_RANK", "COHORT_SIZE", "COHORT_LOCAL_RANK", "COHORT_LOCAL_SIZE"},
    {launcher::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {launcher::open_mpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {launcher::pmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {launcher::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

/// Reads variables through a getenv function and keeps the first problem, naming the variable.
class launch_env_parser {
 public:
  explicit launch_env_parser(const getenv_function& getenv_fn) : getenv_(getenv_fn) {}

  /// The value of `name`, or nullptr when it is unset or empty.
  const char* get(const char* name) const {
    const char* value = getenv_(name);
    return value != nullptr && *value != '\0' ? value : nullptr;
  }
  /// The value of the first of `names` that is set, or "".
  std::string first(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      if (const char* value = get(name)) return value;
    }
    return {};
  }
  /// `NAME="value"`, for messages.
  std::string quote(const char* name) const {
    return std::string(name) + "=\"" + (get(name) ? get(name) : "") + '"';
  }
  /// Keeps the first problem; returns nullopt so that callers can `return fail(...)`.
  std::nullopt_t fail(const std::string& message) {
    if (what.empty()) what = message + " (launcher: " + std::string(launcher_name(source)) + ")";
    return std::nullopt;
  }
  /// Reads `name` as an integer in [min, max]; `needed_by` is the variable that needs it.
  std::optional<int> integer(const char* name, int min, int max = INT_MAX,
                             const char* needed_by = nullptr) {
    const char* text = get(name);
    if (text == nullptr) {
      return fail(std::string(name) + " is not set" + (needed_by ? " although " : "") +
                  (needed_by ? needed_by : "") + (needed_by ? " is" : ""));
    }
    int value = 0;
    const char* end = text + std::char_traits<char>::length(text);
    auto [ptr, ec] = std::from_chars(text, end, value);
    if (ec == std::errc::result_out_of_range) return fail(quote(name) + " is too large");
    if (ec != std::errc{} || ptr != end) return fail(quote(name) + " is not an integer");
    if (value < min) return fail(quote(name) + " is less than " + std::to_string(min));
    if (value > max) return fail(quote(name) + " is greater than " + std::to_string(max));
    return value;
  }
  /// Reads a count (or takes `count`) and an index below it; false after a problem.
  bool index(const char* index_name, const char* count_name, std::optional<int> count,
             int& index_out, int& count_out) {
    if (!count) count = integer(count_name, 1, INT_MAX, index_name);
    std::optional<int> index = count ? integer(index_name, 0) : std::nullopt;
    if (index && *index >= *count) {
      fail(quote(index_name) + " is not less than " + quote(count_name));
      return false;
    }
    if (!index) return false;
    index_out = *index;
    count_out = *count;
    return true;
  }

  launcher source = launcher::explicit_args;  ///< The launcher found, for messages.
  std::string what;                           ///< The first problem, or empty.

 private:
  const getenv_function& getenv_;
};

/// Does the work of `launch_info_from_env`: the info, or nullopt with `env.what` set.
inline std::optional<launch_info> parse_launch_env(launch_env_parser& env) {
  launch_info info;
  const launcher_variables* vars = nullptr;
  for (const auto& row : launcher_table) {
    if (vars == nullptr && env.get(row.rank) != nullptr) vars = &row;
  }
  if (vars != nullptr) {
    info.source = env.source = vars->source;
    if (!env.index(vars->rank, vars->size, std::nullopt, info.rank, info.size)) return std::nullopt;
  }
  if (vars != nullptr && env.get(vars->local_rank) != nullptr) {
    const char* local_size_name = vars->local_size;
    std::optional<int> local_size;
    for (const char* list : {"SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE"}) {
      if (info.source == launcher::slurm && env.get(list) != nullptr) local_size_name = list;
    }
    if (local_size_name != vars->local_size) {  // a Slurm per-node list
      auto node = env.get("SLURM_NODEID") ? env.integer("SLURM_NODEID", 0) : 0;
      if (!node) return std::nullopt;
      local_size = slurm_tasks_on_node(env.get(local_size_name), *node);
      if (!local_size) {
        return env.fail(env.quote(local_size_name) + " has no count for node " +
                        std::to_string(*node));
      }
    }
    if (!env.index(vars->local_rank, local_size_name, local_size, info.local_rank,
                   info.local_size)) {
      return std::nullopt;
    }
    if (info.local_size > info.size) {
      return env.fail(env.quote(local_size_name) + " is greater than " + env.quote(vars->size));
    }
  }
  if (const char* addr = env.get("MASTER_ADDR")) info.master_addr = addr;
  if (env.get("MASTER_PORT") != nullptr) {
    auto port = env.integer("MASTER_PORT", 1, 65535);
    if (!port) return std::nullopt;
    info.master_port = *port;
  }

  std::string job;
  switch (info.source) {
    case launcher::explicit_args: break;  // the pid, below
    case launcher::cohort_run: break;     // COHORT_JOB_ID, below
    case launcher::torchrun:
      job = env.first({"TORCHELASTIC_RUN_ID"});
      if (job == "none") job.clear();  // torchrun's default --rdzv-id: the same for every job
      if (job.empty() && info.master_port != 0 && !info.master_addr.empty()) {
        job = info.master_addr + '_' + std::to_string(info.master_port);
      }
      break;
    case launcher::open_mpi: job = env.first({"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}); break;
    case launcher::pmi:
      job = env.first({"PMI_KVSNAME", "PMI_KVS", "PMI_JOBID"});
      if (job.empty()) job = "ppid" + std::to_string(::getppid());  // Hydra's proxy on this host
      break;
    case launcher::slurm:
      job = env.first({"SLURM_JOB_ID", "SLURM_JOBID"});
      if (std::string step = env.first({"SLURM_STEP_ID", "SLURM_STEPID"}); !step.empty()) {
        job += job.empty() ? "" : '.' + step;
      }
      break;
  }
  if (const char* given = env.get("COHORT_JOB_ID")) {
    if (!valid_job_id(given)) {
      return env.fail(env.quote("COHORT_JOB_ID") +
                      " is not a job id (1 to 128 characters of A-Z a-z 0-9 _ . -)");
    }
    job = given;
  } else if (job.empty() && info.size == 1) {
    job = "pid" + std::to_string(::getpid());
  } else if (job.empty()) {
    return env.fail("no job id: the launcher sets none; set COHORT_JOB_ID, the same on every rank");
  }
  info.job_id = sanitize_job_id(job);
  return info;
}

}  // namespace detail

/// Reads where this process sits in the job through `getenv_fn` (see the table at the top).
///
/// On garbage (a non-number, a negative value, size < 1, rank >= size, a port outside 1-65535,
/// a size missing beside its rank, a COHORT_JOB_ID that is not file-name safe) returns nullopt
/// and sets `ec` to `errc::invalid_argument`; the throwing overloads also say which variable.
inline std::optional<launch_info> launch_info_from_env(const getenv_function& getenv_fn,
                                                       std::error_code& ec) {
  detail::launch_env_parser env(getenv_fn);
  std::optional<launch_info> info = detail::parse_launch_env(env);
  ec = info ? std::error_code() : make_error_code(errc::invalid_argument);
  return info;
}

/// Reads where this process sits in the job through `getenv_fn`.
///
/// Throws `cohort::error` with `errc::invalid_argument`, operation "launch_info_from_env" and
/// peer -1, whose message names the variable and its value.
inline launch_info launch_info_from_env(const getenv_function& getenv_fn) {
  detail::launch_env_parser env(getenv_fn);
  std::optional<launch_info> info = detail::parse_launch_env(env);
  if (!info) {
    throw error(errc::invalid_argument, "launch_info_from_env", -1,
                "launch_info_from_env: " + env.what);
  }
  return std::move(*info);
}

/// Reads where this process sits in the job from the real environment; throws like above.
inline launch_info launch_info_from_env() {
  return launch_info_from_env([](const char* name) { return std::getenv(name); });
}

}  // namespace cohort
