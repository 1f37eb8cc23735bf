// The arena source: the region blocks that plans hand out of their arenas (docs/design.md, "Block
// sources"), and the way to the segment source whose spans arenas are (issue 36 step 2, work in
// progress: this file becomes region_blocks.{hpp,cpp}). It owns no memory: a span's bytes are the
// heap's, counted there.
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

#include "segments/span.hpp"

namespace refpool::detail {

class backend_state;
class cache_state;
class region_owner;
class reserved_counter;
class segment_source;
struct planned_request;
struct region_block;

/// What growing an arena in place did.
enum class growth_in_place : std::uint8_t {
  cannot,  ///< (unused with spans: kept until the store's replacement path goes)
  fits,    ///< its span holds the bytes already, or will at its next claim
  grown,   ///< its next claim extends its span (in place, or a new span when no room is after it)
};

/// An arena's memory: a span of its backend's segment heap (segment_source), from its first claim.
struct arena_memory {
  backend_state* backend = nullptr;  ///< its arena holds a counted reference
  stream_ref stream;
  segment_span* span = nullptr;  ///< null before the first claim (or after out of memory)
  std::byte* base = nullptr;     ///< the span's address; regions point into it (plan::rebase)
  /// What its plans need: the span's size at the next claim (the store raises it; runs read it).
  std::atomic<std::size_t> needed{0};
};

class arena_source {
 public:
  /// Counts into `cache`'s reserved bytes, retained: ~cache_state drops its own reference before
  /// the store, and so this source and the arenas it frees last, go.
  explicit arena_source(cache_state& cache);
  ~arena_source();
  arena_source(const arena_source&) = delete;
  arena_source& operator=(const arena_source&) = delete;

  /// The segment source whose spans arenas are (the cache's).
  [[nodiscard]] segment_source& spans() const noexcept;
  /// The cache's idle memory of `backend` goes (no trim counted as a retry): before a new span is
  /// first placed, so that the span takes the place of what the plain path held for its requests.
  void reclaim_idle(backend_state& backend) noexcept;

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

  /// Spans extended in place (arena::take, arena::grow_in_place): the stats' arena_growths.
  std::atomic<std::uint64_t> growths{0};
  /// Spans replaced by a larger one at a claim, nothing being live in the old one (no room after
  /// it): counted in the stats' arena_replacements.
  std::atomic<std::uint64_t> span_replacements{0};

 private:
  cache_state& cache_;
  reserved_counter& reserved_;
  mutable std::mutex owners_mutex_;  // a leaf lock: nothing is taken or waited for under it
  std::vector<const region_owner*> owners_;
};

}  // namespace refpool::detail
