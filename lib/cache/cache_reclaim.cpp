// Idle memory leaving a cache: reclaim, the idle limit and the out-of-memory step of the ladder.
// Idle blocks are taken out of their slots under the cache's mutex (least recently released first),
// then freed with no lock held: plain blocks to their backend, pieces to their heap, then trimmed.
#include "cache/cache_state.hpp"

#include <algorithm>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

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
  oom_retries_.fetch_add(1, std::memory_order_relaxed);
  return reclaim_idle(backend);
}

std::size_t cache_state::reclaim_idle(backend_state& backend) {
  taken_blocks taken;
  std::vector<heap_use> heaps;
  {
    std::lock_guard guard(mutex_);
    heaps = use_heaps_locked(&backend);
    taken = take_idle_locked(0, [&](const block_key& k) { return k.backend == &backend; }, reclaimed_);
  }
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

}  // namespace refpool::detail
