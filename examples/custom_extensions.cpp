// Extending cohort from user code: a reduction of your own and a transport of your own, both
// checked against the library's concepts at compile time, then used by the stock collectives.
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include <cohort/cohort.hpp>

// A reduction: the value of largest magnitude (ties go to the larger value, so it commutes).
struct max_magnitude {
  static constexpr bool commutative = true;
  static constexpr std::string_view name = "max_magnitude";
  template <class A>
  A operator()(A a, A b) const {
    if (std::abs(a) != std::abs(b)) return std::abs(a) < std::abs(b) ? b : a;
    return a < b ? b : a;
  }
};
static_assert(cohort::reduction_for<max_magnitude, float>);
static_assert(cohort::reduction_for<max_magnitude, cohort::bf16>);  // accumulates in float

// A transport: wraps any transport and counts the bytes this rank sends.
template <cohort::transport Inner>
class counting_transport {
 public:
  using request = typename Inner::request;
  explicit counting_transport(Inner inner) : inner_(std::move(inner)) {}
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  request send(int peer, std::span<const std::byte> bytes) {
    sent_ += bytes.size();
    return inner_.send(peer, bytes);
  }
  request recv(int peer, std::span<std::byte> bytes) { return inner_.recv(peer, bytes); }
  void wait(request& r, cohort::deadline d, std::error_code& ec) { inner_.wait(r, d, ec); }
  void abort(const cohort::failure& f) noexcept { inner_.abort(f); }
  const cohort::failure* remote_failure() const { return inner_.remote_failure(); }
  std::size_t bytes_sent() const { return sent_; }

 private:
  Inner inner_;
  std::size_t sent_ = 0;
};
static_assert(cohort::transport<counting_transport<cohort::loopback_transport>>);
// It does not lend views, so the collectives stage received chunks instead.
static_assert(!cohort::zero_copy_transport<counting_transport<cohort::loopback_transport>>);

int main() {
  constexpr int ranks = 3;
  constexpr std::size_t n = 300'000;
  auto world = std::make_shared<cohort::loopback_world>(ranks);
  std::vector<std::thread> threads;
  std::vector<int> failures(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      using transport = counting_transport<cohort::loopback_transport>;
      cohort::basic_communicator<transport> comm(transport(cohort::loopback_transport(world, r)));
      std::vector<float> v(n, r == 1 ? -7.0f : float(r));
      cohort::all_reduce(comm, v, max_magnitude{});
      // Ring all-reduce: 2(P-1)/P of the buffer, plus one 32-byte call header.
      const std::size_t expected = 2 * (ranks - 1) * n / ranks * sizeof(float) + 32;
      const std::size_t sent = comm.transport().bytes_sent();
      failures[r] = v[0] != -7.0f || v[n - 1] != -7.0f || sent != expected;
      if (r == 0)
        std::printf("max_magnitude over %d ranks: %.1f; rank 0 sent %zu bytes (ring formula: %zu)\n",
                    ranks, v[0], sent, expected);
    });
  }
  for (auto& t : threads) t.join();
  for (int f : failures)
    if (f) return 1;
}
