// Planned scopes: a scope run under a plan key records its sequence of requests and their
// lifetimes; at its end an offline placement packs them into one arena; later runs with the same
// key hand out regions of that arena at the planned offsets. A region is handed out only when no
// live region of the plan can reach any byte of it (checked with reference counts, never trusted
// from the plan), else the request falls back to the normal cache and the plan is marked stale.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <refpool/stats.hpp>

#include "cache/block.hpp"
#include "cache/block_key.hpp"
#include "cache/cache_state.hpp"
#include "cache/spinlock.hpp"

namespace refpool::detail {

/// One request of a run, as the plan matches it.
struct planned_request {
  block_key key;  ///< backend, device, kind, alignment, exact bytes
  stream_ref stream;
  friend bool operator==(const planned_request&, const planned_request&) = default;
};

/// The memory that the plans of one key share: they never run at the same time, so one arena of
/// the largest plan's size serves them all. Counts live regions of all its plans.
class arena {
 public:
  /// Holds a counted reference to `backend` (released with the arena).
  arena(backend_state& backend, std::size_t bytes, stream_ref stream);
  ~arena();
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;
  /// False when the backend is out of memory.
  bool allocate();
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::byte* base() const noexcept { return static_cast<std::byte*>(ptr_); }
  [[nodiscard]] backend_state* backend() const noexcept { return backend_; }

  spinlock lock;              // guards live_total and the live counts of its plans
  std::size_t live_total = 0; ///< live regions of every plan in this arena

 private:
  std::atomic<int> refs_{1};
  backend_state* backend_;
  std::size_t bytes_;
  stream_ref stream_;
  void* ptr_ = nullptr;
};

/// A placement: requests, their offsets, which requests share bytes, bound to an arena.
class plan final : public region_owner {
 public:
  plan(std::vector<planned_request> requests, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& lifetimes);
  /// The same placement bound to `a` (retained), with no live regions.
  plan(const plan& other, arena* a);
  ~plan();
  plan& operator=(const plan&) = delete;

  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  /// Binds a new plan to `a` (retained). Once, before the plan is shared.
  void bind(arena* a) noexcept;

  [[nodiscard]] const std::vector<planned_request>& requests() const noexcept { return requests_; }
  [[nodiscard]] std::size_t bytes_needed() const noexcept { return bytes_needed_; }
  [[nodiscard]] std::size_t peak_live_bytes() const noexcept { return peak_live_bytes_; }
  [[nodiscard]] const arena* memory() const noexcept { return arena_; }
  /// Bytes of this plan's regions held by handles now.
  [[nodiscard]] std::size_t live_region_bytes() const;

  /// The region for request `i`, or null when live regions reach its bytes (a region of this
  /// plan: the plan is then stale; of another plan of the arena: this request only falls back).
  block* take_region(std::size_t i, std::size_t requested, stream_ref stream);
  /// The last handle of a region went away.
  void release_region(block* b, bool via_unsafe_free) noexcept override;

  std::atomic<bool> stale{false};
  std::atomic<std::uint64_t> unsafe_frees{0};
  std::atomic<std::uint64_t> last_used{0};  ///< plan_store's clock at the last run that used it

 private:
  std::atomic<int> refs_{1};
  std::vector<planned_request> requests_;
  std::vector<std::size_t> offsets_;
  std::vector<std::vector<std::uint32_t>> overlaps_;  ///< per request: requests sharing bytes (and itself)
  std::size_t bytes_needed_ = 0;
  std::size_t peak_live_bytes_ = 0;
  arena* arena_ = nullptr;
  // Guarded by arena_->lock:
  std::vector<std::uint32_t> live_;  ///< live regions per request, over all runs
  std::size_t live_sum_ = 0;
  std::vector<block*> free_regions_;
};

/// Offsets for `sizes` whose lifetimes [first, second) are given, greedy by size: largest first,
/// each at the lowest offset not overlapping a placed request alive at the same time.
/// Returns the offsets and the arena size. Sizes are rounded up to `alignment`.
std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(
    const std::vector<std::size_t>& sizes, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& lifetimes,
    std::size_t alignment);

/// One planned scope's run: matches its requests against the key's plans, records every request
/// and release, and at the end turns the recording into a plan when none fitted.
class plan_run final : public request_router, public release_observer {
 public:
  plan_run(cache_state& cache, std::string key);
  void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  /// Serves one request of this run (a region, the normal cache through `lease`, or, while
  /// recording the first run of a key, the backend directly).
  block* acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) override;
  /// A block handed out by this run lost its last handle (any thread, any time).
  void observe_release(block* b, bool via_unsafe_free) noexcept override;
  /// The scope ends: count escapes, make or replace the key's plan if this run asks for one.
  void finish() noexcept;

 private:
  ~plan_run();
  block* fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream);
  void note(block* b, std::size_t index);

  std::atomic<int> refs_{1};
  cache_state& cache_;
  const std::string key_;
  std::vector<plan*> candidates_;  ///< the key's plans at the start (retained)
  plan* current_ = nullptr;        ///< the plan being replayed, or null
  bool recording_only_ = false;    ///< no plan existed: serve uncached, exactly
  bool diverged_ = false;
  bool several_streams_ = false;

  std::atomic<std::uint64_t> tick_{0};
  spinlock lock_;  // guards the recording against releases on other threads
  std::vector<planned_request> sequence_;
  backend_state* first_backend_ = nullptr;  ///< one backend per plannable run (its blocks keep it alive)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> lifetimes_;  ///< [alloc tick, free tick)
  std::size_t live_ = 0;
  bool finished_ = false;
};

/// The plans of one cache, by key: up to `plans_per_key` each, one per distinct sequence.
/// Attached to its cache as the cache's extension (plan_store::of).
class plan_store final : public cache_extension {
 public:
  static constexpr std::size_t plans_per_key = 4;  // variable-length loops with a few shapes
  ~plan_store() override;
  /// The store of `cache`, made at first use.
  static plan_store& of(cache_state& cache);

  /// The key's plans, most recently used first, retained for the caller.
  std::vector<plan*> find(std::string_view key);
  /// Adds unbound `p` (adopting its reference), replacing a plan of the same sequence or the
  /// least recently used one beyond plans_per_key, and binds it to the key's shared arena, grown
  /// if `p` needs more (the other plans then move to the new arena). False when out of memory.
  bool add(const std::string& key, plan* p, backend_state& backend, stream_ref stream);
  /// Drops every plan (the cache is closing); arenas go when their last region does.
  void close() noexcept override;
  void add_counters(cache_stats& out) const override;

  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> misses{0};
  std::atomic<std::uint64_t> recordings{0};
  std::atomic<std::uint64_t> clock{0};

 private:
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, plan*>> plans_;
  std::uint64_t retired_unsafe_frees_ = 0;
};

}  // namespace refpool::detail
