// An arena: the memory that plans place their regions in, one backend and one stream. Plans of
// several keys may share one (their runs never overlap in time: a run claims the arena for its
// whole length, and a second run finding it claimed is served by the plain cache). Grows in place
// through the backend's virtual memory when it has some, else by being replaced. Its memory, its
// accounting and its regions' blocks come from the arena source (arena_source.hpp).
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

  /// Memory for `bytes` (> 0) from its source (arena_source::allocate). False when out of
  /// memory. Once, before the arena is shared.
  bool allocate(std::size_t bytes) { return source_.allocate(memory_, bytes); }
  /// Grows to `bytes` where it is, keeping every address (arena_source::grow_in_place): `cannot`
  /// when it cannot (the caller replaces the arena) or is out of memory.
  growth_in_place grow_in_place(std::size_t bytes);
  /// The bytes it holds when committed, whether it is now or not (lent, fresh, or decommitted by
  /// the out-of-memory ladder): what plans placed in it may use.
  /// Read without the memory mutex (the store reads it under its own, which the out-of-memory
  /// ladder of a commit, holding the memory mutex, takes): a hint that grow_in_place confirms.
  [[nodiscard]] std::size_t capacity() const noexcept { return arena_source::capacity(memory_); }
  /// Gives the memory back now (no region can reach it: the caller holds the claim, nothing is
  /// pinned); the arena is retired.
  void free_memory() noexcept;
  /// Lends its memory back to the backend while a run without a plan needs it (plan_run::
  /// before_growth), keeping every address: the caller holds the claim and nothing is pinned.
  void lend() noexcept {
    std::lock_guard guard(memory_mutex_);
    lent_.store(memory_.committed.load(std::memory_order_relaxed), std::memory_order_relaxed);
    source_.decommit(memory_);
  }
  /// Takes it back (arena_source::recommit): false when out of memory, and it stays decommitted.
  [[nodiscard]] bool recommit();
  /// Decommits it if no run holds it, no region pins it and its memory is not being changed (the
  /// out-of-memory ladder: the arena may be the one whose commit ran out). Returns the bytes.
  std::size_t decommit_if_unused(const void* claimant) noexcept;
  /// Read without the memory mutex, which the out-of-memory ladder holds while it decommits: a
  /// run need not wait for that to see it claimed (the claimer reads it again under its claim).
  [[nodiscard]] bool decommitted() const noexcept { return memory_.decommitted.load(std::memory_order_relaxed) != 0; }
  /// Bytes lend() gave back, until recommit takes them again (0: not lent; a fresh arena, or one
  /// the out-of-memory ladder decommitted, lent nothing). Read without the memory mutex: a run's
  /// plain-cache request (plan_run::before_growth) must not wait for another thread's decommit,
  /// which on a GPU waits for the device first.
  [[nodiscard]] std::size_t lent_bytes() const noexcept { return lent_.load(std::memory_order_relaxed); }
  /// Drops pinned regions released since; true when none is left (caller holds the claim).
  [[nodiscard]] bool unpinned() noexcept;
  /// Drops pinned regions released since (caller holds pinned_mutex).
  void drop_released_pins_locked() noexcept;

  [[nodiscard]] arena_source& source() const noexcept { return source_; }
  [[nodiscard]] const arena_memory& memory() const noexcept { return memory_; }
  [[nodiscard]] std::byte* base() const noexcept { return memory_.base; }
  [[nodiscard]] std::size_t bytes() const noexcept { return memory_.committed.load(std::memory_order_relaxed); }
  [[nodiscard]] backend_state* backend() const noexcept { return memory_.backend; }
  [[nodiscard]] stream_ref stream() const noexcept { return memory_.stream; }
  [[nodiscard]] bool in_place_growth() const noexcept { return static_cast<bool>(memory_.region); }

  // ---- one run at a time ----------------------------------------------------------------------
  /// Claims the arena for a run (a token unique to it) of key `key`; false when another run holds
  /// it or the arena was retired. The claimer owns `generation` until it unclaims.
  [[nodiscard]] bool claim(const void* run, const void* key) noexcept;
  void unclaim() noexcept {
    claimed_key_.store(nullptr, std::memory_order_relaxed);
    claimed_by_.store(nullptr, std::memory_order_release);
  }
  /// The key of the run that holds the claim (a hint: read without a lock). Null when no run of
  /// a key holds it: the store's own claims (decommit_if_unused, a replacement) name none, and a
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
  /// Orders `consumer` after every pending stream (throws what order_streams throws; the
  /// pending streams stay pending then).
  void wait_for_pending(stream_ref consumer);
  [[nodiscard]] bool waits_pending() const noexcept { return waits_pending_.load(std::memory_order_acquire); }

 private:
  friend class ref_counted<arena>;
  ~arena();

  arena_source& source_;
  // Serialises changes to memory_ after it is shared: the store grows it in place (no claim)
  // while a run that claims it may commit it (recommit) or lend it.
  mutable std::mutex memory_mutex_;
  arena_memory memory_;
  std::atomic<std::size_t> lent_{0};  ///< bytes lend() gave back, until recommit (written under memory_mutex_)
  std::atomic<const void*> claimed_by_{nullptr};
  std::atomic<const void*> claimed_key_{nullptr};
  std::atomic<bool> retired_{false};

  spinlock waits_lock_;
  std::vector<stream_ref> waits_;
  std::atomic<bool> waits_pending_{false};
};

}  // namespace refpool::detail
