// A block source: where a cache's misses get memory and where memory leaving the cache goes
// (docs/design.md, "Block sources"). The cache keeps slots, idle lists, limits and its counters;
// a source keeps the memory: how it is got (with the out-of-memory ladder), what it costs in
// the backend's and the cache's accounting, and how it goes back. Two sources: whole blocks
// straight from a backend (whole_blocks.hpp) and pieces of segment heaps (segment_source.hpp).
// Plan arenas are the third kind of memory, reached through request_router, not through a miss;
// their source is the plan store's (lib/plan/arena_source.hpp).
//
// Called only on slow paths (a miss, a block leaving the cache, reclaim, close, stats), never on a
// hit or on a release into a slot: the virtual call costs nothing there.
#pragma once

#include <cstddef>

#include <refpool/stats.hpp>
#include <refpool/types.hpp>

namespace refpool::detail {

class backend_state;
struct block;
struct block_key;
struct slot;

class block_source {
 public:
  /// A miss: a new block of `key.bytes` for `stream`, homed in `s` and live
  /// (cache_state::home_new_block), its memory counted. When the backend is out of memory, the
  /// cache's idle memory of `backend` is reclaimed and the request retried once
  /// (cache_state::reclaim_for_retry), then out_of_memory is thrown. Throws std::bad_alloc and
  /// backend errors too; on a throw nothing is kept and nothing stays counted. Caller owns `s`.
  virtual block* make(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                      stream_ref stream) = 0;
  /// Idle (or orphaned) block `b` of this source left the cache: its memory goes back to where it
  /// came from, uncounted, and the block is deleted. Returns the bytes given back to backends now
  /// (0 where the memory stays with the source until a trim).
  virtual std::size_t take_back(block* b) noexcept = 0;
  /// Gives free memory that the source keeps outside blocks back to backends, so that at most
  /// `keep` bytes of it stay; only `only`'s when not null. A trim of every backend also forgets
  /// what the source keeps for backends it has nothing left of. `quiet`: failures are reported on
  /// stderr instead of thrown. Takes the cache's mutex. Returns the bytes given back.
  virtual std::size_t trim(std::size_t keep, const backend_state* only, bool quiet) = 0;
  /// The cache closed: what the source keeps goes back now, the rest with the last blocks.
  virtual void close() noexcept = 0;
  /// Adds its counters to `out`. Caller holds the cache's mutex.
  virtual void add_counters(cache_stats& out) const = 0;

 protected:
  ~block_source() = default;
};

}  // namespace refpool::detail
