// The arena source: where plan arenas get their memory and where it goes back (docs/design.md,
// "Block sources"), and the region blocks that plans hand out of it. All the accounting of arena
// memory is here: the backend's (one allocation, or a vm_region's reservation and commits with
// count_allocation_call / count_deallocation_call) and the cache's reserved bytes. Its
// out-of-memory ladder is the one whole blocks use (cache_state::retry_once), but a failure is
// `false`, not out_of_memory: the plan store then drops the plan and the plain cache serves.
//
// One per plan store (so per cache). Arenas refer to it, uncounted: an arena lives while a plan
// placed in it or the store holds it, and plans retain the cache, whose extension the store is.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include <refpool/types.hpp>

#include "vm/vm_region.hpp"

namespace refpool::detail {

class backend_state;
class cache_state;
class region_owner;
class reserved_counter;
struct planned_request;
struct region_block;

/// What growing an arena in place did.
enum class growth_in_place : std::uint8_t {
  cannot,  ///< no room in its reservation, or no virtual memory (or out of memory): it stays as it was
  fits,    ///< it holds the bytes already (committed, or to be committed at recommit)
  grown,   ///< it grew (committed more, or will commit more at recommit)
};

/// An arena's memory: one allocation, or a reservation of address space committed from its start.
struct arena_memory {
  backend_state* backend = nullptr;  ///< its arena holds a counted reference
  stream_ref stream;
  vm_region region;  ///< when address space was reserved: the reservation and its commits
  std::byte* base = nullptr;
  std::atomic<std::size_t> committed{0};  ///< bytes usable from base (stats read it while it grows)
  /// Bytes given back by decommit (or reserved and not committed yet), committed again by
  /// recommit. Atomic like `committed`: the store reads both for room (capacity) while it changes.
  std::atomic<std::size_t> decommitted{0};
};

class arena_source {
 public:
  /// Counts into `cache`'s reserved bytes, retained: ~cache_state drops its own reference before
  /// the store, and so this source and the arenas it frees last, go.
  explicit arena_source(cache_state& cache);
  ~arena_source();
  arena_source(const arena_source&) = delete;
  arena_source& operator=(const arena_source&) = delete;

  /// Memory for `bytes` (> 0) into empty `m`: reserves address space when the backend offers
  /// virtual memory (committed later, by recommit: `m` starts decommitted), else one allocation.
  /// On out-of-memory the cache's idle blocks of the backend are reclaimed and it retries once.
  /// False when still out of memory; backend_error and size_error propagate (nothing kept).
  bool allocate(arena_memory& m, std::size_t bytes);
  /// Grows `m` to `bytes` where it is, keeping every address: only with virtual memory and room
  /// left in the reservation (a decommitted `m` only commits more at recommit). Room is what `m`
  /// holds committed, or will commit again: a decommitted arena has room too (issue 35).
  growth_in_place grow_in_place(arena_memory& m, std::size_t bytes);
  /// The bytes `m` holds when committed: what it holds now, or what recommit will commit.
  [[nodiscard]] static std::size_t capacity(const arena_memory& m) noexcept {
    return std::max(m.committed.load(std::memory_order_relaxed), m.decommitted.load(std::memory_order_relaxed));
  }
  /// Gives `m`'s memory back and uncounts it; `m` is empty after.
  void free(arena_memory& m) noexcept;
  /// Gives `m`'s committed memory back but keeps its address space, so every region keeps its
  /// address (no region may be live: the caller holds the arena's claim and nothing is pinned).
  /// Only with virtual memory. A GPU backend waits for the device before it unmaps.
  void decommit(arena_memory& m) noexcept;
  /// Commits again what decommit gave back (nothing to do when it gave nothing). False when out
  /// of memory after the ladder (it stays decommitted); backend_error propagates.
  bool recommit(arena_memory& m);

  /// The region blocks of a plan placed in `m`: request i at `offsets[i]`, owned by `owner`,
  /// which counts in live_region_bytes() until it gives them back. Throws std::bad_alloc and
  /// size_error. Given back with take_back_regions.
  region_block* make_regions(region_owner& owner, const arena_memory& m, const std::vector<planned_request>& requests,
                             const std::vector<std::size_t>& offsets);
  /// `owner`'s region blocks (none live) are deleted.
  void take_back_regions(const region_owner& owner, region_block* regions) noexcept;
  /// Bytes of live regions of every plan with region blocks, kept by the store or not (dropped,
  /// or moved to a larger arena, while an escaped region keeps it): the stats' plan_live_bytes.
  [[nodiscard]] std::size_t live_region_bytes() const noexcept;

  /// Bytes held from backends by every arena of this source now, those replaced but still pinned
  /// by a live region (or held by a run) included: the stats' arena_bytes.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }

 private:
  bool commit_more(arena_memory& m, std::size_t bytes);  // m.region: commit [m.committed, bytes)
  static void drop_region(arena_memory& m) noexcept;
  void charge(std::size_t bytes) noexcept;    // counted here and in the cache's reserved bytes
  void uncharge(std::size_t bytes) noexcept;

  cache_state& cache_;
  reserved_counter& reserved_;
  std::atomic<std::size_t> bytes_{0};
  mutable std::mutex owners_mutex_;  // a leaf lock: nothing is taken or waited for under it
  std::vector<const region_owner*> owners_;
};

}  // namespace refpool::detail
