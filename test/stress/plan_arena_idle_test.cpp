// A hostile review of the arena idling fixes (baa0bd0, de7cf37): a plan arena's span must go idle
// once its last pinned region went and no run holds it, whatever thread released which region and
// whatever run claimed the arena meanwhile. Each round ends with nothing live and no run open; a
// plain request for the whole budget must then fit (the out-of-memory ladder yields idle spans, not
// held ones). A round where it does not fit found a span held for good (until a later claim).
//
// Pinned regions are a replay's escapes: buffers of a planned scope still held at its end.
// REFPOOL_HOSTILE_ROUNDS multiplies the rounds for longer runs.
//
// On main (with both fixes) the cases of regions released on two threads at once fail now and then:
// a release's idle_if_unpinned that finds the arena claimed by the other release's check returns,
// and that check read the region live (arena.cpp, idle_if_unpinned). Under ASan about 1 round in
// 2000 to 6000, under TSan 1 in 100 to 900 (plan-arena-claims shows the same window deterministically).
// The case of one release beside the next run's end failed too (ASan, 1 round in 30000): there
// the claimant is the run's own re-check after unclaiming (replay_cursor.cpp, leave_arena).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <refpool/adaptors.hpp>
#include <refpool/refpool.hpp>

using namespace refpool;

namespace {

constexpr std::size_t kib = 1024;
constexpr std::size_t budget = 1024 * kib;
constexpr std::size_t region = 96 * kib;

int rounds(int base) {
  const char* text = std::getenv("REFPOOL_HOSTILE_ROUNDS");
  const int factor = text != nullptr ? std::max(1, std::atoi(text)) : 1;
  return base * factor;
}

bool filled(const data_ref& r, unsigned char v) {
  const auto* p = static_cast<const unsigned char*>(r.data());
  return std::all_of(p, p + r.bytes(), [&](unsigned char x) { return x == v; });
}

// Threads that each run their part of a round at once (a barrier before and after).
class crew {
 public:
  explicit crew(int threads) : start_(threads + 1), end_(threads + 1) {
    for (int t = 0; t < threads; ++t)
      threads_.emplace_back([this, t] {
        for (;;) {
          start_.arrive_and_wait();
          if (stop_) return;
          jobs_[static_cast<std::size_t>(t)]();
          end_.arrive_and_wait();
        }
      });
    jobs_.resize(static_cast<std::size_t>(threads));
  }
  ~crew() {
    stop_ = true;
    start_.arrive_and_wait();
    for (std::thread& t : threads_) t.join();
  }
  /// Runs job t on thread t, all at once; returns when all are done.
  void run(std::vector<std::function<void()>> jobs) {
    jobs_ = std::move(jobs);
    start_.arrive_and_wait();
    end_.arrive_and_wait();
  }

 private:
  std::barrier<> start_, end_;
  std::vector<std::function<void()>> jobs_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

struct fixture {
  std::shared_ptr<limiting_resource> limited = std::make_shared<limiting_resource>(make_host_resource(), budget);
  backend be{limited};
  std::unique_ptr<alloc_cache> cache =
      std::make_unique<alloc_cache>(cache_options{.segments = segment_policy::off});
  int stuck = 0;
  std::atomic<int> broken{0};

  // A planned scope of `key` whose two buffers escape (pinned at a replay's end), each filled.
  std::vector<data_ref> escaping_run(const char* key, unsigned char v, int buffers = 2, std::size_t bytes = region) {
    std::vector<data_ref> out;
    scope s(*cache, {.plan = key});
    for (int i = 0; i < buffers; ++i) {
      out.push_back(allocate(be, bytes));
      std::memset(out.back().data(), v + i, bytes);
    }
    return out;
  }
  // A planned scope of `key` with the same requests, freed inside (nothing pinned by it).
  void contained_run(const char* key, unsigned char v) {
    scope s(*cache, {.plan = key});
    data_ref a = allocate(be, region), b = allocate(be, region);
    std::memset(a.data(), v, region);
    std::memset(b.data(), v + 1, region);
    broken += (filled(a, v) && filled(b, v + 1)) ? 0 : 1;
  }
  // Nothing live, no run open: the whole budget fits once idle spans yield.
  /// Drops `r` (the last handle of a region or buffer) after checking it still holds `v`.
  void release(data_ref& r, unsigned char v) {
    broken += filled(r, v) ? 0 : 1;
    r = data_ref();
  }
  /// After the rounds: plans replayed, no buffer was overwritten, no round left a span held.
  void check_outcome() {
    const cache_stats st = cache->stats();
    INFO(fmt::format("hits {} busy {} escapes {} stuck rounds {}", st.plan_hits, st.plan_busy_runs, st.escapes, stuck));
    CHECK(st.plan_hits > 0);
    CHECK(broken == 0);
    CHECK(stuck == 0);
  }
  /// `round()` 300 times (REFPOOL_HOSTILE_ROUNDS times more), each followed by check_budget_fits.
  template <class Round>
  void in_rounds(Round round) {
    const int n = rounds(300);
    for (int i = 0; i < n; ++i) {
      round();
      check_budget_fits(i);
    }
  }
  void check_budget_fits(int round) {
    try {
      data_ref all = cache->allocate(be, budget);
    } catch (const out_of_memory&) {
      const cache_stats s = cache->stats();
      if (stuck++ < 3)
        WARN(fmt::format("round {}: the budget does not fit; {} arena bytes, {} reserved, {} live, {} plan live", round,
                         s.arena_bytes, s.reserved_bytes, s.live_bytes, s.plan_live_bytes));
    }
    cache->reclaim(0);
  }
};

}  // namespace

// Two pinned regions of one replay released on two threads at once: each release's
// idle_if_unpinned claims the arena; the one that finds it claimed by the other's check leaves the
// idling to it, which may have read the region still live.
TEST_CASE("two pinned regions of one replay released on two threads at once", "[plan][hostile][arena-idle]") {
  fixture f;
  crew two(2);
  f.in_rounds([&] {
    std::vector<data_ref> escaped = f.escaping_run("pair", 1);
    two.run({[&] { f.release(escaped[0], 1); }, [&] { f.release(escaped[1], 2); }});
  });
  CHECK(f.cache->stats().escapes > 0);
  f.check_outcome();
}

// The last pinned regions released while a run of the same key starts and ends on a third thread
// (it claims the arena, replays or goes plain, idles or re-checks at its end: the windows the two
// fixes close, and their own re-check's claim).
TEST_CASE("pinned regions released while a run of their key starts and ends elsewhere", "[plan][hostile][arena-idle]") {
  fixture f;
  crew three(3);
  f.in_rounds([&] {
    std::vector<data_ref> escaped = f.escaping_run("race", 1);
    three.run(
        {[&] { f.release(escaped[0], 1); }, [&] { f.release(escaped[1], 2); }, [&] { f.contained_run("race", 7); }});
  });
  f.check_outcome();
}

// One pinned region released on another thread while the next run of its key ends: the run sees
// it pinned at settle (it stays held), and its release may come while the run still holds the
// claim (de7cf37) or while the run's re-check holds it.
TEST_CASE("a pinned region released while the next run of its key ends", "[plan][hostile][arena-idle]") {
  fixture f;
  crew two(2);
  f.in_rounds([&] {
    std::vector<data_ref> escaped = f.escaping_run("end", 1);
    f.release(escaped[1], 2);
    two.run({[&] { f.release(escaped[0], 1); }, [&] { f.contained_run("end", 9); }});
  });
  f.check_outcome();
}

// Sixteen pinned regions of one replay released by two threads in step, eight each: every release
// but the first few finds the arena claimed by the other thread's check now and then, and the
// last two race as in the first case, more often.
TEST_CASE("sixteen pinned regions of one replay released by two threads in step", "[plan][hostile][arena-idle]") {
  fixture f;
  crew two(2);
  f.in_rounds([&] {
    std::vector<data_ref> escaped = f.escaping_run("many", 1, 16, 8 * kib);
    auto release_every_other = [&](std::size_t first) {
      for (std::size_t i = first; i < escaped.size(); i += 2) {
        f.release(escaped[i], static_cast<unsigned char>(1 + i));
      }
    };
    two.run({[&] { release_every_other(0); }, [&] { release_every_other(1); }});
  });
  f.check_outcome();
}
