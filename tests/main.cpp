// The test programs' main: doctest's, except that a run whose filters pick no test case fails.
// Meson runs several programs as slices (`--test-case=*<float>`, `--test-case=hostile:*`); a
// slice whose pattern no longer names a case after a rename would otherwise pass having run
// nothing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

namespace {

// How many test cases the run's filters picked; -1 until a run (not a query such as
// --list-test-cases) ends.
int picked = -1;

struct count_picked : doctest::IReporter {
  explicit count_picked(const doctest::ContextOptions&) {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    picked = static_cast<int>(stats.numTestCasesPassingFilters);
  }
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("count_picked", 1, count_picked);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (status == 0 && picked == 0) {
    std::fprintf(stderr, "no test case matches this run's filters: nothing was tested\n");
    return 1;
  }
  return status;
}
