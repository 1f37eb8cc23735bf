// What frameworks need from the C++ API: cache-level allocations from any thread, steps that
// span threads, and free by pointer.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <cstring>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <refpool/pointer.hpp>
#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"
#include "support/forwarding_resource.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::host_fixture;
using refpool::test::what;

namespace {

/// A resource that counts its own destruction (to see a backend die).
class watched_resource final : public refpool::test::forwarding_resource {
 public:
  explicit watched_resource(std::atomic<bool>& destroyed) : destroyed_(destroyed) {}
  ~watched_resource() override { destroyed_ = true; }
  std::string_view name() const noexcept override { return "watched"; }

 private:
  std::atomic<bool>& destroyed_;
};

}  // namespace

TEST_CASE_METHOD(host_fixture, "cache-level requests hit from the second round, with releases on another thread",
                 "[framework]") {
  for (int round = 0; round < 5; ++round) {
    std::vector<data_ref> made;
    for (std::size_t i = 1; i <= 8; ++i) made.push_back(cache.allocate(be, 1000 * i));
    std::thread releaser([&] { made.clear(); });  // back to the slot that handed them out
    releaser.join();
  }
  const cache_stats st = cache.stats();
  CHECK(st.misses == 8);
  CHECK(st.hits == 32);
  CHECK(st.steals == 0);
  CHECK(be.allocation_count() == 8);
  CHECK(st.live_blocks == 0);
  CHECK(st.idle_blocks == 8);
}

TEST_CASE_METHOD(host_fixture,
                 "each thread gets its own part of the cache; idle blocks of a thread that ended serve others",
                 "[framework]") {
  void* first = nullptr;
  void* second = nullptr;
  std::thread([&] {
    data_ref r = cache.allocate(be, 4096);
    first = r.data();
  }).join();
  std::thread([&] {
    data_ref r = cache.allocate(be, 4096);  // the ended thread's idle block, not a new one
    second = r.data();
  }).join();
  CHECK(second == first);
  CHECK(be.allocation_count() == 1);
  CHECK(cache.stats().hits == 1);
  CHECK(cache.stats().steals == 0);  // the thread got the whole part, idle block and all

  // Two threads at once, each with a block live: two parts. Each releases into its own part and
  // gets its own block back, taking nothing from the other's.
  std::latch both_hold(2);
  std::array<void*, 2> held{};
  std::array<void*, 2> again{};
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      data_ref r = cache.allocate(be, 8192);
      held[t] = r.data();
      both_hold.arrive_and_wait();
      r.reset();
      again[t] = cache.allocate(be, 8192).data();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(held[0] != held[1]);
  CHECK(again == held);
  const cache_stats st = cache.stats();
  CHECK(st.misses == 3);
  CHECK(st.hits == 3);
  CHECK(st.steals == 0);
}

TEST_CASE_METHOD(host_fixture, "a step counts buffers of any thread that outlive it", "[framework][step]") {
  data_ref kept;
  {
    step s(cache);
    std::thread a([&] { kept = cache.allocate(be, 512); });
    std::thread b([&] { data_ref scratch = cache.allocate(be, 256); });
    a.join();
    b.join();
    data_ref mine = cache.allocate(be, 128);
  }
  CHECK(cache.stats().escapes == 1);
  {
    step s(cache);
    kept.reset();  // released inside a later step: it escaped once, and is not counted again
  }
  const cache_stats st = cache.stats();
  CHECK(st.escapes == 1);
  CHECK(st.steps == 2);
  CHECK(st.live_blocks == 0);
}

TEST_CASE_METHOD(host_fixture, "steps do not nest, end once, and may end on another thread", "[framework][step]") {
  step first(cache);
  CHECK_THROWS_MATCHES(step(cache), scope_error, what(Contains("a step is already open on this cache")));
  std::thread([&] { first.end(); }).join();
  first.end();         // idempotent
  step second(cache);  // the first is over
  first.end();         // ended once already: this does not end the second
  CHECK_THROWS_AS(step(cache), scope_error);
  second.end();
  step third(cache);
  third.end();
  CHECK(cache.stats().steps == 3);
}

TEST_CASE_METHOD(host_fixture, "warm-up steps run uncached", "[framework][step]") {
  for (int i = 0; i < 3; ++i) {
    step s(cache, {.uncached_warmup_entries = 2, .plan = {}});
    data_ref r = cache.allocate(be, 1 << 16);
    CHECK(cache.stats().uncached_live_bytes == (i < 2 ? std::size_t{1} << 16 : 0));
  }
  const cache_stats st = cache.stats();
  CHECK(st.uncached_allocations == 2);
  CHECK(st.uncached_live_bytes == 0);
  CHECK(st.misses == 1);
  CHECK(st.held_bytes == std::size_t{1} << 16);
}

TEST_CASE_METHOD(host_fixture, "free by pointer: round trips, zero bytes, several hand-overs, and misuse",
                 "[framework][pointer]") {
  void* p = to_pointer(cache.allocate(be, 1024));
  REQUIRE(p != nullptr);
  std::memset(p, 1, 1024);
  data_ref view = pointer_ref(p);
  CHECK(view.data() == p);
  CHECK(view.use_count() == 2);
  void* again = to_pointer(std::move(view));  // a second hand-over of the same buffer
  CHECK(again == p);
  free_pointer(p);
  CHECK(cache.stats().live_blocks == 1);  // one hand-over still holds it
  free_pointer(p);
  CHECK(cache.stats().live_blocks == 0);
  const std::string address = fmt::format("{}", p);
  CHECK_THROWS_MATCHES(free_pointer(p), invalid_argument,  // a double free, caught
                       what(Contains("free of pointer " + address) && Contains("double free")));
  int local = 0;
  const std::string local_address = fmt::format("{}", static_cast<void*>(&local));
  CHECK_THROWS_MATCHES(free_pointer(&local), invalid_argument,
                       what(Contains("free of pointer " + local_address) && Contains("never handed out")));
  CHECK_THROWS_MATCHES(pointer_ref(&local), invalid_argument,
                       what(Contains("pointer_ref of pointer " + local_address)));
  free_pointer(nullptr);
  CHECK(to_pointer(cache.allocate(be, 0)) == nullptr);

  data_ref freed = cache.allocate(be, 64);
  freed.unsafe_free();
  CHECK_THROWS_AS(to_pointer(std::move(freed)), use_after_free);
  CHECK(be.outstanding_bytes() == cache.stats().held_bytes);
}

TEST_CASE("a buffer keeps its place in the pointer table across pairs, and leaves it when it goes",
          "[framework][pointer]") {
  for (const segment_policy segments : {segment_policy::off, segment_policy::on}) {
    const backend be = make_host_backend();
    alloc_cache cache{cache_options{.segments = segments}};
    void* p = to_pointer(cache.allocate(be, 1024));
    free_pointer(p);
    CHECK_THROWS_AS(free_pointer(p), invalid_argument);  // idle in the cache: nothing kept under p
    void* again = to_pointer(cache.allocate(be, 1024));  // the same idle block, found by its node
    CHECK(again == p);
    free_pointer(again);
    // Pieces of other sizes around it, so that (with segments) giving pieces back coalesces them.
    std::vector<void*> around;
    for (std::size_t bytes : {512, 4096, 768, 2048}) around.push_back(to_pointer(cache.allocate(be, bytes)));
    for (void* q : around) free_pointer(q);
    CHECK(cache.reclaim() > 0);  // every idle block goes, and its node with it
    CHECK_THROWS_AS(free_pointer(p), invalid_argument);
    for (void* q : around) CHECK_THROWS_AS(free_pointer(q), invalid_argument);
    // Buffers made again, perhaps at the same addresses, get nodes of their own.
    for (int i = 0; i < 3; ++i) {
      std::vector<void*> made;
      for (std::size_t bytes : {1024, 512, 4096, 768, 2048}) made.push_back(to_pointer(cache.allocate(be, bytes)));
      for (void* q : made) free_pointer(q);
      cache.reclaim();
    }
    CHECK(cache.stats().live_blocks == 0);
    CHECK(be.outstanding_bytes() == cache.stats().held_bytes);
  }
}

TEST_CASE("free by pointer in planned steps whose keys share one arena", "[framework][pointer][plan]") {
  // Regions of the two keys' plans lie over the same arena bytes, so one address belongs to one
  // plan's region in one step and to the other's in the next.
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  std::array<std::vector<void*>, 2> seen;
  for (int round = 0; round < 7; ++round) {  // round 0: pending; 1: recorded; 2..6 replayed
    for (std::size_t k = 0; k < 2; ++k) {
      scope s(cache, {.plan = k == 0 ? "short" : "long"});
      void* first = to_pointer(allocate(be, 1024 * (k + 1)));
      void* second = to_pointer(allocate(be, 4096 * (k + 1)));
      std::memset(first, 1, 1024 * (k + 1));
      free_pointer(first);
      void* third = to_pointer(allocate(be, 512));
      free_pointer(second);
      free_pointer(third);
      CHECK_THROWS_AS(free_pointer(first), invalid_argument);
      if (round >= 3) seen[k].insert(seen[k].end(), {first, second, third});
    }
  }
  const cache_stats st = cache.stats();
  CHECK(st.plans == 2);
  CHECK(st.plan_busy_runs == 0);
  CHECK(st.plan_hits == 5 * 2 * 3);  // rounds 2..6 replayed both keys, 3 requests each
  CHECK(std::any_of(seen[0].begin(), seen[0].end(),
                    [&](void* p) { return std::find(seen[1].begin(), seen[1].end(), p) != seen[1].end(); }));
  CHECK(st.live_blocks == 0);
}

TEST_CASE_METHOD(host_fixture,
                 "two threads freeing one pointer at once: one frees it, the other is told of a double free",
                 "[framework][pointer][threads]") {
  constexpr int rounds = 5000;
  std::atomic<void*> shared{nullptr};
  std::atomic<int> freed{0};
  std::atomic<int> refused{0};
  std::barrier<> meet(2);
  const auto free_once = [&] {
    try {
      free_pointer(shared.load());
      freed += 1;
    } catch (const invalid_argument&) {
      refused += 1;
    }
  };
  std::thread other([&] {
    for (int i = 0; i < rounds; ++i) {
      meet.arrive_and_wait();  // the pointer is there
      free_once();
      meet.arrive_and_wait();  // both tried
    }
  });
  for (int i = 0; i < rounds; ++i) {
    shared = to_pointer(cache.allocate(be, 256 * (1 + i % 4)));
    meet.arrive_and_wait();
    free_once();
    meet.arrive_and_wait();
  }
  other.join();
  CHECK(freed == rounds);
  CHECK(refused == rounds);
  const cache_stats st = cache.stats();
  CHECK(st.live_blocks == 0);
  CHECK(st.held_bytes == be.outstanding_bytes());
}

TEST_CASE_METHOD(host_fixture, "pointers freed on other threads while the owners keep allocating",
                 "[framework][pointer][threads]") {
  constexpr int producers = 4;
  constexpr int per_producer = 20000;
  std::mutex mutex;
  std::vector<void*> queue;
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < producers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < per_producer; ++i) {
        const std::size_t bytes = 256 * (1 + (i + t) % 7);
        void* p = to_pointer(cache.allocate(be, bytes));
        std::memset(p, t, bytes);
        std::lock_guard guard(mutex);
        queue.push_back(p);
      }
      done += 1;
    });
  }
  threads.emplace_back([&] {  // frees everything, by address, on its own thread
    for (;;) {
      std::vector<void*> batch;
      {
        std::lock_guard guard(mutex);
        batch.swap(queue);
      }
      for (void* p : batch) free_pointer(p);
      if (batch.empty() && done == producers) {
        std::lock_guard guard(mutex);
        if (queue.empty()) return;
      }
    }
  });
  for (auto& t : threads) t.join();
  const cache_stats st = cache.stats();
  CHECK(st.hits + st.misses == std::uint64_t{producers} * per_producer);
  CHECK(st.live_blocks == 0);
  CHECK(st.held_bytes == be.outstanding_bytes());
  CHECK(st.hits > st.misses);  // released blocks came back to their owners and were reused
}

TEST_CASE("a cache destroyed while threads hold their parts: buffers stay valid, nothing leaks", "[framework]") {
  std::atomic<bool> destroyed{false};
  std::atomic<bool> resource_gone{false};
  {
    const backend be(std::make_shared<watched_resource>(resource_gone));
    auto cache = std::make_unique<alloc_cache>(cache_options{});
    data_ref survivor;
    std::atomic<int> phase{0};
    std::thread worker([&] {
      survivor = cache->allocate(be, 2048);
      data_ref idle = cache->allocate(be, 4096);
      data_ref held = cache->allocate(be, 8192);
      idle.reset();
      phase = 1;
      while (phase != 2) std::this_thread::yield();
      held.reset();  // into its part of a destroyed cache: freed to the backend at once
      // the thread then ends, giving its part back to a cache that is gone
    });
    while (phase != 1) std::this_thread::yield();
    cache.reset();  // frees the idle 4096 B block; the live ones stay valid
    destroyed = true;
    CHECK(be.outstanding_bytes() == 2048 + 8192);
    std::memset(survivor.data(), 3, 2048);
    phase = 2;
    worker.join();
    CHECK(be.outstanding_bytes() == 2048);
    survivor.reset();
    CHECK(be.outstanding_bytes() == 0);
  }
  CHECK(destroyed);
  CHECK(resource_gone);  // nothing kept the backend alive
}

TEST_CASE("after reclaim a cache keeps no backend alive and no bookkeeping per size", "[framework]") {
  std::atomic<bool> gone{false};
  alloc_cache cache{cache_options{}};
  {
    const backend be(std::make_shared<watched_resource>(gone));
    scope s(cache);
    for (std::size_t bytes = 1; bytes <= 2000; ++bytes) (void)allocate(be, bytes);
  }
  CHECK_FALSE(gone);  // its 2000 idle blocks hold it
  CHECK(cache.reclaim(0) > 0);
  CHECK(gone);
  CHECK(cache.stats().idle_blocks == 0);
}

TEST_CASE("a cache destroyed while other threads release its buffers: each is freed once", "[framework][threads]") {
  const backend be = make_host_backend();
  for (int trial = 0; trial < 20; ++trial) {
    auto cache = std::make_unique<alloc_cache>(cache_options{});
    std::vector<data_ref> buffers;
    {
      scope s(*cache);
      for (int i = 0; i < 400; ++i) buffers.push_back(allocate(be, 64 * (1 + i % 5)));
    }
    // Four threads release them (cross-thread: into the ended scope's slot) while the cache goes.
    std::atomic<int> started{0};
    std::vector<std::thread> releasers;
    for (int t = 0; t < 4; ++t) {
      releasers.emplace_back([&, t] {
        started += 1;
        for (std::size_t i = static_cast<std::size_t>(t); i < buffers.size(); i += 4) buffers[i].reset();
      });
    }
    while (started != 4) std::this_thread::yield();
    cache.reset();
    for (auto& t : releasers) t.join();
    CHECK(be.outstanding_bytes() == 0);
  }
  CHECK(be.allocation_count() == be.deallocation_count());
}
