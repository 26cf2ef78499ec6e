/// @file
/// `--compress none|fp16|bf16|int8|topk:DENSITY` for the examples: parses the choice and
/// reduces gradient buckets through it, with one error-feedback residual per bucket for top-k.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>

#include <cohort/compress/all_reduce.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/top_k.hpp>

namespace cohort::examples {

/// A compression choice and the state it keeps across steps.
class compressor_choice {
 public:
  /// True for the spellings `compressor_choice` accepts.
  static bool valid(const std::string& spec) {
    if (spec == "none" || spec == "fp16" || spec == "bf16" || spec == "int8") return true;
    if (spec.rfind("topk:", 0) != 0) return false;
    try {
      const double d = std::stod(spec.substr(5));
      return d > 0 && d <= 1;
    } catch (const std::exception&) {
      return false;
    }
  }

  /// Parses a valid `spec`.
  explicit compressor_choice(const std::string& spec) : spec_(spec) {
    if (spec.rfind("topk:", 0) == 0) density_ = std::stod(spec.substr(5));
  }

  /// True when gradients go uncompressed.
  bool none() const { return spec_ == "none"; }

  /// All-reduces `bucket` to its mean over ranks through the codec; returns the bytes this
  /// rank sent. The same bucket (by address) keeps its error-feedback residual across calls.
  template <communicator Comm>
  std::size_t all_reduce(Comm& comm, std::span<float> bucket) {
    namespace cc = cohort::compress;
    cc::report r;
    if (spec_ == "fp16") r = compressed_all_reduce(comm, bucket, cc::fp16, ops::avg);
    else if (spec_ == "bf16") r = compressed_all_reduce(comm, bucket, cc::bf16, ops::avg);
    else if (spec_ == "int8") r = compressed_all_reduce(comm, bucket, cc::int8, ops::avg);
    else {
      auto [it, fresh] = feedback_.try_emplace(bucket.data(), cc::top_k(density_));
      r = compressed_all_reduce(comm, bucket, it->second, ops::avg);
    }
    return static_cast<std::size_t>(r.bytes_sent);
  }

 private:
  std::string spec_;
  double density_ = 1.0;
  std::map<const float*, cohort::compress::error_feedback<cohort::compress::top_k_codec<float>>>
      feedback_;
};

}  // namespace cohort::examples
