// The slow paths of a cache that concern its slots: holding other threads' slots, leases and
// steps, releases from other threads and after the cache is gone, and its destruction. Misses are
// in cache_misses.cpp, reclaim and limits in cache_reclaim.cpp, stats in cache_stats.cpp, the hit
// path in hit_path.hpp and hit_path.cpp.
#include "cache/cache_state.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

cache_state::cache_state(const cache_options& options, bool bypass)
    : settings_{options.rounding, options.segments, options.auto_plans, bypass},
      idle_limit_(options.max_idle_bytes),
      reserved_(new reserved_counter),
      whole_blocks_(*this, *reserved_),
      segment_pieces_(*this, mutex_, *reserved_) {}

cache_state::~cache_state() { reserved_->release(); }

std::string_view cache_state::step_plan_key(std::string_view explicit_key) const noexcept {
  static constexpr std::string_view automatic{"\0step", 5};  // no user spells it by accident
  return explicit_key.empty() && settings_.auto_plans ? automatic : explicit_key;
}

// ---- holding other threads' slots -----------------------------------------------------------

bool cache_state::intrude(slot& s) noexcept {
  s.lock.lock(s.owner_thread.load(std::memory_order_relaxed) != nullptr);
  return s.handed_off.load(std::memory_order_relaxed) != nullptr &&
         s.handed_off.load(std::memory_order_relaxed) != orphaned_marker && drain_handed_off(s);
}

void cache_state::intrude_all() noexcept {
  for (const auto& s : slots_.all) s->lock.begin_intrusion();
  owner_lock::barrier();
  for (const auto& s : slots_.all) {
    s->lock.wait_until_owner_out();
    const block* pending = s->handed_off.load(std::memory_order_relaxed);
    if (pending != nullptr && pending != orphaned_marker) drain_handed_off(*s);
  }
}

void cache_state::leave_all() noexcept {
  for (const auto& s : slots_.all) s->lock.unlock();
}

// ---- scopes -------------------------------------------------------------------------------

slot* cache_state::lease_locked(std::vector<slot*>& free, const void* thread) {
  slot* s = nullptr;
  auto mine = std::find_if(free.rbegin(), free.rend(), [&](const slot* f) { return f->last_thread == thread; });
  if (mine != free.rend()) {
    s = *mine;
    free.erase(std::next(mine).base());
  } else if (!free.empty()) {
    s = free.back();
    free.pop_back();
  } else {
    slots_.all.push_back(std::make_unique<slot>(this));
    s = slots_.all.back().get();
  }
  s->owner_thread.store(thread, std::memory_order_relaxed);
  s->last_thread = thread;
  s->refs.fetch_add(1, std::memory_order_relaxed);  // the lease's
  return s;
}

slot* cache_state::lease() {
  std::lock_guard guard(mutex_);
  if (closed_.load(std::memory_order_relaxed)) return nullptr;
  return lease_locked(slots_.free_scope, this_thread_token());
}

void cache_state::end_lease(slot* s) noexcept {
  bool over_limit = false;
  {
    owner_section section(s->lock);
    const block* pending = s->handed_off.load(std::memory_order_relaxed);
    if (pending != orphaned_marker) {
      if (pending != nullptr) over_limit = drain_handed_off(*s);
      s->counters.escapes += s->live_in_epoch;
      s->live_in_epoch = 0;
      ++s->epoch;
    }
  }
  {
    std::lock_guard guard(mutex_);
    s->owner_thread.store(nullptr, std::memory_order_relaxed);
    // The marker is set under mutex_; a closed cache keeps no free list.
    if (s->handed_off.load(std::memory_order_relaxed) != orphaned_marker) slots_.free_scope.push_back(s);
  }
  clock_.fetch_add(1, std::memory_order_relaxed);
  if (over_limit) enforce_idle_limit();  // while the lease still keeps the state
  drop_slot_ref(*s);  // the lease's; the last one if the cache closed and no block is homed here
}

bool cache_state::count_entry(std::size_t warmup) noexcept {
  const bool uncached = counters_.scope_entries.fetch_add(1, std::memory_order_relaxed) < warmup;
  if (uncached) counters_.uncached_entries.fetch_add(1, std::memory_order_relaxed);
  return uncached;
}

// ---- cache-level allocations and steps ----------------------------------------------------

slot* cache_state::lease_ambient() {
  std::lock_guard guard(mutex_);
  if (closed_.load(std::memory_order_relaxed)) return nullptr;
  slot* s = lease_locked(slots_.free_ambient, this_thread_token());
  s->ambient = true;
  // Blocks an earlier thread got from this slot in the open step still count for it.
  catch_up_with_steps(*s);
  return s;
}

void cache_state::end_ambient_lease(slot* s) noexcept {
  {
    owner_section section(s->lock);
    const block* pending = s->handed_off.load(std::memory_order_relaxed);
    if (pending != orphaned_marker && pending != nullptr) drain_handed_off(*s);
  }
  {
    std::lock_guard guard(mutex_);
    s->owner_thread.store(nullptr, std::memory_order_relaxed);
    if (s->handed_off.load(std::memory_order_relaxed) != orphaned_marker) slots_.free_ambient.push_back(s);
  }
  drop_slot_ref(*s);  // the lease's
}

void cache_state::roll_epoch(slot& s, std::uint64_t epoch) noexcept {
  if (s.epoch % 2 == 1) s.counters.escapes += s.live_in_epoch;  // an odd epoch is a step
  s.live_in_epoch = 0;
  s.epoch = epoch;
}

namespace {

// A step's epoch is the next odd number of one process-wide sequence, so that it names one step
// of one cache: a thread's kept (cache, epoch) never matches a step of a later cache made at the
// same address, and a kept router need not keep its cache (cache_state.hpp, kept_step_cache).
std::atomic<std::uint64_t> next_step_epoch{1};

}  // namespace

void cache_state::begin_step(request_router* router) {
  std::lock_guard guard(mutex_);
  if (step_.epoch.load(std::memory_order_relaxed) % 2 == 1)
    throw scope_error("refpool: a step is already open on this cache (steps of one cache do not nest; end it first)");
  counters_.steps.fetch_add(1, std::memory_order_relaxed);
  if (router != nullptr) {
    router->retain_router();  // the cache's, until end_step
    std::lock_guard publish(step_.router_lock);
    step_.router.store(router, std::memory_order_relaxed);
  }
  const std::uint64_t epoch = next_step_epoch.fetch_add(2, std::memory_order_relaxed);
  step_.epoch.store(epoch, std::memory_order_release);  // after the router (thread_step_router)
}

router_ref cache_state::retain_step_router() const noexcept {
  // Under the lock, so the router cannot lose its last reference between the load and the retain.
  std::lock_guard guard(step_.router_lock);
  request_router* r = step_.router.load(std::memory_order_relaxed);
  if (r != nullptr) r->retain_router();
  return router_ref(r);
}

void cache_state::end_step() noexcept {
  request_router* ended = nullptr;
  {
    std::lock_guard guard(mutex_);
    const std::uint64_t epoch = step_.epoch.load(std::memory_order_relaxed) + 1;
    step_.epoch.store(epoch, std::memory_order_release);
    {
      std::lock_guard unpublish(step_.router_lock);
      ended = step_.router.exchange(nullptr, std::memory_order_relaxed);
    }
    // The slots are not held here (holding each costs a process-wide barrier): each counts the
    // step's escapes when next held (catch_up_with_steps: a request, a release, stats).
  }
  // The cache's reference, dropped with no lock held; calls in flight hold their own.
  if (ended != nullptr) ended->release_router();
}

// ---- releases on other threads and after the cache is gone --------------------------------

void cache_state::put_back_elsewhere(slot& s, block* b, bool via_unsafe_free) noexcept {
  if (s.owner_thread.load(std::memory_order_acquire) != nullptr && !idle_limit_.tracking()) {
    // The owner (or an intruder) drains it; the block is idle from the next look at the slot.
    b->hand_off.unsafe = via_unsafe_free;
    // Steps end without draining hand-off lists: whether this release came before its step's end
    // is known only now (ambient slots' epochs are the cache's step epochs).
    b->hand_off.in_epoch = b->epoch == step_.epoch.load(std::memory_order_relaxed);
    block* head = s.handed_off.load(std::memory_order_relaxed);
    do {
      if (head == orphaned_marker) {
        put_back_orphaned(s, b);
        return;
      }
      b->hand_off.next = head;
    } while (!s.handed_off.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
    return;
  }
  // Nobody owns the slot, or an idle limit must hold at once: put the block back ourselves. Once
  // it is back nothing of ours keeps the state (a close() on another thread may free the block
  // and end the state), so enforcing the limit holds a count of its own.
  bool over_limit = false;
  {
    std::lock_guard guard(mutex_);
    if (s.handed_off.load(std::memory_order_relaxed) == orphaned_marker) {
      // falls through to the orphan path below, outside mutex_
    } else {
      over_limit = intrude(s);
      over_limit |= put_back_in_slot(s, b, via_unsafe_free);
      s.lock.unlock();
      b = nullptr;
      if (over_limit) retain();  // under mutex_, before close() can take the block
    }
  }
  if (b != nullptr) {
    put_back_orphaned(s, b);
  } else if (over_limit) {
    enforce_idle_limit();
    release();
  }
}

void cache_state::put_back_orphaned(slot& s, block* b) noexcept {
  free_to_backend(b);
  drop_slot_ref(s);  // the block's
}

void cache_state::drop_slot_ref(slot& s) noexcept {
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last reference: the cache closed (it held one until then), and no lease or block is left.
  {
    std::lock_guard guard(mutex_);  // intruders find slots in slots_.all under mutex_
    std::erase_if(slots_.all, [&](const std::unique_ptr<slot>& p) { return p.get() == &s; });
  }
  release();  // each slot that outlived close() held the cache's state
}

// ---- destruction --------------------------------------------------------------------------

cache_extension& cache_state::extension(std::unique_ptr<cache_extension> (*make)(cache_state&)) {
  std::lock_guard guard(mutex_);
  if (!extension_) extension_ = make(*this);
  return *extension_;
}

void cache_state::close() noexcept {
  closed_.store(true, std::memory_order_release);
  {
    std::unique_lock guard(mutex_);
    cache_extension* plans = extension_.get();
    guard.unlock();
    if (plans != nullptr) plans->close();  // plans release their regions' memory as regions go
  }
  std::vector<block*> idle;
  {
    std::lock_guard guard(mutex_);
    slots_.free_scope.clear();
    slots_.free_ambient.clear();
    intrude_all();
    std::size_t idle_count = 0;
    for (const auto& s : slots_.all) s->buckets.for_each([&](const bucket& bk) { idle_count += bk.idle.size(); });
    idle.reserve(idle_count);  // a bad_alloc here ends the process: host memory is gone anyway
    for (const auto& s : slots_.all) {
      // Releases racing with us see the marker from now on and free their blocks themselves.
      if (block* late = s->handed_off.exchange(orphaned_marker, std::memory_order_acq_rel)) drain_list(*s, late);
      std::size_t leaving = 0;
      s->buckets.for_each([&](bucket& bk) {
        for (block* b : bk.idle) idle.push_back(b);  // may grow past the reservation: late releases
        leaving += bk.idle.size();
        bk.clear_idle();
      });
      s->refs.fetch_sub(leaving, std::memory_order_relaxed);  // never the last: ours is still held
    }
    idle_limit_.clear();
    leave_all();
    // The cache's own reference goes. A slot still leased or homing live blocks (also one a miss
    // in flight adds later: its lease holds it until then) stays, and needs our counters.
    std::erase_if(slots_.all, [&](const std::unique_ptr<slot>& s) {
      if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) return true;
      retain();  // released by the drop_slot_ref that deletes it (which waits for mutex_)
      return false;
    });
  }
  free_blocks(idle);  // pieces among them leave their heaps as closed heaps: trimmed at once
  for (block_source* source : sources()) source->close();
}

}  // namespace refpool::detail
