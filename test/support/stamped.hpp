// The stamped-owner check: every buffer a test holds carries its owner's stamp in every byte
// (stamp_pattern.hpp), written once by the owner that allocated it and checked before a hold
// is dropped and whenever the test asks. If refpool ever handed one buffer to two owners at once,
// the later owner's stamp would overwrite the earlier one's, and the earlier owner's next check
// would find a foreign byte (and TSan would see the race).
//
//   stamped_set mine;                                   // this owner's buffers
//   mine.add(empty<std::uint64_t>(be, {64}));           // stamped, kept
//   other.adopt(mine.take(0));                          // handed to another owner, stamp and all
//   CHECK(mine.drop(i));                                // checked, then dropped
//   CHECK(held.damage() == "");                         // all checked; the message says what broke
//
// No Catch2: also for programs that are not Catch2 tests (test/stress/stress_test.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <refpool/array.hpp>

#include "stamp_pattern.hpp"

namespace refpool::test {

/// A hold on a buffer and its owner's stamp. Copies share the buffer (they copy the array): a
/// copy handed to another thread is a shared, read-only hold, and `intact()` may run on every
/// holder at once once the stamp was written (before the buffer was handed over).
struct stamped_buffer {
  refpool::array<std::uint64_t> a;
  std::uint64_t stamp = 0;

  /// True when every byte of the buffer holds the stamp. Throws use_after_free after `a.unsafe_free()`.
  [[nodiscard]] bool intact() const { return !first_foreign_byte(a.data(), a.bytes(), stamp); }

  /// "" when intact; else a sentence naming the buffer, the first foreign byte and both values.
  [[nodiscard]] std::string damage() const {
    const auto i = first_foreign_byte(a.data(), a.bytes(), stamp);
    if (!i) return {};
    return fmt::format(
        "buffer {} ({} B, stamp {:#x}) holds {:#04x} at byte {} where its owner wrote {:#04x}: another owner "
        "wrote it",
        static_cast<const void*>(a.data()), a.bytes(), stamp, reinterpret_cast<const unsigned char*>(a.data())[*i], *i,
        stamp_byte(stamp, *i));
  }
};

/// One owner's live buffers. Each set stamps with its own stamps, unique in the process (a new
/// set takes a new owner number), so buffers of two sets never carry the same pattern. Order is
/// kept: `take` and `drop` close the gap. Thread safety: one thread at a time per set.
class stamped_set {
 public:
  stamped_set() : owner_(next_owner().fetch_add(1, std::memory_order_relaxed) + 1) {}

  /// `a` with this owner's next stamp written into every byte. The set does not keep it (`adopt`).
  [[nodiscard]] stamped_buffer stamp(refpool::array<std::uint64_t> a) {
    stamped_buffer s{std::move(a), (owner_ << 32) + ++stamps_};
    write_stamp(s.a.data(), s.a.bytes(), s.stamp);
    return s;
  }
  /// Stamps `a` and keeps it.
  stamped_buffer& add(refpool::array<std::uint64_t> a) { return adopt(stamp(std::move(a))); }
  /// Keeps a buffer stamped elsewhere (a hand-over from another owner), with its stamp.
  stamped_buffer& adopt(stamped_buffer s) { return live_.emplace_back(std::move(s)); }

  /// Removes buffer `i` and returns it; later buffers keep their order.
  [[nodiscard]] stamped_buffer take(std::size_t i) {
    stamped_buffer s = std::move(live_.at(i));
    live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
    return s;
  }
  /// Checks buffer `i`, then drops this hold on it (through `unsafe_free` when `early`).
  /// True when it was intact.
  [[nodiscard]] bool drop(std::size_t i, bool early = false) {
    stamped_buffer s = take(i);
    const bool was_intact = s.intact();
    if (early) s.a.unsafe_free();
    return was_intact;
  }

  /// "" when every buffer holds only its own stamp; else the first damaged buffer's `damage()`.
  [[nodiscard]] std::string damage() const {
    for (const stamped_buffer& s : live_)
      if (!s.intact()) return s.damage();
    return {};
  }
  /// True when every buffer holds only its own stamp.
  [[nodiscard]] bool check_all() const {
    for (const stamped_buffer& s : live_)
      if (!s.intact()) return false;
    return true;
  }

  [[nodiscard]] std::size_t size() const noexcept { return live_.size(); }
  [[nodiscard]] bool empty() const noexcept { return live_.empty(); }
  stamped_buffer& operator[](std::size_t i) { return live_[i]; }
  const stamped_buffer& operator[](std::size_t i) const { return live_[i]; }
  /// Drops every hold without checking (`damage()` or `check_all()` first).
  void clear() noexcept { live_.clear(); }

 private:
  static std::atomic<std::uint64_t>& next_owner() noexcept {
    static std::atomic<std::uint64_t> owners{0};
    return owners;
  }

  std::vector<stamped_buffer> live_;
  std::uint64_t owner_;
  std::uint64_t stamps_ = 0;
};

}  // namespace refpool::test
