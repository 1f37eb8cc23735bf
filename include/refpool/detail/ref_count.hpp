// The one intrusive reference count of refpool (LLVM's ThreadSafeRefCountedBase, written once):
// buffers (block_header), caches, backends, plans, arenas and runs all count with it.
#pragma once

#include <atomic>
#include <cassert>
#include <cstdint>

namespace refpool::detail {

/// An atomic count of owners. Increments are relaxed (a new owner is made from an existing one,
/// which already keeps the object alive); decrements are acq_rel, so the thread that drops the
/// last owner sees every write the others made. Debug builds assert that no count goes below zero.
class ref_count {
 public:
  constexpr explicit ref_count(std::uint32_t initial = 0) noexcept : count_(initial) {}

  void increment() noexcept { count_.fetch_add(1, std::memory_order_relaxed); }

  /// Adds an owner unless none is left (the last one went: the object is being destroyed). For a
  /// pointer that holds no count, whose object removes it under a lock before it is freed: the
  /// holder of that lock may read the object, and keeps it only if this succeeds. Acquire: a 0
  /// read here was written by the last owner's decrement (acq_rel), so a caller that goes on
  /// without the object sees what that owner did before leaving. A plan run that skips a pinned
  /// region of a dying plan reuses its bytes: relaxed, its writes raced the last holder's reads
  /// (ThreadSanitizer, plan-hostile, about once in 300 runs).
  [[nodiscard]] bool increment_if_owned() noexcept {
    std::uint32_t owners = count_.load(std::memory_order_acquire);
    while (owners != 0)
      if (count_.compare_exchange_weak(owners, owners + 1, std::memory_order_acquire)) return true;
    return false;
  }

  /// Drops one owner; true if it was the last.
  [[nodiscard]] bool decrement() noexcept {
    const std::uint32_t before = count_.fetch_sub(1, std::memory_order_acq_rel);
    assert(before != 0 && "refpool: reference count dropped below zero");
    return before == 1;
  }

  /// Drops one owner held by a handle the caller alone can see: when the count is 1 no other
  /// thread can make a new owner, so a plain acquire load replaces the read-modify-write.
  [[nodiscard]] bool decrement_from_handle() noexcept { return only_owner() || decrement(); }

  [[nodiscard]] std::uint32_t load() const noexcept { return count_.load(std::memory_order_relaxed); }
  /// True when the caller's owner is the only one. Acquire, as decrement_from_handle: whatever
  /// the owners that left did before leaving is visible to the caller.
  [[nodiscard]] bool only_owner() const noexcept { return count_.load(std::memory_order_acquire) == 1; }
  /// Sets the count of an object no other thread can reach (one being handed out or recycled).
  void reset(std::uint32_t value) noexcept { count_.store(value, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> count_;
};

}  // namespace refpool::detail
