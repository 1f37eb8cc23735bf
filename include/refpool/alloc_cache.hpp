// `alloc_cache`: keeps idle blocks and hands them out again, to any shape or element type of
// the same (rounded) byte size. Reuse is decided by reference counts, never by trust.
#pragma once

#include <cstddef>
#include <string>

#include <refpool/backend.hpp>
#include <refpool/cache_options.hpp>
#include <refpool/data_ref.hpp>
#include <refpool/detail/export.hpp>
#include <refpool/rounding.hpp>
#include <refpool/stats.hpp>
#include <refpool/types.hpp>

namespace refpool {

namespace detail {
class cache_state;
struct access;
}  // namespace detail

/// A cache of idle blocks keyed by (backend, device, memory kind, alignment, rounded bytes).
///
/// A cache serves requests made on a thread while a `scope` on it is active there, and requests
/// made through `allocate()` on any thread (frameworks whose work moves between threads: a
/// `step` then marks iteration boundaries). A block is
/// handed out only when no handle references it: when its last data_ref goes away it becomes
/// idle at once, even inside the scope that allocated it, so a loop body's peak is its live
/// working set. Blocks still referenced when their scope ends ("escapes") are counted and go
/// idle only when their last reference drops.
///
/// Among idle blocks of one key the cache prefers one last used on the requesting stream, then
/// the oldest block (lowest creation number), so a loop that repeats its requests gets the same
/// buffers in the same order every iteration (stable addresses, as CUDA graph capture needs).
///
/// Thread safety: every member may be called from any thread. Threads with their own scopes on
/// one cache do not share a lock on the hit path.
///
/// Destruction frees all idle blocks. Blocks still referenced outlive the cache and are freed
/// to their backend by their last reference; a scope still active on the cache keeps its
/// internals alive until it ends (its allocations are then no longer cached).
class REFPOOL_API alloc_cache {
 public:
  /// A cache with `cache_options::from_environment()`.
  alloc_cache();
  explicit alloc_cache(const cache_options& options);
  ~alloc_cache();
  alloc_cache(const alloc_cache&) = delete;
  alloc_cache& operator=(const alloc_cache&) = delete;

  /// Allocates `bytes` from `be` for use on `stream` through this cache, from any thread, with no
  /// scope: each thread gets its own part of the cache (a slot, leased at its first request and
  /// given back when the thread ends), so threads share no lock on hits. A buffer released on
  /// another thread goes back to the part that handed it out. While a `step` is open on the
  /// cache these requests belong to it (escapes, plans). 0 bytes gives a null handle.
  /// Throws as refpool::allocate.
  [[nodiscard]] data_ref allocate(const backend& be, std::size_t bytes, stream_ref stream = {});

  /// Counters; see cache_stats.
  [[nodiscard]] cache_stats stats() const;
  /// The counters as a short table for people (refpool::summary(stats())): requests and hit rate,
  /// allocated/reserved/idle bytes now and at their peaks in KiB/MiB/GiB, plans, backend calls,
  /// out-of-memory failures. `fmt::format("{}", stats())` (refpool/stats_format.hpp) prints every
  /// counter. Thread-safe, like stats().
  [[nodiscard]] std::string summary() const;
  /// Restarts peak_held_bytes and peak_live_bytes from the current values.
  void reset_peaks() noexcept;

  /// Frees least recently released idle blocks to their backends until at most `keep_bytes`
  /// idle bytes remain. Returns the bytes freed. Live blocks are never touched.
  std::size_t reclaim(std::size_t keep_bytes = 0);

  /// Sets the idle limit (evicting at once if needed).
  void set_max_idle_bytes(std::size_t bytes);
  [[nodiscard]] std::size_t max_idle_bytes() const noexcept;
  [[nodiscard]] const rounding_policy& rounding() const noexcept;

 private:
  friend struct detail::access;
  detail::cache_state* state_;
};

}  // namespace refpool
