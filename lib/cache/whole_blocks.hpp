// Whole blocks: the block source that allocates each block straight from its backend and frees
// it there (docs/design.md, "Block sources"), and the direct blocks that no cache owns. All the
// accounting of such memory is here: the backend's (backend_state::allocate and deallocate), the
// cache's backend_allocations and backend_frees, its reserved bytes, and the uncached blocks made
// for the cache (uncached_allocations, uncached_live_bytes and its peak).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cache/block_source.hpp"
#include "cache/reserved_counter.hpp"

namespace refpool::detail {

class cache_state;

class whole_block_source final : public block_source {
 public:
  whole_block_source(cache_state& cache, reserved_counter& reserved) noexcept : cache_(cache), reserved_(reserved) {}
  whole_block_source(const whole_block_source&) = delete;
  whole_block_source& operator=(const whole_block_source&) = delete;

  block* make(slot& s, backend_state& backend, const block_key& key, std::size_t requested, stream_ref stream) override;
  std::size_t take_back(block* b) noexcept override;
  std::size_t trim(std::size_t, const backend_state*, bool) override { return 0; }  // keeps nothing outside blocks
  void close() noexcept override {}
  void add_counters(cache_stats& out) const override;

  /// `bytes` from `backend` for a request of `requested`, with the out-of-memory ladder: on
  /// failure the cache's idle memory of `backend` goes back and the call is retried once, then
  /// out_of_memory (counted in the cache's ooms) says what the cache holds. Also for uncached blocks.
  void* allocate(backend_state& backend, std::size_t bytes, std::size_t requested, stream_ref stream);

  /// An uncached block of `bytes` for the cache: a direct block from `backend` with the
  /// out-of-memory ladder, counted as uncached and reserved. The cache sets its uncached_for.
  block* make_uncached(backend_state& backend, std::size_t bytes, stream_ref stream);
  /// An uncached block lost its last handle: uncounted, freed to its backend, deleted.
  void take_back_uncached(block* b) noexcept;
  /// The peak of uncached live bytes since the last reset_peaks().
  [[nodiscard]] std::size_t uncached_peak() const noexcept { return peak_uncached_live_bytes_.load(); }
  void reset_peaks() noexcept { peak_uncached_live_bytes_.store(uncached_live_bytes_.load()); }

 private:
  cache_state& cache_;
  reserved_counter& reserved_;
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> frees_{0};
  std::atomic<std::uint64_t> uncached_allocations_{0};
  std::atomic<std::size_t> uncached_live_bytes_{0};
  std::atomic<std::size_t> peak_uncached_live_bytes_{0};
};

/// A block straight from `backend`, owned by no cache: freed to it on its last release.
/// Throws out_of_memory at once (there is no cache to reclaim).
block* allocate_direct(backend_state& backend, std::size_t bytes, stream_ref stream);
/// A direct block over `ptr` (from `backend`, which it holds from now), handed out once.
block* direct_block(block* made, backend_state& backend, void* ptr, std::size_t bytes, stream_ref stream) noexcept;
/// Gives `b`'s memory back to its backend, drops its hold on the backend, deletes it.
void free_block(block* b) noexcept;
/// free_block keeps a block whose recorded streams cannot be ordered before its last stream now (a
/// graph capture: docs/design.md, "Stream safety"); this frees those that can be by now. Every
/// free_block does too.
void free_deferred_blocks() noexcept;

}  // namespace refpool::detail
