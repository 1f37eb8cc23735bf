// The cache's side of segments (docs/design.md, "Segments"): idle pieces in its slots given back
// to their heap when a miss needs room (the segment source, segment_source.cpp, asks), the piece
// unit in keys, and the check of both sides for tests. Locks: cache_heap.hpp.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <exception>
#include <stdexcept>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "cache/cache_state.hpp"

namespace refpool::detail {

namespace {

/// The idle pieces of `h` in `s` that could make room for a piece of `bytes`: those of its
/// pool (pieces of the other pool never coalesce with it). Caller holds `s`.
void collect_idle(const slot& s, const cache_heap& h, std::size_t bytes, std::vector<block*>& out) {
  const piece_list* list = s.find_pieces(h.backend, h.heap.small(bytes));
  if (list == nullptr || list->count == 0) return;
  out.reserve(out.size() + list->count);
  for (piece_block* b = list->first; b != nullptr; b = b->idle_piece_next) out.push_back(b);
}

}  // namespace

void cache_state::throw_piece_rounding_overflow(std::size_t bytes, std::size_t unit) {
  throw size_error(
      fmt::format("refpool: a request rounded to {} B cannot be rounded up to the segment piece unit "
                  "of {} B without overflowing size_t",
                  bytes, unit));
}

std::size_t cache_state::give_back_idle_pieces(slot& s, cache_heap& h, std::size_t bytes) {
  std::lock_guard guard(mutex_);               // no intruder touches our slot while we take from it
  std::vector<block*>& pieces = giving_back_;  // keeps its capacity from miss to miss
  pieces.clear();
  {
    // Our own slot first: its owner needs no barrier.
    owner_section section(s.lock);
    collect_idle(s, h, bytes, pieces);  // may throw bad_alloc: nothing taken yet
    detach_idle(s, pieces, 0);
  }
  std::size_t given = return_pieces(h, pieces);
  if (slots_.size() == 1) return given;
  // Then the other slots', as an intruder: all of them with one barrier.
  pieces.clear();
  intrude_all();
  try {
    for (const auto& other : slots_) {
      if (other.get() == &s) continue;
      const std::size_t from = pieces.size();
      collect_idle(*other, h, bytes, pieces);
      detach_idle(*other, pieces, from);
    }
  } catch (...) {
    leave_all();
    given += return_pieces(h, pieces);  // those taken before the list could grow no more
    return given;
  }
  leave_all();
  return given + return_pieces(h, pieces);
}

void cache_state::detach_idle(slot& s, const std::vector<block*>& pieces, std::size_t from) noexcept {
  for (std::size_t i = from; i < pieces.size(); ++i) {
    block* b = pieces[i];
    bucket& home = *b->home;
    home.remove(b);
    remove_idle(s, b);
    s.erase_if_unused(home);                         // a bucket per size ever seen would make every later scan slower
    s.refs.fetch_sub(1, std::memory_order_relaxed);  // it leaves; never the last: the cache is open
  }
}

std::size_t cache_state::return_pieces(cache_heap& h, const std::vector<block*>& pieces) noexcept {
  counters_.count_left(segment_pieces_.return_pieces(h, pieces));
  return pieces.size();
}

// ---- tests --------------------------------------------------------------------------------

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
  for (const auto& s : slots_) {
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
      const bool segmented = bk.key.backend->piece_unit(segments_) != 1;
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
