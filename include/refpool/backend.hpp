// `backend`: a shared handle to a memory resource plus refpool's accounting of what it gave out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <refpool/resource.hpp>
#include <refpool/types.hpp>

namespace refpool {

namespace detail {
class backend_state;
}

/// Copyable handle to a memory resource. Copies share the resource and its counters; the
/// resource lives until the last handle and the last block allocated from it are gone.
/// Two handles are the same backend (and share cache keys) iff they were copied from one another.
/// Thread safety: all members may be called concurrently.
class backend {
 public:
  /// A null handle; using it to allocate throws `refpool::error`.
  backend() noexcept = default;
  /// Wraps `res`. Throws `refpool::error` if `res` is null.
  explicit backend(std::shared_ptr<resource> res);

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

  /// The wrapped resource.
  [[nodiscard]] resource& underlying() const noexcept;

  explicit operator bool() const noexcept { return static_cast<bool>(state_); }
  friend bool operator==(const backend& a, const backend& b) noexcept { return a.state_ == b.state_; }

  /// Internal: the shared state (for refpool's own code).
  [[nodiscard]] const std::shared_ptr<detail::backend_state>& state() const noexcept { return state_; }
  /// Internal: a handle to existing state.
  explicit backend(std::shared_ptr<detail::backend_state> state) noexcept;

 private:
  std::shared_ptr<detail::backend_state> state_;
};

/// The process-wide host backend (pageable memory, 256-byte aligned). Always available.
[[nodiscard]] backend host_backend();

/// A new host backend with its own counters (useful in tests: outstanding bytes start at 0).
[[nodiscard]] backend make_host_backend();

/// Alignment of host backend allocations, in bytes.
inline constexpr std::size_t host_alignment = 256;

}  // namespace refpool
