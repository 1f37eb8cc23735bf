// The cache's side of segments (docs/design.md, "Segments"): idle pieces in its slots given back
// to their heap when a miss needs room (the segment source, segment_source.cpp, asks), the piece
// unit in keys. (Their check for tests is test tooling: test/support/cache_check.cpp.) Locks: cache_heap.hpp.
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
  if (slots_.all.size() == 1) return given;
  // Then the other slots', as an intruder: all of them with one barrier.
  pieces.clear();
  intrude_all();
  try {
    for (const auto& other : slots_.all) {
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

std::size_t cache_state::return_pieces(cache_heap& h, std::span<block* const> pieces) noexcept {
  counters_.count_left(segment_pieces_.return_pieces(h, pieces));
  return pieces.size();
}

}  // namespace refpool::detail
