// Under AddressSanitizer, free bytes of host segments are poisoned, so a write through a piece
// after it was given back is reported (a segment is one allocation to ASan, which therefore
// cannot see the pieces' own bounds). Without ASan these are no-ops.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__SANITIZE_ADDRESS__)
#define REFPOOL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REFPOOL_ASAN 1
#endif
#endif

#ifdef REFPOOL_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace refpool::detail {

inline void poison_bytes(std::uintptr_t address, std::size_t bytes) noexcept {
#ifdef REFPOOL_ASAN
  ASAN_POISON_MEMORY_REGION(reinterpret_cast<void*>(address), bytes);
#else
  (void)address;
  (void)bytes;
#endif
}

inline void unpoison_bytes(std::uintptr_t address, std::size_t bytes) noexcept {
#ifdef REFPOOL_ASAN
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(address), bytes);
#else
  (void)address;
  (void)bytes;
#endif
}

}  // namespace refpool::detail
