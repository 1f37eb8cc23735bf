// A hostile review of the no-repeat policy (issue 36: a key whose sequences do not repeat passes,
// probing now and then): cases written apart from the code they attack. Runs of a key still open
// on other threads when it enters pass; pass entry while another thread replays the key's plan and
// its regions escape, freed by pointer later; key-less steps joined by several threads while the key
// passes and probes; the backoff of the probes up to its cap; out of memory and backend errors in
// probe windows; caches destroyed under a passing or probing step.
//
// Counters are checked exactly: every run of a key after its pass entry is one pass run or one probe
// run, and a key in pass holds no plan and no arena. Buffers carry their owner's stamp, checked before
// they are released; nothing is lost or leaked at the end of each case. Under a second in each build;
// REFPOOL_HOSTILE_ROUNDS multiplies the rounds of the threaded cases.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <semaphore>
#include <thread>
#include <vector>

#include <refpool/pointer.hpp>
#include <refpool/refpool.hpp>
#include "support/forwarding_resource.hpp"

using namespace refpool;

namespace {

int rounds(int base) {
  const char* text = std::getenv("REFPOOL_HOSTILE_ROUNDS");
  const int factor = text != nullptr ? std::max(1, std::atoi(text)) : 1;
  return base * factor;
}

// The detector's constants (lib/plan/key_policy.hpp), as a user reads them in docs/design.md.
constexpr int learn_window = 32;  // runs in learn before a key that does not repeat passes
constexpr int probe_window = 32;
constexpr int first_pass = 64;
constexpr int longest_pass = 4096;

// Every word of a buffer stamped: two owners of one byte show.
void write_stamp(const data_ref& r, std::uint64_t stamp) {
  std::fill_n(static_cast<std::uint64_t*>(r.data()), r.bytes() / 8, stamp);
}
bool stamp_intact(const void* p, std::size_t bytes, std::uint64_t stamp) {
  const auto* w = static_cast<const std::uint64_t*>(p);
  return std::all_of(w, w + bytes / 8, [&](std::uint64_t x) { return x == stamp; });
}
std::atomic<std::uint64_t> next_stamp{1};

// The `i`-th of 729 sequences of six requests of 4, 8 or 12 KiB (the digits of i in base 3): any 16
// consecutive ones differ, and the plain cache serves them all from idle blocks once warm.
std::vector<std::size_t> novel_sizes(std::size_t i) {
  std::vector<std::size_t> sizes;
  for (std::size_t k = 0, d = i % 729; k < 6; ++k, d /= 3) sizes.push_back(4096 * (1 + d % 3));
  return sizes;
}

// A step of `key`: every size allocated, all live at once, then released.
void serve_step(alloc_cache& cache, const backend& be, const std::vector<std::size_t>& sizes,
                std::string_view key = "serve") {
  step st(cache, {.plan = key});
  std::vector<data_ref> live;
  for (std::size_t bytes : sizes) live.push_back(cache.allocate(be, bytes));
}

// A planned scope of `key` on this thread: the same.
void serve_scope(alloc_cache& cache, const backend& be, const std::vector<std::size_t>& sizes,
                 std::string_view key = "serve") {
  scope s(cache, {.plan = key});
  std::vector<data_ref> live;
  for (std::size_t bytes : sizes) live.push_back(allocate(be, bytes));
}

void warm_plain_cache(alloc_cache& cache, const backend& be) {
  std::vector<data_ref> live;
  for (std::size_t bytes : {4096, 8192, 12288})
    for (int i = 0; i < 6; ++i) live.push_back(cache.allocate(be, bytes));
}

// What the detector makes of runs `from` .. `to` - 1 after a key's pass entry when none of them
// repeats: {pass runs, probe runs}. Written from the documented rule (64 runs pass, 32 probe, each
// probe window without repeats doubles the pass up to 4096), apart from the library's code.
std::pair<std::uint64_t, std::uint64_t> expected_after_entry(std::uint64_t runs) {
  std::uint64_t pass = 0, probe = 0, length = first_pass;
  while (runs > 0) {
    const std::uint64_t p = std::min<std::uint64_t>(runs, length);
    pass += p;
    runs -= p;
    const std::uint64_t q = std::min<std::uint64_t>(runs, probe_window);
    probe += q;
    runs -= q;
    length = std::min<std::uint64_t>(2 * length, longest_pass);
  }
  return {pass, probe};
}

// Buffers handed over with to_pointer, freed by pointer on a thread of their own.
class pointer_freer {
 public:
  struct item {
    void* ptr;
    std::size_t bytes;
    std::uint64_t stamp;
  };
  pointer_freer()
      : thread_([this] {
          for (;;) {
            item it{};
            {
              std::lock_guard guard(mutex_);
              if (!items_.empty()) {
                it = items_.back();
                items_.pop_back();
              }
            }
            if (it.ptr == nullptr) {
              if (stop_.load()) return;
              std::this_thread::yield();
              continue;
            }
            broken += stamp_intact(it.ptr, it.bytes, it.stamp) ? 0 : 1;
            try {
              free_pointer(it.ptr);
            } catch (const invalid_argument&) {
              broken += 1;
            }
          }
        }) {}
  ~pointer_freer() { finish(); }
  void put(data_ref ref) {
    const std::uint64_t stamp = next_stamp.fetch_add(1);
    write_stamp(ref, stamp);
    const std::size_t bytes = ref.bytes();
    void* p = to_pointer(std::move(ref));
    std::lock_guard guard(mutex_);
    items_.push_back({p, bytes, stamp});
  }
  // Waits until every buffer handed over is freed (the thread keeps running).
  void drain() {
    for (;;) {
      {
        std::lock_guard guard(mutex_);
        if (items_.empty()) break;
      }
      std::this_thread::yield();
    }
  }
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::atomic<int> broken{0};

 private:
  std::mutex mutex_;
  std::vector<item> items_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void check_nothing_held(const alloc_cache& cache, const backend& be) {
  const cache_stats s = cache.stats();
  CHECK(s.live_bytes == 0);
  CHECK(s.plan_live_bytes == 0);
  CHECK(be.outstanding_bytes() == s.reserved_bytes);
}

}  // namespace

// ---- runs in flight at the pass entry ---------------------------------------------------------

// Two planned scopes of the key are open on other threads (learning: they record the same new
// sequence) when the key enters pass. They end after the entry: the first one's recording must not
// become pending, the second one's must not become a plan with an arena. A key in pass holds
// nothing (its steps and scopes go through no router): no plan, no arena, no driver call.
TEST_CASE("scopes of a key open on other threads at its pass entry add no plan or arena after it", "[pass][hostile]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  const std::vector<std::size_t> late = {12288, 4096, 8192, 4096, 12288, 8192};
  std::counting_semaphore<2> opened{0};
  std::binary_semaphore go_first{0}, go_second{0};
  std::atomic<int> broken{0};
  auto late_scope = [&](std::binary_semaphore& go) {
    scope s(cache, {.plan = "serve"});
    std::vector<data_ref> live;
    for (std::size_t bytes : late) {
      live.push_back(allocate(be, bytes));
      write_stamp(live.back(), 77);
    }
    opened.release();
    go.acquire();
    for (const data_ref& r : live) broken += stamp_intact(r.data(), r.bytes(), 77) ? 0 : 1;
  };
  std::thread first(late_scope, std::ref(go_first));
  std::thread second(late_scope, std::ref(go_second));
  opened.acquire();
  opened.acquire();
  for (std::size_t i = 0; i < learn_window; ++i) serve_scope(cache, be, novel_sizes(100 + i));
  const cache_stats entered = cache.stats();
  REQUIRE(entered.plan_pass_entries == 1);
  REQUIRE(entered.plans == 0);
  REQUIRE(entered.arena_bytes == 0);
  const auto allocations = be.allocation_count();
  go_first.release();
  first.join();
  go_second.release();
  second.join();
  const cache_stats after = cache.stats();
  CHECK(broken == 0);
  CHECK(after.plan_pass_entries == 1);
  CHECK(after.plans == 0);  // the second end made its sequence (pending from the first end) a plan
  CHECK(after.arena_bytes == 0);
  CHECK(after.plan_recordings == entered.plan_recordings);
  CHECK(be.allocation_count() == allocations);  // the plan's arena
  check_nothing_held(cache, be);
}

// Another thread's scope replays one of the key's plans when the key enters pass: the entry drops
// the plan and the arena's group, but the run keeps replaying into the arena, and its last buffer
// escapes (by pointer) past the scope's end. The arena goes exactly when that buffer is freed, on
// yet another thread; the replayed buffers keep their bytes throughout.
TEST_CASE("pass entry while another thread replays the key's plan; its escape freed by pointer later",
          "[pass][hostile]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  for (int round = 0; round < 3; ++round)
    for (std::size_t i = 0; i < 4; ++i) serve_scope(cache, be, novel_sizes(i));
  REQUIRE(cache.stats().plans == 4);
  warm_plain_cache(cache, be);
  const std::vector<std::size_t> replayed = novel_sizes(0);
  std::binary_semaphore halfway{0}, go{0};
  std::atomic<int> broken{0};
  void* escaped = nullptr;
  std::uint64_t escaped_stamp = 0;
  std::size_t escaped_bytes = 0;
  std::thread replayer([&] {
    scope s(cache, {.plan = "serve"});
    std::vector<data_ref> live;
    std::vector<std::uint64_t> stamps;
    for (std::size_t k = 0; k < replayed.size(); ++k) {
      if (k == 3) {
        halfway.release();
        go.acquire();
      }
      live.push_back(allocate(be, replayed[k]));
      stamps.push_back(next_stamp.fetch_add(1));
      write_stamp(live.back(), stamps.back());
    }
    for (std::size_t k = 0; k < live.size(); ++k)
      broken += stamp_intact(live[k].data(), live[k].bytes(), stamps[k]) ? 0 : 1;
    escaped_stamp = stamps.back();
    escaped_bytes = live.back().bytes();
    escaped = to_pointer(std::move(live.back()));
  });
  halfway.acquire();
  const cache_stats before = cache.stats();
  const auto frees = be.deallocation_count();
  std::size_t next = 100;
  while (cache.stats().plan_pass_entries == 0 && next < 100 + learn_window) serve_scope(cache, be, novel_sizes(next++));
  cache_stats stats = cache.stats();
  REQUIRE(stats.plan_pass_entries == 1);
  CHECK(stats.plans == 0);
  CHECK(stats.arena_bytes > 0);                   // the replaying run holds the arena
  CHECK(be.deallocation_count() == frees);        // ... so it is not freed yet
  go.release();
  replayer.join();
  stats = cache.stats();
  CHECK(broken == 0);
  CHECK(stats.plan_hits == before.plan_hits + 3);  // the replay went on to its plan's end
  CHECK(stats.plans == 0);                         // a complete replay records nothing
  CHECK(stats.arena_bytes > 0);                    // its escaped region pins the arena
  CHECK(be.deallocation_count() == frees);
  REQUIRE(escaped != nullptr);
  std::thread freer([&] {
    broken += stamp_intact(escaped, escaped_bytes, escaped_stamp) ? 0 : 1;
    free_pointer(escaped);
  });
  freer.join();
  stats = cache.stats();
  CHECK(broken == 0);
  CHECK(stats.arena_bytes == 0);
  CHECK(be.deallocation_count() == frees + 1);  // the arena, with its last region
  check_nothing_held(cache, be);
}

// A key paused for re-recording (a fixed sequence every other run, new ones between: it learns,
// replays, and keeps re-recording, so its pauses grow: 64, 128, 256 runs) whose traffic then turns
// new (it passes while still paused) and then settles into a cycle of 8 sequences: its probes see
// the repeats and it learns again. Learning must then record and replay the cycle. Were the old
// pause to last, a learning run would record nothing and is served by the plain cache without a
// fingerprint, so it would never read as a repeat, and the key would pass again after 32 runs.
TEST_CASE("a key that learns again after a probe window is not held back by a pause from before its pass",
          "[pass][hostile]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  const std::vector<std::size_t> fixed = {8192, 8192, 4096, 12288, 4096, 8192};
  std::size_t run = 0, fresh = 0;
  while (cache.stats().plan_pauses < 3 && run < 2000) {
    serve_step(cache, be, run % 2 == 0 ? fixed : novel_sizes(fresh++));
    ++run;
  }
  REQUIRE(cache.stats().plan_pauses == 3);  // the third pause: 256 runs from now
  REQUIRE(cache.stats().plan_pass_entries == 0);
  const std::size_t paused_at = run;
  while (cache.stats().plan_pass_entries == 0 && run < paused_at + 64) {
    serve_step(cache, be, novel_sizes(fresh++));
    ++run;
  }
  REQUIRE(cache.stats().plan_pass_entries == 1);
  // The pass and its probe window: a cycle of 8 sequences, which the probes see repeat.
  for (int i = 0; i < first_pass + probe_window; ++i, ++run) serve_step(cache, be, novel_sizes(600 + run % 8));
  REQUIRE(run - paused_at < 200);  // the old pause still holds
  const cache_stats learned = cache.stats();
  REQUIRE(learned.plan_probe_runs == probe_window);
  // Learning again: the cycle is recorded and replays; the key does not pass a second time.
  for (int i = 0; i < 2 * learn_window; ++i, ++run) serve_step(cache, be, novel_sizes(600 + run % 8));
  const cache_stats stats = cache.stats();
  CHECK(stats.plan_pass_entries == 1);
  CHECK(stats.plans == 8);
  CHECK(stats.plan_hits > learned.plan_hits);
  check_nothing_held(cache, be);
}

// Four plans share a prefix; new runs replay the prefix (regions of a plan) and diverge. Each keeps
// its first buffer (a region, or a block of the plain cache once the region is pinned) by pointer
// past its step: the run that brings the key into pass holds pinned regions of the plans its own
// end drops. The arena goes exactly when the last of those buffers is freed, on another thread.
TEST_CASE("the run that enters pass holds regions of the plans it drops; freed by pointer later", "[pass][hostile]") {
  const backend be = make_host_backend();
  const std::vector<std::size_t> prefix = {4096, 8192, 12288};
  auto with_suffix = [&](std::size_t j) {
    std::vector<std::size_t> sizes = prefix;
    const std::vector<std::size_t> tail = novel_sizes(j);
    sizes.insert(sizes.end(), tail.begin(), tail.begin() + 4);
    return sizes;
  };
  alloc_cache cache{cache_options{}};
  for (int round = 0; round < 3; ++round)
    for (std::size_t j = 0; j < 4; ++j) serve_step(cache, be, with_suffix(j));
  REQUIRE(cache.stats().plans == 4);
  warm_plain_cache(cache, be);
  const auto frees = be.deallocation_count();
  const auto hits = cache.stats().plan_hits;
  pointer_freer freer;
  std::vector<data_ref> kept;  // handed to the freer once the key passes
  std::size_t next = 20;       // suffixes 20.. (of 81): none is a plan's
  while (cache.stats().plan_pass_entries == 0 && next < 20 + learn_window) {
    step st(cache, {.plan = "serve"});
    std::vector<data_ref> live;
    for (std::size_t bytes : with_suffix(next)) live.push_back(cache.allocate(be, bytes));
    kept.push_back(std::move(live.front()));
    ++next;
  }
  cache_stats stats = cache.stats();
  REQUIRE(stats.plan_pass_entries == 1);
  CHECK(stats.plan_hits > hits);  // the prefixes replayed
  CHECK(stats.plans == 0);
  CHECK(stats.arena_bytes > 0);   // pinned by the kept regions
  CHECK(be.deallocation_count() == frees);
  for (data_ref& r : kept) freer.put(std::move(r));
  freer.drain();
  freer.finish();
  stats = cache.stats();
  CHECK(freer.broken == 0);
  CHECK(stats.arena_bytes == 0);
  CHECK(be.deallocation_count() == frees + 1);  // the arena, with its last pinned region
  check_nothing_held(cache, be);
}

// ---- steps and scopes of a key in pass on several threads -----------------------------------

// Key-less steps (the cache's automatic key) that three threads join, each step's requests in the
// order the threads arrive (never a repeat: one size is new in every 97 steps). Each thread keeps
// one buffer past the step, freed by pointer on a fourth thread. The key passes after 32 steps,
// then passes and probes exactly as documented, and every step is counted once.
TEST_CASE("threads join key-less steps while their key passes and probes; escapes freed by pointer",
          "[pass][hostile][threads]") {
  const backend be = make_host_backend();
  constexpr int workers = 3;
  const int steps = learn_window + static_cast<int>(rounds(1)) * (first_pass + probe_window + 2 * first_pass +
                                                                  probe_window);
  {
    alloc_cache cache{cache_options{}};
    warm_plain_cache(cache, be);
    pointer_freer freer;
    std::atomic<int> broken{0};
    std::atomic<int> current{0};
    std::barrier opened(workers + 1), served(workers + 1);
    std::vector<std::thread> threads;
    for (int t = 0; t < workers; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < steps; ++i) {
          opened.arrive_and_wait();
          const int at = current.load();
          std::vector<data_ref> live;
          live.push_back(cache.allocate(be, 4096 * (1 + (at + t) % 3)));
          live.push_back(cache.allocate(be, 64 * (1 + (at * 3 + t) % 97)));
          const std::uint64_t s = next_stamp.fetch_add(1);
          write_stamp(live[0], s);
          broken += stamp_intact(live[0].data(), live[0].bytes(), s) ? 0 : 1;
          freer.put(std::move(live[1]));
          served.arrive_and_wait();
        }
      });
    }
    for (int i = 0; i < steps; ++i) {
      step st(cache);
      current = i;
      opened.arrive_and_wait();
      served.arrive_and_wait();
    }
    for (std::thread& t : threads) t.join();
    freer.drain();
    freer.finish();
    const cache_stats stats = cache.stats();
    const auto [pass, probe] = expected_after_entry(static_cast<std::uint64_t>(steps - learn_window));
    CHECK(broken == 0);
    CHECK(freer.broken == 0);
    CHECK(stats.plan_pass_entries == 1);
    CHECK(stats.plan_pass_runs == pass);
    CHECK(stats.plan_probe_runs == probe);
    CHECK(stats.plans == 0);
    CHECK(stats.arena_bytes == 0);
    check_nothing_held(cache, be);
  }
  CHECK(be.outstanding_bytes() == 0);
}

// Once a key passes, planned scopes of it on four threads at once (their tickets begin and end
// interleaved, and some probe): each run is counted once, as a pass run or a probe run.
TEST_CASE("planned scopes of a passing key on four threads: every run counted once", "[pass][hostile][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  for (std::size_t i = 0; i < learn_window; ++i) serve_scope(cache, be, novel_sizes(i));
  REQUIRE(cache.stats().plan_pass_entries == 1);
  constexpr int threads_n = 4;
  const int per_thread = rounds(150);
  pointer_freer freer;
  std::atomic<int> broken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        scope s(cache, {.plan = "serve"});
        std::vector<data_ref> live;
        for (std::size_t bytes : novel_sizes(static_cast<std::size_t>(200 + i * threads_n + t))) {
          live.push_back(allocate(be, bytes));
          const std::uint64_t stamp = next_stamp.fetch_add(1);
          write_stamp(live.back(), stamp);
          broken += stamp_intact(live.back().data(), live.back().bytes(), stamp) ? 0 : 1;
        }
        if (i % 3 == 0) freer.put(std::move(live.back()));  // freed by pointer, maybe after the scope
      }
    });
  }
  for (std::thread& t : threads) t.join();
  freer.drain();
  freer.finish();
  const cache_stats stats = cache.stats();
  CHECK(broken == 0);
  CHECK(freer.broken == 0);
  CHECK(stats.plan_pass_runs + stats.plan_probe_runs == static_cast<std::uint64_t>(threads_n * per_thread));
  CHECK(stats.plan_pass_runs >= static_cast<std::uint64_t>(first_pass));
  CHECK(stats.plans == 0);
  CHECK(stats.arena_bytes == 0);
  check_nothing_held(cache, be);
}

// Two keys whose traffic switches between new sequences and a short cycle, on three threads at
// once: each key enters pass, probes, learns again and passes again while the other threads' scopes
// of it record, replay and pass. A third of the buffers escape by pointer, freed on a fourth thread
// (regions of dropped plans pin their arenas past the pass entries that drop them).
TEST_CASE("keys entering and leaving pass on three threads while escapes are freed by pointer",
          "[pass][hostile][threads]") {
  const backend be = make_host_backend();
  {
    alloc_cache cache{cache_options{}};
    warm_plain_cache(cache, be);
    pointer_freer freer;
    std::atomic<int> broken{0};
    const int per_thread = rounds(400);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(31 + t));
        for (int i = 0; i < per_thread; ++i) {
          const bool novel_phase = (i / 100) % 2 == 0;
          const std::size_t which = novel_phase ? static_cast<std::size_t>(1000 + i * 3 + t) : 650 + rng() % 4;
          scope s(cache, {.plan = (i + t) % 5 == 0 ? "other" : "serve"});
          std::vector<data_ref> live;
          std::vector<std::uint64_t> stamps;
          for (std::size_t bytes : novel_sizes(which)) {
            live.push_back(allocate(be, bytes));
            stamps.push_back(next_stamp.fetch_add(1));
            write_stamp(live.back(), stamps.back());
          }
          for (std::size_t k = 0; k < live.size(); ++k)
            broken += stamp_intact(live[k].data(), live[k].bytes(), stamps[k]) ? 0 : 1;
          if (i % 3 == 0) freer.put(std::move(live[rng() % live.size()]));
        }
      });
    }
    for (std::thread& t : threads) t.join();
    freer.drain();
    freer.finish();
    const cache_stats stats = cache.stats();
    CHECK(broken == 0);
    CHECK(freer.broken == 0);
    CHECK(stats.plan_pass_entries >= 2);  // "serve" passes, learns again on the cycle, and passes again
    check_nothing_held(cache, be);
  }
  CHECK(be.outstanding_bytes() == 0);
}

// A step of a passing key opened on another thread while one is open fails (steps of a cache do
// not nest): only the step that opened counts a pass run, and the failed one leaves no ticket.
TEST_CASE("a step that fails to open while the key passes counts no run", "[pass][hostile][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  for (std::size_t i = 0; i < learn_window; ++i) serve_step(cache, be, novel_sizes(i));
  REQUIRE(cache.stats().plan_pass_entries == 1);
  const cache_stats before = cache.stats();
  int refused = 0;
  {
    step open(cache, {.plan = "serve"});
    data_ref held = cache.allocate(be, 4096);
    std::thread other([&] {
      for (int i = 0; i < 5; ++i) {
        try {
          step nested(cache, {.plan = "serve"});
        } catch (const scope_error&) {
          refused += 1;
        }
      }
    });
    other.join();
  }
  const cache_stats stats = cache.stats();
  CHECK(refused == 5);
  CHECK(stats.plan_pass_runs == before.plan_pass_runs + 1);
  CHECK(stats.plan_probe_runs == before.plan_probe_runs);
  // The runs that follow are counted from there: 63 more pass, then the probes.
  for (int i = 0; i < first_pass - 1; ++i) serve_step(cache, be, novel_sizes(100 + static_cast<std::size_t>(i)));
  CHECK(cache.stats().plan_pass_runs == static_cast<std::uint64_t>(first_pass));
  serve_step(cache, be, novel_sizes(200));
  CHECK(cache.stats().plan_probe_runs == 1);
  check_nothing_held(cache, be);
}

// Each step of a passing or probing key keeps one buffer into the next step (an escape, counted
// by the slot: pass and probe steps track nothing): exactly one escape a step, none counted twice
// or lost across the window's edges, and the probes' buffers come from the plain cache (no driver
// call once it is warm).
TEST_CASE("escapes of pass and probe steps are counted once each", "[pass][hostile]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  std::size_t run = 0;
  for (; run < learn_window; ++run) serve_step(cache, be, novel_sizes(run));
  REQUIRE(cache.stats().plan_pass_entries == 1);
  data_ref escaped;
  auto escaping_step = [&] {
    step st(cache, {.plan = "serve"});
    std::vector<data_ref> live;
    for (std::size_t bytes : novel_sizes(run++)) live.push_back(cache.allocate(be, bytes));
    escaped = live.back();  // the previous step's goes now, in this step
  };
  escaping_step();  // its escape is released in the first step counted below
  const cache_stats before = cache.stats();
  const auto allocations = be.allocation_count();
  for (int i = 0; i < first_pass - 1 + probe_window + 8; ++i) escaping_step();
  escaped = {};
  const cache_stats stats = cache.stats();
  CHECK(stats.plan_pass_runs == before.plan_pass_runs + first_pass - 1 + 8);
  CHECK(stats.plan_probe_runs == before.plan_probe_runs + probe_window);
  CHECK(stats.escapes == before.escapes + first_pass - 1 + probe_window + 8);
  CHECK(stats.plan_hits == before.plan_hits);
  CHECK(stats.plan_misses == before.plan_misses);
  CHECK(be.allocation_count() == allocations);
  check_nothing_held(cache, be);
}

// ---- backoff, faults, teardown ---------------------------------------------------------------

// Probe windows that never see a repeat double the pass each time, up to 4096 runs and no
// further: 12,512 steps of new sequences reach the first pass after the cap. Checked at the end of
// every window, against the documented rule.
TEST_CASE("the pass doubles after each probe window without repeats, up to 4096 runs", "[pass][hostile]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  warm_plain_cache(cache, be);
  const auto allocations = be.allocation_count();
  std::uint64_t run = 0;
  for (; run < learn_window; ++run) serve_step(cache, be, novel_sizes(run));
  REQUIRE(cache.stats().plan_pass_entries == 1);
  std::uint64_t length = first_pass;
  for (int window = 0; window < 8; ++window) {
    for (std::uint64_t i = 0; i < length + probe_window; ++i, ++run) serve_step(cache, be, novel_sizes(run));
    const cache_stats stats = cache.stats();
    const auto [pass, probe] = expected_after_entry(run - learn_window);
    INFO("window " << window << ", pass of " << length << " runs");
    REQUIRE(stats.plan_pass_runs == pass);
    REQUIRE(stats.plan_probe_runs == probe);
    REQUIRE(stats.plan_pass_entries == 1);
    length = std::min<std::uint64_t>(2 * length, longest_pass);
  }
  // After the cap: 4096 runs pass again, then the probes.
  for (std::uint64_t i = 0; i < longest_pass; ++i, ++run) serve_step(cache, be, novel_sizes(run));
  cache_stats stats = cache.stats();
  CHECK(stats.plan_probe_runs == 8 * probe_window);
  serve_step(cache, be, novel_sizes(run++));
  stats = cache.stats();
  CHECK(stats.plan_probe_runs == 8 * probe_window + 1);
  CHECK(stats.plan_recordings == 0);
  CHECK(stats.arena_bytes == 0);
  CHECK(be.allocation_count() == allocations);  // the steady state calls no driver
  check_nothing_held(cache, be);
}

// A host resource that refuses allocations from `refuse_from` bytes: as out of memory (nullptr) or,
// with `as_backend_error`, as a backend error. Smaller requests are served.
class refusing_resource final : public refpool::test::forwarding_resource {
 public:
  std::string_view name() const noexcept override { return "host refusing large allocations"; }
  void* allocate(std::size_t bytes, stream_ref stream) override {
    if (bytes >= refuse_from.load()) {
      refused += 1;
      if (as_backend_error.load()) throw backend_error("refpool test: refused allocation", -1);
      return nullptr;
    }
    return forwarding_resource::allocate(bytes, stream);
  }
  std::atomic<std::size_t> refuse_from{static_cast<std::size_t>(-1)};
  std::atomic<bool> as_backend_error{false};
  std::atomic<int> refused{0};
};

// A step of `key` whose fourth request is `large`: the others are served; the large one may fail
// (out of memory or a backend error). Returns whether one of its requests failed.
bool step_with_large_request(alloc_cache& cache, const backend& be, std::size_t i, std::size_t large) {
  step st(cache, {.plan = "serve"});
  std::vector<data_ref> live;
  std::vector<std::size_t> sizes = novel_sizes(i);
  sizes.insert(sizes.begin() + 3, large + 4096 * (i % 64));
  bool failed = false;
  for (std::size_t bytes : sizes) {
    try {
      live.push_back(cache.allocate(be, bytes));
    } catch (const out_of_memory&) {
      failed = true;
    } catch (const backend_error&) {
      failed = true;
    }
  }
  return failed;
}

// Out of memory and backend errors on a large request of every step of a probe window (and of the
// step that enters pass; the out-of-memory ladder gives the idle blocks back each time): the other
// requests are served, the window counts exactly 32 probes and sees no repeat, and the pass
// resumes twice as long. Nothing is leaked.
TEST_CASE("out of memory and backend errors in a probe window and at the pass entry", "[pass][hostile]") {
  const auto refusing = std::make_shared<refusing_resource>();
  const backend be(refusing);
  constexpr std::size_t large = std::size_t{32} << 20;
  {
    alloc_cache cache{cache_options{}};
    warm_plain_cache(cache, be);
    std::size_t run = 0;
    for (; run + 1 < learn_window; ++run) serve_step(cache, be, novel_sizes(run));
    refusing->refuse_from = large;
    CHECK(step_with_large_request(cache, be, run++, large));  // the 32nd run: the key passes
    cache_stats stats = cache.stats();
    REQUIRE(stats.plan_pass_entries == 1);
    for (int i = 0; i < first_pass; ++i) serve_step(cache, be, novel_sizes(run++));
    int failed = 0;
    for (int i = 0; i < probe_window; ++i) {
      refusing->as_backend_error = i % 2 == 1;
      failed += step_with_large_request(cache, be, run++, large) ? 1 : 0;
    }
    CHECK(failed == probe_window);
    stats = cache.stats();
    CHECK(stats.plan_pass_runs == first_pass);
    CHECK(stats.plan_probe_runs == probe_window);
    for (int i = 0; i < 2 * first_pass; ++i) serve_step(cache, be, novel_sizes(run++));
    stats = cache.stats();
    CHECK(stats.plan_pass_entries == 1);
    CHECK(stats.plan_pass_runs == 3 * first_pass);  // the pass after the window was twice as long
    CHECK(stats.plan_probe_runs == probe_window);
    CHECK(stats.plans == 0);
    CHECK(stats.arena_bytes == 0);
    check_nothing_held(cache, be);
  }
  CHECK(be.outstanding_bytes() == 0);
}

// A probe window in which every request of every step fails (out of memory: the backend refuses
// everything, and the ladder emptied the plain cache): the steps asked for new sequences, none of
// which repeats. The probes must not read as repeats of one another, or an out-of-memory storm
// brings a key that does not repeat back to learning and recording, then into pass again: the pass
// after the window must be twice as long, with no second entry. (A probe that hashed only the sizes
// it served, and whose end took position 0 for the empty sequence, would have the fingerprint 1.)
TEST_CASE("a probe window whose requests all fail does not read as repeating", "[pass][hostile]") {
  const auto refusing = std::make_shared<refusing_resource>();
  const backend be(refusing);
  {
    alloc_cache cache{cache_options{}};
    std::size_t run = 0;
    for (; run < learn_window + first_pass; ++run) serve_step(cache, be, novel_sizes(run));
    REQUIRE(cache.stats().plan_pass_entries == 1);
    cache.reclaim();
    refusing->refuse_from = 0;
    int failed = 0;
    for (int i = 0; i < probe_window; ++i) failed += step_with_large_request(cache, be, run++, 4096) ? 1 : 0;
    refusing->refuse_from = static_cast<std::size_t>(-1);
    CHECK(failed == probe_window);
    cache_stats stats = cache.stats();
    CHECK(stats.plan_probe_runs == probe_window);
    for (int i = 0; i < 2 * first_pass; ++i) serve_step(cache, be, novel_sizes(run++));
    stats = cache.stats();
    CHECK(stats.plan_pass_entries == 1);             // no learning again, so no second entry
    CHECK(stats.plan_pass_runs == 3 * first_pass);   // the pass after the window was twice as long
    CHECK(stats.plan_probe_runs == probe_window);
    check_nothing_held(cache, be);
  }
  CHECK(be.outstanding_bytes() == 0);
}

// Learning runs whose requests all fail (out of memory: the backend refuses everything) saw no
// sequence of the key: they are no repeats of one another (each has no fingerprint), so a key that
// only fails passes after its 32 learning runs, dropping what it holds, rather than taking each
// failure for the empty sequence (then every run would repeat the last and it would never pass).
TEST_CASE("learning runs whose requests all fail are no repeats: the key passes", "[pass][hostile]") {
  const auto refusing = std::make_shared<refusing_resource>();
  const backend be(refusing);
  {
    alloc_cache cache{cache_options{}};
    refusing->refuse_from = 0;
    for (std::size_t run = 0; run < learn_window; ++run) {
      step st(cache, {.plan = "serve"});
      CHECK_THROWS_AS(cache.allocate(be, 4096 * (1 + run)), out_of_memory);
    }
    refusing->refuse_from = static_cast<std::size_t>(-1);
    const cache_stats stats = cache.stats();
    CHECK(stats.plan_pass_entries == 1);
    CHECK(stats.plan_recordings == 0);
    check_nothing_held(cache, be);
  }
  CHECK(be.outstanding_bytes() == 0);
}

// A cache destroyed while a step of its passing key is open (and, in the other section, while a
// probing step is open): the step ends after the cache, and its buffers, one held by pointer, are
// released after both. Every byte goes back to the backend.
TEST_CASE("caches destroyed under a passing or probing step; escapes freed by pointer after", "[pass][hostile]") {
  const backend be = make_host_backend();
  const bool probing = GENERATE(false, true);
  INFO((probing ? "probing" : "passing"));
  void* escaped = nullptr;
  std::uint64_t stamp = 0;
  std::size_t bytes = 0;
  {
    std::optional<step> open;
    std::vector<data_ref> live;
    {
      alloc_cache cache{cache_options{}};
      warm_plain_cache(cache, be);
      std::size_t run = 0;
      for (; run < learn_window; ++run) serve_step(cache, be, novel_sizes(run));
      if (probing)
        for (int i = 0; i < first_pass; ++i) serve_step(cache, be, novel_sizes(run++));
      REQUIRE(cache.stats().plan_pass_entries == 1);
      const cache_stats before = cache.stats();
      open.emplace(cache, scope_options{.plan = "serve"});
      for (std::size_t b : novel_sizes(run)) {
        live.push_back(cache.allocate(be, b));
        write_stamp(live.back(), 99);
      }
      stamp = next_stamp.fetch_add(1);
      write_stamp(live.back(), stamp);
      bytes = live.back().bytes();
      escaped = to_pointer(std::move(live.back()));
      live.pop_back();
      CHECK(cache.stats().plan_pass_runs == before.plan_pass_runs);
    }
    for (const data_ref& r : live) CHECK(stamp_intact(r.data(), r.bytes(), 99));
    open.reset();  // the step ends after its cache
  }
  CHECK(stamp_intact(escaped, bytes, stamp));
  free_pointer(escaped);
  CHECK(be.outstanding_bytes() == 0);
}

// The key's 32nd run ends after its cache was destroyed: scopes of it open on three threads when
// the cache goes; the first to end brings the key into pass in the closed store, the others end
// after it. Their buffers keep their bytes, one of each is freed by pointer after all, and every
// byte goes back to the backend.
TEST_CASE("a key enters pass at the end of a scope after its cache was destroyed", "[pass][hostile]") {
  const backend be = make_host_backend();
  constexpr int threads_n = 3;
  struct escape {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    std::uint64_t stamp = 0;
  };
  std::vector<escape> escapes(threads_n);
  std::atomic<int> broken{0};
  {
    auto cache = std::make_unique<alloc_cache>(cache_options{});
    warm_plain_cache(*cache, be);
    for (std::size_t i = 0; i + 1 < learn_window; ++i) serve_scope(*cache, be, novel_sizes(i));
    REQUIRE(cache->stats().plan_pass_entries == 0);
    std::counting_semaphore<threads_n> opened{0};
    std::vector<std::unique_ptr<std::binary_semaphore>> go;
    for (int t = 0; t < threads_n; ++t) go.push_back(std::make_unique<std::binary_semaphore>(0));
    std::vector<std::thread> threads;
    for (int t = 0; t < threads_n; ++t) {
      threads.emplace_back([&, t] {
        scope s(*cache, {.plan = "serve"});
        std::vector<data_ref> live;
        std::vector<std::uint64_t> stamps;
        auto take = [&](std::size_t bytes) {
          live.push_back(allocate(be, bytes));
          stamps.push_back(next_stamp.fetch_add(1));
          write_stamp(live.back(), stamps.back());
        };
        const std::vector<std::size_t> sizes = novel_sizes(static_cast<std::size_t>(300 + t));
        for (std::size_t k = 0; k < 3; ++k) take(sizes[k]);
        opened.release();
        go[static_cast<std::size_t>(t)]->acquire();
        for (std::size_t k = 3; k < sizes.size(); ++k) take(sizes[k]);  // the cache is gone by now
        for (std::size_t k = 0; k < live.size(); ++k)
          broken += stamp_intact(live[k].data(), live[k].bytes(), stamps[k]) ? 0 : 1;
        escapes[static_cast<std::size_t>(t)] = {nullptr, live.back().bytes(), stamps.back()};
        escapes[static_cast<std::size_t>(t)].ptr = to_pointer(std::move(live.back()));
      });
    }
    for (int t = 0; t < threads_n; ++t) opened.acquire();
    cache.reset();
    for (int t = 0; t < threads_n; ++t) {
      go[static_cast<std::size_t>(t)]->release();
      threads[static_cast<std::size_t>(t)].join();
    }
  }
  CHECK(broken == 0);
  for (const escape& e : escapes) {
    REQUIRE(e.ptr != nullptr);
    CHECK(stamp_intact(e.ptr, e.bytes, e.stamp));
    free_pointer(e.ptr);
  }
  CHECK(be.outstanding_bytes() == 0);
}
