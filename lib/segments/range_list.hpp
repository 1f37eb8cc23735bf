// The address-ordered list of a segment's ranges: linking a range in and out, and joining free
// neighbours.
#pragma once

#include <cstdint>

#include "free_index.hpp"
#include "segment.hpp"

namespace refpool::detail {

/// Links `b` into `seg`'s list right after `a`, or first when `a` is null.
inline void link_after(segment& seg, range* a, range* b) noexcept {
  b->prev = a;
  b->next = a != nullptr ? a->next : seg.first;
  if (b->next != nullptr)
    b->next->prev = b;
  else
    seg.last = b;
  if (a != nullptr)
    a->next = b;
  else
    seg.first = b;
}

inline void unlink(segment& seg, range* r) noexcept {
  if (r->prev != nullptr)
    r->prev->next = r->next;
  else
    seg.first = r->next;
  if (r->next != nullptr)
    r->next->prev = r->prev;
  else
    seg.last = r->prev;
}

/// True when `a` and `b` are free and touch (no hole between them): they must be one range.
inline bool joinable(const range* a, const range* b) noexcept {
  return a != nullptr && b != nullptr && a->free && b->free && a->end() == b->address;
}

/// Joins free range `r` of `seg` (not in `index`) with the free ranges that touch it, uniting their
/// streams: those leave `index` and the list and go to `retire` (their records). Returns the joined
/// range, not in `index`; counts each join in `merges` when given. Inline: it is on give_back's path.
template <class Retire>
inline range* join_free_neighbours(segment& seg, free_index& index, range* r, std::uint64_t* merges,
                                   Retire retire) noexcept {
  if (range* before = r->prev; joinable(before, r)) {
    index.erase(before);
    before->bytes += r->bytes;
    before->streams.merge(r->streams);
    unlink(seg, r);
    retire(r);
    r = before;
    if (merges != nullptr) ++*merges;
  }
  if (range* after = r->next; joinable(r, after)) {
    index.erase(after);
    r->bytes += after->bytes;
    r->streams.merge(after->streams);
    unlink(seg, after);
    retire(after);
    if (merges != nullptr) ++*merges;
  }
  return r;
}

}  // namespace refpool::detail
