// The cache's segment checks for tests (test tooling, not part of librefpool): every heap checked
// (segment_heap::check, segment_check.cpp) and the bytes of pieces the heaps have out matched
// against the cache's blocks. White-box: linked with refpool's own objects.
#include <mutex>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cache/cache_state.hpp"
#include "cache/segment_source.hpp"

namespace refpool::detail {

void segment_source::check(std::size_t& used_bytes, std::size_t& pieces_out) const {
  for (const auto& h : heaps_) {
    std::lock_guard lock(h->mutex);
    h->heap.check();
    const segment_heap_stats st = h->heap.stats();
    used_bytes += st.used_bytes;
    pieces_out += st.pieces_out;
  }
}

void cache_state::check_segments() const {
  auto& self = const_cast<cache_state&>(*this);  // holding slots drains their hand-off lists
  std::lock_guard guard(mutex_);
  std::size_t in_blocks = 0;
  std::size_t idle_pieces = 0;
  self.intrude_all();
  const auto fail = [&](std::string what) {
    self.leave_all();
    throw std::logic_error(std::move(what));
  };
  for (const auto& s : slots_.all) {
    // Every idle piece is listed exactly once, in its bucket's piece list.
    std::size_t listed = 0;
    for (const auto& list : s->piece_lists) {
      std::size_t n = 0;
      for (const piece_block* b = list->first; b != nullptr; b = b->idle_piece_next, ++n)
        if (!b->idle || b->home->pieces != list.get() || b->home->owner != s.get() ||
            (b->idle_piece_next != nullptr && b->idle_piece_next->idle_piece_prev != b))
          fail(fmt::format("refpool: block at {} is in the wrong idle piece list", b->ptr));
      if (n != list->count) fail(fmt::format("refpool: an idle piece list counts {} of its {} blocks", list->count, n));
      listed += n;
    }
    const std::size_t idle_before = idle_pieces;
    s->buckets.for_each([&](const bucket& bk) {
      if (bk.unused()) return;  // holds no block, so nothing holds its key's backend
      const bool segmented = piece_unit(*bk.key.backend, settings_.segments) != 1;
      if ((bk.pieces != nullptr) != segmented)
        fail(fmt::format("refpool: the bucket of {} B has the wrong piece list", bk.key.bytes));
      if (!segmented) return;
      in_blocks += (bk.live + bk.idle.size()) * bk.key.bytes;
      for (const block* idle : bk.idle) {
        const piece_block* b = as_piece(idle);  // the bucket has a piece list: its blocks are pieces
        if (b->source != &segment_pieces_ || b->heap == nullptr || b->piece.bytes != b->capacity ||
            b->piece.address != b->ptr)
          fail(fmt::format("refpool: idle block at {} of {} B is no piece of its heap", b->ptr, b->capacity));
        if (b->heap->heap.small(b->capacity) != bk.pieces->small)
          fail(fmt::format("refpool: idle piece at {} of {} B is listed in the wrong pool", b->ptr, b->capacity));
        ++idle_pieces;
      }
    });
    if (listed != idle_pieces - idle_before)
      fail(
          fmt::format("refpool: idle piece lists hold {} blocks, their buckets {}", listed, idle_pieces - idle_before));
  }
  self.leave_all();
  std::size_t in_heaps = 0;
  std::size_t pieces_out = 0;
  segment_pieces_.check(in_heaps, pieces_out);
  // Before close every piece out is a block of a slot; after it, orphaned slots' live blocks
  // are no longer listed, so only the inequality holds.
  const bool exact = !closed();
  if ((exact && in_heaps != in_blocks) || in_heaps < in_blocks || pieces_out < idle_pieces)
    throw std::logic_error(
        fmt::format("refpool: segment heaps have {} B in {} pieces out, the cache's blocks of "
                    "segmented backends {} B ({} idle pieces)",
                    in_heaps, pieces_out, in_blocks, idle_pieces));
}

}  // namespace refpool::detail
