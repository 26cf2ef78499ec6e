/// @file
/// CUDA errors as cohort errors: `errc::cuda_error`, with the CUDA runtime's own name and text.
///
/// Needs the program to link `cohort_cuda_dep` once one of these is called; including the
/// header needs nothing from the CUDA toolkit.
#pragma once

#include <cohort/core/error.hpp>
#include <cohort/cuda/detail/abi.hpp>
#include <string>
#include <string_view>

namespace cohort::cuda {

/// The cudaError_t value that says a device (or its driver) is missing.
inline constexpr int error_no_device = 100;           // cudaErrorNoDevice
inline constexpr int error_insufficient_driver = 35;  // cudaErrorInsufficientDriver

/// "cudaErrorInvalidValue (1): invalid argument": the runtime's name, number and text.
inline std::string error_text(int code) {
  const char* name = cohort_cuda_error_name(code);
  const char* text = cohort_cuda_error_string(code);
  return std::string(name != nullptr ? name : "cudaError") + " (" + std::to_string(code) +
         "): " + (text != nullptr ? text : "unknown CUDA error");
}

/// The failure a CUDA error becomes: `errc::cuda_error` and "<what>: <CUDA name and text>".
inline failure cuda_failure(int code, std::string_view what, int peer = -1) {
  return {make_error_code(errc::cuda_error), peer, std::string(what) + ": " + error_text(code)};
}

/// Throws `cohort::error` with `errc::cuda_error` (operation `operation`) when `code` is not 0.
inline void check(int code, std::string_view operation, std::string_view what) {
  if (code == 0) return;
  const failure f = cuda_failure(code, std::string(operation) + ": " + std::string(what));
  throw error(f.code, std::string(operation), f.peer, f.what);
}

/// Throws `cohort::error` with `errc::invalid_argument` (operation `operation`).
[[noreturn]] inline void throw_invalid(std::string_view operation, std::string_view what) {
  throw error(make_error_code(errc::invalid_argument), std::string(operation), -1,
              std::string(operation) + ": " + std::string(what));
}

}  // namespace cohort::cuda
