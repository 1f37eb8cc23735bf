// The internals of an alloc_cache: its slots, counters and the paths that move blocks between
// live, idle and the backend. Lock order: mutex_ before any slot lock; one slot lock at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <refpool/alloc_cache.hpp>
#include <refpool/backend.hpp>

#include "block.hpp"
#include "plan.hpp"
#include "slot.hpp"

namespace refpool::detail {

class cache_state {
 public:
  explicit cache_state(const cache_options& options);
  cache_state(const cache_state&) = delete;
  cache_state& operator=(const cache_state&) = delete;

  // Lifetime: the alloc_cache, each active scope and each orphaned slot hold a reference.
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept;
  /// The alloc_cache is being destroyed: free idle blocks, orphan slots still in use.
  void close() noexcept;

  /// A slot for a scope entered on `thread`; null when the cache is closed (run uncached).
  slot* lease(std::thread::id thread);
  /// The scope that leased `s` ended: count its escapes and make `s` available again.
  void give_back(slot* s) noexcept;
  /// Counts a scope entry; true if it falls in the first `warmup` entries (run uncached).
  bool count_entry(std::size_t warmup) noexcept;

  /// A live block of at least `bytes` for `stream`, from `s`'s idle blocks, another slot's,
  /// or the backend (reclaiming idle blocks and retrying once on out-of-memory).
  block* acquire(slot& s, const backend& be, std::size_t bytes, stream_ref stream);
  /// The last handle of cached block `b` went away.
  void release_block(block* b, bool via_unsafe_free) noexcept;

  [[nodiscard]] cache_stats stats() const;
  std::size_t reclaim(std::size_t keep_bytes);
  void set_max_idle_bytes(std::size_t bytes);
  [[nodiscard]] std::size_t max_idle_bytes() const noexcept {
    return max_idle_bytes_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] const rounding_policy& rounding() const noexcept { return rounding_; }

  /// The plans of planned scopes on this cache.
  [[nodiscard]] plan_store& plans() noexcept { return plans_; }
  /// Counts buffers that a planned run saw escape (regions and direct blocks).
  void add_escapes(slot& s, std::size_t count) noexcept;

 private:
  ~cache_state();

  block* steal(slot& thief, bucket& target, stream_ref stream, bool& other_stream);
  block* allocate_new(slot& s, bucket& target, const backend& be, std::size_t capacity,
                      std::size_t requested, stream_ref stream);
  void mark_live(slot& s, block* b, bool hit) noexcept;  // caller holds s.lock
  void add_idle(slot& s, block* b) noexcept;             // caller holds s.lock
  void remove_idle(slot& s, block* b) noexcept;          // caller holds s.lock
  /// Frees least recently released idle blocks matching `filter` while more than `keep`
  /// idle bytes match. Caller holds mutex_. Returns bytes freed; counts into `counter`.
  std::size_t free_idle_locked(std::size_t keep, const std::function<bool(const block_key&)>& filter,
                               std::atomic<std::uint64_t>& counter);
  void enforce_idle_limit() noexcept;
  void free_to_backend(block* b) noexcept;
  void remove_orphan(slot* s) noexcept;

  std::atomic<int> refs_{1};
  const rounding_policy rounding_;
  std::atomic<std::size_t> max_idle_bytes_;

  mutable std::mutex mutex_;  // guards slots_, free_slots_, closed_, block homes during steals
  std::vector<std::unique_ptr<slot>> slots_;
  std::vector<slot*> free_slots_;
  bool closed_ = false;

  // Idle bytes over all slots, maintained only while a limit is set (so the hit path of an
  // unlimited cache touches no shared counter). Changes under a slot lock.
  std::atomic<bool> tracking_idle_{false};
  std::atomic<std::size_t> idle_total_{0};

  std::atomic<std::uint64_t> next_block_id_{1};
  std::atomic<std::uint64_t> clock_{1};  // ticks at each scope exit: the LRU time base
  std::atomic<std::uint64_t> backend_allocations_{0};
  std::atomic<std::uint64_t> backend_frees_{0};
  std::atomic<std::uint64_t> evictions_{0};
  std::atomic<std::uint64_t> reclaimed_{0};
  std::atomic<std::uint64_t> oom_retries_{0};
  std::atomic<std::uint64_t> scope_entries_{0};
  std::atomic<std::uint64_t> uncached_entries_{0};
  std::atomic<std::size_t> held_bytes_{0};
  std::atomic<std::size_t> peak_held_bytes_{0};
  plan_store plans_;
};

/// A block straight from `be`, owned by no cache: freed to `be` on its last release.
block* allocate_direct(const backend& be, std::size_t bytes, stream_ref stream);

}  // namespace refpool::detail
