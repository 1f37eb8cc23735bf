// Planned steps: one plan served by several threads (a framework's forward pass on one thread and
// its backward pass on another), and steps whose threads interleave in an order the plan did not
// record (they diverge and fall back; no byte ever has two owners).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <semaphore>
#include <thread>
#include <vector>

#include <refpool/refpool.hpp>

using namespace refpool;

namespace {

// A thread that runs one job at a time for the test's thread and waits to be asked again (as
// PyTorch's autograd thread runs each backward pass).
class worker {
 public:
  worker() : thread_([this] { loop(); }) {}
  ~worker() {
    job_ = nullptr;
    go_.release();
    thread_.join();
  }
  void run(const std::function<void()>& job) {
    job_ = &job;
    go_.release();
    done_.acquire();
  }

 private:
  void loop() {
    for (;;) {
      go_.acquire();
      if (job_ == nullptr) return;
      (*job_)();
      done_.release();
    }
  }
  const std::function<void()>* job_ = nullptr;
  std::binary_semaphore go_{0}, done_{0};
  std::thread thread_;
};

void stamp(const data_ref& r, unsigned char value) { std::memset(r.data(), value, r.bytes()); }
bool stamped(const data_ref& r, unsigned char value) {
  const auto* p = static_cast<const unsigned char*>(r.data());
  for (std::size_t i = 0; i < r.bytes(); ++i)
    if (p[i] != value) return false;
  return true;
}

}  // namespace

TEST_CASE("a planned step served by two threads in a fixed order records once and then replays", "[plan][step]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  worker backward_thread;
  constexpr int steps = 7;  // the first is a new sequence (pending), the second is recorded
  std::uint64_t allocations_after_first = 0;
  std::vector<std::vector<void*>> addresses(steps);
  for (int s = 0; s < steps; ++s) {
    step st(cache, {.plan = "train"});
    // Forward on this thread: activations that backward consumes.
    data_ref x = cache.allocate(be, 4096);
    data_ref h = cache.allocate(be, 16384);
    data_ref y = cache.allocate(be, 2048);
    stamp(x, 1);
    stamp(h, 2);
    stamp(y, 3);
    bool intact = true;
    backward_thread.run([&] {
      // Backward on the other thread: gradients, and the activations released as they are used.
      data_ref gy = cache.allocate(be, 2048);
      void* const gy_at = gy.data();
      stamp(gy, 4);
      intact = intact && stamped(y, 3);
      y = {};
      data_ref gh = cache.allocate(be, 16384);
      stamp(gh, 5);
      intact = intact && stamped(h, 2) && stamped(gy, 4);
      h = {};
      gy = {};
      data_ref gx = cache.allocate(be, 4096);
      stamp(gx, 6);
      intact = intact && stamped(x, 1) && stamped(gh, 5);
      addresses[static_cast<std::size_t>(s)] = {gy_at, gh.data(), gx.data()};
    });
    CHECK(intact);
    addresses[static_cast<std::size_t>(s)].push_back(x.data());
    x = {};
    st.end();
    // The arena's span is placed at the first replay's first claim (the third step).
    if (s == 2) allocations_after_first = be.allocation_count();
  }
  const auto stats = cache.stats();
  CHECK(stats.steps == steps);
  CHECK(stats.plan_recordings == 1);
  CHECK(stats.plans == 1);
  CHECK(stats.plan_hits == (steps - 2) * 6);  // six requests a step, all from the plan after the second
  CHECK(stats.plan_misses == 0);
  CHECK(be.allocation_count() == allocations_after_first);  // none after the first replay placed the arena
  for (int s = 3; s < steps; ++s) CHECK(addresses[static_cast<std::size_t>(s)] == addresses[2]);  // stable
  CHECK(stats.escapes == 0);
}

TEST_CASE("a planned step whose threads interleave freely never gives one byte two owners", "[plan][step][threads]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options{}};
  constexpr int threads = 4;
  constexpr int steps = 60;
  constexpr int per_thread = 40;
  std::atomic<int> wrong{0};
  for (int s = 0; s < steps; ++s) {
    step st(cache, {.plan = "racy"});
    std::vector<std::thread> pool;
    // The first two steps run one thread, so their sequence repeats and becomes a plan (a sequence
    // becomes one only when it comes again); the racing steps after it then run against that plan.
    const int active = s < 2 ? 1 : threads;
    for (int t = 0; t < active; ++t) {
      pool.emplace_back([&, t] {
        std::vector<std::pair<data_ref, unsigned char>> held;
        for (int k = 0; k < per_thread; ++k) {
          const auto value = static_cast<unsigned char>(t * 50 + k % 50 + 1);
          data_ref r = cache.allocate(be, 256 * static_cast<std::size_t>(1 + (k + t) % 5));
          stamp(r, value);
          held.emplace_back(std::move(r), value);
          if (held.size() > 3) {
            if (!stamped(held.front().first, held.front().second)) wrong.fetch_add(1);
            held.erase(held.begin());
          }
        }
        for (const auto& [r, value] : held)
          if (!stamped(r, value)) wrong.fetch_add(1);
      });
    }
    for (auto& th : pool) th.join();
  }
  CHECK(wrong.load() == 0);
  const auto stats = cache.stats();
  CHECK(stats.steps == steps);
  CHECK(stats.plan_hits + stats.plan_misses > 0);
  CHECK(stats.escapes == 0);
}
