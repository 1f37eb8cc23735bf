// Free by pointer: for code that hands out raw addresses and gets only the address back
// (framework allocator hooks, C). A data_ref handed to `to_pointer` is kept in a process-wide
// table under its buffer's address until `free_pointer(address)` drops it.
#pragma once

#include <cstddef>

#include <refpool/data_ref.hpp>
#include <refpool/detail/export.hpp>

namespace refpool {

/// Keeps `ref`'s reference in refpool's pointer table and returns the buffer's address. A null
/// handle (a 0-byte request) gives nullptr and keeps nothing. The same buffer may be handed over
/// several times; each handing-over is one reference, dropped by one free_pointer.
/// Thread safety: any thread. A buffer is entered in the table once, at its first hand-over, and
/// stays there while it lives (idle in a cache included); later hand-overs take no lock.
/// Throws `use_after_free` if `ref` was unsafe_freed (the handle is left as it was).
[[nodiscard]] REFPOOL_API void* to_pointer(data_ref&& ref);

/// Drops one reference kept by to_pointer for `ptr` (any thread, no lock: one compare-and-swap).
/// nullptr does nothing. Two frees of one hand-over racing each other: one frees, one throws.
/// Throws `invalid_argument` naming the pointer when refpool keeps nothing under it: a pointer
/// it never handed out, or one already freed (a double free); nothing is freed then.
/// A stale free is not detectable, as with malloc: once the address was freed and handed out
/// again (the cache reuses buffers), a late second free frees the new owner's buffer.
REFPOOL_API void free_pointer(void* ptr);

/// The buffer kept under `ptr`, as a new handle (the kept reference stays). Throws
/// `invalid_argument` as free_pointer does.
[[nodiscard]] REFPOOL_API data_ref pointer_ref(void* ptr);

}  // namespace refpool
