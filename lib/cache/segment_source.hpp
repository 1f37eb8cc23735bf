// Segment pieces: the block source of caches that carve their blocks from segment heaps
// (docs/design.md, "Segments" and "Block sources"). It owns one heap per backend with segments
// (cache_heap.hpp), made on the backend's first miss, and all accounting of their memory: the
// backend's (in the heap's virtual-memory regions, lib/vm) and the cache's reserved bytes, which
// follow each heap's committed bytes. A piece is a cached block like any other in its slot; only
// where its memory comes from and goes back to is here.
//
// Locks. The list of heaps is guarded by the cache's mutex (`mutex_` here is that mutex); each
// heap by its own (cache_heap.hpp). A miss that carves calls back into the cache to give idle
// pieces of its slots back to the heap (cache_state::give_back_idle_pieces).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cache/block_source.hpp"
#include "cache/cache_heap.hpp"
#include "cache/reserved_counter.hpp"

namespace refpool::detail {

class cache_state;

class segment_source final : public block_source {
 public:
  segment_source(cache_state& cache, std::mutex& cache_mutex, reserved_counter& reserved) noexcept
      : cache_(cache), mutex_(cache_mutex), reserved_(reserved) {}
  segment_source(const segment_source&) = delete;
  segment_source& operator=(const segment_source&) = delete;

  block* make(slot& s, backend_state& backend, const block_key& key, std::size_t requested, stream_ref stream) override;
  std::size_t take_back(block* b) noexcept override;
  std::size_t trim(std::size_t keep, const backend_state* only, bool quiet) override;
  void close() noexcept override;
  void add_counters(cache_stats& out) const override;

  /// Gives detached idle pieces of `h` back to it and deletes their blocks. Returns their bytes
  /// (the caller counts them out of the cache).
  std::size_t return_pieces(cache_heap& h, std::span<block* const> pieces) noexcept;
  /// `backend`'s heap if it has one, with one use held. Takes mutex_.
  std::optional<heap_use> find_heap(const backend_state& backend);
  /// A take at an address (cache_state::take_at): a new block of exactly the bytes [address,
  /// address + key.bytes) of `h` for `stream`, homed in `s` and live, as make() makes one. Null
  /// when some byte is in use or the bytes cannot be a piece of `h` (segment_heap::carve_exact):
  /// nothing changed then. Throws as make, out of memory included (no reclaim: the bytes are
  /// the caller's to free).
  block* make_at(slot& s, cache_heap& h, const block_key& key, std::uintptr_t address, stream_ref stream);
  /// For cache_state::check_segments (test/support/cache_check.cpp): checks every heap (segment_heap::check, throws
  /// std::logic_error) and sums the bytes and count of their pieces out. Caller holds the cache's mutex.
  void check(std::size_t& used_bytes, std::size_t& pieces_out) const;

  // ---- spans (docs/segments.md, "One memory space"): what plan arenas are -----------------------
  // Each call uses `backend`'s heap (made on demand: for a backend this cache keeps plain blocks
  // for, a heap of spans alone, each span a segment of its own, one backend allocation as an arena
  // was), under its lock, with the cache's reserved bytes following its committed bytes (a span
  // needs no charge of its own). The streams a span's bytes may still be used on are waited for
  // here (as a piece's are): the holder may use the bytes on `stream` at once. A span is an
  // optimisation: out of memory after the ladder (cache_state::retry_once) is nullopt, not an error.

  /// A new held span of at least `bytes` of `backend`'s memory for `stream`. nullopt: out of
  /// memory, or no heap can serve the backend (an alignment that is not a power of two). Throws
  /// backend_error, size_error, std::bad_alloc (nothing kept).
  std::optional<segment_span*> carve_span(backend_state& backend, std::size_t bytes, stream_ref stream);
  /// Held span `s` is not used now: the heap may yield its bytes. `used_on`: every stream that may
  /// still use them.
  void idle_span(backend_state& backend, segment_span& s, const stream_set& used_on) noexcept;
  /// `s` is used again on `stream` (a yielded one after the cache's idle blocks of the backend went
  /// back to the heap, cache_state::return_idle); true when it moved (it was yielded and its home was taken: a
  /// new s.address(), the holder rebases). nullopt: out of memory, and it stays yielded.
  std::optional<bool> hold_span(backend_state& backend, segment_span& s, stream_ref stream);
  /// Grows held span `s` in place to at least `bytes`. False when the bytes after it are not free
  /// (or out of memory): the holder replaces it. No reclaim: a span in the way is no shortage.
  bool extend_span(backend_state& backend, segment_span& s, std::size_t bytes, stream_ref stream);
  /// `s` goes for good (its record too); its bytes become free, with `used_on`.
  void give_back_span(backend_state& backend, segment_span* s, const stream_set& used_on) noexcept;
  /// The event counts of every heap, those dropped included (span_yields, span_moves,
  /// span_returns: what the fuzzer's coverage check reads). Takes the cache's mutex.
  [[nodiscard]] segment_heap_events span_events() const;
  /// The out-of-memory step: every idle span of `backend`'s heap yields (trim can then give its
  /// bytes back). Returns the bytes yielded.
  std::size_t yield_idle_spans(const backend_state& backend) noexcept;

  // ---- the memory map (segment_source_map.cpp) ------------------------------------------------
  /// Every heap's segments (segment_heap::layout), each heap read under its lock, with its backend.
  /// Caller holds the cache's mutex (heaps are dropped only under it). Throws std::bad_alloc only.
  struct heap_layout {
    const backend_state* backend;
    std::vector<segment_layout> segments;
  };
  [[nodiscard]] std::vector<heap_layout> layouts_locked() const;

 private:
  /// The heap that holds span `s` (carve_span keeps it in the span): no lookup under mutex_, and no
  /// use counted, since a heap that holds a span is never dropped.
  static cache_heap& heap_of(const segment_span& s) noexcept { return *static_cast<cache_heap*>(s.owner_tag); }
  /// The heap for `backend`, made if absent, with one use held for the caller. Takes mutex_.
  /// Throws config_error where no heap can serve the backend (span_options: nullopt).
  heap_use use_heap(backend_state& backend);
  /// The options of a new heap of `backend`: the defaults where this cache carves its blocks from
  /// segments, else those of a heap of spans alone; nullopt when no heap can serve it.
  [[nodiscard]] std::optional<segment_heap_options> heap_options(const backend_state& backend) const;
  /// Every heap (or `backend`'s only), with one use held for the caller. Caller holds mutex_.
  std::vector<heap_use> use_heaps_locked(const backend_state* only = nullptr);
  /// Takes out the heaps that hold no segment and have no user, for the caller to destroy once
  /// it left mutex_ (a heap holds its backend: the last reference may destroy a resource).
  /// Caller holds mutex_.
  std::vector<std::unique_ptr<cache_heap>> drop_empty_heaps_locked() noexcept;
  /// The same, destroying them once it left mutex_. Takes mutex_.
  void drop_empty_heaps() noexcept;
  segment_heap::carved carve(slot& s, cache_heap& h, std::size_t bytes, std::size_t requested, stream_ref stream);
  /// The carved piece `c` of `h` (`backend`'s) becomes block `made` (released to the caller's
  /// return), homed in `s` and live, once `stream` is ordered after the streams that used its
  /// bytes. On a throw the piece goes back to the heap and `made` stays the caller's.
  block* home_piece(slot& s, cache_heap& h, backend_state& backend, const block_key& key,
                    std::unique_ptr<piece_block>& made, const segment_heap::carved& c, stream_ref stream);
  void wait_for_piece(cache_heap& h, const stream_set& waits, stream_ref stream);
  /// A heap of a closed cache: every segment back when nothing is out of it, else every free one
  /// (the rest goes with the last piece or span). Caller holds its lock.
  static void free_or_trim(segment_heap& heap);
  /// Trims `heaps` so that at most `keep` of their bytes stay free, in total.
  std::size_t trim_heaps(const std::vector<heap_use>& heaps, std::size_t keep, bool quiet);

  /// Counts the change in a heap's committed bytes over its lifetime (a grow, trim or release
  /// under the heap's lock) into the cache's reserved bytes.
  class committed_change {
   public:
    committed_change(reserved_counter& reserved, cache_heap& h) noexcept
        : reserved_(reserved), heap_(h.heap), before_(h.heap.committed_bytes()) {}
    ~committed_change() {
      const std::size_t after = heap_.committed_bytes();
      if (after > before_) {
        reserved_.add(after - before_);
      } else if (before_ > after) {
        reserved_.remove(before_ - after);
      }
    }
    committed_change(const committed_change&) = delete;
    committed_change& operator=(const committed_change&) = delete;

   private:
    reserved_counter& reserved_;
    const segment_heap& heap_;
    std::size_t before_;
  };

  cache_state& cache_;
  std::mutex& mutex_;  // the cache's: guards heaps_ and dropped_heap_counts_
  reserved_counter& reserved_;
  std::vector<std::unique_ptr<cache_heap>> heaps_;  // one per backend with segments, made on its first miss
  segment_heap_events dropped_heap_counts_;         // event counters of heaps dropped since
};

}  // namespace refpool::detail
