// Resource adaptors that wrap another resource: a byte limit, and fault injection for tests.
#pragma once

#include <refpool/detail/export.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <refpool/resource.hpp>

namespace refpool {

/// Fails (returns nullptr, i.e. out of memory) any allocation that would take the bytes it
/// has outstanding past `capacity`. Thread-safe.
class REFPOOL_API limiting_resource final : public resource {
 public:
  limiting_resource(std::shared_ptr<resource> upstream, std::size_t capacity);

  std::string_view name() const noexcept override { return name_; }
  device_id device() const noexcept override { return upstream_->device(); }
  memory_kind kind() const noexcept override { return upstream_->kind(); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }
  void* allocate(std::size_t bytes, stream_ref stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override;
  void order_streams(stream_ref producer, stream_ref consumer) override {
    upstream_->order_streams(producer, consumer);
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::size_t used() const noexcept { return used_.load(); }

 private:
  std::shared_ptr<resource> upstream_;
  std::size_t capacity_;
  std::atomic<std::size_t> used_{0};
  std::string name_;
};

/// Makes chosen allocation calls fail, for failure tests: calls number `first` to
/// `first + count - 1` (1-based, counted from construction or the last `arm`) return nullptr
/// (out of memory) or throw `backend_error`. Thread-safe.
class REFPOOL_API failing_resource final : public resource {
 public:
  enum class failure { out_of_memory, backend_error };

  explicit failing_resource(std::shared_ptr<resource> upstream);

  /// Fails calls `first` .. `first + count - 1` from now on, in the given way.
  void arm(std::uint64_t first, std::uint64_t count = 1, failure how = failure::out_of_memory);
  /// No more failures.
  void disarm();
  /// allocate() calls since the last arm(), failed ones included.
  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_.load(); }
  /// Calls made to fail since construction.
  [[nodiscard]] std::uint64_t injected() const noexcept { return injected_.load(); }

  std::string_view name() const noexcept override { return name_; }
  device_id device() const noexcept override { return upstream_->device(); }
  memory_kind kind() const noexcept override { return upstream_->kind(); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }
  void* allocate(std::size_t bytes, stream_ref stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override;
  void order_streams(stream_ref producer, stream_ref consumer) override {
    upstream_->order_streams(producer, consumer);
  }

 private:
  std::shared_ptr<resource> upstream_;
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> first_{0};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<failure> how_{failure::out_of_memory};
  std::atomic<std::uint64_t> injected_{0};
  std::string name_;
};

/// A new resource for pageable host memory (what host_backend() wraps).
[[nodiscard]] REFPOOL_API std::shared_ptr<resource> make_host_resource();

}  // namespace refpool
