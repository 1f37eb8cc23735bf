// The fuzzer's outermost resource: forwards to its upstream and logs every call and its result,
// so the reference model can check each backend call the cache makes, in order.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include <refpool/resource.hpp>

namespace refpool::test::fuzz {

/// One call the cache made to a backend.
struct backend_event {
  enum class kind { allocate, deallocate, order_streams };
  kind what = kind::allocate;
  int backend = 0;
  std::size_t bytes = 0;
  void* ptr = nullptr;       ///< allocate: the result (null: out of memory); deallocate: the pointer
  bool threw = false;        ///< allocate threw (backend_error)
  void* producer = nullptr;  ///< order_streams
  void* consumer = nullptr;
};

/// Calls of all backends of one input, in order. The harness runs one operation at a time
/// (on the main or the helper thread, never both at once; a call held at the gate below logs
/// nothing until it is let go, after the other thread's operation), so a plain vector suffices.
class event_log {
 public:
  void push(const backend_event& e) { events_.push_back(e); }
  /// The next event the model has not consumed yet, or null.
  [[nodiscard]] const backend_event* next() noexcept { return read_ < events_.size() ? &events_[read_++] : nullptr; }
  [[nodiscard]] std::size_t pending() const noexcept { return events_.size() - read_; }
  [[nodiscard]] const backend_event* peek_pending(std::size_t i) const noexcept {
    return read_ + i < events_.size() ? &events_[read_ + i] : nullptr;
  }
  void clear() noexcept {
    events_.clear();
    read_ = 0;
  }
  /// Events logged so far, consumed or not (a position for move_to_front).
  [[nodiscard]] std::size_t logged() const noexcept { return events_.size(); }
  /// Moves the events logged from `from` on to position `at` (<= from), before those logged in
  /// between: effects in the order they landed (a call held at the gate logs after the other
  /// thread's operation, whose effects came after the held call's operation had begun).
  void move_to(std::size_t from, std::size_t at) {
    std::rotate(events_.begin() + static_cast<std::ptrdiff_t>(at), events_.begin() + static_cast<std::ptrdiff_t>(from),
                events_.end());
  }
  /// Forgets consumed events (keeps memory bounded on long inputs).
  void compact() {
    events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(read_));
    read_ = 0;
  }

 private:
  std::vector<backend_event> events_;
  std::size_t read_ = 0;
};

/// Holds one backend call in flight: once armed, the next allocate() (or, armed for frees, the
/// next deallocate()) of any tracked backend waits here, before it reaches its upstream or logs
/// anything, until let go. The harness runs other operations meanwhile (a miss in flight while its
/// cache is destroyed, its step ends; a release's eviction while its cache is destroyed).
class call_gate {
 public:
  void arm(bool frees = false) {
    std::lock_guard lock(mutex_);
    armed_ = true;
    frees_ = frees;
    parked_ = open_ = false;
  }
  /// Disarms; false if no call came.
  bool disarm() {
    std::lock_guard lock(mutex_);
    armed_ = false;
    return parked_;
  }
  [[nodiscard]] bool parked() {
    std::lock_guard lock(mutex_);
    return parked_;
  }
  void let_go() {
    std::lock_guard lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  /// Called by allocate() (`free` false) and deallocate() (true): waits if armed for it (once).
  void pass(bool free = false) {
    std::unique_lock lock(mutex_);
    if (!armed_ || frees_ != free) return;
    armed_ = false;
    parked_ = true;
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_ = false, frees_ = false, parked_ = false, open_ = false;
};

class tracking_resource final : public refpool::resource {
 public:
  tracking_resource(std::shared_ptr<refpool::resource> upstream, int index, event_log& log, call_gate& gate)
      : upstream_(std::move(upstream)), index_(index), log_(log), gate_(gate) {}

  std::string_view name() const noexcept override { return upstream_->name(); }
  refpool::device_id device() const noexcept override { return upstream_->device(); }
  refpool::memory_kind kind() const noexcept override { return upstream_->kind(); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }

  void* allocate(std::size_t bytes, refpool::stream_ref stream) override {
    gate_.pass();
    backend_event e{backend_event::kind::allocate, index_, bytes};
    try {
      e.ptr = upstream_->allocate(bytes, stream);
    } catch (...) {
      e.threw = true;
      log_.push(e);
      throw;
    }
    log_.push(e);
    return e.ptr;
  }
  void deallocate(void* ptr, std::size_t bytes, refpool::stream_ref stream) noexcept override {
    gate_.pass(true);
    log_.push({backend_event::kind::deallocate, index_, bytes, ptr});
    upstream_->deallocate(ptr, bytes, stream);
  }
  void order_streams(refpool::stream_ref producer, refpool::stream_ref consumer) override {
    backend_event e{backend_event::kind::order_streams, index_};
    e.producer = producer.handle;
    e.consumer = consumer.handle;
    log_.push(e);
    upstream_->order_streams(producer, consumer);
  }

 private:
  std::shared_ptr<refpool::resource> upstream_;
  int index_;
  event_log& log_;
  call_gate& gate_;
};

}  // namespace refpool::test::fuzz
