// Lifetimes across threads (docs/design.md, "Lifetimes"): whatever another thread can still reach
// (a slot, a step's router, a planned run, a pointer-table entry) outlives that thread's use of
// it, also when the cache, scope or step that made it ends meanwhile. These tests race those
// ends against calls in flight; under ASan and TSan (CI runs both) a broken lifetime shows as a
// use-after-free or a data race, and the checks below catch lost or doubled frees in any build.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <refpool/pointer.hpp>
#include <refpool/refpool.hpp>

#include "support/forwarding_resource.hpp"

using namespace refpool;

namespace {

/// A gate a backend call waits at, so a test can hold a miss in flight while it ends things.
class gate {
 public:
  /// Called from the backend call: says it arrived, waits until opened.
  void pass() {
    arrived_.store(true);
    arrived_.notify_all();
    while (!open_.load()) open_.wait(false);
  }
  void wait_for_arrival() {
    while (!arrived_.load()) arrived_.wait(false);
  }
  void open() {
    open_.store(true);
    open_.notify_all();
  }
  /// Only calls made after this wait (the ones before are the test's set-up).
  void arm() { armed_.store(true); }
  [[nodiscard]] bool armed() const { return armed_.load(); }

 private:
  std::atomic<bool> armed_{false};
  std::atomic<bool> arrived_{false};
  std::atomic<bool> open_{false};
};

/// Host virtual memory whose commits wait at the gate (the segment path's driver call).
class gated_virtual_memory final : public virtual_memory {
 public:
  gated_virtual_memory(virtual_memory& upstream, gate& g) : upstream_(upstream), gate_(g) {}
  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  void* reserve(std::size_t bytes) override { return upstream_.reserve(bytes); }
  bool commit(void* addr, std::size_t bytes) override {
    if (gate_.armed()) gate_.pass();
    return upstream_.commit(addr, bytes);
  }
  void decommit(void* addr, std::size_t bytes) noexcept override { upstream_.decommit(addr, bytes); }
  void release(void* addr, std::size_t bytes) noexcept override { upstream_.release(addr, bytes); }

 private:
  virtual_memory& upstream_;
  gate& gate_;
};

/// A host resource whose allocations and commits wait at the gate once it is armed.
class gated_resource final : public test::forwarding_resource {
 public:
  explicit gated_resource(gate& g) : gate_(g), vm_(*upstream_->address_space(), g) {}
  void* allocate(std::size_t bytes, stream_ref stream) override {
    if (gate_.armed()) gate_.pass();
    return forwarding_resource::allocate(bytes, stream);
  }
  virtual_memory* address_space() noexcept override { return &vm_; }

 private:
  gate& gate_;
  gated_virtual_memory vm_;
};

/// A host resource whose first free after the gate is armed waits at the gate; later frees pass
/// (a cache's close frees its blocks through it while the first one waits).
class gated_free_resource final : public test::forwarding_resource {
 public:
  explicit gated_free_resource(gate& g) : gate_(g) {}
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override {
    if (gate_.armed() && !held_.exchange(true)) gate_.pass();
    forwarding_resource::deallocate(ptr, bytes, stream);
  }

 private:
  gate& gate_;
  std::atomic<bool> held_{false};
};

/// Destroys the cache while a miss waits at the gate, then lets the miss go on. The gate opens
/// from here after a pause, not after the destruction: with segments the destruction itself waits
/// for the heap the miss is growing.
void destroy_then_open(std::unique_ptr<alloc_cache>& cache, gate& g) {
  std::thread destroyer([&] { cache.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  g.open();
  destroyer.join();
}

cache_options with_segments(segment_policy policy) {
  cache_options o;
  o.segments = policy;
  return o;
}

}  // namespace

TEST_CASE("a cache destroyed while a scope's miss is in flight: the block the miss makes outlives it safely",
          "[lifetime][threads]") {
  const segment_policy policy = GENERATE(segment_policy::off, segment_policy::on);
  CAPTURE(policy == segment_policy::on);
  gate g;
  const backend be(std::make_shared<gated_resource>(g));
  auto cache = std::make_unique<alloc_cache>(with_segments(policy));
  {
    scope warm(*cache);  // a segment for the heap to grow, so the miss below commits more
    (void)allocate(be, 4096);
  }
  g.arm();
  std::thread worker([&] {
    scope s(*cache);
    data_ref r = allocate(be, std::size_t{3} << 20);  // a miss: waits in the backend
    std::memset(r.data(), 7, r.bytes());
    s.close();  // gives the lease back to a cache that is gone
    r.reset();  // the block's slot must still be there
  });
  g.wait_for_arrival();
  destroy_then_open(cache, g);
  worker.join();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == be.deallocation_count());
}

TEST_CASE("a cache destroyed while a cache-level miss is in flight: the thread's slot outlives its block",
          "[lifetime][threads]") {
  const segment_policy policy = GENERATE(segment_policy::off, segment_policy::on);
  CAPTURE(policy == segment_policy::on);
  gate g;
  const backend be(std::make_shared<gated_resource>(g));
  auto cache = std::make_unique<alloc_cache>(with_segments(policy));
  (void)cache->allocate(be, 4096);
  g.arm();
  data_ref kept;
  std::thread worker([&] {
    kept = cache->allocate(be, std::size_t{3} << 20);  // waits in the backend
    std::memset(kept.data(), 7, kept.bytes());
  });  // the thread ends: its slot goes back to a cache that is gone
  g.wait_for_arrival();
  destroy_then_open(cache, g);
  worker.join();
  kept.reset();
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE("a cache destroyed while a step's first replay places its arena's span: the span goes too",
          "[lifetime][threads][step][plan]") {
  // An arena's memory is a span of the backend's heap, placed at its first claim: the first
  // request of the first replay. The cache goes while that placement waits in the backend.
  gate g;
  const backend be(std::make_shared<gated_resource>(g));
  auto cache = std::make_unique<alloc_cache>(cache_options{});
  for (int i = 0; i < 2; ++i) {  // a new sequence (pending), then the same again: a plan, no memory yet
    step run(*cache, {.plan = "ends-late"});
    (void)cache->allocate(be, 4096);
  }
  const std::uint64_t before = be.allocation_count();
  g.arm();
  std::thread replayer([&] {
    step st(*cache, {.plan = "ends-late"});
    data_ref r = cache->allocate(be, 4096);  // the claim places the span: waits in the backend
    std::memset(r.data(), 7, r.bytes());
    r.reset();
    st.end();
  });
  g.wait_for_arrival();
  CHECK(be.allocation_count() == before);  // the span's allocation is the one waiting
  destroy_then_open(cache, g);
  replayer.join();
  CHECK(be.outstanding_bytes() == 0);  // the span came too late for the store: nothing is kept
  CHECK(be.allocation_count() == be.deallocation_count());
}

TEST_CASE("a release over the idle limit frees while another thread destroys the cache: the state outlives it",
          "[lifetime][threads][idle-limit]") {
  // The release puts its block back, finds the cache over its limit and frees idle blocks; the
  // free waits in the backend while the cache is destroyed. The releasing thread holds the cache's
  // state until its last access (ASan: heap-use-after-free in free_idle without it). Whole blocks:
  // a segment's trim waits under its heap's lock, which close() takes too (the stress test races it).
  gate g;
  const backend be(std::make_shared<gated_free_resource>(g));
  cache_options options = with_segments(segment_policy::off);
  options.max_idle_bytes = 0;
  auto cache = std::make_unique<alloc_cache>(options);
  data_ref kept;
  std::thread([&] { kept = cache->allocate(be, std::size_t{3} << 20); }).join();  // nobody owns its slot now
  g.arm();
  std::thread releaser([&] { kept.reset(); });  // over the limit at once: frees it (and trims) itself
  g.wait_for_arrival();
  cache.reset();
  g.open();
  releaser.join();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == be.deallocation_count());
}

namespace {

/// Threads that keep allocating through a cache (cache-level requests, which go through the open
/// step's router) until told to stop.
class allocating_threads {
 public:
  allocating_threads(alloc_cache& cache, const backend& be, int count) {
    for (int t = 0; t < count; ++t) {
      threads_.emplace_back([&cache, &be, this, t] {
        while (!stop_.load(std::memory_order_relaxed)) {
          data_ref a = cache.allocate(be, 256 * static_cast<std::size_t>(1 + t));
          data_ref b = cache.allocate(be, 4096);
          std::memset(a.data(), t, a.bytes());
          requests_.fetch_add(2, std::memory_order_relaxed);
        }
      });
    }
  }
  ~allocating_threads() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  [[nodiscard]] std::uint64_t requests() const { return requests_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> requests_{0};
  std::vector<std::thread> threads_;
};

/// Opens and ends `steps` steps with `options` while three threads allocate through them.
void end_steps_under_allocating_threads(scope_options options, int steps) {
  const backend be = make_host_backend();
  {
    alloc_cache cache{cache_options{}};
    allocating_threads threads(cache, be, 3);
    for (int i = 0; i < steps; ++i) {
      step st(cache, options);
      const std::uint64_t before = threads.requests();
      // Wait until the threads are inside this step's requests, so its end races them.
      while (threads.requests() < before + 4) std::this_thread::yield();
    }
    threads.stop();
    CHECK(cache.stats().steps == static_cast<std::uint64_t>(steps));
  }
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == be.deallocation_count());
}

}  // namespace

TEST_CASE("warm-up steps ended while other threads allocate through them", "[lifetime][threads][step]") {
  scope_options warmup;
  warmup.uncached_warmup_entries = 1000000;
  end_steps_under_allocating_threads(warmup, 300);
}

TEST_CASE("planned steps ended while other threads allocate through them", "[lifetime][threads][step][plan]") {
  end_steps_under_allocating_threads({.plan = "racing"}, 300);
}

TEST_CASE("a thread's kept step router outlives its step and its cache, and goes with the thread",
          "[lifetime][threads][step][plan]") {
  // A thread keeps a reference to the router of the step it last called (cache_state.cpp): here
  // it outlives the step and then the cache, and the thread's exit drops it. Nothing may leak
  // (LSan in the ASan build) or be freed twice, and a later step on a new cache is served apart.
  const backend be = make_host_backend();
  std::atomic<int> stage{0};
  auto cache = std::make_unique<alloc_cache>(cache_options{});
  auto st = std::make_unique<step>(*cache);  // no key: planned under the cache's own (auto_plans)
  std::thread worker([&] {
    for (int i = 0; i < 3; ++i) (void)cache->allocate(be, 4096 * (i + 1));
    stage.store(1);
    stage.notify_all();
    while (stage.load() != 2) stage.wait(1);
  });
  while (stage.load() != 1) stage.wait(0);
  st.reset();                          // the step ends: the worker still keeps its router
  cache.reset();                       // and the cache goes: the router keeps its state
  CHECK(be.outstanding_bytes() == 0);  // the cache's blocks went back all the same
  stage.store(2);
  stage.notify_all();
  worker.join();  // the thread's exit drops the last reference
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == be.deallocation_count());

  // A thread whose kept router is an ended step's sends its next requests to the open step.
  alloc_cache other{cache_options{}};
  std::atomic<int> turn{0};  // odd: the worker's turn in step (turn + 1) / 2; 9: stop
  std::thread t([&] {
    for (int seen = 0;;) {
      while (turn.load() == seen) turn.wait(seen);
      seen = turn.load();
      if (seen == 9) return;
      for (int i = 0; i < 3; ++i) (void)other.allocate(be, 4096 * (i + 1));
      turn.store(++seen);
      turn.notify_all();
    }
  });
  for (int round = 0; round < 4; ++round) {
    step s(other);
    const int mine = 2 * round + 1;
    turn.store(mine);
    turn.notify_all();
    while (turn.load() == mine) turn.wait(mine);
  }
  turn.store(9);
  turn.notify_all();
  t.join();
  const cache_stats stats = other.stats();
  CHECK(stats.steps == 4);
  CHECK(stats.plans == 1);  // the sequence repeated in round 2: rounds 3 and 4 replay it
  CHECK(stats.plan_hits == 6);
}

namespace {

/// A host resource that says when it is destroyed.
class watched_resource final : public test::forwarding_resource {
 public:
  explicit watched_resource(std::atomic<bool>& destroyed) : destroyed_(destroyed) {}
  ~watched_resource() override { destroyed_.store(true); }

 private:
  std::atomic<bool>& destroyed_;
};

/// A thread that does `work` and then stays alive, making no request, until released.
class idle_worker {
 public:
  explicit idle_worker(const std::function<void()>& work)
      : thread_([this, work] {
          work();
          stage_.store(1);
          stage_.notify_all();
          while (stage_.load() != 2) stage_.wait(1);
        }) {
    while (stage_.load() != 1) stage_.wait(0);
  }
  ~idle_worker() {
    stage_.store(2);
    stage_.notify_all();
    thread_.join();
  }
  idle_worker(const idle_worker&) = delete;
  idle_worker& operator=(const idle_worker&) = delete;

 private:
  std::atomic<int> stage_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a thread that makes no more steps keeps nothing of its last step: its backend goes with the cache",
          "[lifetime][threads][step][plan]") {
  // The worker keeps a reference to the router of the step it called (cache_state::step_router)
  // and then makes no request for a long time. That finished router must hold neither the cache's
  // state (whose segment heaps and plans hold backends) nor a backend of its own.
  const segment_policy policy = GENERATE(segment_policy::off, segment_policy::on);
  const bool warmup = GENERATE(false, true);
  CAPTURE(policy == segment_policy::on, warmup);
  std::atomic<bool> destroyed{false};
  auto be = std::make_unique<backend>(std::make_shared<watched_resource>(destroyed));
  auto cache = std::make_unique<alloc_cache>(with_segments(policy));
  std::optional<idle_worker> worker;
  {
    scope_options options;  // no key: planned under the cache's own (auto_plans)
    if (warmup) options.uncached_warmup_entries = 1;
    step st(*cache, options);
    worker.emplace([&] {
      for (int i = 0; i < 3; ++i) (void)cache->allocate(*be, 4096 * (i + 1));
    });
  }
  cache.reset();
  be.reset();
  CHECK(destroyed.load());
  worker.reset();
  CHECK(destroyed.load());
}

TEST_CASE("a thread that keeps a lease of a destroyed cache keeps nothing of its backends",
          "[lifetime][threads][segments]") {
  // The worker's cache-level lease keeps the closed cache's state until its next request or its
  // end; the state's segment heaps, each holding its backend, go at close() when they hold nothing.
  std::atomic<bool> destroyed{false};
  auto be = std::make_unique<backend>(std::make_shared<watched_resource>(destroyed));
  auto cache = std::make_unique<alloc_cache>(with_segments(segment_policy::on));
  std::optional<idle_worker> worker(std::in_place, [&] {
    data_ref r = cache->allocate(*be, 4096);  // a piece of a segment
    std::memset(r.data(), 1, r.bytes());
  });
  cache.reset();
  be.reset();
  CHECK(destroyed.load());
  worker.reset();
  CHECK(destroyed.load());
}

TEST_CASE("a pending recording of a backend that went becomes a plan safely: the recording holds its backend",
          "[lifetime][step][plan]") {
  // A sequence seen once waits as a recording; when another sequence of its key comes again,
  // every pending one becomes a plan, with an arena of its backend. Here the first backend has
  // gone by then (its handle dropped, the cache's idle blocks of it reclaimed, its run ended).
  std::atomic<bool> destroyed{false};
  auto first = std::make_unique<backend>(std::make_shared<watched_resource>(destroyed));
  const backend second = make_host_backend();
  alloc_cache cache{with_segments(segment_policy::off)};
  const auto run = [&](const backend& be) {
    step st(cache, {.plan = "two-backends"});
    data_ref a = cache.allocate(be, 4096);
    data_ref b = cache.allocate(be, 8192);
    std::memset(a.data(), 1, a.bytes());
  };
  run(*first);   // pending
  run(second);   // pending
  cache.reclaim(0);
  first.reset();
  run(second);  // came again: both become plans, the first one's arena on its own backend
  const cache_stats stats = cache.stats();
  CHECK(stats.plans == 2);
  CHECK_FALSE(destroyed.load());  // its plan holds it now
  cache.reclaim(0);
}

TEST_CASE("a double free racing pointer_ref: exactly one of the two frees is accepted",
          "[lifetime][threads][pointer]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  int accepted_twice = 0;
  for (int trial = 0; trial < 300; ++trial) {
    void* p = to_pointer(cache.allocate(be, 512));
    std::atomic<int> looking{0};
    std::atomic<int> accepted{0};
    // Two threads keep taking handles by address (each a pin in the table while it runs) until
    // the buffer is gone from the table; two others free its one hand-over meanwhile.
    std::vector<std::thread> threads;
    for (int l = 0; l < 2; ++l) {
      threads.emplace_back([&] {
        looking.fetch_add(1);
        // Bounded: a broken table may keep the buffer findable for ever (then the checks below fail).
        for (int round = 0; round < 200000; ++round) {
          try {
            const data_ref r = pointer_ref(p);
            if (r.bytes() != 512) std::abort();  // the buffer, still alive (read only: both threads hold it)
          } catch (const invalid_argument&) {
            return;  // freed
          }
        }
      });
    }
    for (int f = 0; f < 2; ++f) {
      threads.emplace_back([&] {
        while (looking.load() < 2) {}
        try {
          free_pointer(p);
          accepted.fetch_add(1);
        } catch (const invalid_argument&) {}
      });
    }
    for (auto& t : threads) t.join();
    if (accepted.load() != 1) ++accepted_twice;
    CHECK_THROWS_AS(free_pointer(p), invalid_argument);  // freed: nothing is left to free
    CHECK(cache.stats().live_blocks == 0);               // and nothing keeps the buffer
  }
  CHECK(accepted_twice == 0);
  cache.reclaim(0);
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE("a cache destroyed while four threads allocate in their scopes: every buffer stays its owner's",
          "[lifetime][threads]") {
  const backend be = make_host_backend();
  for (int trial = 0; trial < 20; ++trial) {
    auto cache =
        std::make_unique<alloc_cache>(with_segments(trial % 2 == 0 ? segment_policy::off : segment_policy::on));
    std::atomic<int> running{0};
    std::atomic<bool> stop{false};
    std::atomic<int> damaged{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        scope s(*cache);  // outlives the cache: later requests of the scope go to the backend
        running.fetch_add(1);
        std::vector<data_ref> mine;
        for (unsigned i = 0; !stop.load(std::memory_order_relaxed) || i < 200; ++i) {
          data_ref r = allocate(be, 256 * (1 + (i + static_cast<unsigned>(t)) % 7));
          std::memset(r.data(), t + 1, r.bytes());
          mine.push_back(std::move(r));
          if (mine.size() > 8) mine.erase(mine.begin() + static_cast<long>(i % mine.size()));
          for (const data_ref& m : mine)
            if (static_cast<const unsigned char*>(m.data())[m.bytes() - 1] != t + 1) damaged.fetch_add(1);
        }
      });
    }
    while (running.load() < 4) std::this_thread::yield();
    cache.reset();
    stop = true;
    for (auto& t : threads) t.join();
    CHECK(damaged.load() == 0);
    CHECK(be.outstanding_bytes() == 0);
  }
}

// ---- a hostile review of the lifetime fixes of issue 35 ---------------------------------------
// Cases that try to break them apart from the tests written with them. A few rounds by default
// (CI's time: about 0.3 s on the 2-core machine); REFPOOL_HOSTILE_ROUNDS sets the rounds of each
// (a sanitizer pass or a soak may run hundreds).

namespace {

int hostile_rounds(int fallback) {
  const char* v = std::getenv("REFPOOL_HOSTILE_ROUNDS");
  return v != nullptr ? std::max(1, std::atoi(v)) : fallback;
}

/// Waits until `count` threads arrived, then lets them all go at once.
class start_line {
 public:
  explicit start_line(int count) : left_(count) {}
  void arrive_and_wait() {
    left_.fetch_sub(1);
    while (left_.load() > 0) {}
  }

 private:
  std::atomic<int> left_;
};

}  // namespace

TEST_CASE("hostile: the last releases of a cache race its destruction, over an idle limit",
          "[lifetime][threads][idle-limit][hostile]") {
  // Each release puts its block back, finds the cache over its limit and frees idle memory (with
  // segments: a trim under the heap's lock) while the cache is destroyed: with nothing else
  // holding the state, only the releases' own counts keep it.
  const backend be = make_host_backend();
  const int rounds = hostile_rounds(6);
  for (int round = 0; round < rounds; ++round) {
    cache_options options = with_segments(round % 2 == 0 ? segment_policy::off : segment_policy::on);
    options.max_idle_bytes = static_cast<std::size_t>(round % 3) * 4096;
    auto cache = std::make_unique<alloc_cache>(options);
    std::vector<data_ref> buffers(4);
    std::thread([&] {  // their slot's thread ends: the releases put them back themselves
      for (std::size_t i = 0; i < buffers.size(); ++i) buffers[i] = cache->allocate(be, 4096 * (i + 1));
    }).join();
    start_line line(static_cast<int>(buffers.size()) + 1);
    std::vector<std::thread> threads;
    for (data_ref& b : buffers) {
      threads.emplace_back([&] {
        line.arrive_and_wait();
        b.reset();
      });
    }
    threads.emplace_back([&] {
      line.arrive_and_wait();
      cache.reset();
    });
    for (auto& t : threads) t.join();
    REQUIRE(be.outstanding_bytes() == 0);
  }
}

TEST_CASE("hostile: frees by pointer on two threads race the destruction of a cache with an idle limit",
          "[lifetime][threads][idle-limit][pointer][hostile]") {
  const backend be = make_host_backend();
  const int rounds = hostile_rounds(4);
  for (int round = 0; round < rounds; ++round) {
    cache_options options = with_segments(round % 2 == 0 ? segment_policy::on : segment_policy::off);
    options.max_idle_bytes = 4096;
    auto cache = std::make_unique<alloc_cache>(options);
    std::vector<void*> pointers;
    for (int i = 0; i < 8; ++i) pointers.push_back(to_pointer(cache->allocate(be, 1024 * static_cast<std::size_t>(i + 1))));
    start_line line(3);
    std::vector<std::thread> threads;
    for (int half = 0; half < 2; ++half) {
      threads.emplace_back([&, half] {
        line.arrive_and_wait();
        for (std::size_t i = static_cast<std::size_t>(half); i < pointers.size(); i += 2) free_pointer(pointers[i]);
      });
    }
    threads.emplace_back([&] {
      line.arrive_and_wait();
      cache.reset();
    });
    for (auto& t : threads) t.join();
    for (void* p : pointers) CHECK_THROWS_AS(free_pointer(p), invalid_argument);  // each freed once
    REQUIRE(be.outstanding_bytes() == 0);
  }
}

TEST_CASE("hostile: a cache destroyed under an open step, threads ending mid-step, the step ending last",
          "[lifetime][threads][step][plan][hostile]") {
  // Threads make requests through the open step (keeping its router) and end while it is open;
  // others are still inside requests when the cache goes; the step ends after its cache, and the
  // backend must go with the last thread that held anything of it.
  const int rounds = hostile_rounds(6);
  for (int round = 0; round < rounds; ++round) {
    std::atomic<bool> destroyed{false};
    auto be = std::make_unique<backend>(std::make_shared<watched_resource>(destroyed));
    cache_options options = with_segments(round % 2 == 0 ? segment_policy::on : segment_policy::off);
    if (round % 3 == 0) options.max_idle_bytes = 0;
    auto cache = std::make_unique<alloc_cache>(options);
    std::shared_mutex cache_mutex;  // cache-level requests need the alloc_cache object
    scope_options step_options;
    if (round % 4 == 1) step_options.uncached_warmup_entries = 1;
    if (round % 4 == 2) step_options.plan = "hostile";
    auto st = std::make_unique<step>(*cache, step_options);
    std::atomic<int> running{0};
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        running.fetch_add(1);
        std::vector<data_ref> mine;
        for (int i = 0; !stop.load() || i < 32; ++i) {
          std::shared_lock lock(cache_mutex);
          if (!cache) break;
          data_ref r = cache->allocate(*be, 512 * static_cast<std::size_t>(1 + (i + t) % 5));
          lock.unlock();
          std::memset(r.data(), t + 1, r.bytes());
          mine.push_back(std::move(r));
          if (mine.size() > 4) mine.erase(mine.begin());
          if (t == 0 && i == 16) return;  // ends mid-step: its kept router goes with it
        }
      });
    }
    while (running.load() < 3) std::this_thread::yield();
    {
      std::unique_lock lock(cache_mutex);
      cache.reset();
    }
    stop = true;
    for (auto& t : threads) t.join();
    st.reset();  // the step ends after its cache
    be.reset();
    CHECK(destroyed.load());
  }
}
