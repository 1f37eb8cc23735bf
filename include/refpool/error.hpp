// The exceptions refpool throws. Every one derives from refpool::error, so one catch clause
// handles them all; messages are complete sentences built with fmt.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace refpool {

/// Base of every exception refpool throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A handle was used after `unsafe_free()` released it: `data()`, `reshape`, a copy.
class use_after_free : public error {
 public:
  using error::error;
};

/// A reshape or reinterpretation that does not preserve the byte size, or a view that does
/// not fit its buffer. The message names both shapes.
class shape_error : public error {
 public:
  using error::error;
};

/// A request of zero bytes, or a size whose computation overflows `std::size_t`
/// (dims product, element size, rounding). The message names the dims or bytes.
class size_error : public error {
 public:
  using error::error;
};

/// The backend could not satisfy a request even after the cache reclaimed its idle blocks
/// of that backend and device and retried. Only thrown when the backend said "out of memory".
class out_of_memory : public error {
 public:
  out_of_memory(const std::string& message, std::size_t requested_bytes, int device)
      : error(message), requested_bytes_(requested_bytes), device_(device) {}
  /// Bytes the failed request asked for (after rounding).
  [[nodiscard]] std::size_t requested_bytes() const noexcept { return requested_bytes_; }
  /// Device of the failed request (-1 for host memory).
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  std::size_t requested_bytes_;
  int device_;
};

/// A backend call failed for a reason other than out-of-memory. Carries the native code.
class backend_error : public error {
 public:
  backend_error(const std::string& message, int native_code)
      : error(message), native_code_(native_code) {}
  /// The runtime's own error code (CUresult, hipError_t, errno).
  [[nodiscard]] int native_code() const noexcept { return native_code_; }

 private:
  int native_code_;
};

/// A backend cannot be used here: library missing, no device, driver too old, or refpool was
/// built without it. The message says which.
class backend_unavailable : public error {
 public:
  using error::error;
};

/// A scope was closed out of order (not the innermost on its thread) or on another thread.
class scope_error : public error {
 public:
  using error::error;
};

/// A bad value in REFPOOL_CONF or in options: the message names the key and allowed values.
class config_error : public error {
 public:
  using error::error;
};

}  // namespace refpool
