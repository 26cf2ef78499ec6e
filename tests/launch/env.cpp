// Unit tests of rank discovery: every launcher's variables through a fake getenv.
#include <cohort/launch/env.hpp>

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <ostream>

#include <doctest/doctest.h>

namespace {

using env_map = std::map<std::string, std::string>;

cohort::getenv_function fake(const env_map& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

cohort::launch_info read(const env_map& vars) {
  std::error_code ec = cohort::errc::timed_out;
  auto info = cohort::launch_info_from_env(fake(vars), ec);
  CHECK(!ec);
  try {
    auto thrown = cohort::launch_info_from_env(fake(vars));
    CHECK(info.has_value());
    CHECK(cohort::detail::valid_job_id(thrown.job_id));
    return thrown;
  } catch (const cohort::error& e) {
    FAIL(e.what());
    throw;
  }
}

// The message of the invalid_argument error that `vars` must give, through both overloads.
std::string error_of(const env_map& vars) {
  std::error_code ec;
  CHECK(!cohort::launch_info_from_env(fake(vars), ec).has_value());
  CHECK(ec == cohort::errc::invalid_argument);
  try {
    cohort::launch_info_from_env(fake(vars));
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::invalid_argument);
    CHECK(e.operation() == "launch_info_from_env");
    CHECK(e.peer() == -1);
    return e.what();
  }
  FAIL("no cohort::error thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const env_map cohort_run_env = {{"COHORT_RANK", "2"},       {"COHORT_SIZE", "4"},
                                {"COHORT_LOCAL_RANK", "2"}, {"COHORT_LOCAL_SIZE", "4"},
                                {"COHORT_JOB_ID", "cr-1f"}, {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", "40001"}};
const env_map torchrun_env = {{"RANK", "5"},
                              {"WORLD_SIZE", "8"},
                              {"LOCAL_RANK", "1"},
                              {"LOCAL_WORLD_SIZE", "4"},
                              {"MASTER_ADDR", "10.1.2.3"},
                              {"MASTER_PORT", "29500"},
                              {"TORCHELASTIC_RUN_ID", "a1b2c3"}};
// What Debian's mpirun (Open MPI 4.1.4) sets, as seen with `mpirun -np 3 env`.
const env_map open_mpi_env = {
    {"OMPI_COMM_WORLD_RANK", "1"},       {"OMPI_COMM_WORLD_SIZE", "3"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"},
    {"OMPI_COMM_WORLD_NODE_RANK", "1"},  {"OMPI_MCA_ess_base_jobid", "2101608449"},
    {"PMIX_NAMESPACE", "2101608449"},    {"PMIX_RANK", "1"}};
const env_map pmi_env = {{"PMI_RANK", "3"},
                         {"PMI_SIZE", "6"},
                         {"MPI_LOCALRANKID", "0"},
                         {"MPI_LOCALNRANKS", "3"},
                         {"PMI_KVSNAME", "kvs_77_0"}};
const env_map slurm_env = {{"SLURM_PROCID", "7"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_NODEID", "3"},
                           {"SLURM_JOB_ID", "4242"},
                           {"SLURM_STEP_ID", "0"},
                           {"SLURM_TASKS_PER_NODE", "2(x4)"}};

env_map with(env_map vars, const env_map& changes) {
  for (const auto& [name, value] : changes) vars[name] = value;
  return vars;
}
env_map without(env_map vars, const std::vector<std::string>& names) {
  for (const auto& name : names) vars.erase(name);
  return vars;
}

}  // namespace

static_assert(cohort::launcher_name(cohort::launcher::open_mpi) == "open-mpi");
static_assert(cohort::detail::valid_job_id("slurm-42.0_x") && !cohort::detail::valid_job_id("a/b"));
static_assert(!cohort::detail::valid_job_id("") && !cohort::detail::valid_job_id("a b"));

TEST_CASE("launcher names are distinct and have no spaces") {
  using cohort::launcher;
  std::vector<std::string_view> names;
  for (auto l : {launcher::explicit_args, launcher::cohort_run, launcher::torchrun,
                 launcher::open_mpi, launcher::pmi, launcher::slurm}) {
    auto name = cohort::launcher_name(l);
    CHECK(name.find(' ') == std::string_view::npos);
    for (auto other : names) CHECK(other != name);
    names.push_back(name);
  }
}

TEST_CASE("no launcher: rank 0 of 1, job id from the pid") {
  auto info = read({});
  CHECK(info.source == cohort::launcher::explicit_args);
  CHECK(info.rank == 0);
  CHECK(info.size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 1);
  CHECK(info.master_addr.empty());
  CHECK(info.master_port == 0);
  CHECK(info.job_id == "pid" + std::to_string(::getpid()));
  // Empty values count as unset.
  CHECK(read({{"RANK", ""}, {"WORLD_SIZE", ""}}).source == cohort::launcher::explicit_args);
  CHECK(read({{"COHORT_JOB_ID", "mine"}}).job_id == "mine");
  auto master = read({{"MASTER_ADDR", "host-1"}, {"MASTER_PORT", "65535"}});
  CHECK(master.master_addr == "host-1");
  CHECK(master.master_port == 65535);
}

TEST_CASE("cohort-run variables") {
  auto info = read(cohort_run_env);
  CHECK(info.source == cohort::launcher::cohort_run);
  CHECK(info.rank == 2);
  CHECK(info.size == 4);
  CHECK(info.local_rank == 2);
  CHECK(info.local_size == 4);
  CHECK(info.master_addr == "127.0.0.1");
  CHECK(info.master_port == 40001);
  CHECK(info.job_id == "cr-1f");
  auto no_local = read(without(cohort_run_env, {"COHORT_LOCAL_RANK", "COHORT_LOCAL_SIZE"}));
  CHECK(no_local.local_rank == 0);
  CHECK(no_local.local_size == 1);
  CHECK(read({{"COHORT_RANK", "0"}, {"COHORT_SIZE", "1"}}).job_id ==
        "pid" + std::to_string(::getpid()));
}

TEST_CASE("torchrun variables") {
  auto info = read(torchrun_env);
  CHECK(info.source == cohort::launcher::torchrun);
  CHECK(info.rank == 5);
  CHECK(info.size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 4);
  CHECK(info.master_addr == "10.1.2.3");
  CHECK(info.master_port == 29500);
  CHECK(info.job_id == "a1b2c3");
  SUBCASE("job id from MASTER_ADDR and MASTER_PORT without a run id, or with the default 'none'") {
    CHECK(read(without(torchrun_env, {"TORCHELASTIC_RUN_ID"})).job_id == "10.1.2.3_29500");
    CHECK(read(with(torchrun_env, {{"TORCHELASTIC_RUN_ID", "none"}})).job_id == "10.1.2.3_29500");
    CHECK(read(with(without(torchrun_env, {"TORCHELASTIC_RUN_ID"}), {{"MASTER_ADDR", "fe80::1"}}))
              .job_id == "fe80__1_29500");
  }
  SUBCASE("a run id that is not file-name safe is made safe") {
    CHECK(read(with(torchrun_env, {{"TORCHELASTIC_RUN_ID", "job/7:x"}})).job_id == "job_7_x");
  }
}

TEST_CASE("Open MPI variables, as Debian's mpirun 4.1 sets them") {
  auto info = read(open_mpi_env);
  CHECK(info.source == cohort::launcher::open_mpi);
  CHECK(info.rank == 1);
  CHECK(info.size == 3);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 3);
  CHECK(info.job_id == "2101608449");
  CHECK(info.master_addr.empty());
  // Open MPI 5 (PRRTE) sets only PMIX_NAMESPACE, e.g. "prterun-host-1234@1".
  auto v5 = with(without(open_mpi_env, {"OMPI_MCA_ess_base_jobid"}),
                 {{"PMIX_NAMESPACE", "prterun-host-1234@1"}});
  CHECK(read(v5).job_id == "prterun-host-1234_1");
}

TEST_CASE("MPICH/PMI variables") {
  auto info = read(pmi_env);
  CHECK(info.source == cohort::launcher::pmi);
  CHECK(info.rank == 3);
  CHECK(info.size == 6);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 3);
  CHECK(info.job_id == "kvs_77_0");
  CHECK(read(with(without(pmi_env, {"PMI_KVSNAME"}), {{"PMI_JOBID", "77"}})).job_id == "77");
  CHECK(read(with(without(pmi_env, {"PMI_KVSNAME"}), {{"PMI_KVS", "k9"}})).job_id == "k9");
  auto bare = read({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
  CHECK(bare.local_rank == 0);
  CHECK(bare.local_size == 1);
  CHECK(bare.job_id == "ppid" + std::to_string(::getppid()));
}

TEST_CASE("Slurm variables") {
  auto info = read(slurm_env);
  CHECK(info.source == cohort::launcher::slurm);
  CHECK(info.rank == 7);
  CHECK(info.size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 2);
  CHECK(info.job_id == "4242.0");
  SUBCASE("local size is this node's count in the per-node list") {
    auto uneven = with(slurm_env, {{"SLURM_TASKS_PER_NODE", "3(x2),1,1"}, {"SLURM_LOCALID", "0"}});
    CHECK(read(with(uneven, {{"SLURM_NODEID", "0"}})).local_size == 3);
    CHECK(read(with(uneven, {{"SLURM_NODEID", "1"}})).local_size == 3);
    CHECK(read(with(uneven, {{"SLURM_NODEID", "2"}})).local_size == 1);
    CHECK(read(with(uneven, {{"SLURM_NODEID", "3"}})).local_size == 1);
    CHECK(read(without(uneven, {"SLURM_NODEID"})).local_size == 3);
    // The step's list wins over the allocation's.
    CHECK(read(with(uneven, {{"SLURM_STEP_TASKS_PER_NODE", "1,4(x3)"}})).local_size == 4);
  }
  SUBCASE("SLURM_NTASKS_PER_NODE without a per-node list") {
    auto env = with(without(slurm_env, {"SLURM_TASKS_PER_NODE"}), {{"SLURM_NTASKS_PER_NODE", "4"}});
    CHECK(read(env).local_size == 4);
  }
  SUBCASE("job id without a step, and the old spellings") {
    CHECK(read(without(slurm_env, {"SLURM_STEP_ID"})).job_id == "4242");
    auto old = with(without(slurm_env, {"SLURM_JOB_ID", "SLURM_STEP_ID"}),
                    {{"SLURM_JOBID", "17"}, {"SLURM_STEPID", "2"}});
    CHECK(read(old).job_id == "17.2");
  }
}

TEST_CASE("precedence: cohort-run, torchrun, Open MPI, PMI, Slurm") {
  env_map all;
  for (const auto* vars : {&cohort_run_env, &torchrun_env, &open_mpi_env, &pmi_env, &slurm_env}) {
    all = with(all, *vars);
  }
  all.erase("COHORT_JOB_ID");  // it would override every job id
  all.erase("MASTER_ADDR");    // so that torchrun's job id comes from its run id only
  CHECK(read(with(all, {{"COHORT_JOB_ID", "x"}})).source == cohort::launcher::cohort_run);
  CHECK(error_of(all).find("COHORT_JOB_ID") != std::string::npos);  // cohort-run needs one
  auto rest = without(all, {"COHORT_RANK"});
  auto torch = read(rest);
  CHECK(torch.source == cohort::launcher::torchrun);
  CHECK(torch.rank == 5);
  CHECK(torch.job_id == "a1b2c3");
  rest = without(rest, {"RANK"});
  auto ompi = read(rest);
  CHECK(ompi.source == cohort::launcher::open_mpi);
  CHECK(ompi.job_id == "2101608449");
  rest = without(rest, {"OMPI_COMM_WORLD_RANK"});
  CHECK(read(rest).source == cohort::launcher::pmi);
  rest = without(rest, {"PMI_RANK"});
  auto slurm = read(rest);
  CHECK(slurm.source == cohort::launcher::slurm);
  CHECK(slurm.rank == 7);
  CHECK(read(without(rest, {"SLURM_PROCID"})).source == cohort::launcher::explicit_args);
}

TEST_CASE("COHORT_JOB_ID overrides every launcher's job id") {
  for (const auto* vars : {&torchrun_env, &open_mpi_env, &pmi_env, &slurm_env}) {
    CHECK(read(with(*vars, {{"COHORT_JOB_ID", "override.1"}})).job_id == "override.1");
  }
}

TEST_CASE("long launcher ids are shortened and stay distinct") {
  std::string a(300, 'a'), b = a;
  b.back() = 'b';
  auto ia = cohort::detail::sanitize_job_id(a), ib = cohort::detail::sanitize_job_id(b);
  CHECK(cohort::detail::valid_job_id(ia));
  CHECK(cohort::detail::valid_job_id(ib));
  CHECK(ia != ib);
  CHECK(read(with(torchrun_env, {{"TORCHELASTIC_RUN_ID", a}})).job_id == ia);
}

TEST_CASE("garbage is invalid_argument naming the variable and its value") {
  struct garbage_case {
    env_map vars;
    std::vector<std::string> named;  // parts the message must contain
  };
  const std::vector<garbage_case> cases = {
      {with(torchrun_env, {{"RANK", "two"}}), {"RANK=\"two\"", "not an integer", "torchrun"}},
      {with(torchrun_env, {{"RANK", "3x"}}), {"RANK=\"3x\"", "not an integer"}},
      {with(torchrun_env, {{"RANK", " 3"}}), {"RANK=\" 3\"", "not an integer"}},
      {with(torchrun_env, {{"RANK", "+3"}}), {"RANK=\"+3\"", "not an integer"}},
      {with(torchrun_env, {{"RANK", "-1"}}), {"RANK=\"-1\"", "less than 0"}},
      {with(torchrun_env, {{"RANK", "8"}}), {"RANK=\"8\"", "not less than", "WORLD_SIZE=\"8\""}},
      {with(torchrun_env, {{"WORLD_SIZE", "0"}}), {"WORLD_SIZE=\"0\"", "less than 1"}},
      {with(torchrun_env, {{"WORLD_SIZE", "99999999999"}}),
       {"WORLD_SIZE=\"99999999999\"", "large"}},
      {without(torchrun_env, {"WORLD_SIZE"}), {"WORLD_SIZE is not set although RANK is"}},
      {with(torchrun_env, {{"LOCAL_RANK", "4"}}), {"LOCAL_RANK=\"4\"", "LOCAL_WORLD_SIZE=\"4\""}},
      {with(torchrun_env, {{"LOCAL_WORLD_SIZE", "9"}}), {"LOCAL_WORLD_SIZE=\"9\"", "greater"}},
      {without(torchrun_env, {"LOCAL_WORLD_SIZE"}), {"LOCAL_WORLD_SIZE is not set"}},
      {with(torchrun_env, {{"MASTER_PORT", "0"}}), {"MASTER_PORT=\"0\""}},
      {with(torchrun_env, {{"MASTER_PORT", "65536"}}), {"MASTER_PORT=\"65536\"", "greater"}},
      {with(torchrun_env, {{"MASTER_PORT", "http"}}), {"MASTER_PORT=\"http\"", "not an integer"}},
      {without(torchrun_env, {"TORCHELASTIC_RUN_ID", "MASTER_ADDR"}), {"no job id", "torchrun"}},
      {with(cohort_run_env, {{"COHORT_SIZE", "-4"}}), {"COHORT_SIZE=\"-4\"", "cohort-run"}},
      {with(cohort_run_env, {{"COHORT_LOCAL_SIZE", "x"}}), {"COHORT_LOCAL_SIZE=\"x\""}},
      {with(cohort_run_env, {{"COHORT_JOB_ID", "a/b"}}), {"COHORT_JOB_ID=\"a/b\"", "not a job id"}},
      {with(cohort_run_env, {{"COHORT_JOB_ID", std::string(129, 'j')}}), {"COHORT_JOB_ID=\""}},
      {without(cohort_run_env, {"COHORT_JOB_ID"}), {"no job id", "COHORT_JOB_ID"}},
      {with(open_mpi_env, {{"OMPI_COMM_WORLD_SIZE", "2"}}),
       {"OMPI_COMM_WORLD_LOCAL_SIZE=\"3\"", "greater", "OMPI_COMM_WORLD_SIZE=\"2\"", "open-mpi"}},
      {with(open_mpi_env, {{"OMPI_COMM_WORLD_LOCAL_RANK", "1.0"}}),
       {"OMPI_COMM_WORLD_LOCAL_RANK=\"1.0\""}},
      {with(pmi_env, {{"PMI_SIZE", "0x10"}}), {"PMI_SIZE=\"0x10\"", "pmi"}},
      {with(pmi_env, {{"MPI_LOCALNRANKS", "0"}}), {"MPI_LOCALNRANKS=\"0\""}},
      {with(slurm_env, {{"SLURM_NTASKS", "7"}}), {"SLURM_PROCID=\"7\"", "SLURM_NTASKS=\"7\""}},
      {with(slurm_env, {{"SLURM_TASKS_PER_NODE", "2(x"}}), {"SLURM_TASKS_PER_NODE=\"2(x\""}},
      {with(slurm_env, {{"SLURM_NODEID", "4"}}), {"SLURM_TASKS_PER_NODE=\"2(x4)\"", "node 4"}},
      {with(slurm_env, {{"SLURM_NODEID", "n1"}}), {"SLURM_NODEID=\"n1\""}},
      {with(slurm_env, {{"SLURM_LOCALID", "2"}}), {"SLURM_LOCALID=\"2\"", "slurm"}},
      {without(slurm_env, {"SLURM_JOB_ID"}), {"no job id", "slurm"}},
  };
  for (const auto& c : cases) {
    std::string what = error_of(c.vars);
    for (const auto& part : c.named) CHECK_MESSAGE(contains(what, part), what, " lacks ", part);
  }
}

TEST_CASE("the real environment") {
  const char* names[] = {"COHORT_RANK", "COHORT_SIZE", "COHORT_LOCAL_RANK", "COHORT_LOCAL_SIZE",
                         "COHORT_JOB_ID"};
  std::map<std::string, std::string> saved;
  for (const char* name : names) {
    if (const char* value = std::getenv(name)) saved[name] = value;
  }
  ::setenv("COHORT_RANK", "1", 1);
  ::setenv("COHORT_SIZE", "2", 1);
  ::setenv("COHORT_LOCAL_RANK", "1", 1);
  ::setenv("COHORT_LOCAL_SIZE", "2", 1);
  ::setenv("COHORT_JOB_ID", "real-env", 1);
  auto info = cohort::launch_info_from_env();
  ::setenv("COHORT_SIZE", "1", 1);
  CHECK_THROWS_AS(cohort::launch_info_from_env(), cohort::error);
  for (const char* name : names) ::unsetenv(name);
  for (const auto& [name, value] : saved) ::setenv(name.c_str(), value.c_str(), 1);
  CHECK(info.source == cohort::launcher::cohort_run);
  CHECK(info.rank == 1);
  CHECK(info.size == 2);
  CHECK(info.job_id == "real-env");
}
