// step_tickets: a step's requests shared out among worker threads. The step's thread opens a step
// of `length` tickets and waits until that many were served; each worker takes tickets until the
// step's share is gone, then makes one late request that races the step's end, and waits for the
// next step.
//
// The order of open() is the point: `done` and `quota` are reset before `tickets`. A worker late
// from the last step may take a ticket the moment `tickets` is reset; its request then counts
// towards this step's `done` against this step's quota. Resetting `tickets` first let such a
// worker take ticket 0 of the new step and add its `done` before the reset: the step waited
// forever for a request that had been served (seen once in about 1,700 runs of plan-hostile).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace refpool::test {

class step_tickets {
 public:
  /// What a worker's call to take() gives it to do.
  enum class turn {
    wait,    ///< no new step since its late request: yield and ask again
    ticket,  ///< one of the step's requests: make it, then call served()
    late,    ///< the step's share is gone: one request that races its end
  };

  /// The step's thread: opens a step of `length` requests.
  void open(std::uint64_t length) noexcept {
    done_ = 0;
    quota_ = length;
    tickets_ = 0;  // last (above)
    generation_.fetch_add(1, std::memory_order_release);
  }
  /// The step's thread: waits until the open step's `length` requests were served.
  void wait_served() const noexcept {
    while (done_.load() < quota_.load()) std::this_thread::yield();
  }

  /// A worker: what to do next. `seen` is the worker's own (0 at first): the step it made its
  /// late request in; `step` is set to the step the turn belongs to (1 for the first).
  turn take(std::uint64_t& seen, std::uint64_t& step) noexcept {
    step = generation_.load(std::memory_order_acquire);
    if (step == seen) return turn::wait;
    if (tickets_.fetch_add(1) < quota_.load()) return turn::ticket;
    seen = step;
    return turn::late;
  }
  /// A worker: its ticket's request was served.
  void served() noexcept { done_ += 1; }

 private:
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::uint64_t> quota_{0};
  std::atomic<std::uint64_t> tickets_{0};
  std::atomic<std::uint64_t> done_{0};
};

}  // namespace refpool::test
