// Planned runs and record_stream: bytes a region lent to other streams go out again only after
// their next user's stream waits for those streams (docs/design.md, "Planned scopes"). A region
// released after record_stream leaves its streams pending in its arena; the next region handed out
// of that arena orders its stream after them. Each case drives planned scopes or steps over a host
// backend whose resource (support/stream_wait_checker.hpp) logs every order_streams call and
// checks each hand-out against every earlier buffer its bytes overlap: a missing wait fails the
// case, whichever path (a region, the plain cache, the segment heap) handed the bytes out.
//
// The deterministic cases cover where the release happens (the run's own thread, another
// thread, a pinned region of an earlier run released in the middle of the next, a step's region
// released on the step's thread), how (reset, unsafe_free, free_pointer), and an idle arena's
// bytes freed after its lent streams. The race case releases on one thread while another replays,
// many rounds: the pending waits read before the region's state (the order take_region must not
// have) show there in nearly every run (test/broken/README.md).
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include <refpool/pointer.hpp>
#include <refpool/refpool.hpp>
#include "support/stream_wait_checker.hpp"

using namespace refpool;
using refpool::test::stream_wait_checker;

namespace {

constexpr std::size_t KiB = 1024;

stream_ref stream(std::uintptr_t n) { return stream_ref{reinterpret_cast<void*>(n)}; }
const stream_ref compute = stream(1);  // every planned request's stream
const stream_ref side = stream(2);     // streams the buffers are lent to (record_stream)
const stream_ref copy = stream(3);

int rounds(int base) {
  const char* text = std::getenv("REFPOOL_HOSTILE_ROUNDS");
  const int factor = text != nullptr ? std::max(1, std::atoi(text)) : 1;
  return base * factor;
}

struct checked_cache {
  std::shared_ptr<stream_wait_checker> checker = std::make_shared<stream_wait_checker>();
  backend be{checker};
  alloc_cache cache{cache_options{}};
  std::string wrong;  // what the checker found (the first of it), all cases' threads joined

  void note(const std::string& found) {
    if (wrong.size() < 1000) wrong += found;
  }
  /// What the checker found: at takes and releases (noted), and at frees, once every idle byte
  /// went back to the backend (reclaim).
  [[nodiscard]] std::string found() {
    cache.reclaim(0);
    return wrong + checker->problems().substr(0, 1000);
  }

  data_ref take(std::size_t bytes, stream_ref s = compute) {
    data_ref r = allocate(be, bytes, s);
    note(checker->take(r, s));
    return r;
  }
  data_ref take_from_cache(std::size_t bytes, stream_ref s = compute) {  // a step's request
    data_ref r = cache.allocate(be, bytes, s);
    note(checker->take(r, s));
    return r;
  }
  void lend(const data_ref& r, std::initializer_list<stream_ref> streams) {
    for (stream_ref s : streams) checker->record_stream(r, s);
  }
  void release(data_ref& r) { note(checker->release(r)); }
};

enum class drop { reset, unsafe_free, free_pointer };

// The last handle goes the way `how` says, numbered by the checker first.
std::string release_by(stream_wait_checker& checker, data_ref& r, drop how) {
  switch (how) {
    case drop::reset: return checker.release(r);
    case drop::unsafe_free: return checker.release(r.data(), [&] { r.unsafe_free(); });
    case drop::free_pointer: {
      void* p = to_pointer(std::move(r));
      return checker.release(p, [&] { free_pointer(p); });
    }
  }
  return {};
}

}  // namespace

TEST_CASE("a region released after record_stream goes out again after the lent streams, in its run and the next",
          "[plan][streams][record_stream]") {
  checked_cache c;
  constexpr int runs = 6;
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "lent"});
    data_ref a = c.take(64 * KiB);
    c.lend(a, {side, copy});
    c.release(a);
    data_ref b = c.take(64 * KiB);  // placed over a's bytes: a was gone when b was asked for
    c.lend(b, {copy});
    c.release(b);  // the next run's a is placed over it
  }
  CHECK(c.found() == "");
  CHECK(c.checker->missed() == 0);
  const cache_stats st = c.cache.stats();
  CHECK(st.plan_hits == 2 * (runs - 2));  // two runs record, the rest replay
  // Each b over a, each a over the last run's b: every hand-out was checked, but the first and
  // perhaps the first replay's a (the arena's bytes are new to it, unless the host allocator gave
  // it those of the plain blocks its first claim freed).
  CHECK(c.checker->checked() >= 2 * runs - 2);
}

TEST_CASE("a replayed region whose lent streams cannot be ordered now (a graph capture) is a miss, not an error",
          "[plan][streams][record_stream]") {
  // In one replay the resource refuses every order, as a GPU resource does while a stream captures
  // a graph: b, whose region lies over a's bytes lent to `side`, is served by the plain cache (a
  // plan miss) instead of throwing stream_order_unavailable; `side` stays pending, and the next
  // run's regions wait for it.
  checked_cache c;
  constexpr int runs = 6;
  constexpr int refused_run = 3;  // a replay: the first two runs record
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "capture"});
    data_ref a = c.take(64 * KiB);
    c.lend(a, {side});
    c.release(a);
    c.checker->refuse_orders(i == refused_run);
    data_ref b;
    REQUIRE_NOTHROW(b = c.take(64 * KiB));
    c.checker->refuse_orders(false);
    c.release(b);
  }
  CHECK(c.found() == "");
  const cache_stats st = c.cache.stats();
  CHECK(st.plan_misses >= 1);
  CHECK(st.plan_hits >= 2 * (runs - 2) - 1);
}

TEST_CASE("a region released on another thread after record_stream: the next region over its bytes waits",
          "[plan][streams][record_stream]") {
  const drop how = GENERATE(drop::reset, drop::unsafe_free, drop::free_pointer);
  CAPTURE(static_cast<int>(how));
  checked_cache c;
  constexpr int runs = 6;
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "elsewhere"});
    data_ref a = c.take(32 * KiB);
    std::string wrong;
    // Released off the run's thread: the release publishes the region free with a
    // read-modify-write, and the run sees it only through the region's state.
    std::thread([&] {
      c.lend(a, {side});
      wrong = release_by(*c.checker, a, how);
    }).join();
    c.note(wrong);
    data_ref b = c.take(32 * KiB);
    c.release(b);
  }
  CHECK(c.found() == "");
  CHECK(c.cache.stats().plan_hits == 2 * (runs - 2));
  CHECK(c.checker->checked() >= 2 * runs - 2);  // as above
}

TEST_CASE("a pinned region released with record_stream in the middle of the next run: that run's region over it waits",
          "[plan][streams][record_stream]") {
  // Each run keeps its second buffer past its end (an escape: a region of a replay stays live, so
  // its arena is not idled, and the segment heap orders nothing at the next claim). The next run
  // releases it after its own first request, so the arena is claimed by then: only the arena's
  // pending waits can order the run's second region, which is the same region again.
  const bool on_other_thread = GENERATE(false, true);
  CAPTURE(on_other_thread);
  checked_cache c;
  constexpr int runs = 7;
  data_ref kept;
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "pinned"});
    data_ref x = c.take(16 * KiB);
    if (kept) {
      if (on_other_thread) {
        std::string wrong;
        std::thread([&] {
          c.lend(kept, {side});
          wrong = c.checker->release(kept);
        }).join();
        c.note(wrong);
      } else {
        c.lend(kept, {side});
        c.release(kept);
      }
    }
    kept = c.take(64 * KiB);
    c.release(x);
  }
  c.lend(kept, {side});
  c.release(kept);
  CHECK(c.found() == "");
  const cache_stats st = c.cache.stats();
  CHECK(st.plan_hits == 2 * (runs - 2));
  CHECK(st.escapes == static_cast<std::uint64_t>(runs));
  // From the second run on, each x and each kept buffer is over the last run's (the first replay's
  // perhaps not: as in the first case). From the fourth, the kept one is the pinned region the run
  // released.
  CHECK(c.checker->checked() >= 2 * (runs - 1) - 2);
}

TEST_CASE("an idle arena's bytes go back to the backend after the streams its last region was lent to",
          "[plan][streams][record_stream]") {
  // The run's last region is lent and dropped: the run leaves its arena idle, with the lent stream
  // among those its bytes may still see. A request out of memory then yields the idle span and
  // frees its bytes, on the arena's stream, which must wait for the lent one first.
  checked_cache c;
  constexpr int runs = 4;
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "idle"});
    data_ref a = c.take(256 * KiB);
    c.lend(a, {side});
    c.release(a);
  }
  CHECK(c.cache.stats().plan_hits == runs - 2);
  c.cache.reclaim(0);  // the plain blocks of the recording runs
  const std::size_t freed = c.checker->freed();
  c.checker->refuse_allocations(1);
  data_ref z = c.cache.allocate(c.be, 512 * KiB, copy);  // no scope: the plain cache
  CHECK(c.checker->freed() - freed >= 256 * KiB);        // the span's bytes went
  z.reset();
  CHECK(c.found() == "");
  CHECK(c.checker->missed() == 0);
}

TEST_CASE("a step's region released on the step's thread after record_stream: a worker's region over it waits",
          "[plan][streams][record_stream][step]") {
  checked_cache c;
  constexpr int steps = 6;
  for (int i = 0; i < steps; ++i) {
    step st(c.cache, {.plan = "step"});
    data_ref a;
    std::string wrong;
    std::thread([&] { a = c.take_from_cache(64 * KiB); }).join();
    c.lend(a, {side, copy});
    c.release(a);
    std::thread([&] {
      data_ref b = c.take_from_cache(64 * KiB);
      c.lend(b, {copy});
      wrong = c.checker->release(b);
    }).join();
    c.note(wrong);
    st.end();
  }
  CHECK(c.found() == "");
  CHECK(c.cache.stats().plan_hits == 2 * (steps - 2));
  CHECK(c.checker->checked() >= 2 * steps - 2);  // as in the first case
}

namespace {

// The racing case's two threads. The replaying thread hands each run's kept buffer over (put),
// and in its next run says when it is about to ask for that region again (go). The releasing
// thread takes the buffer, waits for the word, and drops it after a short random pause.
class race_line {
 public:
  void put(data_ref r) {
    wait_until([&] { return !full_.load(std::memory_order_acquire); });
    ref_ = std::move(r);
    full_.store(true, std::memory_order_release);
  }
  /// The releasing thread: the next buffer; false once closed and empty.
  bool take(data_ref& out) {
    wait_until([&] { return full_.load(std::memory_order_acquire) || closed_.load(std::memory_order_acquire); });
    if (!full_.load(std::memory_order_acquire)) return false;
    out = std::move(ref_);
    full_.store(false, std::memory_order_release);
    return true;
  }
  void close() { closed_.store(true, std::memory_order_release); }
  /// The replaying thread: it asks for the region of buffer `n` (from 1) now.
  void go(std::uint64_t n) { go_.store(n, std::memory_order_release); }
  /// The releasing thread: waits for the word on buffer `n` (or the end).
  void wait_go(std::uint64_t n) const {
    wait_until([&] { return go_.load(std::memory_order_acquire) >= n || closed_.load(std::memory_order_acquire); });
  }

 private:
  /// Spins a while (the other thread is a few microseconds away: a yield would put this one
  /// behind every other process), then yields (it was descheduled: CI has two cores).
  template <class Ready>
  static void wait_until(Ready ready) {
    for (int i = 0; !ready(); ++i)
      if (i > 100000) std::this_thread::yield();
  }

  data_ref ref_;
  std::atomic<bool> full_{false};
  std::atomic<bool> closed_{false};
  std::atomic<std::uint64_t> go_{0};
};

// Puts the calling thread on the `k`th CPU it may run on, when there are two or more: the two
// racing threads on one core would never run side by side (a loaded machine leaves them there).
void pin_to_cpu(int k) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != k) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    return;
  }
}

void spin(unsigned n) {
  std::atomic<unsigned> i{0};  // not optimised away
  while (i.fetch_add(1, std::memory_order_relaxed) < n) {}
}

}  // namespace

TEST_CASE("record_stream releases racing replays: no region goes out without the lent stream's wait",
          "[plan][streams][record_stream][threads]") {
  // Each run asks for a small region (the run claims its arena), then for the region the last run
  // kept past its end (pinned: its arena is not idled, so the segment heap orders nothing), which
  // the other thread lends to a side stream and drops meanwhile. The run either finds the region
  // still live (the plain cache serves it) or takes it, and then must have seen the waits the
  // release left before it published the region free.
  checked_cache c;
  race_line line;
  std::string released_wrong;
  std::thread releaser([&] {
    pin_to_cpu(1);
    std::mt19937 rng(7);
    std::uint64_t n = 0;
    data_ref r;
    while (line.take(r)) {
      line.wait_go(++n);
      spin(rng() % 16);
      c.lend(r, {side});
      const std::string wrong = c.checker->release(r);
      if (released_wrong.size() < 1000) released_wrong += wrong;
    }
  });
  // The replaying thread waits `lead` after its word. A round races when the last run kept the
  // region (it took it back): then a region taken again means the drop came first, so the lead
  // shrinks; a miss, it grows (a staircase: drops keep landing where the run takes the region).
  // After a miss the drop lands in the same run, which idles the arena at its end, and the next run
  // takes the region back through the segment heap's wait: no race.
  unsigned lead = 0, races = 0, raced_and_taken = 0;
  bool kept_region = false;
  cpu_set_t was;
  const bool saved = sched_getaffinity(0, sizeof was, &was) == 0;
  pin_to_cpu(0);
  const int runs = rounds(10000);
  std::uint64_t handed = 0;
  for (int i = 0; i < runs; ++i) {
    scope s(c.cache, {.plan = "race"});
    data_ref x = c.take(16 * KiB);
    const std::uint64_t hits = c.cache.stats().plan_hits;
    line.go(handed);
    spin(lead);
    data_ref y = allocate(c.be, 64 * KiB, compute);  // checked below, after the race
    c.note(c.checker->take(y, compute));
    const bool taken = c.cache.stats().plan_hits > hits;
    if (kept_region) {
      ++races;
      raced_and_taken += taken ? 1 : 0;
      lead = taken ? (lead > 4 ? lead - 4 : 0) : std::min(lead + 4, 4096u);
    }
    kept_region = taken;
    c.release(x);
    s.close();
    line.put(std::move(y));
    ++handed;
  }
  line.close();
  releaser.join();
  if (saved) sched_setaffinity(0, sizeof was, &was);
  c.note(released_wrong);
  CHECK(c.checker->missed() == 0);
  CHECK(c.found() == "");
  const cache_stats st = c.cache.stats();
  CAPTURE(st.plan_hits, st.plan_misses, st.plan_busy_runs, races, lead);
  // Each run's first request, and every other run's second at least (after a miss the region was
  // dropped in that run), unless the releasing thread held the arena a moment (busy runs).
  CHECK(st.plan_hits >= static_cast<std::uint64_t>(runs));
  // The staircase keeps about half the racing rounds taking the region back (the rest are served
  // by the plain cache). Where the two threads cannot run side by side (one core free on a loaded
  // machine) the drop always comes after the take: said, not asserted.
  if (raced_and_taken < static_cast<unsigned>(runs / 20))
    WARN("the releasing thread's drops never landed before the replaying thread's take: no race this run");
}
