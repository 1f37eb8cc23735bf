// Segments and ranges: the records a segment_heap keeps. A segment is one backend allocation,
// or one reserved address range backed by commits; its committed bytes are cut into ranges in
// address order, each either a piece handed out or free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stream_set.hpp"
#include "vm/vm_region.hpp"

namespace refpool::detail {

struct segment;

/// The two pools of a heap (docs/segments.md, "Size classes").
enum class pool_id : std::uint8_t { small = 0, large = 1 };

/// A byte range of a segment: a piece handed out, or free. Neighbours in address order are
/// linked, and two free ranges never touch (give_back coalesces them; a hole may lie between).
struct range {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  segment* owner = nullptr;
  range* prev = nullptr;
  range* next = nullptr;
  bool free = true;
  /// A span's range (not free; span.hpp): its record is the heap's one whose node this is. A flag,
  /// not a pointer, so that a range stays 120 B (128 B records cost the carve path 40 instructions
  /// a request in malloc on the GPT trace).
  bool span = false;
  /// Free ranges: every stream whose work may still touch these bytes. Pieces: unused.
  stream_set streams;

  [[nodiscard]] std::uintptr_t end() const noexcept { return address + bytes; }
};

struct segment {
  std::uint64_t id = 0;
  pool_id pool = pool_id::small;
  /// A pool's growable segment (virtual memory, shared by the pool's requests); false for a
  /// huge request's segment of its own and for backend allocations.
  bool growable = false;
  std::uintptr_t base = 0;
  /// Address space of the segment (its allocation's size without virtual memory).
  std::size_t reserved = 0;
  /// Virtual memory: the reservation and its commits (one physical allocation each), in address
  /// order, with uncommitted holes where trim decommitted free commits or growth has not reached
  /// yet. Empty for a backend allocation.
  vm_region vm;
  /// Ranges tile the committed bytes: in address order, touching within a run of contiguous
  /// commits, never crossing a hole.
  range* first = nullptr;
  range* last = nullptr;
  std::size_t pieces = 0;  ///< ranges that are not free: pieces and spans (either keeps the segment)
  /// Heap tick of the last carve or give_back here (trim returns the least recent first).
  std::uint64_t last_use = 0;

  [[nodiscard]] bool virtual_memory() const noexcept { return static_cast<bool>(vm); }
  /// Bytes backed by memory (all of them for a backend allocation).
  [[nodiscard]] std::size_t committed() const noexcept { return vm ? vm.committed() : reserved; }
};

}  // namespace refpool::detail
