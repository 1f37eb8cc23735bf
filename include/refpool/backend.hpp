// `backend`: a shared handle to a memory resource plus refpool's accounting of what it gave out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <refpool/detail/export.hpp>
#include <refpool/resource.hpp>
#include <refpool/types.hpp>

namespace refpool {

namespace detail {
class backend_state;
struct access;
}  // namespace detail

/// Copyable handle to a memory resource. Copies share the resource and its counters; the
/// resource lives until the last handle and the last block allocated from it are gone.
/// Two handles are the same backend (and share cache keys) iff they were copied from one another.
/// Thread safety: all members may be called concurrently.
class REFPOOL_API backend {
 public:
  /// A null handle; allocating from it throws `invalid_argument`.
  backend() noexcept = default;
  /// Wraps `res`. Throws `invalid_argument` if `res` is null.
  explicit backend(std::shared_ptr<resource> res);
  backend(const backend& other) noexcept;
  backend(backend&& other) noexcept : state_(other.state_) { other.state_ = nullptr; }
  backend& operator=(const backend& other) noexcept;
  backend& operator=(backend&& other) noexcept;
  ~backend();

  [[nodiscard]] std::string_view name() const noexcept;
  [[nodiscard]] device_id device() const noexcept;
  [[nodiscard]] memory_kind kind() const noexcept;
  [[nodiscard]] std::size_t alignment() const noexcept;

  /// Bytes currently allocated from the resource and not yet given back, cached or live.
  [[nodiscard]] std::size_t outstanding_bytes() const noexcept;
  /// Number of successful `resource::allocate` calls so far.
  [[nodiscard]] std::uint64_t allocation_count() const noexcept;
  /// Number of `resource::deallocate` calls so far.
  [[nodiscard]] std::uint64_t deallocation_count() const noexcept;

  /// The wrapped resource. The handle must not be null.
  [[nodiscard]] resource& underlying() const noexcept;

  explicit operator bool() const noexcept { return state_ != nullptr; }
  friend bool operator==(const backend& a, const backend& b) noexcept { return a.state_ == b.state_; }

 private:
  friend struct detail::access;
  detail::backend_state* state_ = nullptr;  // one counted reference, or null
};

/// The process-wide host backend (pageable memory, 256-byte aligned). Always available.
[[nodiscard]] REFPOOL_API backend host_backend();

/// A new host backend with its own counters (useful in tests: outstanding bytes start at 0).
[[nodiscard]] REFPOOL_API backend make_host_backend();

/// Alignment of host backend allocations, in bytes.
inline constexpr std::size_t host_alignment = 256;

}  // namespace refpool
