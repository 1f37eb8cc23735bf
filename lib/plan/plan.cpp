// Planned scopes: placement, regions, runs and the per-cache store of plans.
#include "plan/plan.hpp"

#include <algorithm>
#include <limits>

namespace refpool::detail {

namespace {
constexpr std::size_t region_alignment = 256;  // what every backend's own allocations guarantee
constexpr std::uint64_t still_live = std::numeric_limits<std::uint64_t>::max();

std::size_t aligned(std::size_t bytes) { return (bytes + region_alignment - 1) / region_alignment * region_alignment; }
}  // namespace

// ---- placement ----------------------------------------------------------------------------

std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(
    const std::vector<std::size_t>& sizes, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& lifetimes,
    std::size_t alignment) {
  const std::size_t n = sizes.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  // Largest first; ties by first use, so the result does not depend on sort stability.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sizes[a] != sizes[b] ? sizes[a] > sizes[b] : lifetimes[a].first < lifetimes[b].first;
  });
  const auto round = [&](std::size_t s) { return (s + alignment - 1) / alignment * alignment; };
  std::vector<std::size_t> offsets(n, 0);
  std::vector<std::size_t> placed;  // indices placed so far
  std::size_t arena = 0;
  std::vector<std::pair<std::size_t, std::size_t>> busy;  // [offset, end) of placed requests alive with this one
  for (std::size_t i : order) {
    busy.clear();
    for (std::size_t j : placed)
      if (lifetimes[j].first < lifetimes[i].second && lifetimes[i].first < lifetimes[j].second)
        busy.emplace_back(offsets[j], offsets[j] + round(sizes[j]));
    std::sort(busy.begin(), busy.end());
    std::size_t at = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= at + round(sizes[i])) break;  // the gap before this one fits
      at = std::max(at, end);
    }
    offsets[i] = at;
    arena = std::max(arena, at + round(sizes[i]));
    placed.push_back(i);
  }
  return {offsets, arena};
}

// ---- arena -------------------------------------------------------------------------------

arena::arena(backend_state& backend, std::size_t bytes, stream_ref stream)
    : backend_(&backend), bytes_(bytes), stream_(stream) {
  backend.retain();
}

arena::~arena() {
  if (ptr_ != nullptr) backend_->deallocate(ptr_, bytes_, stream_);
  backend_->release();
}

bool arena::allocate() {
  ptr_ = bytes_ == 0 ? nullptr : backend_->allocate(bytes_, stream_);
  return ptr_ != nullptr;
}

// ---- plan ---------------------------------------------------------------------------------

plan::plan(std::vector<planned_request> requests, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& lifetimes)
    : requests_(std::move(requests)) {
  std::vector<std::size_t> sizes;
  for (const auto& r : requests_) sizes.push_back(r.key.bytes);
  std::tie(offsets_, bytes_needed_) = place_greedy_by_size(sizes, lifetimes, region_alignment);
  const std::size_t n = requests_.size();
  overlaps_.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      if (offsets_[j] < offsets_[i] + aligned(sizes[i]) && offsets_[i] < offsets_[j] + aligned(sizes[j]))
        overlaps_[i].push_back(static_cast<std::uint32_t>(j));
  live_.assign(n, 0);
  // Peak live bytes of the recorded run: sweep its allocation and release ticks.
  std::vector<std::pair<std::uint64_t, std::int64_t>> events;
  for (std::size_t i = 0; i < n; ++i) {
    events.emplace_back(lifetimes[i].first, static_cast<std::int64_t>(sizes[i]));
    events.emplace_back(lifetimes[i].second, -static_cast<std::int64_t>(sizes[i]));
  }
  std::sort(events.begin(), events.end());
  std::int64_t live = 0;
  for (const auto& [tick, delta] : events) {
    live += delta;
    peak_live_bytes_ = std::max(peak_live_bytes_, static_cast<std::size_t>(std::max<std::int64_t>(live, 0)));
  }
}

plan::plan(const plan& other, arena* a)
    : requests_(other.requests_),
      offsets_(other.offsets_),
      overlaps_(other.overlaps_),
      bytes_needed_(other.bytes_needed_),
      peak_live_bytes_(other.peak_live_bytes_),
      live_(other.requests_.size(), 0) {
  last_used.store(other.last_used.load());
  bind(a);
}

plan::~plan() {
  for (block* b : free_regions_) delete b;
  if (arena_ != nullptr) arena_->release();
}

void plan::bind(arena* a) noexcept {
  a->retain();
  arena_ = a;
}

block* plan::take_region(std::size_t i, std::size_t requested, stream_ref stream) {
  block* b = nullptr;
  {
    std::lock_guard guard(arena_->lock);
    if (arena_->live_total != live_sum_) return nullptr;  // another plan's region is live here
    for (std::uint32_t j : overlaps_[i]) {
      if (live_[j] != 0) {  // a handle can still reach these bytes: never hand them out
        stale.store(true, std::memory_order_relaxed);
        return nullptr;
      }
    }
    live_[i] += 1;
    live_sum_ += 1;
    arena_->live_total += 1;
    if (!free_regions_.empty()) {
      b = free_regions_.back();
      free_regions_.pop_back();
    }
  }
  if (b == nullptr) b = new block;
  b->ptr = arena_->base() + offsets_[i];
  b->capacity = aligned(requests_[i].key.bytes);
  b->requested = requested;
  b->backend = arena_->backend();
  b->origin = block_origin::region;
  b->region = this;
  b->region_index = static_cast<std::uint32_t>(i);
  b->last_stream = stream;
  retain();  // a live region keeps its plan and arena
  b->refs.reset(1);
  return b;
}

std::size_t plan::live_region_bytes() const {
  std::lock_guard guard(arena_->lock);
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < live_.size(); ++i) bytes += live_[i] * aligned(requests_[i].key.bytes);
  return bytes;
}

void plan::release_region(block* b, bool via_unsafe_free) noexcept {
  if (via_unsafe_free) unsafe_frees.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard guard(arena_->lock);
    live_[b->region_index] -= 1;
    live_sum_ -= 1;
    arena_->live_total -= 1;
    free_regions_.push_back(b);
  }
  release();
}

// ---- run ----------------------------------------------------------------------------------

plan_run::plan_run(cache_state& cache, std::string key)
    : cache_(cache), key_(std::move(key)), candidates_(plan_store::of(cache).find(key_)) {
  recording_only_ = candidates_.empty();
  cache_.retain();  // releases of this run's blocks may come after the scope and the cache ended
}

plan_run::~plan_run() {
  for (plan* p : candidates_) p->release();
  if (first_backend_ != nullptr) first_backend_->release();
  cache_.release();
}

block* plan_run::fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  return lease != nullptr ? cache_.acquire(*lease, backend, cache_.key_of(backend, bytes), bytes, stream)
                          : cache_.allocate_uncached(backend, bytes, stream);
}

block* plan_run::acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  const backend_state& bs = backend;
  plan_store& store = plan_store::of(cache_);
  const planned_request request{{&bs, bs.device(), bs.kind(), bs.alignment(), bytes}, stream};
  std::size_t index = 0;
  {
    std::lock_guard guard(lock_);
    index = sequence_.size();
    sequence_.push_back(request);
    lifetimes_.emplace_back(tick_.fetch_add(1, std::memory_order_relaxed), still_live);
    several_streams_ |= request.stream != sequence_.front().stream || request.key.backend != sequence_.front().key.backend;
    if (index == 0) {
      first_backend_ = &backend;
      backend.retain();  // the recording's blocks may all be gone by finish()
    }
  }
  block* b = nullptr;
  if (recording_only_) {
    b = cache_.allocate_uncached(backend, bytes, stream);  // the first run: exact and uncached, so nothing lingers
  } else {
    // The current plan matched every earlier request, so only this one needs comparing; another
    // plan is taken only if it matches the whole sequence so far.
    const auto matches = [&](const plan* p) {
      return p->requests().size() > index && std::equal(sequence_.begin(), sequence_.begin() + index + 1, p->requests().begin());
    };
    const bool current_fits = current_ != nullptr && current_->requests().size() > index &&
                              current_->requests()[index] == request;
    if (!diverged_ && !current_fits) {
      auto it = std::find_if(candidates_.begin(), candidates_.end(), matches);
      current_ = it != candidates_.end() ? *it : nullptr;
      if (current_ == nullptr) {
        diverged_ = true;  // another sequence: the normal cache serves the rest of this run
        store.misses.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (!diverged_) {
      b = current_->take_region(index, bytes, stream);
      (b != nullptr ? store.hits : store.misses).fetch_add(1, std::memory_order_relaxed);
      if (b == nullptr) b = fallback(lease, backend, bytes, stream);  // live bytes in the way: this request only
    } else {
      // A new sequence: served exactly and uncached, like a first run, since it will be recorded
      // into a plan; cached copies of its blocks would only add to the memory held.
      b = cache_.allocate_uncached(backend, bytes, stream);
    }
  }
  note(b, index);
  return b;
}

void plan_run::note(block* b, std::size_t index) {
  b->observer = this;
  b->observer_index = static_cast<std::uint32_t>(index);
  retain();
  if (b->origin != block_origin::cached) {  // regions and uncached blocks: escapes are counted here
    std::lock_guard guard(lock_);
    ++live_;
  }
}

void plan_run::observe_release(block* b, bool) noexcept {
  {
    std::lock_guard guard(lock_);
    if (!finished_) lifetimes_[b->observer_index].second = tick_.fetch_add(1, std::memory_order_relaxed);
    if (b->origin != block_origin::cached) --live_;
  }
  release();
}

void plan_run::finish() noexcept {
  std::vector<planned_request> sequence;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> lifetimes;
  std::size_t escaped = 0;
  {
    std::lock_guard guard(lock_);
    finished_ = true;
    escaped = live_;
    const std::uint64_t end = tick_.load(std::memory_order_relaxed);
    for (auto& l : lifetimes_)
      if (l.second == still_live) l.second = end + 1;  // escaped: alive to the end of the run
    sequence = sequence_;
    lifetimes = lifetimes_;
  }
  if (escaped != 0) cache_.add_escapes(escaped);
  plan_store& store = plan_store::of(cache_);
  const bool complete = current_ != nullptr && !diverged_ && current_->requests().size() == sequence.size();
  if (complete) current_->last_used.store(store.clock.fetch_add(1) + 1, std::memory_order_relaxed);
  if (!complete && current_ != nullptr && !diverged_) store.misses.fetch_add(1, std::memory_order_relaxed);
  const bool record = !sequence.empty() && !several_streams_ && (!complete || current_->stale.load());
  if (!record) return;
  try {
    auto* made = new plan(std::move(sequence), lifetimes);
    if (!store.add(key_, made, *first_backend_, sequence_.front().stream)) return;  // no memory: normal cache
    store.recordings.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    // A plan is an optimisation: failing to make one leaves the cache correct.
  }
}

// ---- store --------------------------------------------------------------------------------

plan_store::~plan_store() { close(); }

plan_store& plan_store::of(cache_state& cache) {
  return static_cast<plan_store&>(cache.extension([](cache_state&) -> std::unique_ptr<cache_extension> {
    return std::make_unique<plan_store>();
  }));
}

std::vector<plan*> plan_store::find(std::string_view key) {
  std::lock_guard guard(mutex_);
  std::vector<plan*> out;
  for (const auto& [k, p] : plans_) {
    if (k != key) continue;
    p->retain();
    out.push_back(p);
  }
  std::sort(out.begin(), out.end(), [](const plan* a, const plan* b) { return a->last_used > b->last_used; });
  return out;
}

bool plan_store::add(const std::string& key, plan* p, backend_state& backend, stream_ref stream) {
  std::vector<plan*> dropped;
  bool added = true;
  {
    std::lock_guard guard(mutex_);
    p->last_used.store(clock.fetch_add(1) + 1);
    auto same = std::find_if(plans_.begin(), plans_.end(),
                             [&](const auto& e) { return e.first == key && e.second->requests() == p->requests(); });
    if (same != plans_.end()) {
      dropped.push_back(same->second);
      plans_.erase(same);
    }
    // Plans of this key made for another backend cannot share its memory: drop them.
    for (auto it = plans_.begin(); it != plans_.end();) {
      if (it->first == key && it->second->memory()->backend() != &backend) {
        dropped.push_back(it->second);
        it = plans_.erase(it);
      } else {
        ++it;
      }
    }
    // The key's plans share one arena: reuse it if it is big enough, else grow it and move them.
    arena* shared = nullptr;
    std::size_t needed = p->bytes_needed();
    for (const auto& [k, q] : plans_) {
      if (k != key) continue;
      needed = std::max(needed, q->bytes_needed());
      if (shared == nullptr || q->memory()->bytes() > shared->bytes()) shared = const_cast<arena*>(q->memory());
    }
    if (shared != nullptr && shared->bytes() >= needed) {
      p->bind(shared);
    } else {
      auto* grown = new arena(backend, needed, stream);
      if (!grown->allocate()) {
        grown->release();
        dropped.push_back(p);
        added = false;
      } else {
        p->bind(grown);
        for (auto& [k, q] : plans_) {
          if (k != key) continue;
          plan* moved = new plan(*q, grown);
          dropped.push_back(q);
          q = moved;
        }
      }
      grown->release();  // the plans hold it now
    }
    if (added) {
      plans_.emplace_back(key, p);
      if (std::count_if(plans_.begin(), plans_.end(), [&](const auto& e) { return e.first == key; }) >
          static_cast<std::ptrdiff_t>(plans_per_key)) {
        auto oldest = plans_.end();
        for (auto it = plans_.begin(); it != plans_.end(); ++it)
          if (it->first == key && (oldest == plans_.end() || it->second->last_used < oldest->second->last_used)) oldest = it;
        dropped.push_back(oldest->second);
        plans_.erase(oldest);
      }
    }
    for (plan* d : dropped) retired_unsafe_frees_ += d->unsafe_frees.load();
  }
  for (plan* d : dropped) d->release();
  return added;
}

void plan_store::close() noexcept {
  std::vector<std::pair<std::string, plan*>> all;
  {
    std::lock_guard guard(mutex_);
    all.swap(plans_);
    for (const auto& e : all) retired_unsafe_frees_ += e.second->unsafe_frees.load();
  }
  for (const auto& e : all) e.second->release();
}

void plan_store::add_counters(cache_stats& out) const {
  out.plan_hits = hits.load();
  out.plan_misses = misses.load();
  out.plan_recordings = recordings.load();
  std::lock_guard guard(mutex_);
  out.unsafe_frees += retired_unsafe_frees_;
  std::vector<const arena*> arenas;
  std::vector<std::pair<std::string_view, std::size_t>> peak_by_key;
  for (const auto& [key, p] : plans_) {
    out.plans += 1;
    out.unsafe_frees += p->unsafe_frees.load();
    out.plan_live_bytes += p->live_region_bytes();
    if (std::find(arenas.begin(), arenas.end(), p->memory()) == arenas.end()) arenas.push_back(p->memory());
    auto k = std::find_if(peak_by_key.begin(), peak_by_key.end(), [&key = key](const auto& e) { return e.first == key; });
    if (k == peak_by_key.end()) {
      peak_by_key.emplace_back(key, p->peak_live_bytes());
    } else {
      k->second = std::max(k->second, p->peak_live_bytes());
    }
  }
  for (const arena* a : arenas) out.arena_bytes += a->bytes();
  for (const auto& e : peak_by_key) out.planned_peak_live_bytes += e.second;
}

}  // namespace refpool::detail
