// owner_lock: mutual exclusion that is free for one thread. A slot is used almost only by the
// thread that leased it (its owner); other threads ("intruders": steals, reclaim, stats, cache
// destruction) come rarely. The owner enters and leaves with plain stores; an intruder takes a
// spinlock, raises a flag and forces every thread of the process through a memory barrier
// (membarrier(2), as folly's asymmetric barrier and liburcu do), so either the owner sees the flag
// and waits, or the intruder sees the owner inside and waits for it to leave.
//
// Where membarrier is unavailable the owner uses a full fence instead, and under ThreadSanitizer
// (which cannot model membarrier) every side takes the spinlock; REFPOOL_OWNER_LOCK=fence or
// =spinlock selects those modes for tests.
#pragma once

#include <atomic>

#include "cache/spinlock.hpp"

namespace refpool::detail {

class owner_lock {
 public:
  // spinlock is 0: the safe mode for anything that would run before the choice is made.
  enum class mode : unsigned char { spinlock, fence, membarrier };
  /// Chooses the process's mode (once, while the library loads: owner_lock_mode).
  static mode choose_mode() noexcept;

  /// The owner's side. Returns a token for owner_leave: true on the fast path.
  [[nodiscard]] bool owner_enter() noexcept {
    if (owner_enter_fast()) [[likely]]
      return true;
    gate_.lock();
    return false;
  }
  /// The owner's fast path alone: true when entered (leave with owner_leave(true)); false, holding
  /// nothing, when an intruder is in or the mode has no fast path.
  [[nodiscard]] bool owner_enter_fast() noexcept {
    const mode m = owner_lock_mode;
    if (m == mode::spinlock) return false;
    busy_.store(true, std::memory_order_relaxed);
    if (m == mode::fence) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the intruder's membarrier is the fence
    }
    if (!intruding_.load(std::memory_order_acquire)) [[likely]]
      return true;
    busy_.store(false, std::memory_order_release);
    return false;
  }
  void owner_leave(bool fast) noexcept {
    if (fast) {
      busy_.store(false, std::memory_order_release);
    } else {
      gate_.unlock();
    }
  }

  /// Any other thread's side (also the owner's, on slow paths). `owner_present` false skips the
  /// barrier: nobody owns the slot now (the caller holds the lock that hands it out).
  void lock(bool owner_present = true) noexcept {
    begin_intrusion();
    if (owner_present) {
      barrier();
      wait_until_owner_out();
    }
  }
  void unlock() noexcept {
    intruding_.store(false, std::memory_order_release);
    gate_.unlock();
  }

  /// lock() in three steps, so that an intruder taking many slots pays for one barrier:
  /// begin_intrusion() on each, one barrier(), then wait_until_owner_out() on each.
  void begin_intrusion() noexcept;
  static void barrier() noexcept;
  void wait_until_owner_out() noexcept;

 private:
  static const mode owner_lock_mode;

  spinlock gate_;  // serialises intruders (and the owner's slow path)
  std::atomic<bool> intruding_{false};
  std::atomic<bool> busy_{false};  // the owner is inside
};

/// Owner-side RAII.
class owner_section {
 public:
  explicit owner_section(owner_lock& lock) noexcept : lock_(lock), fast_(lock.owner_enter()) {}
  ~owner_section() { lock_.owner_leave(fast_); }
  owner_section(const owner_section&) = delete;
  owner_section& operator=(const owner_section&) = delete;

 private:
  owner_lock& lock_;
  bool fast_;
};

}  // namespace refpool::detail
