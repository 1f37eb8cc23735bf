// tracking_resource: an adaptor for segment tests that passes every call to its upstream and
// keeps the books from the outside: bytes allocated, address space reserved, bytes committed,
// how many requests the upstream refused, and every stream ordering and device-wide wait asked
// for. A heap that leaks or double-frees, or a wait that goes missing, shows up here, whatever
// the heap's own counters say. It may report another memory kind than its upstream's (the
// cache's segment policy depends on it; the memory stays host memory).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool::test {

class tracking_resource final : public resource {
  class tracking_vm final : public virtual_memory {
   public:
    tracking_vm(tracking_resource& owner, virtual_memory& upstream) : owner_(owner), upstream_(upstream) {}
    std::size_t granularity() const noexcept override { return upstream_.granularity(); }
    void* reserve(std::size_t bytes) override {
      void* p = upstream_.reserve(bytes);
      std::lock_guard guard(owner_.mutex_);
      if (p == nullptr) {
        ++owner_.refusals_;
      } else {
        owner_.reservations_[p] = bytes;
        owner_.reserved_ += bytes;
      }
      return p;
    }
    bool commit(void* addr, std::size_t bytes) override {
      const bool ok = upstream_.commit(addr, bytes);
      std::lock_guard guard(owner_.mutex_);
      if (ok) {
        owner_.committed_ += bytes;
        ++owner_.commits_;
      } else {
        ++owner_.refusals_;
      }
      return ok;
    }
    void decommit(void* addr, std::size_t bytes) noexcept override {
      upstream_.decommit(addr, bytes);
      std::lock_guard guard(owner_.mutex_);
      owner_.committed_ -= bytes;
      ++owner_.decommits_;
    }
    void release(void* addr, std::size_t bytes) noexcept override {
      upstream_.release(addr, bytes);
      std::lock_guard guard(owner_.mutex_);
      auto it = owner_.reservations_.find(addr);
      if (it == owner_.reservations_.end() || it->second != bytes)
        ++owner_.bad_releases_;
      else
        owner_.reservations_.erase(it);
      owner_.reserved_ -= bytes;
    }

   private:
    tracking_resource& owner_;
    virtual_memory& upstream_;
  };

 public:
  explicit tracking_resource(std::shared_ptr<resource> upstream, std::optional<memory_kind> reported_kind = {},
                             bool with_address_space = true)
      : upstream_(std::move(upstream)), reported_kind_(reported_kind) {
    if (virtual_memory* vm = upstream_->address_space(); vm != nullptr && with_address_space)
      vm_ = std::make_unique<tracking_vm>(*this, *vm);
  }

  std::string_view name() const noexcept override { return upstream_->name(); }
  device_id device() const noexcept override { return upstream_->device(); }
  memory_kind kind() const noexcept override { return reported_kind_.value_or(upstream_->kind()); }
  std::size_t alignment() const noexcept override { return upstream_->alignment(); }
  void* allocate(std::size_t bytes, stream_ref stream) override {
    void* p = upstream_->allocate(bytes, stream);
    std::lock_guard guard(mutex_);
    if (p == nullptr) {
      ++refusals_;
    } else {
      allocated_ += bytes;
      ++allocations_;
    }
    return p;
  }
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    upstream_->deallocate(ptr, bytes, stream);
    std::lock_guard guard(mutex_);
    allocated_ -= bytes;
    ++deallocations_;
    deallocation_streams_.push_back(stream);
  }
  virtual_memory* address_space() noexcept override { return vm_.get(); }
  void order_streams(stream_ref producer, stream_ref consumer) override {
    upstream_->order_streams(producer, consumer);
    std::lock_guard guard(mutex_);
    orders_.emplace_back(producer, consumer);
  }
  void synchronize() override {
    upstream_->synchronize();
    std::lock_guard guard(mutex_);
    ++synchronizations_;
  }

  /// Backend allocations plus commits outstanding: the memory the heap holds.
  std::size_t held() const {
    std::lock_guard guard(mutex_);
    return allocated_ + committed_;
  }
  std::size_t allocated() const {
    std::lock_guard guard(mutex_);
    return allocated_;
  }
  std::size_t committed() const {
    std::lock_guard guard(mutex_);
    return committed_;
  }
  std::size_t reserved() const {
    std::lock_guard guard(mutex_);
    return reserved_;
  }
  std::size_t reservations() const {
    std::lock_guard guard(mutex_);
    return reservations_.size();
  }
  std::size_t commits() const {
    std::lock_guard guard(mutex_);
    return commits_;
  }
  std::size_t decommits() const {
    std::lock_guard guard(mutex_);
    return decommits_;
  }
  std::size_t allocations() const {
    std::lock_guard guard(mutex_);
    return allocations_;
  }
  std::size_t deallocations() const {
    std::lock_guard guard(mutex_);
    return deallocations_;
  }
  /// Requests the upstream answered with "out of memory" / "no address space".
  std::size_t refusals() const {
    std::lock_guard guard(mutex_);
    return refusals_;
  }
  std::size_t bad_releases() const {
    std::lock_guard guard(mutex_);
    return bad_releases_;
  }
  /// Every order_streams(producer, consumer) so far, in order.
  std::vector<std::pair<stream_ref, stream_ref>> orders() const {
    std::lock_guard guard(mutex_);
    return orders_;
  }
  void clear_orders() {
    std::lock_guard guard(mutex_);
    orders_.clear();
  }
  std::size_t synchronizations() const {
    std::lock_guard guard(mutex_);
    return synchronizations_;
  }
  /// The stream of every deallocate so far, in order.
  std::vector<stream_ref> deallocation_streams() const {
    std::lock_guard guard(mutex_);
    return deallocation_streams_;
  }

 private:
  std::shared_ptr<resource> upstream_;
  std::optional<memory_kind> reported_kind_;
  std::unique_ptr<tracking_vm> vm_;
  mutable std::mutex mutex_;
  std::size_t allocated_ = 0, committed_ = 0, reserved_ = 0;
  std::size_t allocations_ = 0, deallocations_ = 0, commits_ = 0, decommits_ = 0, refusals_ = 0, bad_releases_ = 0;
  std::map<void*, std::size_t> reservations_;
  std::vector<std::pair<stream_ref, stream_ref>> orders_;
  std::vector<stream_ref> deallocation_streams_;
  std::size_t synchronizations_ = 0;
};

}  // namespace refpool::test
