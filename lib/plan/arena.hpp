// An arena: the memory that plans place their regions in, one backend and one stream. Plans of
// several keys may share one (their runs never overlap in time: a run claims the arena for its
// whole length, and a second run finding it claimed is served by the plain cache). Its memory is a
// span of the backend's segment heap (issue 36 step 2, work in progress): held while a run claims
// it or a region pins it, idle between runs (the heap may yield it), grown at a claim.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include <refpool/types.hpp>

#include "backend_state.hpp"
#include "cache/spinlock.hpp"
#include "plan/arena_source.hpp"
#include "ref_counted.hpp"

namespace refpool::detail {

class plan;

/// A region of a finished run still live: it pins its bytes until released. Recorded at the
/// run's end; the next run that claims the arena avoids it while it is live.
///
/// `owner` holds no count: ~plan removes its plan's entries under pinned_mutex before anything
/// of the plan is freed, so a holder of the mutex may read an entry's plan, and takes a
/// reference only with retain_if_owned. That fails once the last one went: the region was
/// released (on any thread, with no lock) after the holder read it live, and the plan's
/// destructor waits for the mutex. A counted entry would be simpler to read but would keep its
/// plan, and so its arena, alive until a run claims the arena again, which for a replaced
/// (retired) arena is never: its memory would stay held after its last region went.
struct pinned_region {
  plan* owner;               ///< not counted (above)
  std::uint32_t index;       ///< its request in the plan
  std::uint64_t live_state;  ///< the region's state while it stays live
};

class arena : public ref_counted<arena> {
 public:
  /// Memory of `backend` from `source` (which outlives it); holds a counted reference to
  /// `backend`. No memory yet.
  arena(arena_source& source, backend_state& backend, stream_ref stream);

  /// Its plans need `bytes` (> 0): its span is made at the first claim. Once, before it is shared.
  bool allocate(std::size_t bytes) {
    memory_.needed.store(bytes, std::memory_order_relaxed);
    return true;
  }
  /// Its plans need `bytes`. `fits`: its span holds them already (or will at its next claim).
  /// `grown`: its next claim extends its span (or moves it whole, nothing being live in it), or,
  /// pinned by a live region, it was extended now. `cannot`: pinned and no room after its span
  /// (or the backend failed): the caller replaces the arena. Claims it as `claimant` (the store).
  growth_in_place grow_in_place(std::size_t bytes, const void* claimant) noexcept;
  /// What plans placed in it may use (its span has it, or will at the next claim).
  [[nodiscard]] std::size_t capacity() const noexcept { return memory_.needed.load(std::memory_order_relaxed); }
  /// Gives its span back now (no region can reach it: the caller holds the claim, nothing is
  /// pinned); the arena is retired.
  void free_memory() noexcept;
  /// The claimer makes its span usable for this run: made at the first claim (after the cache's
  /// idle memory of the backend went), held again (rebased when it moved), extended to what its
  /// plans need (a new span when no room is after it and nothing pins the old one). False: out
  /// of memory (the run is served by the plain cache). Caller holds the claim.
  [[nodiscard]] bool take();
  /// A plan joined: the next take first gives the plain path's idle memory of the backend back,
  /// which the runs before it may have grown since (docs/segments.md, "Spans apart from pieces").
  void reclaim_before_next_take() noexcept { reclaim_before_take_.store(true, std::memory_order_relaxed); }
  /// The claimer's run ended and no region of it is live: the heap may yield its bytes.
  void idle() noexcept;
  /// The last pinned region of a finished run went (plan::put back of a region whose plan it
  /// held): idles the span when no run holds the arena and nothing else pins it, so that the plain
  /// path may take its bytes before the arena's next claim.
  void idle_if_unpinned() noexcept;
  /// Plan `p` places its regions in it (plan::bind): they follow its span (rebase). Takes pinned_mutex.
  void add_plan(plan& p);
  void remove_plan(const plan& p) noexcept;  // ~plan, under pinned_mutex
  /// Drops pinned regions released since; true when none is left (caller holds the claim).
  [[nodiscard]] bool unpinned() noexcept;
  /// Drops pinned regions released since (caller holds pinned_mutex).
  void drop_released_pins_locked() noexcept;

  [[nodiscard]] arena_source& source() const noexcept { return source_; }
  [[nodiscard]] const arena_memory& memory() const noexcept { return memory_; }
  [[nodiscard]] std::byte* base() const noexcept { return memory_.base; }
  [[nodiscard]] backend_state* backend() const noexcept { return memory_.backend; }
  [[nodiscard]] stream_ref stream() const noexcept { return memory_.stream; }

  // ---- one run at a time ----------------------------------------------------------------------
  /// Claims the arena for a run (a token unique to it) of key `key`; false when another run holds
  /// it or the arena was retired. The claimer owns `generation` until it unclaims.
  [[nodiscard]] bool claim(const void* run, const void* key) noexcept;
  /// Gives the claim up; then runs the check a release left to it (idle_if_unpinned found the
  /// arena claimed while this claimant held it, maybe after its own check).
  void unclaim() noexcept {
    release_claim();
    if (idle_wanted_.load(std::memory_order_seq_cst)) [[unlikely]]
      idle_if_unpinned();
  }
  /// The key of the run that holds the claim (a hint: read without a lock). Null when no run of
  /// a key holds it: the store's own claims (a growth, a replacement) name none, and a
  /// run that found it claimed must not take the store for another key (issue 35).
  [[nodiscard]] const void* claimed_key() const noexcept { return claimed_key_.load(std::memory_order_relaxed); }
  /// No run may claim it any more (it was replaced); runs holding it finish normally.
  void retire() noexcept { retired_.store(true, std::memory_order_release); }
  [[nodiscard]] bool retired() const noexcept { return retired_.load(std::memory_order_acquire); }

  /// The claiming run's position (requests made so far); regions record it at release.
  std::atomic<std::uint64_t> position{0};
  /// Numbers runs of this arena (claimer only): a region's state names the run that holds it.
  std::uint64_t generation = 0;

  /// Regions of finished runs still live. Guarded by pinned_mutex (claimers, plan destruction).
  std::mutex pinned_mutex;
  std::vector<pinned_region> pinned;

  // ---- streams recorded on released regions (record_stream) -----------------------------------
  /// A region used on `streams` too was released: its bytes' next user waits for them.
  void add_waits(const std::vector<stream_ref>& streams);
  /// Orders `consumer` after every pending stream. False, with the streams not ordered yet still
  /// pending, where order_streams cannot order them now (stream_order_unavailable: a graph
  /// capture): the bytes must not go out on `consumer` then. Throws what else order_streams throws
  /// (the same streams pending).
  [[nodiscard]] bool wait_for_pending(stream_ref consumer);
  [[nodiscard]] bool waits_pending() const noexcept { return waits_pending_.load(std::memory_order_acquire); }

 private:
  friend class ref_counted<arena>;
  ~arena();

  arena_source& source_;
  /// Every stream its bytes may still be used on: its own and the pending waits.
  [[nodiscard]] stream_set streams_in_use() noexcept;
  /// Its plans' regions point into the span at its address now (caller holds memory_mutex_).
  void rebase_locked() noexcept;
  /// A new held span of `bytes` for it, its plans rebased onto it; false when out of memory.
  /// Caller holds memory_mutex_ and the claim, and it has no span.
  bool place_new_span(std::size_t bytes);
  void raise_needed(std::size_t bytes) noexcept;
  void release_claim() noexcept {
    claimed_key_.store(nullptr, std::memory_order_relaxed);
    claimed_by_.store(nullptr, std::memory_order_seq_cst);  // before unclaim's look at idle_wanted_
  }

  // Serialises changes to its span: claimers take it, the last reference gives it back.
  mutable std::mutex memory_mutex_;
  arena_memory memory_;
  bool span_held_ = false;    ///< its span is held (not idle, not yielded), under memory_mutex_
  std::vector<plan*> plans_;  ///< bound plans (uncounted: ~plan removes itself), under pinned_mutex
  std::atomic<const void*> claimed_by_{nullptr};
  std::atomic<const void*> claimed_key_{nullptr};
  std::atomic<bool> retired_{false};
  /// A release found the arena claimed: the claimant's unclaim checks for it (idle_if_unpinned).
  std::atomic<bool> idle_wanted_{false};
  std::atomic<bool> reclaim_before_take_{false};

  spinlock waits_lock_;
  std::vector<stream_ref> waits_;
  std::atomic<bool> waits_pending_{false};
};

}  // namespace refpool::detail
