// Segments and ranges: the records a segment_heap keeps. A segment is one backend allocation,
// or one reserved address range grown by commits; it is cut into ranges in address order, each
// either a piece handed out or free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stream_set.hpp"

namespace refpool::detail {

struct segment;

/// The two pools of a heap (docs/segments.md, "Size classes").
enum class pool_id : std::uint8_t { small = 0, large = 1 };

/// A byte range of a segment: a piece handed out, or free. Neighbours in address order are
/// linked, and two free ranges are never neighbours (give_back coalesces them).
struct range {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  segment* owner = nullptr;
  range* prev = nullptr;
  range* next = nullptr;
  bool free = true;
  /// Free ranges: every stream whose work may still touch these bytes. Pieces: unused.
  stream_set streams;

  [[nodiscard]] std::uintptr_t end() const noexcept { return address + bytes; }
};

struct segment {
  std::uint64_t id = 0;
  pool_id pool = pool_id::small;
  /// Reserved address space grown by commits; else one backend allocation.
  bool virtual_memory = false;
  /// A pool's growable segment (virtual memory, shared by the pool's requests); false for a
  /// huge request's segment of its own and for backend allocations.
  bool growable = false;
  std::uintptr_t base = 0;
  /// Address space of the segment (its allocation's size without virtual memory).
  std::size_t reserved = 0;
  /// Bytes backed by memory: [base, base + committed). Equals reserved without virtual memory.
  std::size_t committed = 0;
  /// Virtual memory: where each commit ends, as offsets from base, in address order. One
  /// commit is one physical allocation; commits are contiguous from base.
  std::vector<std::size_t> commit_ends;
  range* first = nullptr;
  range* last = nullptr;
  std::size_t pieces = 0;
  /// Heap tick of the last carve or give_back here (trim returns the least recent first).
  std::uint64_t last_use = 0;
};

}  // namespace refpool::detail
