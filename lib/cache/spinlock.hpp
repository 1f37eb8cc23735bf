// A lock for short critical sections that are almost never contended (a scope's own state):
// one atomic exchange to take, one store to give back. Yields while another thread holds it.
#pragma once

#include <atomic>
#include <thread>

namespace refpool::detail {

class spinlock {
 public:
  void lock() noexcept {
    if (locked_.exchange(true, std::memory_order_acquire)) [[unlikely]]
      lock_contended();
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  // Out of line: the callers' fast paths then keep no registers for the loop (callgrind counted
  // 8-16 more instructions a request where it was inlined).
  [[gnu::noinline, gnu::cold]] void lock_contended() noexcept {
    do {
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins > 64) std::this_thread::yield();
      }
    } while (locked_.exchange(true, std::memory_order_acquire));
  }

  std::atomic<bool> locked_{false};
};

}  // namespace refpool::detail
