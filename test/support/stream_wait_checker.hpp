// stream_wait_checker: a host resource (forwarding_resource) that checks, from the outside, that
// bytes last used on a stream are handed out for another stream only after a wait. Every
// order_streams(producer, consumer) and synchronize() is logged with a number from one counter.
// The test tells it what it does with its buffers: take() after each request (the bytes and the
// stream they were asked for), record_stream() for each stream it uses them on too, release()
// around the call that drops the last handle. take() then checks every earlier buffer whose bytes
// overlap the new one and that was released: for each stream it was used on (its own and the
// recorded ones) other than the new one's, the calls logged between that release and this
// take must order the new stream after it (directly, through other streams, or by a
// synchronize). A take that overlaps a buffer still live is reported too. Bytes freed to the
// backend are checked the same way against the stream they are freed on, and forgotten. It offers
// no virtual memory (the cache's segments are then backend allocations): a decommit would
// be a free it does not see.
//
// Numbers are taken under the checker's mutex: a release is numbered before the handle is
// dropped (every call made after that number came after the buffer's last use), a take after the
// request returned (every call the request made has a smaller number). Another thread's call
// that falls between a request's return and its take() counts for it: that can hide a missing
// wait, never report one that was made.
//
// Thread-safe; take() and release() answer with what is wrong (empty when nothing is), so that
// threads need not call Catch2.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>
#include "support/forwarding_resource.hpp"

namespace refpool::test {

class stream_wait_checker final : public forwarding_resource {
 public:
  void order_streams(stream_ref producer, stream_ref consumer) override {
    // As a GPU resource refuses while one of the streams captures a graph: nothing is ordered.
    if (refusing_orders_.load())
      throw stream_order_unavailable("stream_wait_checker: orders refused (as during a graph capture)", 900);
    forwarding_resource::order_streams(producer, consumer);
    std::lock_guard guard(mutex_);
    log_.push_back({++clock_, producer, consumer, false});
  }
  /// Refuses the next `n` allocations (out of memory: the cache reclaims and retries).
  void refuse_allocations(int n) { refusals_.store(n); }
  /// While on, order_streams throws stream_order_unavailable (a graph capture).
  void refuse_orders(bool on) { refusing_orders_.store(on); }
  void* allocate(std::size_t bytes, stream_ref stream) override {
    for (int n = refusals_.load(); n > 0;)
      if (refusals_.compare_exchange_weak(n, n - 1)) return nullptr;
    return forwarding_resource::allocate(bytes, stream);
  }
  /// Bytes going back to the backend: every stream an earlier buffer in them was used on must be
  /// ordered before `stream`, the one they are freed on (the backend reuses them after that
  /// stream's work, as cuMemFreeAsync does). Their records end here: what the backend hands out
  /// again is the backend's to order. A live buffer in them is reported too (problems()).
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    {
      const auto from = reinterpret_cast<std::uintptr_t>(ptr);
      const std::uintptr_t to = from + bytes;
      std::lock_guard guard(mutex_);
      const std::uint64_t now = ++clock_;
      std::erase_if(buffers_, [&](const buffer& b) {
        if (b.to <= from || to <= b.from) return false;
        if (b.released == 0) {
          problems_ +=
              fmt::format("bytes [{:#x}, {:#x}) freed under a live buffer [{:#x}, {:#x}); ", from, to, b.from, b.to);
          return false;
        }
        problems_ += missing_waits(b, from, to, "freed on", stream, now);
        return true;
      });
    }
    forwarding_resource::deallocate(ptr, bytes, stream);
    freed_.fetch_add(bytes);
  }
  void synchronize() override {
    forwarding_resource::synchronize();
    std::lock_guard guard(mutex_);
    log_.push_back({++clock_, {}, {}, true});
  }

  /// `ref` (just handed out) will be used on `stream`. Returns what is wrong with the hand-out:
  /// a missing wait for an earlier user of its bytes, or an overlap with a live buffer.
  std::string take(const data_ref& ref, stream_ref stream) {
    const auto from = reinterpret_cast<std::uintptr_t>(ref.data());
    const std::uintptr_t to = from + ref.bytes();
    std::lock_guard guard(mutex_);
    const std::uint64_t now = ++clock_;
    std::string wrong;
    std::erase_if(buffers_, [&](const buffer& b) {
      if (b.to <= from || to <= b.from) return false;
      if (b.released == 0) {
        wrong += fmt::format("bytes [{:#x}, {:#x}) handed out for stream {} overlap a live buffer [{:#x}, {:#x}); ",
                             from, to, name(stream), b.from, b.to);
        return false;
      }
      wrong += missing_waits(b, from, to, "handed out for", stream, now);
      ++checked_;
      // Bytes it covers whole need no record of their own: a later user overlaps the new buffer,
      // and waiting for that buffer's stream waits for what it waited for.
      return from <= b.from && b.to <= to;
    });
    buffers_.push_back({from, to, {stream}, 0});
    drop_old_calls();
    return wrong;
  }
  /// `ref` is used on `stream` too: forwards to data_ref::record_stream.
  void record_stream(const data_ref& ref, stream_ref stream) {
    ref.record_stream(stream);
    std::lock_guard guard(mutex_);
    if (buffer* b = live_at(ref.data());
        b != nullptr && std::find(b->streams.begin(), b->streams.end(), stream) == b->streams.end())
      b->streams.push_back(stream);
  }
  /// The live buffer at `data` (one the checker took) goes: numbered, then `drop()` (which drops
  /// the last handle: reset, unsafe_free, free_pointer) is called. Returns what is wrong (no such
  /// live buffer).
  template <class Drop>
  std::string release(const void* data, Drop&& drop) {
    std::string wrong;
    {
      std::lock_guard guard(mutex_);
      if (buffer* b = live_at(data); b != nullptr)
        b->released = ++clock_;
      else
        wrong = fmt::format("released {} which the checker does not know as live; ", data);
    }
    std::forward<Drop>(drop)();
    return wrong;
  }
  std::string release(data_ref& ref) {
    return release(ref.data(), [&] { ref.reset(); });
  }

  /// Bytes freed to the backend so far.
  [[nodiscard]] std::size_t freed() const { return freed_.load(); }
  /// What deallocate found wrong so far (empty when nothing).
  [[nodiscard]] std::string problems() const {
    std::lock_guard guard(mutex_);
    return problems_;
  }
  /// Takes that overlapped a released buffer (each checked against its streams).
  [[nodiscard]] std::uint64_t checked() const {
    std::lock_guard guard(mutex_);
    return checked_;
  }
  /// Streams of released buffers that a take or a free did not wait for.
  [[nodiscard]] std::uint64_t missed() const {
    std::lock_guard guard(mutex_);
    return missed_;
  }
  /// order_streams calls logged with `consumer` (and `producer`, when given) so far, still kept:
  /// every one since the oldest released buffer the checker still tracks.
  [[nodiscard]] std::size_t orders_into(stream_ref consumer) const {
    std::lock_guard guard(mutex_);
    return static_cast<std::size_t>(
        std::count_if(log_.begin(), log_.end(), [&](const call& c) { return !c.sync && c.consumer == consumer; }));
  }

 private:
  struct call {
    std::uint64_t at;
    stream_ref producer, consumer;
    bool sync;
  };
  struct buffer {
    std::uintptr_t from, to;
    std::vector<stream_ref> streams;  ///< its own, then the recorded ones
    std::uint64_t released;           ///< 0 while live
  };

  static std::string name(stream_ref s) { return fmt::format("{}", s.handle); }

  buffer* live_at(const void* data) {
    const auto at = reinterpret_cast<std::uintptr_t>(data);
    for (buffer& b : buffers_)
      if (b.released == 0 && b.from == at) return &b;
    return nullptr;
  }
  /// The streams of released buffer `b` that nothing ordered before `consumer` by `now`, when
  /// bytes [from, to) go to it (`what`: "handed out for", "freed on"); each counts as missed.
  std::string missing_waits(const buffer& b, std::uintptr_t from, std::uintptr_t to, std::string_view what,
                            stream_ref consumer, std::uint64_t now) {
    std::string out;
    for (stream_ref s : b.streams) {
      if (s == consumer || ordered_after(s, consumer, b.released, now)) continue;
      ++missed_;
      out += fmt::format(
          "bytes [{:#x}, {:#x}) {} stream {} without a wait for stream {}, which used [{:#x}, {:#x}) until its "
          "release (#{}; now #{}); ",
          from, to, what, name(consumer), name(s), b.from, b.to, b.released, now);
    }
    return out;
  }
  /// Whether the calls numbered in (after, before) order `consumer` after `producer`'s work.
  bool ordered_after(stream_ref producer, stream_ref consumer, std::uint64_t after, std::uint64_t before) const {
    std::vector<stream_ref> reached{producer};
    for (const call& c : log_) {
      if (c.at <= after || c.at >= before) continue;
      if (c.sync) return true;
      if (std::find(reached.begin(), reached.end(), c.producer) != reached.end() &&
          std::find(reached.begin(), reached.end(), c.consumer) == reached.end())
        reached.push_back(c.consumer);
    }
    return std::find(reached.begin(), reached.end(), consumer) != reached.end();
  }
  /// Calls older than every release still tracked can order nothing a later take checks.
  void drop_old_calls() {
    std::uint64_t oldest = clock_;
    for (const buffer& b : buffers_)
      if (b.released != 0) oldest = std::min(oldest, b.released);
    while (!log_.empty() && log_.front().at < oldest) log_.pop_front();
  }

  mutable std::mutex mutex_;
  std::uint64_t clock_ = 0;
  std::deque<call> log_;
  std::vector<buffer> buffers_;
  std::uint64_t checked_ = 0, missed_ = 0;
  std::string problems_;
  std::atomic<int> refusals_{0};
  std::atomic<bool> refusing_orders_{false};
  std::atomic<std::size_t> freed_{0};
};

}  // namespace refpool::test
