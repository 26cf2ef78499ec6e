/// @file
/// Compressed pushes: any cohort codec (fp16, bf16, int8, top-k, with error feedback or
/// composed) behind one type the worker and the server share.
#pragma once

#include <cohort/compress/codec.hpp>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cohort::ps {

/// The codec a worker encodes its pushes with and the servers decode them with. Empty: pushes
/// go as f32.
///
/// The worker keeps one copy of the codec per key and server (each server gets its own slice
/// of every key, encoded on its own), so an `error_feedback` codec keeps its residual per
/// slice, on the worker, across steps. The server checks an encoding's length (and, for
/// sparse codecs, its entries) before it decodes: a malformed one is refused, never decoded.
/// Every rank must use the same codec; a server without one refuses compressed pushes.
/// Each compressed push allocates its encoding buffer.
class push_codec {
  struct concept_base;

 public:
  /// No compression.
  push_codec() = default;

  /// Compresses with a copy of `c`. (push_codec itself is ruled out first: asking whether it is
  /// a codec would ask whether it is copyable, which asks this constructor again.)
  template <class C>
    requires(!std::same_as<C, push_codec>) && compress::codec<C>
  explicit push_codec(C c) : impl_(std::make_shared<model<C>>(std::move(c))) {}

  /// True when pushes go uncompressed.
  bool empty() const noexcept { return impl_ == nullptr; }
  /// The codec's name ("none" when empty).
  std::string name() const { return impl_ ? impl_->name() : "none"; }

  /// One codec instance for one slice: encodes (keeping its state) and decodes.
  class slot {
   public:
    std::size_t max_encoded_bytes(std::size_t n) const { return impl_->max_encoded_bytes(n); }
    std::size_t workspace_bytes(std::size_t n) const { return impl_->workspace_bytes(n); }
    std::size_t encode(std::span<const float> in, std::span<std::byte> out,
                       std::span<std::byte> work, std::uint64_t salt) {
      return impl_->encode(in, out, work, salt);
    }
    /// True when `bytes` is a well-formed encoding of `n` floats.
    bool acceptable(std::span<const std::byte> bytes, std::size_t n) const {
      return impl_->acceptable(bytes, n);
    }
    void decode(std::span<const std::byte> bytes, std::span<float> x) const {
      impl_->decode(bytes, x);
    }

   private:
    friend class push_codec;
    explicit slot(std::unique_ptr<concept_base> p) : impl_(std::move(p)) {}
    std::unique_ptr<concept_base> impl_;
  };

  /// A fresh copy of the codec (its own error-feedback residual). Requires `!empty()`.
  slot make_slot() const { return slot(impl_->clone()); }

 private:
  struct concept_base {
    virtual ~concept_base() = default;
    virtual std::unique_ptr<concept_base> clone() const = 0;
    virtual std::string name() const = 0;
    virtual std::size_t max_encoded_bytes(std::size_t n) const = 0;
    virtual std::size_t workspace_bytes(std::size_t n) const = 0;
    virtual std::size_t encode(std::span<const float>, std::span<std::byte>, std::span<std::byte>,
                               std::uint64_t) = 0;
    virtual bool acceptable(std::span<const std::byte>, std::size_t) const = 0;
    virtual void decode(std::span<const std::byte>, std::span<float>) const = 0;
  };

  template <class C>
  static bool well_formed(const C& c, std::span<const std::byte> b, std::size_t n) {
    if constexpr (requires { c.inner(); }) {
      return well_formed(c.inner(), b, n);
    } else if constexpr (requires { c.valid(b, n); }) {
      return c.valid(b, n);
    } else if constexpr (requires { c.encoded_bytes(n); }) {
      return b.size() == c.encoded_bytes(n);
    } else if constexpr (requires { typename C::wire_type; }) {
      return b.size() == n * sizeof(typename C::wire_type);
    } else {
      return b.size() <= c.max_encoded_bytes(n);
    }
  }

  template <class C>
  struct model final : concept_base {
    explicit model(C c) : c_(std::move(c)) {}
    std::unique_ptr<concept_base> clone() const override { return std::make_unique<model>(c_); }
    std::string name() const override { return c_.name(); }
    std::size_t max_encoded_bytes(std::size_t n) const override { return c_.max_encoded_bytes(n); }
    std::size_t workspace_bytes(std::size_t n) const override { return c_.workspace_bytes(n); }
    std::size_t encode(std::span<const float> in, std::span<std::byte> out,
                       std::span<std::byte> work, std::uint64_t salt) override {
      return c_.encode(in, out, work, salt);
    }
    bool acceptable(std::span<const std::byte> b, std::size_t n) const override {
      return well_formed(c_, b, n);
    }
    void decode(std::span<const std::byte> b, std::span<float> x) const override {
      c_.decode(b, x, compress::decode_mode::assign);
    }
    C c_;
  };

  std::shared_ptr<const concept_base> impl_;
};

namespace detail {
/// A byte buffer whose data is 64-byte aligned (what codecs' workspaces and outputs expect).
class aligned_bytes {
 public:
  std::span<std::byte> get(std::size_t n) {
    if (buf_.size() < n + 64) buf_.resize(n + 64);
    auto p = reinterpret_cast<std::uintptr_t>(buf_.data());
    const std::size_t skip = (64 - p % 64) % 64;
    return {buf_.data() + skip, n};
  }

 private:
  std::vector<std::byte> buf_;
};
}  // namespace detail

}  // namespace cohort::ps
