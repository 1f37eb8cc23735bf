// The part of a block that inline handle code touches: its reference count.
#pragma once

#include <atomic>
#include <cstdint>

namespace refpool::detail {

/// First member of every block. `refs` counts user handles (data_ref copies).
struct block_header {
  std::atomic<std::uint32_t> refs{0};
};

/// Called when the last handle of `b` goes away. `via_unsafe_free` is true when that happened
/// through `unsafe_free()`, so the cache can count it.
void last_reference_dropped(block_header* b, bool via_unsafe_free) noexcept;

/// Drops one reference. When the caller's handle is the only one, no other thread can copy it,
/// so a plain load replaces the read-modify-write on the common path.
inline void drop_reference(block_header* b, bool via_unsafe_free) noexcept {
  if (b->refs.load(std::memory_order_acquire) == 1 ||
      b->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    last_reference_dropped(b, via_unsafe_free);
  }
}

}  // namespace refpool::detail
