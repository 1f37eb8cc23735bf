// The GPU resource shared by every runtime: allocation by memory kind, out-of-memory as nullptr
// (so the cache reclaims and retries), stream ordering through an event, and for device memory
// the device's virtual memory where it has it.
#include <cstdio>
#include <mutex>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "runtime_api.hpp"

namespace refpool::detail::gpu {

namespace {

class gpu_resource final : public resource {
 public:
  gpu_resource(const runtime_api& api, int device, memory_kind kind, std::string name)
      : api_(api), device_(device), kind_(kind), name_(std::move(name)) {}

  ~gpu_resource() override {
    if (event_ != nullptr) (void)api_.event_destroy(event_);
  }

  std::string_view name() const noexcept override { return name_; }
  device_id device() const noexcept override { return device_; }
  memory_kind kind() const noexcept override { return kind_; }
  // Device allocations are 256-byte aligned by both runtimes; pinned host pages more.
  std::size_t alignment() const noexcept override { return 256; }

  void* allocate(std::size_t bytes, stream_ref stream) override {
    device_guard guard(api_, device_);
    void* ptr = nullptr;
    status code = api_.success;
    std::string_view call;
    switch (kind_) {
      case memory_kind::device:
        code = api_.mem_alloc(&ptr, bytes);
        call = api_.mem_alloc.name;
        break;
      case memory_kind::device_async:
        code = api_.mem_alloc_async(&ptr, bytes, stream.handle);
        call = api_.mem_alloc_async.name;
        break;
      case memory_kind::pinned_host:
        code = api_.host_alloc(&ptr, bytes);
        call = api_.host_alloc.name;
        break;
      case memory_kind::host: throw backend_error("refpool: a GPU resource cannot hand out pageable host memory", -1);
    }
    if (code == api_.out_of_memory) return nullptr;
    check(api_, code, call, fmt::format("{} B on device {}", bytes, device_));
    return ptr;
  }

  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    if (api_.torn_down()) return;  // at exit, after the runtime's teardown
    try {
      device_guard guard(api_, device_);
      status code = api_.success;
      std::string_view call;
      switch (kind_) {
        case memory_kind::device:
          code = api_.mem_free(ptr);
          call = api_.mem_free.name;
          break;
        case memory_kind::device_async: {  // a destroyed last stream was synchronised: free on the default one
          const retirement_lock streams;
          code = api_.mem_free_async(ptr, streams.retired(stream.handle) ? nullptr : stream.handle);
          call = api_.mem_free_async.name;
          break;
        }
        case memory_kind::pinned_host:
          code = api_.host_free(ptr);
          call = api_.host_free.name;
          break;
        case memory_kind::host: break;
      }
      check(api_, code, call, fmt::format("{} B at {} on device {}", bytes, ptr, device_));
    } catch (const std::exception& e) {
      // Cannot throw from here; a failed free at shutdown is worth a line, not a crash.
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  virtual_memory* address_space() noexcept override {
    if (kind_ != memory_kind::device) return nullptr;  // pinned to the device: only device memory
    std::call_once(address_space_once_, [&] { address_space_ = make_virtual_memory(api_, device_); });
    return address_space_.get();
  }

  // Waits for every stream of the device (the cache's wait for bytes whose last streams it no
  // longer knows: docs/design.md, "Segments").
  void synchronize() override {
    device_guard guard(api_, device_);
    const status code = api_.device_synchronize();
    if (api_.context_gone(code)) return;  // at exit: nothing of the device is in flight any more
    check(api_, code, api_.device_synchronize.name, fmt::format("device {}", device_));
  }

  void order_streams(stream_ref producer, stream_ref consumer) override {
    if (producer == consumer) return;
    const retirement_lock streams;  // the streams, if not retired, stay valid until the wait is enqueued
    if (streams.retired(producer.handle)) return;
    // A retired consumer gets no more work; what refpool still enqueues for memory last used on it
    // (a stream-ordered free) goes to the default stream, as deallocate does: that one waits.
    const handle waiter = streams.retired(consumer.handle) ? nullptr : consumer.handle;
    if (waiter == producer.handle) return;
    device_guard guard(api_, device_);
    // One event suffices: a wait captures the event's latest record when it is enqueued.
    std::lock_guard lock(event_mutex_);
    if (event_ == nullptr) check(api_, api_.event_create(&event_), api_.event_create.name);
    check(api_, api_.event_record(event_, producer.handle), api_.event_record.name, "stream ordering");
    check(api_, api_.stream_wait_event(waiter, event_), api_.stream_wait_event.name, "stream ordering");
  }

 private:
  const runtime_api& api_;
  const int device_;
  const memory_kind kind_;
  const std::string name_;
  std::mutex event_mutex_;
  handle event_ = nullptr;
  std::once_flag address_space_once_;
  std::unique_ptr<virtual_memory> address_space_;
};

}  // namespace

std::shared_ptr<resource> make_resource(const runtime_api& api, int device, memory_kind kind, std::string name) {
  return std::make_shared<gpu_resource>(api, device, kind, std::move(name));
}

}  // namespace refpool::detail::gpu
