// The address-ordered list of a segment's ranges: linking a range in and out.
#pragma once

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

}  // namespace refpool::detail
