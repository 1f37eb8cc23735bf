// The GPU resource shared by every runtime: allocation by memory kind, out-of-memory as nullptr
// (so the cache reclaims and retries), stream ordering through an event, and for device memory
// the device's virtual memory where it has it.
#include <atomic>
#include <cstdio>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "gpu/captures.hpp"
#include "runtime_api.hpp"

namespace refpool::detail::gpu {

namespace {

class gpu_resource final : public resource {
 public:
  gpu_resource(const runtime_api& api, int device, memory_kind kind, std::string name)
      : api_(api), device_(device), kind_(kind), name_(std::move(name)) {}

  ~gpu_resource() override {
    if (has_deferred_.load(std::memory_order_relaxed) && !api_.torn_down()) retry_deferred();
    for (const deferred_free& d : deferred_)
      std::fprintf(stderr, "refpool: %s: %zu B at %p not freed: a graph capture still runs on stream %p\n",
                   name_.c_str(), d.bytes, d.ptr, d.stream.handle);
    if (event_ != nullptr) (void)api_.event_destroy(event_);
  }

  std::string_view name() const noexcept override { return name_; }
  device_id device() const noexcept override { return device_; }
  memory_kind kind() const noexcept override { return kind_; }
  // Device allocations are 256-byte aligned by both runtimes; pinned host pages more.
  std::size_t alignment() const noexcept override { return 256; }

  void* allocate(std::size_t bytes, stream_ref stream) override {
    if (has_deferred_.load(std::memory_order_relaxed)) retry_deferred();
    device_guard guard(api_, device_);
    // A capture in global mode (on any stream) must not refuse the allocation. The mode does not
    // change what a stream-ordered allocation on a capturing stream is: a node of its graph.
    const relaxed_capture_mode relaxed(api_);
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
    if (has_deferred_.load(std::memory_order_relaxed)) retry_deferred();
    if (!free_now({ptr, bytes, stream})) defer({ptr, bytes, stream});
  }

  virtual_memory* address_space() noexcept override {
    if (kind_ != memory_kind::device) return nullptr;  // pinned to the device: only device memory
    std::call_once(address_space_once_, [&] { address_space_ = make_virtual_memory(api_, device_); });
    return address_space_.get();
  }

  // Waits for every stream of the device (the cache's wait for bytes whose last streams it no
  // longer knows: docs/design.md, "Segments").
  void synchronize() override {
    const device_wait wait = permit_device_wait(device_, nullptr);
    if (!wait)  // the wait would fail and break the capture: the caller keeps the memory
      throw stream_order_unavailable(
          fmt::format("refpool: cannot wait for device {} while a graph capture may run on it", device_),
          capture_unsupported);
    device_guard guard(api_, device_);
    const status code = api_.device_synchronize();
    if (api_.context_gone(code)) return;  // at exit: nothing of the device is in flight any more
    if (code == capture_unsupported)      // a stream of the device captures: the caller keeps the memory
      throw stream_order_unavailable(
          fmt::format("refpool: cannot wait for device {} while one of its streams captures a graph ({})", device_,
                      api_.error_name(code)),
          code);
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
    check_same_capture(producer.handle, waiter);
    // One event suffices: a wait captures the event's latest record when it is enqueued.
    std::lock_guard lock(event_mutex_);
    if (event_ == nullptr) check(api_, api_.event_create(&event_), api_.event_create.name);
    check(api_, api_.event_record(event_, producer.handle), api_.event_record.name, "stream ordering");
    check(api_, api_.stream_wait_event(waiter, event_), api_.stream_wait_event.name, "stream ordering");
  }

 private:
  struct deferred_free {
    void* ptr;
    std::size_t bytes;
    stream_ref stream;
  };

  // Frees `d`, or returns false where that is illegal now: a stream-ordered free on a capturing
  // stream (it would become a node of the graph), or a free the runtime refused because a stream
  // captures. Failures for other reasons are reported: the memory goes with the context.
  bool free_now(const deferred_free& d) noexcept {
    try {
      device_guard guard(api_, device_);
      const relaxed_capture_mode relaxed(api_);
      status code = api_.success;
      std::string_view call;
      switch (kind_) {
        case memory_kind::device:
          code = api_.mem_free(d.ptr);
          call = api_.mem_free.name;
          break;
        case memory_kind::device_async: {  // a destroyed last stream was synchronised: free on the default one
          const retirement_lock streams;
          const handle on = streams.retired(d.stream.handle) ? nullptr : d.stream.handle;
          if (capture(on).status != capture_status::none) return false;
          code = api_.mem_free_async(d.ptr, on);
          call = api_.mem_free_async.name;
          break;
        }
        case memory_kind::pinned_host:
          code = api_.host_free(d.ptr);
          call = api_.host_free.name;
          break;
        case memory_kind::host: break;
      }
      if (code == capture_unsupported) return false;
      check(api_, code, call, fmt::format("{} B at {} on device {}", d.bytes, d.ptr, device_));
    } catch (const std::exception& e) {
      // Cannot throw from here; a failed free at shutdown is worth a line, not a crash.
      std::fprintf(stderr, "%s\n", e.what());
    }
    return true;
  }

  void defer(const deferred_free& d) noexcept {
    std::lock_guard lock(deferred_mutex_);
    try {
      deferred_.push_back(d);
      has_deferred_.store(true, std::memory_order_relaxed);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "refpool: %s: %zu B at %p kept by a graph capture is lost\n", name_.c_str(), d.bytes, d.ptr);
    }
  }

  // The frees kept while a capture ran, tried again (at the next allocate or deallocate).
  void retry_deferred() noexcept {
    std::vector<deferred_free> waiting;
    {
      std::lock_guard lock(deferred_mutex_);
      waiting.swap(deferred_);
      has_deferred_.store(false, std::memory_order_relaxed);
    }
    for (const deferred_free& d : waiting)
      if (!free_now(d)) defer(d);
  }

  // cudaErrorStreamCaptureUnsupported and hipErrorStreamCaptureUnsupported: the code both runtimes
  // return for a device-wide wait while a stream of the device captures.
  static constexpr status capture_unsupported = 900;

  struct capture_of {
    capture_status status = capture_status::none;
    unsigned long long id = 0;
  };
  capture_of capture(handle stream) const {
    capture_of c;
    if (stream == nullptr) return c;  // the null stream never captures (and asking may break a capture)
    check(api_, api_.stream_capture(stream, &c.status, &c.id), api_.stream_capture.name, "stream ordering");
    return c;
  }

  // An event recorded in a capture and waited for by a stream outside it joins that stream to the
  // capture (which then cannot end: the stream never rejoins it); a capturing stream waiting for an
  // event of another capture, or of none, invalidates its capture. Only streams outside any capture,
  // or in the same one, can be ordered: otherwise throws before enqueuing anything.
  void check_same_capture(handle producer, handle consumer) const {
    const capture_of p = capture(producer);
    const capture_of c = capture(consumer);
    if (p.status == capture_status::none && c.status == capture_status::none) return;
    if (p.status == capture_status::active && c.status == capture_status::active && p.id == c.id) return;
    const auto text = [](const capture_of& x) {
      return x.status == capture_status::none
                 ? std::string("captures nothing")
                 : fmt::format("{} capture {}", x.status == capture_status::active ? "is in" : "is in invalidated",
                               x.id);
    };
    throw stream_order_unavailable(
        fmt::format("refpool: cannot order stream {} after stream {} on device {} now: the producer {} and the "
                    "consumer {} (an event wait across a graph capture's boundary would join or break the capture)",
                    consumer, producer, device_, text(p), text(c)),
        capture_unsupported);
  }

  const runtime_api& api_;
  const int device_;
  const memory_kind kind_;
  const std::string name_;
  std::mutex event_mutex_;
  handle event_ = nullptr;
  std::mutex deferred_mutex_;
  std::atomic<bool> has_deferred_{false};
  std::vector<deferred_free> deferred_;  // frees a graph capture kept back
  std::once_flag address_space_once_;
  std::unique_ptr<virtual_memory> address_space_;
};

}  // namespace

std::shared_ptr<resource> make_resource(const runtime_api& api, int device, memory_kind kind, std::string name) {
  return std::make_shared<gpu_resource>(api, device, kind, std::move(name));
}

}  // namespace refpool::detail::gpu
