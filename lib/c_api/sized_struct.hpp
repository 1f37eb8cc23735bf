// Structs that grow (refpool.h, "Structs that grow"): the caller passes the size of its struct,
// and the library reads or writes only that many bytes, so a program built against an older or a
// newer refpool.h of the same soname never has bytes written past its struct or read from beyond it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <fmt/format.h>

#include "c_api/support.hpp"

namespace refpool::c_api {

/// The smallest `T` any refpool.h declared: its first field. A struct's first version may hold more,
/// but a size ending inside the first field is never right (refpool_cache_options starts with a
/// 16-byte rounding policy).
template <class T>
inline constexpr std::size_t first_layout_bytes = alignof(T);
template <>
inline constexpr std::size_t first_layout_bytes<refpool_cache_options> = sizeof(refpool_cache_options::rounding);

/// No refpool.h struct will reach this: a larger size is a caller's mistake (a negative int, a
/// byte count of something else), refused before a byte is read or written.
inline constexpr std::size_t max_struct_bytes = std::size_t{1} << 16;

/// Fails (INVALID_ARGUMENT) for a size no refpool.h ever gave `T`: 0, not a multiple of its
/// alignment (sizeof always is one), ending inside its first field, or beyond max_struct_bytes.
template <class T>
void check_struct_size(std::size_t size, const char* function, const char* type) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (size == 0 || size % alignof(T) != 0 || size < first_layout_bytes<T> || size > max_struct_bytes)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: {} bytes is not the size of a {} (pass sizeof(*ptr); this library's is {} bytes)",
                     function, size, type, sizeof(T)));
}

/// Fails (INVALID_ARGUMENT) when the caller's struct at `at` is not aligned as a `T` is.
template <class T>
void check_struct_alignment(const void* at, const char* function, const char* type) {
  if (reinterpret_cast<std::uintptr_t>(at) % alignof(T) != 0)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: the {} at {} is not aligned to {} bytes (not a pointer to one)", function, type, at,
                     alignof(T)));
}

/// Writes `value` into the caller's struct of `size` bytes at `out`: the bytes both know; bytes of a
/// larger caller struct (fields this library lacks) are zeroed; past `size` nothing is touched.
template <class T>
void write_sized(const T& value, void* out, std::size_t size, const char* function, const char* type) {
  if (out == nullptr) fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: out is NULL", function));
  check_struct_size<T>(size, function, type);
  check_struct_alignment<T>(out, function, type);
  const std::size_t known = std::min(size, sizeof(T));
  std::memcpy(out, &value, known);
  if (size > known) std::memset(static_cast<unsigned char*>(out) + known, 0, size - known);
}

/// Reads the caller's struct of `size` bytes at `in` over `base`: fields a smaller struct lacks keep
/// base's values. A larger struct (a newer header) is taken only when every byte past this
/// library's struct is 0, i.e. the fields this library lacks are unset.
template <class T>
T read_sized(const void* in, std::size_t size, T base, const char* function, const char* type) {
  check_struct_size<T>(size, function, type);
  check_struct_alignment<T>(in, function, type);
  const std::size_t known = std::min(size, sizeof(T));
  std::memcpy(&base, in, known);
  const auto* bytes = static_cast<const unsigned char*>(in);
  const auto* set = std::find_if(bytes + known, bytes + size, [](unsigned char b) { return b != 0; });
  if (set != bytes + size)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: byte {} of the caller's {} ({} bytes) is set, but this library (refpool {}) knows "
                     "only its first {} bytes: a field of a newer refpool.h; leave it 0 or use a newer library",
                     function, set - bytes, type, size, REFPOOL_VERSION, sizeof(T)));
  return base;
}

/// Input structs must have no padding at their end: a field appended into it would read the
/// uninitialised padding of an older caller's struct of the same size. Append a field that leaves
/// padding together with an explicit one, so that every layout has a size of its own.
template <class T, std::size_t LastFieldEnd>
constexpr bool ends_without_padding = sizeof(T) == LastFieldEnd;

}  // namespace refpool::c_api
