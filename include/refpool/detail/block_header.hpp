// The part of a block that inline handle code reads: its reference count, address and sizes.
#pragma once

#include <cstddef>

#include <refpool/detail/export.hpp>
#include <refpool/detail/ref_count.hpp>

namespace refpool::detail {

/// First member of every block (lib/cache/block.hpp has the rest).
struct block_header {
  ref_count refs;             ///< user handles (data_ref copies)
  void* ptr = nullptr;        ///< the buffer's address
  std::size_t requested = 0;  ///< bytes of the current request
  std::size_t capacity = 0;   ///< bytes of the block (requested bytes after rounding)
};

/// Called when the last handle of `b` goes away. `via_unsafe_free` is true when that happened
/// through `unsafe_free()`, so the owner can count it.
REFPOOL_API void last_reference_dropped(block_header* b, bool via_unsafe_free) noexcept;

/// Drops one handle's reference.
inline void drop_reference(block_header* b, bool via_unsafe_free) noexcept {
  if (b->refs.decrement_from_handle()) last_reference_dropped(b, via_unsafe_free);
}

}  // namespace refpool::detail
