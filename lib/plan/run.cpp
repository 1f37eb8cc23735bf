// Planned runs: matching requests against the key's plans, handing out regions, and recording.
// What a run leaves behind at its end (pinned regions, escapes, a new plan): run_end.cpp.
#include "plan/run.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <utility>

namespace refpool::detail {

namespace {
bool overlap(std::size_t a, std::size_t an, std::size_t b, std::size_t bn) noexcept { return a < b + bn && b < a + an; }
}  // namespace

plan_run* plan_run::open(cache_state& cache, std::string_view key, bool shared, pass_ticket& passing) {
  return plan_store::of(cache).begin_run(key, shared, passing);
}

plan_run::plan_run(cache_state& cache, plan_store& store, key_state* key, run_kind kind, std::vector<plan*> candidates,
                   bool may_record, bool shared)
    : cache_(cache),
      store_(store),
      key_(key),
      shared_(shared),
      thread_(shared ? nullptr : this_thread_token()),
      mode_(kind == run_kind::probe ? mode::probe : mode::start),
      may_record_(may_record),
      candidates_(std::move(candidates)) {
  for (plan* p : candidates_) p->retain();
  cache_.retain();  // until its end (finish)
}

plan_run::~plan_run() {
  if (mode_ != mode::finished) {  // never started (a step that could not open): no run to count
    store_.abandon_run(this);
    for (plan* p : candidates_) p->release();
    if (first_backend_ != nullptr) first_backend_->release();
    cache_.release();  // a finished run gave both back at its end
  }
}

// ---- serving requests ---------------------------------------------------------------------

block* plan_run::acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (shared_) {
    const serving_section serving(serving_);
    return serve(lease, backend, bytes, stream);
  }
  return serve(lease, backend, bytes, stream);
}

// The replay path: the request is the one the plan recorded at this position. serve, replay_one
// and take_region are inlined into acquire: as calls, their prologues, epilogues and the try's
// set-up cost 51 of a replayed request's 469 instructions (callgrind, bench/host/instructions.sh).
[[gnu::always_inline]] inline block* plan_run::serve(slot* lease, backend_state& backend, std::size_t bytes,
                                                     stream_ref stream) {
  const std::uint64_t at = position_.load(std::memory_order_relaxed);
  if (mode_ == mode::replay && at < current_->size()) [[likely]] {
    const planned_request& want = current_->request(at);
    if (want.key.bytes == bytes && want.key.backend == &backend && want.stream == stream) [[likely]]
      return replay_one(lease, backend, bytes, stream, at);
  }
  return serve_slow(lease, backend, bytes, stream);
}

[[gnu::always_inline]] inline block* plan_run::replay_one(slot* lease, backend_state& backend, std::size_t bytes,
                                                          stream_ref stream, std::uint64_t at) {
  advance(at + 1);
  try {
    if (block* b = take_region(at, stream)) [[likely]] {
      hits.store(hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return b;
    }
    // A live handle can still reach these bytes: this request alone goes to the plain cache.
    misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    reserve_tracking();
    block* b = fallback(lease, backend, bytes, stream);
    track(b, current_->request(at), at);
    return b;
  } catch (...) {
    advance(at);  // nothing was served: the next request takes this position again
    throw;
  }
}

[[gnu::always_inline]] inline block* plan_run::take_region(std::uint64_t at, stream_ref stream) {
  plan& p = *current_;
  if (arena_->waits_pending()) [[unlikely]]
    arena_->wait_for_pending(stream);
  if (at >= due_processed_) {
    // Regions the recording had released by now: one this run still holds is overdue.
    for (const std::uint32_t* d = p.due_begin(at); d != p.due_end(at); ++d)
      if (p.state(*d).state.load(std::memory_order_acquire) == region_state::live_in(generation_)) [[unlikely]]
        overdue_.push_back(*d);
    due_processed_ = at + 1;
  }
  region_state& st = p.state(at);
  if ((st.state.load(std::memory_order_acquire) & region_state::live) != 0) [[unlikely]]
    return nullptr;
  // Only an overdue region of this run or a live region of another can share bytes with this one:
  // every other live region was recorded alive together with it, and placed apart.
  if ((!overdue_.empty() || !foreign_.empty()) && blocked(at)) [[unlikely]]
    return nullptr;
  region_block& r = p.region_at(at);
  r.thread = thread_;
  r.refs.reset(1);
  st.state.store(region_state::live_in(generation_), std::memory_order_relaxed);
  return &r;
}

bool plan_run::blocked(std::uint64_t at) {
  const plan& p = *current_;
  const std::size_t from = p.offset(at);
  const std::size_t span = p.span(at);
  std::erase_if(overdue_, [&](std::uint32_t j) {
    return p.state(j).state.load(std::memory_order_acquire) != region_state::live_in(generation_);
  });
  for (std::uint32_t j : overdue_) {
    if (overlap(from, span, p.offset(j), p.span(j))) {
      stale_ = true;  // a release later than recorded: the plan's lifetimes no longer hold
      return true;
    }
  }
  bool hit = false;
  std::erase_if(foreign_, [&](const foreign_region& f) {
    if (f.owner->state(f.index).state.load(std::memory_order_acquire) != f.live_state) {
      f.owner->release();
      return true;
    }
    hit = hit || overlap(from, span, f.owner->offset(f.index), f.owner->span(f.index));
    return false;
  });
  return hit;
}

block* plan_run::serve_slow(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (mode_ == mode::probe && lease != nullptr) {
    // Does the key repeat again? Only the sizes are seen: nothing is tracked or matched.
    probed_.add(bytes);  // asked for, served or not: probes that fail are no repeats of each other
    block* b = cache_.acquire(*lease, backend, cache_.key_of(backend, bytes), bytes, stream);
    advance(position_.load(std::memory_order_relaxed) + 1);
    return b;
  }
  if (mode_ != mode::finished) asked_ = true;
  const backend_state& bs = backend;
  const planned_request request{{&bs, bs.device(), bs.kind(), bs.alignment(), bytes}, stream};
  const std::uint64_t at = position_.load(std::memory_order_relaxed);
  if (mode_ == mode::start) {
    begin_with(request);
  } else if (mode_ == mode::replay && !switch_to(request, at)) {
    diverge();
  }
  switch (mode_) {
    case mode::replay: return replay_one(lease, backend, bytes, stream, at);
    case mode::record: {
      // A new sequence: served by the plain cache, as the default path would serve it (no
      // driver call a request, no memory beside the cache's), and tracked, since it may become a
      // plan at the end (the store keeps it pending until the sequence comes again).
      reserve_tracking();
      block* b = fallback(lease, backend, bytes, stream);
      track(b, request, at);  // only now that it succeeded: a request that threw is no part of it
      advance(at + 1);
      return b;
    }
    case mode::probe:  // without a lease (not a step's or scope's request)
    case mode::plain: {
      if (lease == nullptr) reserve_tracking();
      if (mode_ == mode::probe) probed_.add(bytes);
      block* b = fallback(lease, backend, bytes, stream);
      if (lease == nullptr) track(b, request, at);  // its escape is counted by the run
      advance(at + 1);
      return b;
    }
    default: return fallback(lease, backend, bytes, stream);  // a step's late request after its end
  }
}

void plan_run::begin_with(const planned_request& request) {
  for (plan* c : candidates_) {
    if (c->size() == 0 || !(c->request(0) == request)) continue;
    arena& a = c->memory();
    if (!a.claim(this, key_)) {
      // Another run holds the arena (or it was just replaced): the plain cache serves this one.
      busy_ = true;
      // Null: the store holds it (or the claimer has not named its key yet), no other key's run.
      const void* holder = a.claimed_key();
      busy_other_key_ = !a.retired() && holder != nullptr && holder != key_;
      mode_ = mode::plain;
      return;
    }
    bool usable = false;  // its span: made, held again or extended (out of memory: the plain cache)
    try {
      usable = a.take();
    } catch (...) {
      usable = false;
    }
    if (!usable) {
      a.unclaim();
      mode_ = mode::plain;
      return;
    }
    arena_ = &a;
    current_ = c;
    generation_ = ++a.generation;
    try {
      // Regions of finished runs still live pin their bytes: this run must not hand those out.
      std::lock_guard guard(a.pinned_mutex);
      a.drop_released_pins_locked();
      foreign_.reserve(a.pinned.size());
      for (const pinned_region& p : a.pinned) {
        // Released since it was read live, by the plan's last region: the plan is being
        // destroyed, and its entries go as soon as this lock is free (pinned_region).
        if (!p.owner->retain_if_owned()) continue;
        foreign_.push_back({p.owner, p.index, p.live_state});
      }
    } catch (...) {
      a.unclaim();
      arena_ = nullptr;
      current_ = nullptr;
      throw;
    }
    mode_ = mode::replay;
    return;
  }
  if (!candidates_.empty()) misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  mode_ = may_record_ ? mode::record : mode::plain;
}

bool plan_run::switch_to(const planned_request& request, std::uint64_t at) {
  for (plan* c : candidates_) {
    if (c == current_ || c->size() <= at || &c->memory() != arena_ || !(c->request(at) == request)) continue;
    if (!std::equal(c->requests().begin(), c->requests().begin() + static_cast<std::ptrdiff_t>(at),
                    current_->requests().begin()))
      continue;
    // The regions this run holds of the plan it leaves may share bytes with the new plan's.
    const std::uint64_t held = region_state::live_in(generation_);
    std::size_t live = 0;
    for (std::uint64_t p = segment_from_; p < at; ++p)
      live += current_->state(p).state.load(std::memory_order_acquire) == held;
    foreign_.reserve(foreign_.size() + live);
    segments_.reserve(segments_.size() + 1);
    for (std::uint64_t p = segment_from_; p < at; ++p) {
      if (current_->state(p).state.load(std::memory_order_acquire) != held) continue;
      current_->retain();
      foreign_.push_back({current_, static_cast<std::uint32_t>(p), held});
    }
    segments_.push_back({current_, segment_from_, at});
    current_ = c;
    segment_from_ = at;
    overdue_.clear();
    due_processed_ = at;
    return true;
  }
  return false;
}

void plan_run::diverge() {
  misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  replayed_to_ = position_.load(std::memory_order_relaxed);
  mode_ = may_record_ ? mode::record : mode::plain;
}

block* plan_run::fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  return lease != nullptr ? cache_.acquire(*lease, backend, cache_.key_of(backend, bytes), bytes, stream)
                          : cache_.allocate_uncached(backend, bytes, stream);
}

void plan_run::reserve_tracking() {
  std::lock_guard guard(lock_);
  // Geometric: reserving size + 1 reallocated (and copied) every request, quadratic in the run's
  // length (42% of the time of a 7,453-request recording run).
  if (tracked_.size() == tracked_.capacity()) tracked_.reserve(std::max<std::size_t>(64, 2 * tracked_.capacity()));
}

void plan_run::track(block* b, const planned_request& request, std::uint64_t at) noexcept {
  const bool cached = b->origin == block_origin::cached;
  retain();  // released by observe_release
  std::lock_guard guard(lock_);
  b->observer = this;
  b->observer_index = static_cast<std::uint32_t>(tracked_.size());
  tracked_.push_back({request, at, 0, true, cached});  // room was reserved
  if (!cached) ++uncached_live_;
  if (first_backend_ == nullptr) {
    first_backend_ = b->backend;
    first_backend_->retain();
  }
}

void plan_run::advance(std::uint64_t to) noexcept {
  position_.store(to, std::memory_order_relaxed);
  if (arena_ != nullptr) arena_->position.store(to, std::memory_order_relaxed);
}

void plan_run::observe_release(block* b, bool) noexcept {
  {
    std::lock_guard guard(lock_);
    tracked& t = tracked_[b->observer_index];
    if (!finished_) {  // after the end the recording sees it alive to the end, as it was
      t.released_at = position_.load(std::memory_order_relaxed);
      t.live = false;
    }
    if (!t.cached) --uncached_live_;
  }
  release();
}

}  // namespace refpool::detail
