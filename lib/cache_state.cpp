// How blocks move: handed out (hit, steal, miss), released to idle, evicted, reclaimed, and
// what happens to all of them when the cache is destroyed.
#include "cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "alloc_log.hpp"

namespace refpool::detail {

namespace {

void raise_max(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void wait_for_streams(block* b, stream_ref stream) {
  b->backend->res().order_streams(b->last_stream, stream);
  std::lock_guard guard(b->streams_lock);
  for (stream_ref s : b->extra_streams)
    if (s != stream) b->backend->res().order_streams(s, stream);
  b->extra_streams.clear();
}

}  // namespace

cache_state::cache_state(const cache_options& options)
    : rounding_(options.rounding), max_idle_bytes_(options.max_idle_bytes) {
  tracking_idle_.store(options.max_idle_bytes != cache_options::unlimited);
}

cache_state::~cache_state() = default;

void cache_state::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

// ---- scopes -------------------------------------------------------------------------------

slot* cache_state::lease(std::thread::id thread) {
  std::lock_guard guard(mutex_);
  if (closed_) return nullptr;
  slot* s = nullptr;
  auto mine = std::find_if(free_slots_.rbegin(), free_slots_.rend(),
                           [&](const slot* f) { return f->last_thread == thread; });
  if (mine != free_slots_.rend()) {
    s = *mine;
    free_slots_.erase(std::next(mine).base());
  } else if (!free_slots_.empty()) {
    s = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slots_.push_back(std::make_unique<slot>(this));
    s = slots_.back().get();
  }
  std::lock_guard slot_guard(s->lock);
  s->leased = true;
  s->last_thread = thread;
  return s;
}

void cache_state::give_back(slot* s) noexcept {
  bool remove = false;
  {
    std::lock_guard guard(mutex_);
    std::lock_guard slot_guard(s->lock);
    s->counters.escapes += s->live_in_epoch;
    s->live_in_epoch = 0;
    ++s->epoch;
    s->leased = false;
    if (s->orphaned) {
      remove = s->counters.live_blocks == 0;
    } else {
      free_slots_.push_back(s);
    }
  }
  clock_.fetch_add(1, std::memory_order_relaxed);
  if (remove) remove_orphan(s);
}

bool cache_state::count_entry(std::size_t warmup) noexcept {
  const bool uncached = scope_entries_.fetch_add(1, std::memory_order_relaxed) < warmup;
  if (uncached) uncached_entries_.fetch_add(1, std::memory_order_relaxed);
  return uncached;
}

// ---- handing out --------------------------------------------------------------------------

void cache_state::mark_live(slot& s, block* b, bool hit) noexcept {
  auto& c = s.counters;
  (hit ? c.hits : c.misses) += 1;
  c.live_blocks += 1;
  c.live_bytes += b->capacity;
  s.live_in_epoch += 1;
  b->epoch = s.epoch;
  b->idle = false;
}

void cache_state::add_idle(slot& s, block* b) noexcept {
  b->idle = true;
  b->idle_since = clock_.load(std::memory_order_relaxed);
  b->idle_seq = ++s.releases;
  b->home->put(b);
  s.counters.idle_blocks += 1;
  s.counters.idle_bytes += b->capacity;
  if (tracking_idle_.load(std::memory_order_relaxed))
    idle_total_.fetch_add(b->capacity, std::memory_order_relaxed);
}

void cache_state::remove_idle(slot& s, block* b) noexcept {
  b->idle = false;
  s.counters.idle_blocks -= 1;
  s.counters.idle_bytes -= b->capacity;
  if (tracking_idle_.load(std::memory_order_relaxed))
    idle_total_.fetch_sub(b->capacity, std::memory_order_relaxed);
}

block* cache_state::acquire(slot& s, const backend& be, std::size_t bytes, stream_ref stream) {
  const backend_state& bs = *be.state();
  const block_key key{&bs, bs.device(), bs.kind(), bs.alignment(), rounding_.round(bytes)};
  block* b = nullptr;
  bucket* target = nullptr;
  bool other_stream = false;
  {
    std::lock_guard guard(s.lock);
    target = s.last_bucket != nullptr && s.last_bucket->key == key ? s.last_bucket
                                                                    : &s.bucket_for(key, be.state());
    s.last_bucket = target;
    b = target->take(stream);
    if (b != nullptr) {
      remove_idle(s, b);
      mark_live(s, b, true);
      other_stream = b->last_stream != stream || !b->extra_streams.empty();
      if (other_stream) s.counters.cross_stream_reuses += 1;
    }
  }
  if (b == nullptr) b = steal(s, *target, stream, other_stream);
  if (b == nullptr) {
    b = allocate_new(s, *target, be, key.bytes, bytes, stream);
  } else if (other_stream) {
    try {
      wait_for_streams(b, stream);
    } catch (...) {
      release_block(b, false);  // still ordered after its old stream: idle again, unchanged
      throw;
    }
  }
  b->last_stream = stream;
  b->requested = bytes;
  b->refs.store(1, std::memory_order_relaxed);
  return b;
}

block* cache_state::steal(slot& thief, bucket& target, stream_ref stream, bool& other_stream) {
  std::lock_guard guard(mutex_);
  for (const auto& victim : slots_) {
    if (victim.get() == &thief) continue;
    block* b = nullptr;
    {
      std::lock_guard victim_guard(victim->lock);
      bucket* from = victim->buckets.find(target.key);
      b = from != nullptr ? from->take(stream) : nullptr;
      if (b == nullptr) continue;
      remove_idle(*victim, b);
    }
    b->home = &target;  // homes change only under mutex_, so reclaim sees a consistent home
    other_stream = b->last_stream != stream || !b->extra_streams.empty();
    std::lock_guard thief_guard(thief.lock);
    mark_live(thief, b, true);
    thief.counters.steals += 1;
    if (other_stream) thief.counters.cross_stream_reuses += 1;
    return b;
  }
  return nullptr;
}

block* cache_state::allocate_new(slot& s, bucket& target, const backend& be, std::size_t capacity,
                                 std::size_t requested, stream_ref stream) {
  backend_state& bs = *be.state();
  auto made = std::make_unique<block>();  // before the backend call, so a bad_alloc leaks nothing
  void* ptr = bs.allocate(capacity, stream);
  if (ptr == nullptr) {
    // Out of memory: give back this backend's idle blocks (all sizes, all slots), retry once.
    std::size_t freed = 0;
    {
      std::lock_guard guard(mutex_);
      freed = free_idle_locked(0, [&](const block_key& k) { return k.backend == &bs; }, reclaimed_);
    }
    oom_retries_.fetch_add(1, std::memory_order_relaxed);
    ptr = bs.allocate(capacity, stream);
    if (ptr == nullptr) {
      const cache_stats now = stats();
      throw out_of_memory(
          fmt::format("refpool: out of memory: {} could not allocate {} B (request {} B) on device {}, "
                      "even after reclaiming {} B of idle cache; the cache now holds {} B live in {} "
                      "blocks and {} B idle; the backend has {} B outstanding",
                      bs.res().name(), capacity, requested, bs.device(), freed, now.live_bytes,
                      now.live_blocks, now.idle_bytes, bs.outstanding_bytes.load()),
          capacity, bs.device());
    }
  }
  block* b = made.get();
  b->ptr = ptr;
  b->capacity = capacity;
  b->backend = &bs;
  b->home = &target;
  b->id = next_block_id_.fetch_add(1, std::memory_order_relaxed);
  b->last_stream = stream;
  backend_allocations_.fetch_add(1, std::memory_order_relaxed);
  raise_max(peak_held_bytes_, held_bytes_.fetch_add(capacity, std::memory_order_relaxed) + capacity);
  {
    std::lock_guard guard(s.lock);
    mark_live(s, b, false);
  }
  return made.release();
}

// ---- giving back --------------------------------------------------------------------------

void cache_state::release_block(block* b, bool via_unsafe_free) noexcept {
  slot& s = *b->home->owner;
  std::shared_ptr<backend_state> keep_backend;  // only for blocks freed at once (orphaned slot)
  bool free_now = false;
  bool remove_slot = false;
  bool over_limit = false;
  {
    std::lock_guard guard(s.lock);
    auto& c = s.counters;
    c.live_blocks -= 1;
    c.live_bytes -= b->capacity;
    if (b->epoch == s.epoch && s.leased) s.live_in_epoch -= 1;
    if (via_unsafe_free) c.unsafe_frees += 1;
    if (s.orphaned) {
      free_now = true;
      keep_backend = b->home->backend_owner;
      held_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
      backend_frees_.fetch_add(1, std::memory_order_relaxed);
      remove_slot = c.live_blocks == 0 && !s.leased;
    } else {
      add_idle(s, b);
      over_limit = tracking_idle_.load(std::memory_order_relaxed) &&
                   idle_total_.load(std::memory_order_relaxed) > max_idle_bytes();
      // The cache may be closed by another thread once s is unlocked: hold it for the eviction.
      if (over_limit) retain();
    }
  }
  if (free_now) {
    keep_backend->deallocate(b->ptr, b->capacity, b->last_stream);
    delete b;
    if (remove_slot) remove_orphan(&s);
  } else if (over_limit) {
    enforce_idle_limit();
    release();
  }
}

void cache_state::free_to_backend(block* b) noexcept {
  held_bytes_.fetch_sub(b->capacity, std::memory_order_relaxed);
  backend_frees_.fetch_add(1, std::memory_order_relaxed);
  b->backend->deallocate(b->ptr, b->capacity, b->last_stream);
  delete b;
}

std::size_t cache_state::free_idle_locked(std::size_t keep,
                                          const std::function<bool(const block_key&)>& filter,
                                          std::atomic<std::uint64_t>& counter) {
  struct candidate {
    std::uint64_t idle_since;
    std::uint64_t idle_seq;
    block* b;
    slot* s;
  };
  std::vector<candidate> candidates;
  std::size_t matching = 0;
  for (const auto& s : slots_) {
    std::lock_guard guard(s->lock);
    s->buckets.for_each([&](const bucket& bk) {
      if (!filter(bk.key)) return;
      for (block* b : bk.idle) {
        candidates.push_back({b->idle_since, b->idle_seq, b, s.get()});
        matching += b->capacity;
      }
    });
  }
  std::sort(candidates.begin(), candidates.end(), [](const candidate& x, const candidate& y) {
    return x.idle_since != y.idle_since ? x.idle_since < y.idle_since : x.idle_seq < y.idle_seq;
  });
  std::size_t freed = 0;
  for (const candidate& c : candidates) {
    if (matching - freed <= keep) break;
    {
      std::lock_guard guard(c.s->lock);
      // Handed out and given back since we looked? Then it is newer than its place here.
      if (!c.b->idle || c.b->home->owner != c.s || c.b->idle_seq != c.idle_seq) continue;
      c.b->home->remove(c.b);
      remove_idle(*c.s, c.b);
    }
    freed += c.b->capacity;
    counter.fetch_add(1, std::memory_order_relaxed);
    free_to_backend(c.b);
  }
  return freed;
}

void cache_state::enforce_idle_limit() noexcept {
  std::lock_guard guard(mutex_);
  const std::size_t limit = max_idle_bytes();
  if (closed_ || idle_total_.load(std::memory_order_relaxed) <= limit) return;
  free_idle_locked(limit, [](const block_key&) { return true; }, evictions_);
}

std::size_t cache_state::reclaim(std::size_t keep_bytes) {
  std::lock_guard guard(mutex_);
  return free_idle_locked(keep_bytes, [](const block_key&) { return true; }, reclaimed_);
}

void cache_state::set_max_idle_bytes(std::size_t bytes) {
  {
    std::lock_guard guard(mutex_);
    // With every slot locked, no idle count is in flight: start tracking from the exact sum.
    std::vector<std::unique_lock<spinlock>> locks;
    std::size_t idle = 0;
    for (const auto& s : slots_) {
      locks.emplace_back(s->lock);
      idle += s->counters.idle_bytes;
    }
    max_idle_bytes_.store(bytes, std::memory_order_relaxed);
    tracking_idle_.store(bytes != cache_options::unlimited, std::memory_order_relaxed);
    idle_total_.store(idle, std::memory_order_relaxed);
  }
  if (bytes != cache_options::unlimited) enforce_idle_limit();
}

// ---- destruction --------------------------------------------------------------------------

void cache_state::add_escapes(slot& s, std::size_t count) noexcept {
  std::lock_guard guard(s.lock);
  s.counters.escapes += count;
}

void cache_state::close() noexcept {
  plans_.clear();
  std::lock_guard guard(mutex_);
  closed_ = true;
  free_slots_.clear();
  std::vector<block*> idle;
  for (auto& s : slots_) {
    std::lock_guard slot_guard(s->lock);
    s->buckets.for_each([&](bucket& bk) {
      for (block* b : bk.idle) idle.push_back(b);
      bk.idle.clear();
    });
    s->counters.idle_blocks = 0;
    s->counters.idle_bytes = 0;
    if (s->leased || s->counters.live_blocks != 0) {
      s->orphaned = true;
      retain();  // an orphan slot needs our counters until its last block goes
    }
  }
  for (block* b : idle) free_to_backend(b);
  std::erase_if(slots_, [](const std::unique_ptr<slot>& s) { return !s->orphaned; });
}

void cache_state::remove_orphan(slot* s) noexcept {
  {
    std::lock_guard guard(mutex_);
    std::erase_if(slots_, [&](const std::unique_ptr<slot>& p) { return p.get() == s; });
  }
  release();
}

// ---- stats --------------------------------------------------------------------------------

cache_stats cache_state::stats() const {
  cache_stats out;
  std::lock_guard guard(mutex_);
  for (const auto& s : slots_) {
    std::lock_guard slot_guard(s->lock);
    const slot_counters& c = s->counters;
    out.hits += c.hits;
    out.misses += c.misses;
    out.steals += c.steals;
    out.unsafe_frees += c.unsafe_frees;
    out.escapes += c.escapes;
    out.cross_stream_reuses += c.cross_stream_reuses;
    out.live_blocks += c.live_blocks;
    out.idle_blocks += c.idle_blocks;
    out.live_bytes += c.live_bytes;
    out.idle_bytes += c.idle_bytes;
  }
  out.backend_allocations = backend_allocations_.load();
  out.backend_frees = backend_frees_.load();
  out.evictions = evictions_.load();
  out.reclaimed_blocks = reclaimed_.load();
  out.oom_retries = oom_retries_.load();
  out.scope_entries = scope_entries_.load();
  out.uncached_entries = uncached_entries_.load();
  out.held_bytes = held_bytes_.load();
  out.peak_held_bytes = peak_held_bytes_.load();
  plans_.add_counters(out);
  return out;
}

}  // namespace refpool::detail
