// The serving lock of a step's run (lib/plan/serving_lock.hpp): free for the thread that serves,
// handed over when another thread comes, shared by everyone once the records run out, and in
// every case one thread inside at a time. Runs in each owner_lock mode (test/meson.build).
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "plan/serving_lock.hpp"

using refpool::detail::serving_lock;
using refpool::detail::serving_section;

namespace {

// What the lock protects: plain ints, so that two threads inside at once are seen (and reported
// by ThreadSanitizer as a race).
struct guarded {
  int inside = 0;
  long entries = 0;
  bool overlapped = false;
  void enter_and_leave() {
    overlapped = overlapped || ++inside != 1;
    ++entries;
    --inside;
  }
};

// Threads that take the lock in turns, `turns` turns of `entries` each, thread t serving turns
// t, t + threads, ...: every turn's first entry is a handover.
void take_turns(serving_lock& lock, guarded& state, int threads, int turns, int entries) {
  std::atomic<int> turn{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int mine = t; mine < turns; mine += threads) {
        while (turn.load(std::memory_order_acquire) != mine) std::this_thread::yield();
        for (int i = 0; i < entries; ++i) {
          const serving_section section(lock);
          state.enter_and_leave();
        }
        turn.store(mine + 1, std::memory_order_release);
      }
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

TEST_CASE("one thread serves a run through one record: its first entry is the only handover") {
  serving_lock lock;
  guarded state;
  for (int i = 0; i < 1000; ++i) {
    const serving_section section(lock);
    state.enter_and_leave();
  }
  CHECK(state.entries == 1000);
  CHECK(lock.handovers() == 1);
}

TEST_CASE("threads that take turns hand the serving over once a turn") {
  serving_lock lock;
  guarded state;
  take_turns(lock, state, 2, 6, 200);  // forward, backward, optimizer, three steps' worth
  CHECK(state.entries == 6 * 200);
  CHECK_FALSE(state.overlapped);
  CHECK(lock.handovers() == 6);
}

TEST_CASE("past its records a run's threads share one spinlock, still one at a time") {
  serving_lock lock;
  guarded state;
  const int turns = serving_lock::max_records + 8;
  take_turns(lock, state, 3, turns, 50);
  CHECK(state.entries == turns * 50);
  CHECK_FALSE(state.overlapped);
  CHECK(lock.handovers() == serving_lock::max_records);
}

TEST_CASE("threads that interleave freely are never inside together") {
  serving_lock lock;
  guarded state;
  constexpr int threads = 4;
  constexpr int entries = 20000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < entries; ++i) {
        const serving_section section(lock);
        state.enter_and_leave();
      }
    });
  }
  for (auto& th : pool) th.join();
  CHECK(state.entries == threads * entries);
  CHECK_FALSE(state.overlapped);
  CHECK(lock.handovers() >= 1);
  CHECK(lock.handovers() <= serving_lock::max_records);
}
