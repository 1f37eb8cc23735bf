// Resource adaptors that wrap another resource: a byte limit, and the same for virtual memory, so
// segment growth can be limited. Fault injection for tests is in the test-support library (test/support/fault_injection.hpp).
#pragma once

#include <refpool/detail/export.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool {

/// A count of bytes in use against a capacity, shared by the adaptors that charge it
/// (a limiting_resource and its address space charge one budget). Thread-safe.
class REFPOOL_API byte_budget {
 public:
  explicit byte_budget(std::size_t capacity) noexcept : capacity_(capacity) {}
  /// Charges `bytes` if they fit under the capacity; false (and nothing charged) otherwise.
  [[nodiscard]] bool take(std::size_t bytes) noexcept;
  /// Returns bytes charged by take().
  void give_back(std::size_t bytes) noexcept { used_.fetch_sub(bytes); }
  /// Changes the capacity from now on. Bytes already charged stay charged: below them, every
  /// take() fails until enough are given back (PyTorch's set_per_process_memory_fraction).
  void set_capacity(std::size_t capacity) noexcept { capacity_.store(capacity); }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_.load(); }
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(); }

 private:
  std::atomic<std::size_t> capacity_;
  std::atomic<std::size_t> used_{0};
};

/// Virtual memory whose commits fail (return false, i.e. out of memory) when they would take
/// the budget's used bytes past its capacity; decommits give the bytes back. Reservations are
/// address space, not memory, and are not charged. `upstream` is not owned and must outlive
/// the adaptor. Thread-safe.
class REFPOOL_API limiting_virtual_memory final : public virtual_memory {
 public:
  limiting_virtual_memory(virtual_memory& upstream, std::shared_ptr<byte_budget> budget);
  limiting_virtual_memory(virtual_memory& upstream, std::size_t capacity)
      : limiting_virtual_memory(upstream, std::make_shared<byte_budget>(capacity)) {}

  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  void* reserve(std::size_t bytes) override { return upstream_.reserve(bytes); }
  bool commit(void* addr, std::size_t bytes) override;
  void decommit(void* addr, std::size_t bytes) noexcept override;
  void release(void* addr, std::size_t bytes) noexcept override { upstream_.release(addr, bytes); }

  [[nodiscard]] std::size_t capacity() const noexcept { return budget_->capacity(); }
  /// Bytes committed through this adaptor (plus whatever else charges the same budget).
  [[nodiscard]] std::size_t used() const noexcept { return budget_->used(); }

 private:
  virtual_memory& upstream_;
  std::shared_ptr<byte_budget> budget_;
};

/// Base of a resource that wraps another one (its upstream) and changes only some of its calls:
/// forwards device(), kind(), alignment(), order_streams() and synchronize() to the upstream, which
/// it keeps alive. A derived adaptor implements name(), allocate() and deallocate(), and
/// address_space() if it offers one. Thread safety is the upstream's for the forwarded calls.
class REFPOOL_API resource_adaptor : public resource {
 public:
  device_id device() const noexcept override { return upstream_->device(); }
  memory_kind kind() const noexcept override { return upstream_->kind(); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }
  void order_streams(stream_ref producer, stream_ref consumer) override {
    upstream_->order_streams(producer, consumer);
  }
  void synchronize() override { upstream_->synchronize(); }

  /// The wrapped resource.
  [[nodiscard]] resource& upstream() const noexcept { return *upstream_; }

 protected:
  /// Throws invalid_argument, naming `adaptor`, when `upstream` is null.
  resource_adaptor(std::shared_ptr<resource> upstream, std::string_view adaptor);

  std::shared_ptr<resource> upstream_;
};

/// Fails (returns nullptr, i.e. out of memory) any allocation that would take the bytes it
/// has outstanding past `capacity`. Thread-safe.
///
/// Its address space (when the upstream has one) is a limiting_virtual_memory charging the same
/// budget: committed memory is memory, and a limit that commits could bypass would not limit a
/// segment heap that grows through virtual memory. `used()` counts both.
class REFPOOL_API limiting_resource final : public resource_adaptor {
 public:
  limiting_resource(std::shared_ptr<resource> upstream, std::size_t capacity);
  /// Charges `budget`, which others may share and change (byte_budget::set_capacity).
  limiting_resource(std::shared_ptr<resource> upstream, std::shared_ptr<byte_budget> budget);

  std::string_view name() const noexcept override { return name_; }
  void* allocate(std::size_t bytes, stream_ref stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override;
  /// A limiting_virtual_memory over the upstream's address space, or nullptr if it has none.
  virtual_memory* address_space() noexcept override { return address_space_.get(); }

  [[nodiscard]] std::size_t capacity() const noexcept { return budget_->capacity(); }
  /// Bytes allocated plus bytes committed through address_space().
  [[nodiscard]] std::size_t used() const noexcept { return budget_->used(); }

 private:
  std::shared_ptr<byte_budget> budget_;
  std::unique_ptr<limiting_virtual_memory> address_space_;
  std::string name_;
};

/// A new resource for pageable host memory (what host_backend() wraps).
[[nodiscard]] REFPOOL_API std::shared_ptr<resource> make_host_resource();

}  // namespace refpool
