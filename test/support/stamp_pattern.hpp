// The owner's stamp as bytes: what a test writes into a buffer it owns so that a second owner
// shows. Byte i of a buffer stamped with `s` is byte i % 8 of the word s + (i / 8) * step (in the
// machine's byte order), so every 8-byte word differs from its neighbours and from the words of
// any other stamp, and a shifted or partial overwrite shows too.
//
// Raw bytes, no refpool and no Catch2: for stamped.hpp, for the fuzz harness (which stamps views
// at byte offsets, so `from` says where in the stamped buffer `p` starts), and for programs that
// are not Catch2 tests. Thread safety: pure functions; writing and checking one buffer from two
// threads at once is the caller's race.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>

namespace refpool::test {

/// Distance between consecutive words of one stamp (2^64 / golden ratio: consecutive words share
/// no bytes in practice).
inline constexpr std::uint64_t stamp_step = 0x9E3779B97F4A7C15ull;

/// Word `word` of a buffer stamped with `stamp`.
[[nodiscard]] constexpr std::uint64_t stamp_word(std::uint64_t stamp, std::size_t word) noexcept {
  return stamp + static_cast<std::uint64_t>(word) * stamp_step;
}

/// Byte `i` of a buffer stamped with `stamp`.
[[nodiscard]] inline unsigned char stamp_byte(std::uint64_t stamp, std::size_t i) noexcept {
  const std::uint64_t word = stamp_word(stamp, i / 8);
  unsigned char bytes[8];
  std::memcpy(bytes, &word, 8);
  return bytes[i % 8];
}

/// Writes bytes from .. from + bytes - 1 of the pattern of `stamp` to p[0] .. p[bytes - 1].
inline void write_stamp(void* p, std::size_t bytes, std::uint64_t stamp, std::size_t from = 0) noexcept {
  auto* out = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i < bytes && (from + i) % 8 != 0; ++i) out[i] = stamp_byte(stamp, from + i);
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t word = stamp_word(stamp, (from + i) / 8);
    std::memcpy(out + i, &word, 8);
  }
  for (; i < bytes; ++i) out[i] = stamp_byte(stamp, from + i);
}

/// The first i < bytes where p[i] is not byte from + i of the pattern of `stamp`; none when the
/// bytes hold the stamp (an intact buffer).
[[nodiscard]] inline std::optional<std::size_t> first_foreign_byte(const void* p, std::size_t bytes,
                                                                   std::uint64_t stamp, std::size_t from = 0) noexcept {
  const auto* in = static_cast<const unsigned char*>(p);
  std::size_t i = 0;
  for (; i < bytes && (from + i) % 8 != 0; ++i)
    if (in[i] != stamp_byte(stamp, from + i)) return i;
  for (; i + 8 <= bytes; i += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, in + i, 8);
    if (word != stamp_word(stamp, (from + i) / 8)) break;  // the byte loop below finds which
  }
  for (; i < bytes; ++i)
    if (in[i] != stamp_byte(stamp, from + i)) return i;
  return std::nullopt;
}

}  // namespace refpool::test
