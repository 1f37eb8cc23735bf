// Lifetimes under load (docs/design.md, "Lifetimes"; issue 23 rows 1-4): T threads x N mixed
// operations on one cache, where, among allocations through scopes and cache-level requests,
//   - a thread now and then replaces the cache, while the others are inside scopes on it with
//     their misses in flight (the scopes and their buffers outlive it);
//   - a thread now and then ends the open step (warm-up, planned or plain) and opens another,
//     while the others make cache-level requests through it;
//   - threads hand buffers to the pointer table, and each hand-over is freed twice, by any two
//     threads, while others take handles by the address: exactly one of the two frees must be
//     accepted, and afterwards the address is unknown (its owner holds the buffer until then, so
//     the address cannot be handed out again meanwhile).
// Buffers carry their owner's stamp (a buffer handed to two owners shows a foreign one); at the
// end nothing is left with the backend. Under ASan and TSan (CI runs both) an object freed while
// another thread can still reach it is reported. Seen failing with each of test/fuzz/broken's
// lifetime1 and lifetime4 (ASan: heap-use-after-free) and pointer1 (two frees accepted) applied.
//
//   lifetime_stress_test [--threads T] [--ops N]   (defaults 6 and 20000; REFPOOL_LIFETIME_STRESS_OPS overrides N)
//
// Exits 0 when every check passed; prints the counts.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <refpool/pointer.hpp>
#include <refpool/refpool.hpp>

#include "support/stamped.hpp"
#include "support/stress_args.hpp"

using namespace refpool;
using refpool::test::stamped_buffer;
using refpool::test::stamped_set;

namespace {

std::atomic<std::uint64_t> failures{0};

void check(bool ok, const std::string& what) {
  if (!ok && failures.fetch_add(1) < 20) fmt::print(stderr, "lifetime_stress_test: FAILED: {}\n", what);
}

/// The cache every thread uses, and its open step. Opening a scope or a step, and a cache-level
/// request, hold `mutex` shared (they need the alloc_cache object); what they made runs on without
/// it, so the cache may be destroyed (under `mutex`, exclusive) under a scope, a step or a miss in
/// flight. Steps change under `step_mutex` (one open step at a time; taken before `mutex`).
struct current_cache {
  std::shared_mutex mutex;
  std::unique_ptr<alloc_cache> cache = std::make_unique<alloc_cache>(cache_options{});
  std::mutex step_mutex;
  std::unique_ptr<step> open_step;
};

/// A buffer handed to the pointer table, to be freed twice by any two threads. The owner keeps
/// its own handle until both frees were tried, so the address cannot be handed out again before.
struct race_slot {
  std::mutex mutex;
  void* ptr = nullptr;    // null: free for an owner
  int frees_claimed = 0;  // of 2
  int frees_tried = 0;
  int frees_accepted = 0;
};

struct counts {
  std::uint64_t ops = 0, scope_allocations = 0, cache_level = 0, races = 0, frees_accepted = 0, handles_taken = 0,
                caches_destroyed = 0, steps = 0;
};

constexpr std::size_t race_slots = 8;

class worker {
 public:
  worker(current_cache& shared, race_slot (&races)[race_slots], const backend& be, int id, counts& out)
      : shared_(shared), races_(races), be_(be), rng_(0x11FE0000ull + static_cast<std::uint64_t>(id)), out_(out) {}

  void run(std::uint64_t ops) {
    std::uint64_t op = 0;
    while (op < ops) {
      std::unique_ptr<scope> s = open_scope();
      const std::uint64_t body = 1 + rng_() % 48;
      for (std::uint64_t k = 0; k < body && op < ops; ++k, ++op) {
        one_operation();
      }
      if (rng_() % 4 != 0) drop_all();  // else some buffers escape the scope (and maybe its cache)
    }
    finish_own_race();
    drop_all();
    out_.ops = op;
  }

 private:
  std::unique_ptr<scope> open_scope() {
    std::shared_lock lock(shared_.mutex);
    return std::make_unique<scope>(*shared_.cache);
  }

  void one_operation() {
    switch (rng_() % 13) {
      case 0:
      case 1:
      case 2:  // through the thread's scope, whose cache may be gone by now
        mine_.add(empty<std::uint64_t>(be_, {std::size_t{1} << (rng_() % 8)}));
        out_.scope_allocations += 1;
        break;
      case 3:
      case 4: {  // cache-level: the thread's slot, or the open step's router
        const std::size_t words = std::size_t{1} << (rng_() % 8);
        data_ref r;
        {
          std::shared_lock lock(shared_.mutex);
          r = shared_.cache->allocate(be_, words * sizeof(std::uint64_t));
        }
        mine_.add(array<std::uint64_t>(std::move(r), {words}));
        out_.cache_level += 1;
        break;
      }
      case 5: {  // a nested scope on the cache as it is now; a buffer may outlive it
        std::unique_ptr<scope> inner = open_scope();
        stamped_buffer b = mine_.stamp(empty<std::uint64_t>(be_, {64}));
        check(b.intact(), "a buffer of a nested scope lost its stamp");
        if (rng_() % 2 == 0) mine_.adopt(std::move(b));
        break;
      }
      case 6: publish_or_finish_race(); break;
      case 10:
        if (rng_() % 16 == 0)
          replace_cache();
        else if (rng_() % 4 == 0)
          next_step();
        break;
      case 7:
      case 8: try_a_free(races_[rng_() % race_slots]); break;
      case 9: take_handles(races_[rng_() % race_slots]); break;
      default:
        if (!mine_.empty()) check(mine_.drop(rng_() % mine_.size(), rng_() % 8 == 0), "a buffer lost its stamp");
    }
    if (mine_.size() > 16) check(mine_.drop(0), "a buffer lost its stamp");
  }

  // The others' scopes, steps and misses in flight on the old cache run on.
  void replace_cache() {
    std::unique_lock lock(shared_.mutex);
    shared_.cache = std::make_unique<alloc_cache>(cache_options{});
    out_.caches_destroyed += 1;
  }

  // Ends the open step (its cache may be gone by now) while the others allocate through it, and
  // opens another on the cache as it is now: warm-up, planned or plain.
  void next_step() {
    std::lock_guard steps(shared_.step_mutex);
    if (shared_.open_step != nullptr) {
      shared_.open_step->end();
      out_.steps += 1;
    }
    scope_options options;
    const std::uint64_t kind = rng_() % 3;
    if (kind == 0) options.uncached_warmup_entries = std::numeric_limits<std::size_t>::max();
    if (kind == 1) options.plan = rng_() % 2 == 0 ? "a" : "b";
    std::shared_lock lock(shared_.mutex);
    shared_.open_step = std::make_unique<step>(*shared_.cache, options);
  }

  void drop_all() {
    check(mine_.check_all(), "a buffer lost its stamp before it was dropped");
    mine_.clear();
  }

  // ---- racing frees by pointer ----

  void publish_or_finish_race() {
    if (own_ != nullptr) {
      std::unique_lock lock(own_->mutex);
      if (own_->frees_tried == 2) {
        lock.unlock();
        finish_own_race();
      }
      return;
    }
    race_slot& slot = races_[rng_() % race_slots];
    std::lock_guard lock(slot.mutex);
    if (slot.ptr != nullptr) return;
    owned_ = mine_.stamp(empty<std::uint64_t>(be_, {std::size_t{8} << (rng_() % 4)}));
    slot.ptr = to_pointer(data_ref(owned_.a.ref()));  // a copy: the owner keeps its handle
    slot.frees_claimed = slot.frees_tried = slot.frees_accepted = 0;
    own_ = &slot;
  }

  // Claims one of the two frees of the slot's hand-over, if one is left, and tries it.
  void try_a_free(race_slot& slot) {
    void* p = nullptr;
    {
      std::lock_guard lock(slot.mutex);
      if (slot.ptr == nullptr || slot.frees_claimed == 2) return;
      slot.frees_claimed += 1;
      p = slot.ptr;
    }
    bool accepted = false;
    try {
      free_pointer(p);
      accepted = true;
    } catch (const invalid_argument&) {}
    std::lock_guard lock(slot.mutex);
    slot.frees_tried += 1;
    slot.frees_accepted += accepted;
  }

  // Handles by the address, each a pin in the table while pointer_ref runs. The address may be
  // stale (its race finished and its buffer was handed out again): then it is someone else's
  // buffer or unknown, and only read.
  void take_handles(race_slot& slot) {
    void* p = nullptr;
    {
      std::lock_guard lock(slot.mutex);
      p = slot.ptr;
    }
    if (p == nullptr) return;
    for (int i = 0; i < 32; ++i) {
      try {
        const data_ref r = pointer_ref(p);
        check(r.data() == p, "pointer_ref gave a handle to another address");
        out_.handles_taken += 1;
      } catch (const invalid_argument&) {
        return;
      }
    }
  }

  // Both frees tried (the owner tries those no other thread took): exactly one accepted, and the
  // address unknown from then on, while the owner's handle keeps the buffer.
  void finish_own_race() {
    if (own_ == nullptr) return;
    while (true) {
      {
        std::lock_guard lock(own_->mutex);
        if (own_->frees_tried == 2) break;
      }
      try_a_free(*own_);
      std::this_thread::yield();  // a free another thread claimed is still running
    }
    void* const p = own_->ptr;
    bool unknown_after = false;
    try {
      free_pointer(p);
    } catch (const invalid_argument&) {
      unknown_after = true;
    }
    std::lock_guard lock(own_->mutex);
    check(own_->frees_accepted == 1,
          fmt::format("{} of two racing frees of one hand-over were accepted", own_->frees_accepted));
    check(unknown_after, "a third free after two racing frees was accepted");
    check(owned_.intact(), "a buffer handed to the pointer table lost its stamp");
    out_.races += 1;
    out_.frees_accepted += static_cast<std::uint64_t>(own_->frees_accepted);
    own_->ptr = nullptr;
    own_ = nullptr;
    owned_ = {};
  }

  current_cache& shared_;
  race_slot (&races_)[race_slots];
  const backend& be_;
  std::mt19937_64 rng_;
  counts& out_;
  stamped_set mine_;
  race_slot* own_ = nullptr;  // this worker's published race, if any
  stamped_buffer owned_;      // its buffer, held until the race is finished
};

}  // namespace

int main(int argc, char** argv) {
  const refpool::test::stress_args args =
      refpool::test::parse_stress_args(argc, argv, {6, 20000}, "REFPOOL_LIFETIME_STRESS_OPS");
  const int thread_count = args.threads;
  const std::uint64_t ops = args.ops;
  const auto start = std::chrono::steady_clock::now();
  const backend be = make_host_backend();
  std::vector<counts> per_thread(static_cast<std::size_t>(thread_count));
  {
    current_cache shared;
    race_slot races[race_slots];
    std::vector<std::thread> workers;
    for (int t = 0; t < thread_count; ++t) {
      workers.emplace_back([&, t] { worker(shared, races, be, t, per_thread[static_cast<std::size_t>(t)]).run(ops); });
    }
    for (auto& w : workers) w.join();
    shared.open_step.reset();
  }
  check(be.outstanding_bytes() == 0, fmt::format("{} B left with the backend at the end", be.outstanding_bytes()));
  check(be.allocation_count() == be.deallocation_count(), "backend allocations and frees differ at the end");
  counts sum;
  for (const counts& c : per_thread) {
    sum.ops += c.ops;
    sum.scope_allocations += c.scope_allocations;
    sum.cache_level += c.cache_level;
    sum.races += c.races;
    sum.frees_accepted += c.frees_accepted;
    sum.handles_taken += c.handles_taken;
    sum.caches_destroyed += c.caches_destroyed;
    sum.steps += c.steps;
  }
  check(sum.ops == ops * static_cast<std::uint64_t>(thread_count), "a worker did not finish its operations");
  check(sum.caches_destroyed > 0 && sum.steps > 0 && sum.races > 0, "a kind of lifetime event never happened");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "lifetime stress: {} threads x {} operations in {:.2f} s; {} scope and {} cache-level allocations; {} "
      "caches destroyed under them, {} steps ended under them; {} racing double frees by pointer ({} "
      "accepted), {} handles taken by address meanwhile; {} failures\n",
      thread_count, ops, seconds, sum.scope_allocations, sum.cache_level, sum.caches_destroyed, sum.steps, sum.races,
      sum.frees_accepted, sum.handles_taken, failures.load());
  return failures.load() == 0 ? 0 : 1;
}
