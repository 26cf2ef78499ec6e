/// @file
/// Error codes, the error category and the exception type of cohort.
#pragma once

#include <string>
#include <system_error>
#include <utility>

namespace cohort {

/// Failures a user can cause or meet. Values never change once released.
enum class errc {
  ok = 0,
  timed_out = 1,         ///< A wait passed its deadline.
  peer_lost = 2,         ///< A peer closed, crashed or stopped answering for good.
  mismatch = 3,          ///< Ranks called different collectives, counts, types, ops or roots.
  protocol_error = 4,    ///< Bytes on the wire did not follow the protocol.
  aborted = 5,           ///< The communicator was aborted, locally or by a peer.
  invalid_argument = 6,  ///< A caller passed arguments that cannot be right.
  unsupported = 7,       ///< The request is valid but this build or transport cannot do it.
  cuda_error = 8,        ///< A CUDA runtime call failed.
  poisoned = 9,          ///< An earlier failure left the communicator unusable.
};

namespace detail {
class error_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "cohort"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::ok: return "success";
      case errc::timed_out: return "timed out";
      case errc::peer_lost: return "peer lost";
      case errc::mismatch: return "ranks disagree about the collective call";
      case errc::protocol_error: return "protocol error";
      case errc::aborted: return "aborted";
      case errc::invalid_argument: return "invalid argument";
      case errc::unsupported: return "unsupported";
      case errc::cuda_error: return "CUDA error";
      case errc::poisoned: return "communicator poisoned by an earlier failure";
    }
    return "unknown cohort error";
  }
};
}  // namespace detail

/// The category of every `cohort::errc` value.
inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

/// Makes `errc` values usable as `std::error_code`.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// The exception thrown by the throwing overloads: the code, the operation and the peer.
///
/// `peer()` is the rank the failure concerns, or -1 where no single peer is to blame.
class error : public std::system_error {
 public:
  error(std::error_code code, std::string operation, int peer, const std::string& what)
      : std::system_error(code, what), operation_(std::move(operation)), peer_(peer) {}

  /// The name of the call that failed, e.g. "all_reduce".
  const std::string& operation() const noexcept { return operation_; }
  /// The rank the failure concerns, or -1.
  int peer() const noexcept { return peer_; }

 private:
  std::string operation_;
  int peer_;
};

}  // namespace cohort

template <>
struct std::is_error_code_enum<cohort::errc> : std::true_type {};

namespace cohort {

/// What went wrong, where: the record a communicator keeps of its first failure, and what a
/// transport passes between ranks when one of them aborts.
struct failure {
  std::error_code code;  ///< The cause.
  int peer = -1;         ///< The rank the failure concerns (or that reported it), -1 if none.
  std::string what;      ///< A sentence for a person: operation, peer and probable cause.
};

}  // namespace cohort
