// The fuzzer's outermost resource: forwards to its upstream and logs every call and its result,
// so the reference model can check each backend call the cache makes, in order.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <vector>

#include <refpool/resource.hpp>

namespace refpool_fuzz {

/// One call the cache made to a backend.
struct backend_event {
  enum class kind { allocate, deallocate, order_streams };
  kind what = kind::allocate;
  int backend = 0;
  std::size_t bytes = 0;
  void* ptr = nullptr;   ///< allocate: the result (null: out of memory); deallocate: the pointer
  bool threw = false;    ///< allocate threw (backend_error)
  void* producer = nullptr;  ///< order_streams
  void* consumer = nullptr;
};

/// Calls of all backends of one input, in order. The harness runs one operation at a time
/// (on the main or the helper thread, never both at once), so a plain vector suffices.
class event_log {
 public:
  void push(const backend_event& e) { events_.push_back(e); }
  /// The next event the model has not consumed yet, or null.
  [[nodiscard]] const backend_event* next() noexcept {
    return read_ < events_.size() ? &events_[read_++] : nullptr;
  }
  [[nodiscard]] std::size_t pending() const noexcept { return events_.size() - read_; }
  [[nodiscard]] const backend_event* peek_pending(std::size_t i) const noexcept {
    return read_ + i < events_.size() ? &events_[read_ + i] : nullptr;
  }
  void clear() noexcept {
    events_.clear();
    read_ = 0;
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

class tracking_resource final : public refpool::resource {
 public:
  tracking_resource(std::shared_ptr<refpool::resource> upstream, int index, event_log& log)
      : upstream_(std::move(upstream)), index_(index), log_(log) {}

  std::string_view name() const noexcept override { return upstream_->name(); }
  refpool::device_id device() const noexcept override { return upstream_->device(); }
  refpool::memory_kind kind() const noexcept override { return upstream_->kind(); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }

  void* allocate(std::size_t bytes, refpool::stream_ref stream) override {
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
};

}  // namespace refpool_fuzz
