// stream_set: the streams whose work may still touch some bytes of a free range, so that the
// next user of those bytes can be ordered after every one of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <refpool/types.hpp>

namespace refpool::detail {

/// A small set of stream handles, or "any stream" once more than `capacity` distinct streams
/// were added. "Any" keeps the promise (never lose a wait) without growing: whoever takes
/// bytes marked "any" must wait for all work on the device before using them (docs/segments.md,
/// "Streams"). Not thread-safe; a plain value.
class stream_set {
 public:
  /// Eight handles: a compute stream, a few copy streams and a communication stream cover the
  /// programs refpool serves; a free range that has seen more distinct streams than that is
  /// rare (and its next user pays one device synchronisation). 8 handles keep a set at 72 B.
  static constexpr std::size_t capacity = 8;

  stream_set() noexcept = default;
  /// The set of one stream.
  stream_set(stream_ref s) noexcept { add(s); }  // NOLINT: implicit, a stream is a set of one

  /// "Any stream": the streams are no longer known.
  [[nodiscard]] static stream_set any_stream() noexcept {
    stream_set s;
    s.any_ = true;
    return s;
  }

  void add(stream_ref s) noexcept {
    if (any_ || contains(s)) return;
    if (size_ == capacity) {
      any_ = true;
      size_ = 0;
      return;
    }
    streams_[size_++] = s;
  }
  void merge(const stream_set& other) noexcept {
    if (other.any_) {
      any_ = true;
      size_ = 0;
      return;
    }
    for (std::size_t i = 0; i < other.size_; ++i) add(other.streams_[i]);
  }
  /// This set without `s` (the stream that asks needs no wait on itself). "Any" stays "any".
  [[nodiscard]] stream_set without(stream_ref s) const noexcept {
    stream_set out;
    out.any_ = any_;
    for (std::size_t i = 0; i < size_; ++i)
      if (!(streams_[i] == s)) out.streams_[out.size_++] = streams_[i];
    return out;
  }
  void clear() noexcept {
    any_ = false;
    size_ = 0;
  }

  /// True once the streams are no longer known: wait for the whole device.
  [[nodiscard]] bool any() const noexcept { return any_; }
  [[nodiscard]] bool empty() const noexcept { return !any_ && size_ == 0; }
  /// Number of known streams (0 when any()).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True if `s` is in the set, or the set is "any".
  [[nodiscard]] bool contains(stream_ref s) const noexcept {
    if (any_) return true;
    for (std::size_t i = 0; i < size_; ++i)
      if (streams_[i] == s) return true;
    return false;
  }
  [[nodiscard]] const stream_ref* begin() const noexcept { return streams_.data(); }
  [[nodiscard]] const stream_ref* end() const noexcept { return streams_.data() + size_; }

 private:
  std::array<stream_ref, capacity> streams_{};
  std::uint8_t size_ = 0;
  bool any_ = false;
};

}  // namespace refpool::detail
