// Plans: placement of a recording, their regions, and what a region's release does.
#include "plan/plan.hpp"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "cache/cache_state.hpp"
#include "plan/key_policy.hpp"

namespace refpool::detail {

std::uint64_t fingerprint_of(const std::vector<planned_request>& requests) noexcept {
  fingerprint f;
  for (const planned_request& r : requests) f.add(r.key.bytes);
  return f.value();
}

plan::plan(cache_state& cache, std::vector<planned_request> requests, const std::vector<lifetime>& lifetimes)
    : cache_(&cache), requests_(std::move(requests)), backend_(hold_backend(requests_)) {
  const std::size_t n = requests_.size();
  if (n >= std::numeric_limits<std::uint32_t>::max())
    throw size_error(fmt::format("refpool: a planned run of {} requests is too long to plan", n));
  std::vector<std::size_t> sizes(n);
  for (std::size_t i = 0; i < n; ++i) sizes[i] = requests_[i].key.bytes;
  std::tie(offsets_, bytes_needed_) = place_greedy_by_size(sizes, lifetimes, region_alignment);
  peak_live_bytes_ = detail::peak_live_bytes(sizes, lifetimes);
  fingerprint_ = fingerprint_of(requests_);
  // Due lists: request j is due at the position of its recorded release (if within the run).
  due_start_.assign(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j)
    if (lifetimes[j].second < n) due_start_[lifetimes[j].second + 1] += 1;
  for (std::size_t p = 0; p < n; ++p) due_start_[p + 1] += due_start_[p];
  due_.resize(due_start_[n]);
  std::vector<std::uint32_t> fill(due_start_.begin(), due_start_.end() - 1);
  for (std::size_t j = 0; j < n; ++j)
    if (lifetimes[j].second < n) due_[fill[lifetimes[j].second]++] = static_cast<std::uint32_t>(j);
  states_ = std::make_unique<region_state[]>(n);
  cache.retain();  // last: a constructor that threw must not keep the cache
}

plan::plan(const plan& other, arena& a)
    : ref_counted<plan>(),
      region_owner(),
      cache_(other.cache_),
      requests_(other.requests_),
      backend_(other.backend_),
      offsets_(other.offsets_),
      due_start_(other.due_start_),
      due_(other.due_),
      bytes_needed_(other.bytes_needed_),
      peak_live_bytes_(other.peak_live_bytes_),
      fingerprint_(other.fingerprint_),
      states_(std::make_unique<region_state[]>(other.requests_.size())) {
  bind(a);
  cache_->retain();
}

plan::~plan() {
  if (arena_ != nullptr) {
    {
      // Entries of this plan in the arena's pinned list are stale (no region of a destroyed plan
      // is live); drop them before anyone reads through them.
      std::lock_guard guard(arena_->pinned_mutex);
      std::erase_if(arena_->pinned, [&](const pinned_region& p) { return p.owner == this; });
      arena_->remove_plan(*this);
    }
    arena_->source().take_back_regions(*this, regions_);
    arena_->release();
  }
  cache_->release();
}

void plan::bind(arena& a) {
  regions_ = a.source().make_regions(*this, a.memory(), requests_, offsets_);
  try {
    a.add_plan(*this);  // its regions point into the arena's span from now on
  } catch (...) {
    a.source().take_back_regions(*this, std::exchange(regions_, nullptr));
    throw;
  }
  a.retain();
  arena_ = &a;
}

void plan::rebase(std::byte* base) noexcept {
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    region_block& r = regions_[i];
    std::byte* at = base == nullptr ? nullptr : base + offsets_[i];
    if (r.ptr == at) continue;
    // The pointer table keeps a region's node under its address until the block goes: a region
    // that moves must leave it first, or its node stays filed under bytes it no longer has (and
    // ~block looks for it in the wrong shard). No region is live, so no hand-over is lost.
    if (r.pointer.load(std::memory_order_acquire) != nullptr) forget_pointer(r);
    r.ptr = at;
  }
}

std::size_t plan::live_region_bytes() const noexcept {
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < requests_.size(); ++i)
    if ((states_[i].state.load(std::memory_order_acquire) & region_state::live) != 0) bytes += regions_[i].capacity;
  return bytes;
}

void plan::put_back_region(block* b, bool via_unsafe_free) noexcept {
  auto& r = static_cast<region_block&>(*b);
  region_state& st = states_[r.region_index];
  if (via_unsafe_free) cache_->add_unsafe_free();  // counted whether or not the plan is still kept
  if (!r.extra_streams.empty()) [[unlikely]] {
    // Used on other streams too (record_stream): the next user of these bytes waits for them.
    // The last handle is gone, so nobody else reads or grows the list now.
    arena_->add_waits(r.extra_streams);
    r.extra_streams.clear();
  }
  st.released_at.store(arena_->position.load(std::memory_order_relaxed), std::memory_order_relaxed);
  const std::uint64_t held = st.state.load(std::memory_order_relaxed);
  const std::uint64_t freed = held & ~(region_state::live | region_state::holds_plan);
  // Only its run's end sets holds_plan, on the run's own thread: there, a plain store suffices.
  if ((held & region_state::holds_plan) == 0 && r.thread != nullptr && r.thread == this_thread_token()) {
    st.state.store(freed, std::memory_order_release);
    return;
  }
  if ((st.state.exchange(freed, std::memory_order_acq_rel) & region_state::holds_plan) != 0) {
    // A pinned region (it outlived its run): the arena's span stays held until the last goes.
    arena_->idle_if_unpinned();
    release();
  }
}

}  // namespace refpool::detail
