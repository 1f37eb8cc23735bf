// The slow paths of a cache: leases and steps, steals, misses and the out-of-memory ladder,
// releases from other threads, reclaim and the idle limit, stats, and what happens to everything
// when the cache is destroyed. The hit path is in hit_path.cpp.
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

namespace {

/// A direct block over `ptr` (from `backend`, which it holds), handed out once.
block* direct_block(std::unique_ptr<block> made, backend_state& backend, void* ptr, std::size_t bytes,
                    stream_ref stream) noexcept {
  block* b = made.release();
  b->ptr = ptr;
  b->capacity = bytes;
  b->requested = bytes;
  b->backend = &backend;
  backend.retain();
  b->last_stream = stream;
  b->refs.reset(1);
  return b;
}

/// Gives `b`'s memory back to its backend, drops its hold on the backend, deletes it.
void free_block(block* b) noexcept {
  b->backend->deallocate(b->ptr, b->capacity, b->last_stream);
  b->backend->release();
  delete b;
}

}  // namespace

cache_state::cache_state(const cache_options& options, bool bypass)
    : rounding_(options.rounding),
      segments_(options.segments),
      bypass_(bypass),
      max_idle_bytes_(options.max_idle_bytes),
      reserved_(new reserved_counter) {
  tracking_idle_.store(options.max_idle_bytes != cache_options::unlimited);
}

cache_state::~cache_state() { reserved_->release(); }

// ---- holding other threads' slots -----------------------------------------------------------

bool cache_state::intrude(slot& s) noexcept {
  s.lock.lock(s.owner_thread.load(std::memory_order_relaxed) != nullptr);
  return s.handed_off.load(std::memory_order_relaxed) != nullptr &&
         s.handed_off.load(std::memory_order_relaxed) != orphaned_marker && drain_handed_off(s);
}

void cache_state::intrude_all() noexcept {
  for (const auto& s : slots_) s->lock.begin_intrusion();
  owner_lock::barrier();
  for (const auto& s : slots_) {
    s->lock.wait_until_owner_out();
    const block* pending = s->handed_off.load(std::memory_order_relaxed);
    if (pending != nullptr && pending != orphaned_marker) drain_handed_off(*s);
  }
}

void cache_state::leave_all() noexcept {
  for (const auto& s : slots_) s->lock.unlock();
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
    slots_.push_back(std::make_unique<slot>(this));
    s = slots_.back().get();
  }
  s->owner_thread.store(thread, std::memory_order_relaxed);
  s->last_thread = thread;
  s->refs.fetch_add(1, std::memory_order_relaxed);  // the lease's
  return s;
}

slot* cache_state::lease() {
  std::lock_guard guard(mutex_);
  if (closed_.load(std::memory_order_relaxed)) return nullptr;
  return lease_locked(free_slots_, this_thread_token());
}

void cache_state::give_back(slot* s) noexcept {
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
    if (s->handed_off.load(std::memory_order_relaxed) != orphaned_marker) free_slots_.push_back(s);
  }
  clock_.fetch_add(1, std::memory_order_relaxed);
  drop_slot_ref(*s);  // the lease's; the last one if the cache closed and no block is homed here
  if (over_limit) enforce_idle_limit();
}

bool cache_state::count_entry(std::size_t warmup) noexcept {
  const bool uncached = scope_entries_.fetch_add(1, std::memory_order_relaxed) < warmup;
  if (uncached) uncached_entries_.fetch_add(1, std::memory_order_relaxed);
  return uncached;
}

// ---- cache-level allocations and steps ----------------------------------------------------

slot* cache_state::lease_ambient() {
  std::lock_guard guard(mutex_);
  if (closed_.load(std::memory_order_relaxed)) return nullptr;
  slot* s = lease_locked(free_ambient_slots_, this_thread_token());
  s->ambient = true;
  // Blocks an earlier thread got from this slot in the open step still count for it.
  catch_up_with_steps(*s);
  return s;
}

void cache_state::give_back_ambient(slot* s) noexcept {
  {
    owner_section section(s->lock);
    const block* pending = s->handed_off.load(std::memory_order_relaxed);
    if (pending != orphaned_marker && pending != nullptr) drain_handed_off(*s);
  }
  {
    std::lock_guard guard(mutex_);
    s->owner_thread.store(nullptr, std::memory_order_relaxed);
    if (s->handed_off.load(std::memory_order_relaxed) != orphaned_marker) free_ambient_slots_.push_back(s);
  }
  drop_slot_ref(*s);  // the lease's
}

void cache_state::roll_epoch(slot& s, std::uint64_t epoch) noexcept {
  if (s.epoch % 2 == 1) s.counters.escapes += s.live_in_epoch;  // an odd epoch is a step
  s.live_in_epoch = 0;
  s.epoch = epoch;
}

void cache_state::begin_step(request_router* router) {
  std::lock_guard guard(mutex_);
  const std::uint64_t epoch = step_epoch_.load(std::memory_order_relaxed);
  if (epoch % 2 == 1)
    throw scope_error("refpool: a step is already open on this cache (steps of one cache do not nest; end it first)");
  steps_.fetch_add(1, std::memory_order_relaxed);
  if (router != nullptr) {
    router->retain_router();  // the cache's, until end_step
    std::lock_guard publish(router_lock_);
    step_router_.store(router, std::memory_order_relaxed);
  }
  step_epoch_.store(epoch + 1, std::memory_order_relaxed);
}

router_ref cache_state::retain_step_router() const noexcept {
  // Under the lock, so the router cannot lose its last reference between the load and the retain.
  std::lock_guard guard(router_lock_);
  request_router* r = step_router_.load(std::memory_order_relaxed);
  if (r != nullptr) r->retain_router();
  return router_ref(r);
}

void cache_state::end_step() noexcept {
  request_router* ended = nullptr;
  {
    std::lock_guard guard(mutex_);
    const std::uint64_t epoch = step_epoch_.load(std::memory_order_relaxed) + 1;
    step_epoch_.store(epoch, std::memory_order_relaxed);
    {
      std::lock_guard unpublish(router_lock_);
      ended = step_router_.exchange(nullptr, std::memory_order_relaxed);
    }
    // The slots are not held here (holding each costs a process-wide barrier): each counts the
    // step's escapes when next held (catch_up_with_steps: a request, a release, stats).
  }
  // The cache's reference, dropped with no lock held; calls in flight hold their own.
  if (ended != nullptr) ended->release_router();
}

// ---- misses -------------------------------------------------------------------------------

void cache_state::remove_idle(slot&, block* b) noexcept {
  b->idle = false;
  if (tracking_idle_.load(std::memory_order_relaxed)) idle_total_.fetch_sub(b->capacity, std::memory_order_relaxed);
}

block* cache_state::steal(slot& thief, const block_key& key, stream_ref stream, bool& other_stream) {
  std::lock_guard guard(mutex_);
  {
    owner_section section(thief.lock);  // nobody intrudes: every intruder needs mutex_
    reserve_for_one_more(thief.bucket_for(key));
  }
  for (const auto& victim : slots_) {
    if (victim.get() == &thief) continue;
    block* b = nullptr;
    intrude(*victim);
    if (bucket* from = victim->buckets.find(key)) {
      b = from->take(stream);
      if (b != nullptr) {
        remove_idle(*victim, b);
        victim->erase_if_unused(*from);
        // Its home moves to the thief. Never the victim's last reference: the cache is open.
        victim->refs.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    victim->lock.unlock();
    if (b == nullptr) continue;
    other_stream = b->last_stream != stream || !b->extra_streams.empty();
    owner_section section(thief.lock);
    mark_live(thief, thief.bucket_for(key), b, true);  // homes change only under mutex_
    thief.refs.fetch_add(1, std::memory_order_relaxed);
    thief.counters.steals += 1;
    if (other_stream) thief.counters.cross_stream_reuses += 1;
    return b;
  }
  return nullptr;
}

void* cache_state::allocate_or_reclaim(backend_state& backend, std::size_t bytes, std::size_t requested,
                                       stream_ref stream) {
  void* ptr = backend.allocate(bytes, stream);
  if (ptr != nullptr) return ptr;
  // Out of memory: give back this backend's idle blocks (all sizes, all slots), retry once.
  const std::size_t freed = reclaim_for_retry(backend);
  ptr = backend.allocate(bytes, stream);
  if (ptr != nullptr) return ptr;
  ooms_.fetch_add(1, std::memory_order_relaxed);
  const cache_stats now = stats();
  throw out_of_memory(
      fmt::format("refpool: out of memory: {} could not allocate {} B (request {} B) on device {}, "
                  "even after reclaiming {} B of idle cache; the cache now holds {} B live in {} "
                  "blocks and {} B idle; the backend has {} B outstanding",
                  backend.res().name(), bytes, requested, backend.device(), freed, now.live_bytes, now.live_blocks,
                  now.idle_bytes, backend.outstanding_bytes.load()),
      bytes, backend.device());
}

block* cache_state::allocate_new(slot& s, backend_state& backend, const block_key& key, std::size_t requested,
                                 stream_ref stream) {
  if (backend.piece_unit(segments_) != 1) return allocate_piece(s, backend, key, requested, stream);
  auto made = std::make_unique<block>();  // before the backend call, so a bad_alloc leaks nothing
  void* ptr = allocate_or_reclaim(backend, key.bytes, requested, stream);
  try {
    home_new_block(s, backend, key, made.get(), ptr, stream, false);
  } catch (...) {
    backend.deallocate(ptr, key.bytes, stream);
    throw;
  }
  backend.retain();
  backend_allocations_.fetch_add(1, std::memory_order_relaxed);
  count_held(key.bytes);
  count_from_backends(key.bytes, 0);
  return made.release();
}

void cache_state::home_new_block(slot& s, backend_state& backend, const block_key& key, block* b, void* ptr,
                                 stream_ref stream, bool waited) {
  b->ptr = ptr;
  b->capacity = key.bytes;
  b->backend = &backend;
  b->origin = block_origin::cached;
  b->id = next_block_id_.fetch_add(1, std::memory_order_relaxed);
  b->last_stream = stream;
  owner_section section(s.lock);
  bucket& home = s.bucket_for(key);  // made again if a reclaim erased it meanwhile
  reserve_for_one_more(home);
  mark_live(s, home, b, false);
  s.refs.fetch_add(1, std::memory_order_relaxed);  // also if the cache closed meanwhile: counted
  if (waited) s.counters.cross_stream_reuses += 1;
}

void cache_state::count_held(std::size_t bytes) noexcept {
  raise_max(peak_held_bytes_, held_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void cache_state::count_from_backends(std::size_t added, std::size_t removed) noexcept {
  if (added > removed) {
    reserved_->add(added - removed);
  } else if (removed > added) {
    reserved_->remove(removed - added);
  }
}

block* cache_state::allocate_uncached(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = allocate_or_reclaim(backend, bytes, bytes, stream);
  block* b = direct_block(std::move(made), backend, ptr, bytes, stream);
  b->uncached_for = this;
  retain();
  uncached_allocations_.fetch_add(1, std::memory_order_relaxed);
  raise_max(peak_uncached_live_bytes_, uncached_live_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
  reserved_->add(bytes);
  return b;
}

void cache_state::release_uncached(block* b, bool via_unsafe_free) noexcept {
  uncached_live_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
  reserved_->remove(b->capacity);
  if (via_unsafe_free) extra_unsafe_frees_.fetch_add(1, std::memory_order_relaxed);
  free_block(b);
  release();
}

block* allocate_direct(backend_state& backend, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = backend.allocate(bytes, stream);
  if (ptr == nullptr)
    throw out_of_memory(fmt::format("refpool: out of memory: {} could not allocate {} B on device {} "
                                    "(uncached allocation: no cache to reclaim); the backend has {} B outstanding",
                                    backend.res().name(), bytes, backend.device(), backend.outstanding_bytes.load()),
                        bytes, backend.device());
  return direct_block(std::move(made), backend, ptr, bytes, stream);
}

void release_direct(block* b, bool via_unsafe_free) noexcept {
  if (cache_state* cache = b->uncached_for) {
    cache->release_uncached(b, via_unsafe_free);
    return;
  }
  free_block(b);
}

// ---- releases on other threads and after the cache is gone --------------------------------

void cache_state::release_elsewhere(slot& s, block* b, bool via_unsafe_free) noexcept {
  if (s.owner_thread.load(std::memory_order_acquire) != nullptr && !tracking_idle_.load(std::memory_order_relaxed)) {
    // The owner (or an intruder) drains it; the block is idle from the next look at the slot.
    b->handed_off_unsafe = via_unsafe_free;
    // Steps end without draining hand-off lists: whether this release came before its step's end
    // is known only now (ambient slots' epochs are the cache's step epochs).
    b->handed_off_in_epoch = b->epoch == step_epoch_.load(std::memory_order_relaxed);
    block* head = s.handed_off.load(std::memory_order_relaxed);
    do {
      if (head == orphaned_marker) {
        release_orphaned(s, b);
        return;
      }
      b->next_handed_off = head;
    } while (!s.handed_off.compare_exchange_weak(head, b, std::memory_order_release, std::memory_order_relaxed));
    return;
  }
  // Nobody owns the slot, or an idle limit must hold at once: put the block back ourselves.
  bool over_limit = false;
  {
    std::lock_guard guard(mutex_);
    if (s.handed_off.load(std::memory_order_relaxed) == orphaned_marker) {
      // falls through to the orphan path below, outside mutex_
    } else {
      over_limit = intrude(s);
      over_limit |= release_in_slot(s, b, via_unsafe_free);
      s.lock.unlock();
      b = nullptr;
    }
  }
  if (b != nullptr) {
    release_orphaned(s, b);
  } else if (over_limit) {
    enforce_idle_limit();
  }
}

void cache_state::release_orphaned(slot& s, block* b) noexcept {
  free_to_backend(b);
  drop_slot_ref(s);  // the block's
}

void cache_state::drop_slot_ref(slot& s) noexcept {
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last reference: the cache closed (it held one until then), and no lease or block is left.
  {
    std::lock_guard guard(mutex_);  // intruders find slots in slots_ under mutex_
    std::erase_if(slots_, [&](const std::unique_ptr<slot>& p) { return p.get() == &s; });
  }
  release();  // each slot that outlived close() held the cache's state
}

// ---- reclaim and limits -------------------------------------------------------------------

void cache_state::free_to_backend(block* b) noexcept {
  held_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
  if (cache_heap* h = b->heap) {
    // A piece: back to its heap. After the cache is gone nothing carves from the heap any more,
    // so its free memory goes back to the backend at once (all of it with the last piece).
    std::lock_guard lock(h->mutex);
    h->heap.give_back(b->piece, streams_of(*b));
    if (closed()) {
      const committed_change change(*this, *h);
      try {
        if (h->heap.stats().pieces_out == 0)
          h->heap.release_all();
        else
          h->heap.trim(0);
      } catch (const std::exception& e) {
        fmt::print(stderr, "refpool: giving back the segments of {} failed: {}\n", h->backend->res().name(), e.what());
      }
    }
    b->backend->release();  // never the last reference: the heap holds one
    delete b;
    return;
  }
  backend_frees_.fetch_add(1, std::memory_order_relaxed);
  count_from_backends(0, b->capacity);
  free_block(b);
}

std::size_t cache_state::free_blocks(const std::vector<block*>& blocks) noexcept {
  std::size_t to_backends = 0;
  for (block* b : blocks) {
    if (b->heap == nullptr) to_backends += b->capacity;
    free_to_backend(b);
  }
  return to_backends;
}

cache_state::taken_blocks cache_state::take_idle_locked(std::size_t keep,
                                                        const std::function<bool(const block_key&)>& filter,
                                                        std::atomic<std::uint64_t>& counter) {
  struct candidate {
    std::uint64_t idle_since;
    std::uint64_t idle_seq;
    block* b;
    slot* s;
  };
  std::vector<candidate> candidates;
  taken_blocks taken;
  std::size_t matching = 0;
  intrude_all();
  try {
    for (const auto& s : slots_) {
      s->buckets.for_each([&](const bucket& bk) {
        if (!filter(bk.key)) return;
        for (block* b : bk.idle) {
          candidates.push_back({b->idle_since, b->idle_seq, b, s.get()});
          matching += b->capacity;
        }
      });
    }
    taken.blocks.reserve(candidates.size());
  } catch (...) {
    leave_all();  // out of host memory for the list: free nothing this time
    taken.idle_left = matching;
    return taken;
  }
  std::sort(candidates.begin(), candidates.end(), [](const candidate& x, const candidate& y) {
    return x.idle_since != y.idle_since ? x.idle_since < y.idle_since : x.idle_seq < y.idle_seq;
  });
  for (const candidate& c : candidates) {
    if (matching - taken.bytes <= keep) break;
    bucket& home = *c.b->home;
    home.remove(c.b);
    remove_idle(*c.s, c.b);
    c.s->erase_if_unused(home);
    c.s->refs.fetch_sub(1, std::memory_order_relaxed);  // it leaves; never the last: the cache is open
    taken.bytes += c.b->capacity;
    taken.blocks.push_back(c.b);
  }
  leave_all();
  taken.idle_left = matching - taken.bytes;
  counter.fetch_add(taken.blocks.size(), std::memory_order_relaxed);
  return taken;
}

std::size_t cache_state::free_idle(std::size_t keep, std::atomic<std::uint64_t>& counter) {
  taken_blocks taken;
  std::vector<heap_use> heaps;
  {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked();  // first: once blocks are taken, nothing may throw before they are freed
    taken = take_idle_locked(keep, [](const block_key&) { return true; }, counter);
  }
  std::size_t freed = free_blocks(taken.blocks);
  // Free bytes of segments are idle memory too: they get what `keep` leaves after idle blocks.
  const std::size_t heap_keep = keep > taken.idle_left ? keep - taken.idle_left : 0;
  std::vector<std::unique_ptr<cache_heap>> dropped;  // destroyed last, with no lock held
  const auto drop_empty = [&] {
    heaps.clear();
    std::lock_guard guard(mutex_);
    dropped = drop_empty_heaps_locked();
  };
  try {
    freed += trim_heaps(heaps, heap_keep, false);
  } catch (...) {
    drop_empty();
    throw;
  }
  drop_empty();
  return freed;
}

std::size_t cache_state::reclaim_for_retry(backend_state& backend) {
  taken_blocks taken;
  std::vector<heap_use> heaps;
  {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked(&backend);
    taken = take_idle_locked(0, [&](const block_key& k) { return k.backend == &backend; }, reclaimed_);
  }
  oom_retries_.fetch_add(1, std::memory_order_relaxed);
  std::size_t freed = free_blocks(taken.blocks);
  freed += trim_heaps(heaps, 0, true);  // an out-of-memory path: a failed trim only means less memory
  return freed;
}

void cache_state::enforce_idle_limit() noexcept {
  const std::size_t limit = max_idle_bytes();
  {
    std::lock_guard guard(mutex_);
    if (closed_.load(std::memory_order_relaxed) || idle_total_.load(std::memory_order_relaxed) <= limit) return;
  }
  try {
    free_idle(limit, evictions_);
  } catch (const std::exception& e) {
    fmt::print(stderr, "refpool: trimming segments to the idle limit failed: {}\n", e.what());
  }
}

std::size_t cache_state::reclaim(std::size_t keep_bytes) { return free_idle(keep_bytes, reclaimed_); }

void cache_state::set_max_idle_bytes(std::size_t bytes) {
  {
    std::lock_guard guard(mutex_);
    // With every slot held, no idle count is in flight: start tracking from the exact sum.
    intrude_all();
    std::size_t idle = 0;
    for (const auto& s : slots_)
      s->buckets.for_each([&](const bucket& bk) { idle += bk.idle.size() * bk.key.bytes; });
    max_idle_bytes_.store(bytes, std::memory_order_relaxed);
    tracking_idle_.store(bytes != cache_options::unlimited, std::memory_order_relaxed);
    idle_total_.store(idle, std::memory_order_relaxed);
    leave_all();
  }
  if (bytes != cache_options::unlimited) enforce_idle_limit();
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
    free_slots_.clear();
    free_ambient_slots_.clear();
    intrude_all();
    std::size_t idle_count = 0;
    for (const auto& s : slots_) s->buckets.for_each([&](const bucket& bk) { idle_count += bk.idle.size(); });
    idle.reserve(idle_count);  // a bad_alloc here ends the process: host memory is gone anyway
    for (const auto& s : slots_) {
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
    idle_total_.store(0, std::memory_order_relaxed);
    leave_all();
    // The cache's own reference goes. A slot still leased or homing live blocks (also one a miss
    // in flight adds later: its lease holds it until then) stays, and needs our counters.
    std::erase_if(slots_, [&](const std::unique_ptr<slot>& s) {
      if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) return true;
      retain();  // released by the drop_slot_ref that deletes it (which waits for mutex_)
      return false;
    });
  }
  free_blocks(idle);  // pieces among them leave their heaps as closed heaps: trimmed at once
  close_heaps();
}

// ---- stats --------------------------------------------------------------------------------

cache_stats cache_state::stats() const {
  auto& self = const_cast<cache_state&>(*this);  // holding slots drains their hand-off lists
  cache_stats out;
  {
    std::lock_guard guard(mutex_);
    self.intrude_all();
    for (const auto& s : slots_) {
      self.catch_up_with_steps(*s);  // escapes of ended steps
      const slot_counters& c = s->counters;
      out.hits += c.hits;
      out.misses += c.misses;
      out.steals += c.steals;
      out.unsafe_frees += c.unsafe_frees;
      out.escapes += c.escapes;
      out.cross_stream_reuses += c.cross_stream_reuses;
      out.live_bytes += c.live_bytes;
      out.peak_live_bytes += c.peak_live_bytes;
      s->buckets.for_each([&](const bucket& bk) {
        out.live_blocks += bk.live;
        out.idle_blocks += bk.idle.size();
        out.idle_bytes += bk.idle.size() * bk.key.bytes;
      });
    }
    self.leave_all();
  }
  out.backend_allocations = backend_allocations_.load();
  out.backend_frees = backend_frees_.load();
  out.unsafe_frees += extra_unsafe_frees_.load();
  out.escapes += extra_escapes_.load();
  out.evictions = evictions_.load();
  out.reclaimed_blocks = reclaimed_.load();
  out.oom_retries = oom_retries_.load();
  out.ooms = ooms_.load();
  out.scope_entries = scope_entries_.load();
  out.uncached_entries = uncached_entries_.load();
  out.steps = steps_.load();
  out.uncached_allocations = uncached_allocations_.load();
  out.uncached_live_bytes = uncached_live_bytes_.load();
  out.held_bytes = held_bytes_.load();
  out.peak_held_bytes = peak_held_bytes_.load();
  {
    std::unique_lock guard(mutex_);
    add_segment_counters(out);
    if (extension_) extension_->add_counters(out);
  }
  const std::size_t uncached_peak = peak_uncached_live_bytes_.load();
  out.allocated_bytes = out.live_bytes + out.plan_live_bytes + out.uncached_live_bytes;
  out.reserved_bytes = out.held_bytes + out.segment_free_bytes + out.arena_bytes + out.uncached_live_bytes;
  out.peak_allocated_bytes = std::max(out.peak_live_bytes + out.planned_peak_live_bytes + uncached_peak, out.allocated_bytes);
  // Exact: every kind of held memory is counted in one place as it changes (reserved_counter).
  out.peak_reserved_bytes = std::max(reserved_->peak(), out.reserved_bytes);
  return out;
}

void cache_state::reset_peaks() noexcept {
  std::lock_guard guard(mutex_);
  intrude_all();
  for (const auto& s : slots_) s->counters.peak_live_bytes = s->counters.live_bytes;
  leave_all();
  peak_held_bytes_.store(held_bytes_.load());
  peak_uncached_live_bytes_.store(uncached_live_bytes_.load());
  reserved_->reset_peak();
}

}  // namespace refpool::detail
