// A span: a range of a segment heap that one owner holds for a long time and places its own blocks
// in (a plan arena: docs/segments.md, "One memory space"). While its owner holds it, a span is a
// pinned range: best fit never carves it and trim never decommits it. When the owner marks it idle,
// the heap may take its bytes back (a yield) when a pool would otherwise grow, or on request (the
// out-of-memory step): they become free ranges like any given-back piece, and trim decommits them
// into holes that growth refills. Holding it again places it at its home address when the bytes
// there are free or uncommitted (committing the holes), else wherever best fit or growth puts it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stream_set.hpp"

namespace refpool::detail {

struct range;
struct segment;

/// A span's record, owned by its heap from carve_span to give_back_span; its owner keeps the
/// pointer. Read by the owner only while it holds the span (the address may change at hold_span).
struct segment_span {
  enum class state : std::uint8_t {
    held,     ///< its owner uses it: a pinned range
    idle,     ///< placed, but its owner uses no byte of it: the heap may yield it
    yielded,  ///< its bytes went back to the heap's free ranges; hold_span places it again
  };

  state now = state::held;
  range* node = nullptr;   ///< its range while placed (held or idle); null once yielded
  std::uintptr_t home = 0;  ///< its address while placed, and where hold_span tries to place it again
  std::size_t bytes = 0;    ///< a multiple of the piece unit
  std::uint64_t id = 0;     ///< numbers spans for stats and messages
  std::uint64_t idle_since = 0;  ///< the heap's tick when it became idle (the least recent yields first)
  /// Whatever the heap's owner keeps it with (the cache's segment source: its cache_heap), set at
  /// carve_span: a span's calls reach its heap without a lookup. The heap never reads it.
  void* owner_tag = nullptr;
  /// Idle: every stream that may still use its bytes (the owner says so at idle_span); they go with
  /// the bytes when it yields.
  stream_set used_on;

  [[nodiscard]] void* address() const noexcept { return reinterpret_cast<void*>(home); }
  [[nodiscard]] bool placed() const noexcept { return now != state::yielded; }
};

/// hold_span's answer: where the span is now and what its holder must wait for.
struct span_hold {
  bool moved = false;  ///< it was yielded and could not go home: a new address (the owner rebases)
  stream_set waits;    ///< streams that may still use its bytes, without the holder's stream
};

}  // namespace refpool::detail
