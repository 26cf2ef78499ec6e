// Must not compile: this type has no wait(), so cohort::transport rejects it, and the compiler
// says so by the concept's name (the type's own name avoids the word). The test runs the
// compiler on it and checks the diagnostic.
#include <cohort/cohort.hpp>

struct half_done {
  struct request {};
  int rank() const { return 0; }
  int size() const { return 1; }
  request send(int, std::span<const std::byte>) { return {}; }
  request recv(int, std::span<std::byte>) { return {}; }
  void abort(const cohort::failure&) noexcept {}
  const cohort::failure* remote_failure() const { return nullptr; }
};

int main() {
  cohort::basic_communicator<half_done> comm(half_done{});
  return comm.size();
}
