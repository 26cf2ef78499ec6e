/// @file
/// How the typed wrappers call the plain-C entry points of cohort-cuda: argument problems are
/// reported before any CUDA call (`errc::invalid_argument`), CUDA failures after it
/// (`errc::cuda_error`), by throwing or through an `std::error_code`.
#pragma once

#include <cohort/core/dtype.hpp>
#include <cohort/cuda/detail/math.hpp>
#include <cohort/cuda/error.hpp>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <system_error>

namespace cohort::cuda::detail {

// The ABI passes cohort's own enumerators as numbers; the kernels read them as these.
static_assert(static_cast<int>(dtype::f32) == f32_type::code &&
              static_cast<int>(dtype::f64) == f64_type::code &&
              static_cast<int>(dtype::fp16) == fp16_type::code &&
              static_cast<int>(dtype::bf16) == bf16_type::code);

// Runs `launch` (returning a CUDA code) unless `bad` names an argument problem; reports either.
template <class Launch>
void run(std::string_view operation, const char* bad, Launch launch, std::error_code* ec) {
  if (bad != nullptr) {
    if (ec == nullptr) throw_invalid(operation, bad);
    *ec = make_error_code(errc::invalid_argument);
    return;
  }
  const int code = launch();
  if (ec == nullptr)
    check(code, operation, "kernel launch");
  else
    *ec = code == 0 ? std::error_code{} : make_error_code(errc::cuda_error);
}

inline bool aligned(const void* p, std::size_t a) {
  return reinterpret_cast<std::uintptr_t>(p) % a == 0;
}

}  // namespace cohort::cuda::detail
