// The concepts, each proven both ways: a model passes, a counter-model is rejected.
#include "../support.hpp"

#include <array>
#include <concepts>
#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <vector>

#include <cohort/cohort.hpp>

namespace {

// Counter-models: each misses one requirement.
struct no_wait_transport {
  struct request {};
  int rank() const { return 0; }
  int size() const { return 1; }
  request send(int, std::span<const std::byte>) { return {}; }
  request recv(int, std::span<std::byte>) { return {}; }
  void abort(const cohort::failure&) noexcept {}
  const cohort::failure* remote_failure() const { return nullptr; }
};
struct throwing_abort_transport : no_wait_transport {
  void wait(request&, cohort::deadline, std::error_code&) {}
  void abort(const cohort::failure&) {}  // may throw: not allowed
};
struct complete_transport : no_wait_transport {
  void wait(request&, cohort::deadline, std::error_code&) {}
};
struct not_an_op {};
struct binary_but_not_on_floats {
  int operator()(int*, int*) const { return 0; }
};

}  // namespace

static_assert(cohort::transport<cohort::loopback_transport>);
static_assert(cohort::zero_copy_transport<cohort::loopback_transport>);
static_assert(cohort::transport<complete_transport>);
static_assert(!cohort::zero_copy_transport<complete_transport>);
static_assert(!cohort::transport<no_wait_transport>);
static_assert(!cohort::transport<throwing_abort_transport>);
static_assert(!cohort::transport<int>);

static_assert(cohort::communicator<cohort::loopback_communicator>);
static_assert(cohort::communicator<cohort::basic_communicator<complete_transport>>);
static_assert(!cohort::communicator<cohort::loopback_transport>);
static_assert(!cohort::communicator<int>);

static_assert(cohort::reduction_for<cohort::ops::sum_t, float>);
static_assert(cohort::reduction_for<cohort::ops::max_t, cohort::bf16>);
static_assert(cohort::reduction_for<cohort::ops::prod_t, std::int64_t>);
static_assert(cohort::reduction_for<cohort::ops::avg_t, cohort::fp16>);
static_assert(!cohort::reduction_for<cohort::ops::avg_t, std::int32_t>);  // avg: floats only
static_assert(!cohort::reduction_for<not_an_op, float>);
static_assert(!cohort::reduction_for<binary_but_not_on_floats, float>);
static_assert(!cohort::reduction_for<cohort::ops::sum_t, char*>);  // not an element type
static_assert(cohort::is_commutative_v<cohort::ops::sum_t>);
static_assert(!cohort::is_commutative_v<not_an_op>);  // silent means ordered

static_assert(cohort::buffer<std::vector<float>>);
static_assert(cohort::mutable_buffer<std::span<cohort::fp16>>);
static_assert(!cohort::mutable_buffer<const std::vector<float>&>);
static_assert(!cohort::buffer<std::list<float>>);  // not contiguous
static_assert(!cohort::buffer<std::deque<float>>);  // sized, not contiguous
static_assert(!cohort::buffer<std::vector<bool>>);  // no data(): bits, not elements
static_assert(!cohort::buffer<std::vector<char>>);  // contiguous, not an element type
static_assert(cohort::mutable_buffer<float (&)[8]>);
static_assert(cohort::buffer<const std::array<std::int64_t, 3>&>);
static_assert(!cohort::mutable_buffer<std::span<const float>>);  // a view of const elements
static_assert(cohort::mutable_buffer<const std::span<float>&>);  // a const view, writable elements
static_assert(std::same_as<cohort::buffer_element_t<std::span<const cohort::bf16>>, cohort::bf16>);

TEST_CASE("block_of splits counts that do not divide by P, first blocks longer") {
  std::size_t total = 0, expected_offset = 0;
  for (int r = 0; r < 7; ++r) {
    auto b = cohort::block_of(100, 7, r);
    CHECK(b.offset == expected_offset);
    CHECK(b.count == (r < 2 ? 15u : 14u));
    expected_offset += b.count;
    total += b.count;
  }
  CHECK(total == 100);
  CHECK(cohort::block_of(0, 3, 2).count == 0);
  CHECK(cohort::block_of(2, 3, 2).count == 0);
}

TEST_CASE("integer sum and product wrap instead of overflowing") {
  constexpr auto big = std::numeric_limits<std::int32_t>::max();
  CHECK(cohort::ops::sum(big, std::int32_t{1}) == std::numeric_limits<std::int32_t>::min());
  CHECK(cohort::ops::prod(std::int8_t{100}, std::int8_t{3}) == static_cast<std::int8_t>(44));
  CHECK(cohort::ops::avg.finalize(10.0f, 4) == 2.5f);
}

TEST_CASE("built-in reductions keep their wire numbers and names; user ops get other tags") {
  namespace d = cohort::detail;
  // The numbers travel in call headers and to the device kernels: they never change.
  CHECK(d::reduction_tag<cohort::ops::sum_t>() == 1);
  CHECK(d::reduction_tag<cohort::ops::prod_t>() == 2);
  CHECK(d::reduction_tag<cohort::ops::min_t>() == 3);
  CHECK(d::reduction_tag<cohort::ops::max_t>() == 4);
  CHECK(d::reduction_tag<cohort::ops::avg_t>() == 5);
  CHECK(d::builtin_reduction_name(1) == "sum");
  CHECK(d::builtin_reduction_name(5) == "avg");
  CHECK(d::builtin_reduction_name(0).empty());
  CHECK(d::builtin_reduction_name(6).empty());
  const auto first = [](auto a, auto) { return a; };
  const std::uint32_t user = d::reduction_tag<cohort::ops::ordered_fn<decltype(first)>>();
  CHECK(user > d::last_builtin_reduction);
  CHECK(d::builtin_reduction_name(user).empty());
  CHECK(user == d::reduction_tag<cohort::ops::ordered_fn<decltype(first)>>());  // stable
}
