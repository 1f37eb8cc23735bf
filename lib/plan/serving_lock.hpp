// serving_lock: mutual exclusion for a step's run, free for the thread that serves it now. A step
// is served by any thread, but almost always by one at a time for long stretches (PyTorch: the
// forward pass on the Python thread, the backward pass on the autograd engine's thread, the
// optimizer on the Python thread again). A std::mutex costs two atomic read-modify-writes a
// request: 24 ns on the H200 machine's Xeon, a third of the default path's time (bench/trace_replay).
//
// The serving thread owns a record whose owner_lock it enters with plain stores. Another thread
// takes the serving over ("handover"): it excludes the other takers (handover_), intrudes on the
// owner's record (one process-wide barrier, owner_lock.hpp), publishes a record of its own and
// serves. A thread that entered a record no longer current leaves it and takes over in turn. After
// max_records handovers in one run (threads that interleave freely) every thread takes handover_,
// a spinlock, instead: no barrier a request.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "cache/owner_lock.hpp"
#include "cache/slot.hpp"  // this_thread_token
#include "cache/spinlock.hpp"

namespace refpool::detail {

class serving_lock {
 public:
  /// A thread's way in: the owner enters its record's owner_lock.
  struct record {
    const void* thread = nullptr;  ///< the owner's this_thread_token(); null: the shared record
    owner_lock lock;
  };
  /// What unlock needs to know of how lock() got in.
  struct ticket {
    record* entered;
    enum class way : std::uint8_t { owner_fast, owner_slow, handover } how;
  };

  /// Takes the lock for the calling thread; pass the ticket to unlock. Inline: the serving
  /// thread's way in is a few loads and stores on every request of a step.
  [[nodiscard]] ticket lock() noexcept {
    record* const r = current_.load(std::memory_order_acquire);
    if (r != nullptr && r->thread == this_thread_token() && r->lock.owner_enter_fast()) [[likely]] {
      // A taker publishes its record only while intruding on this one: entered and still
      // current, this thread serves alone.
      if (current_.load(std::memory_order_acquire) == r) [[likely]]
        return {r, ticket::way::owner_fast};
      r->lock.owner_leave(true);
    }
    return lock_slow();
  }
  void unlock(ticket t) noexcept {
    if (t.how == ticket::way::owner_fast) [[likely]]
      t.entered->lock.owner_leave(true);
    else
      unlock_slow(t);
  }

  /// Handovers so far (the first thread's claim counts): for tests.
  [[nodiscard]] int handovers() const noexcept { return used_; }

  /// Records a run may use before all its threads share handover_ (a training step hands over
  /// about three times: forward, backward, optimizer).
  static constexpr int max_records = 16;

 private:
  ticket lock_slow() noexcept;
  void unlock_slow(ticket t) noexcept;
  ticket take_over(const void* me) noexcept;

  std::atomic<record*> current_{nullptr};  // written while holding handover_ and intruding on the old one
  spinlock handover_;
  int used_ = 0;  // records handed out (under handover_)
  std::array<record, max_records> records_;
  record shared_;  // current once the records ran out: every thread takes handover_
};

/// RAII for serving_lock.
class serving_section {
 public:
  explicit serving_section(serving_lock& lock) noexcept : lock_(lock), ticket_(lock.lock()) {}
  ~serving_section() { lock_.unlock(ticket_); }
  serving_section(const serving_section&) = delete;
  serving_section& operator=(const serving_section&) = delete;

 private:
  serving_lock& lock_;
  serving_lock::ticket ticket_;
};

}  // namespace refpool::detail
