// Idle memory leaving a cache: reclaim, the idle limit and the out-of-memory step of the ladder.
// Idle blocks are taken out of their slots under the cache's mutex (least recently released first),
// then given back to their block source with no lock held (whole blocks to their backend, pieces
// to their heap), and the sources trimmed.
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

// ---- reclaim and limits -------------------------------------------------------------------

void cache_state::free_to_backend(block* b) noexcept {
  counters_.count_left(b->capacity);
  b->source->take_back(b);
}

std::size_t cache_state::free_blocks(const std::vector<block*>& blocks) noexcept {
  std::size_t to_backends = 0;
  for (block* b : blocks) {
    counters_.count_left(b->capacity);
    to_backends += b->source->take_back(b);
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
  {
    std::lock_guard guard(mutex_);
    taken = take_idle_locked(keep, [](const block_key&) { return true; }, counter);
  }
  std::size_t freed = free_blocks(taken.blocks);
  // Free memory the sources keep (free bytes of segments) is idle memory too: it gets what
  // `keep` leaves after idle blocks.
  const std::size_t source_keep = keep > taken.idle_left ? keep - taken.idle_left : 0;
  for (block_source* source : sources()) freed += source->trim(source_keep, nullptr, false);
  return freed;
}

std::size_t cache_state::reclaim_for_retry(backend_state& backend) {
  counters_.oom_retries.fetch_add(1, std::memory_order_relaxed);
  return reclaim_idle(backend);
}

std::size_t cache_state::reclaim_idle(backend_state& backend) {
  taken_blocks taken;
  {
    std::lock_guard guard(mutex_);
    taken = take_idle_locked(0, [&](const block_key& k) { return k.backend == &backend; }, counters_.reclaimed);
  }
  std::size_t freed = free_blocks(taken.blocks);
  // An out-of-memory path: a failed trim only means less memory.
  freed += source_for(backend).trim(0, &backend, true);
  return freed;
}

void cache_state::enforce_idle_limit() noexcept {
  const std::size_t limit = max_idle_bytes();
  {
    std::lock_guard guard(mutex_);
    if (closed_.load(std::memory_order_relaxed) || idle_total_.load(std::memory_order_relaxed) <= limit) return;
  }
  try {
    free_idle(limit, counters_.evictions);
  } catch (const std::exception& e) {
    fmt::print(stderr, "refpool: trimming segments to the idle limit failed: {}\n", e.what());
  }
}

std::size_t cache_state::reclaim(std::size_t keep_bytes) { return free_idle(keep_bytes, counters_.reclaimed); }

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

}  // namespace refpool::detail
