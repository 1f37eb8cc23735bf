// The exceptions refpool throws. Each is a standard exception of the fitting kind (so generic
// code that catches std::bad_alloc, std::invalid_argument or std::exception catches it) and also
// a refpool::error, so one catch clause handles every refpool failure. Messages are complete
// sentences built with fmt.
#pragma once

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

#include <refpool/detail/export.hpp>

namespace refpool {

/// Base of every exception refpool throws: catch it to handle them all. Not itself a
/// std::exception (each concrete type is one, exactly once, so catching std::exception works).
class REFPOOL_API error {
 public:
  virtual ~error() = default;
  /// The message.
  [[nodiscard]] virtual const char* what() const noexcept = 0;

 protected:
  error() = default;
  error(const error&) = default;
  error& operator=(const error&) = default;
};

namespace detail {
/// A refpool::error that is also the standard exception `Std`.
template <class Std>
class REFPOOL_API error_of : public Std, public error {
 public:
  explicit error_of(const std::string& message) : Std(message) {}
  [[nodiscard]] const char* what() const noexcept override { return Std::what(); }
};
}  // namespace detail

/// A handle was used after `unsafe_free()` released it: `data()`, `reshape`, a copy.
class REFPOOL_API use_after_free : public detail::error_of<std::logic_error> {
 public:
  using error_of::error_of;
};

/// A reshape or reinterpretation that does not preserve the byte size, or a view that does
/// not fit its buffer. The message names both shapes.
class REFPOOL_API shape_error : public detail::error_of<std::invalid_argument> {
 public:
  using error_of::error_of;
};

/// A size whose computation overflows `std::size_t` (dims product, element size, rounding,
/// alignment). The message names the dims or bytes.
class REFPOOL_API size_error : public detail::error_of<std::length_error> {
 public:
  using error_of::error_of;
};

/// A precondition of a call does not hold: a null backend or resource, a pointer refpool never
/// handed out (or freed twice), a step ended twice. The message names the argument.
class REFPOOL_API invalid_argument : public detail::error_of<std::invalid_argument> {
 public:
  using error_of::error_of;
};

/// The backend could not satisfy a request even after the cache reclaimed its idle blocks
/// of that backend and device and retried. Only thrown when the backend said "out of memory".
/// A std::bad_alloc, as RMM's is, so generic code that catches that catches it too.
class REFPOOL_API out_of_memory : public std::bad_alloc, public error {
 public:
  out_of_memory(std::string message, std::size_t requested_bytes, int device)
      : message_(std::move(message)), requested_bytes_(requested_bytes), device_(device) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  /// Bytes the failed request asked for (after rounding).
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_bytes_; }
  /// Device of the failed request (-1 for host memory).
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  std::string message_;
  std::size_t requested_bytes_;
  int device_;
};

/// A backend call failed for a reason other than out-of-memory. Carries the native code.
class REFPOOL_API backend_error : public detail::error_of<std::runtime_error> {
 public:
  backend_error(const std::string& message, int native_code) : error_of(message), native_code_(native_code) {}
  /// The runtime's own error code (CUresult, hipError_t, errno).
  [[nodiscard]] int native_code() const noexcept { return native_code_; }

 private:
  int native_code_;
};

/// `resource::order_streams` cannot order the two streams now: one of them captures a CUDA or HIP
/// graph and the other is not in the same capture, where an event wait across the capture's
/// boundary would join the other stream to the capture or invalidate it. The cache then leaves the
/// memory where it is (it serves the request from other memory) and keeps a free that needs the
/// order until a later reclaim; docs/design.md, "Stream safety". A resource of the user's throws it
/// for the same reason. Carries the native code of the runtime's "capture" error (900).
class REFPOOL_API stream_order_unavailable : public backend_error {
 public:
  using backend_error::backend_error;
};

/// A backend cannot be used here: library missing, no device, driver too old, or refpool was
/// built without it. The message says which.
class REFPOOL_API backend_unavailable : public detail::error_of<std::runtime_error> {
 public:
  using error_of::error_of;
};

/// A scope or step was closed out of order (not the innermost on its thread), on another thread,
/// or twice where that is an error.
class REFPOOL_API scope_error : public detail::error_of<std::logic_error> {
 public:
  using error_of::error_of;
};

/// A bad value in REFPOOL_CONF or in options: the message names the key and allowed values.
class REFPOOL_API config_error : public detail::error_of<std::invalid_argument> {
 public:
  using error_of::error_of;
};

}  // namespace refpool
