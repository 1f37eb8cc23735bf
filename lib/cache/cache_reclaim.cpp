// Idle memory leaving a cache: reclaim, the idle limit and the out-of-memory step of the ladder.
// Which idle blocks leave is the reclaim policy's choice (reclaim_policy.hpp); they are taken out of their slots under
// the cache's mutex (least recently released first); pieces go back to their heap before it is left (a memory map
// reads the slots and the heaps under it: a piece in neither would show as live), whole blocks to their backend with
// no lock held; then the sources are trimmed.
#include "cache/cache_state.hpp"

#include "cache/piece_block.hpp"
#include "cache/reclaim_policy.hpp"

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
  free_deferred_blocks();  // those a graph capture kept back at an earlier reclaim
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
  lru_reclaim policy;
  taken_blocks taken;
  intrude_all();
  try {
    for (const auto& s : slots_.all) {
      s->buckets.for_each([&](const bucket& bk) {
        if (!filter(bk.key)) return;
        for (block* b : bk.idle) policy.offer(b, s.get());
      });
    }
    taken.blocks.reserve(policy.offered());
  } catch (...) {
    leave_all();  // out of host memory for the list: free nothing this time
    taken.idle_left = policy.offered_bytes();
    return taken;
  }
  taken.bytes = policy.choose(keep, [&](block* b, slot* s) {
    bucket& home = *b->home;
    home.remove(b);
    remove_idle(*s, b);
    s->erase_if_unused(home);
    s->refs.fetch_sub(1, std::memory_order_relaxed);  // it leaves; never the last: the cache is open
    taken.blocks.push_back(b);                        // reserved: never throws
  });
  leave_all();
  taken.idle_left = policy.offered_bytes() - taken.bytes;
  counter.fetch_add(taken.blocks.size(), std::memory_order_relaxed);
  return_taken_pieces_locked(taken.blocks);  // after the slots: a heap's lock is never taken under a slot's
  return taken;
}

void cache_state::return_taken_pieces_locked(std::vector<block*>& blocks) noexcept {
  const auto pieces =
      std::partition(blocks.begin(), blocks.end(), [&](const block* b) { return b->source != &segment_pieces_; });
  // One heap at a time (a heap per backend): each heap's lock taken once.
  std::sort(pieces, blocks.end(), [](const block* a, const block* b) {
    return std::less<const cache_heap*>()(as_piece(a)->heap, as_piece(b)->heap);
  });
  for (auto run = pieces; run != blocks.end();) {
    cache_heap& h = *as_piece(*run)->heap;
    const auto end = std::find_if(run, blocks.end(), [&](const block* b) { return as_piece(b)->heap != &h; });
    return_pieces(h, std::span<block* const>(&*run, static_cast<std::size_t>(end - run)));
    run = end;
  }
  blocks.erase(pieces, blocks.end());
}

std::size_t cache_state::free_idle(std::size_t keep, std::atomic<std::uint64_t>& counter) {
  taken_blocks taken;
  {
    std::lock_guard guard(mutex_);
    taken = take_idle_locked(
        keep, [](const block_key&) { return true; }, counter);
  }
  std::size_t freed = free_blocks(taken.blocks);
  // Free memory the sources keep (free bytes of segments) is idle memory too: it gets what
  // `keep` leaves after idle blocks.
  const std::size_t source_keep = lru_reclaim::source_keep(keep, taken.idle_left);
  for (block_source* source : sources()) freed += source->trim(source_keep, nullptr, false);
  return freed;
}

std::size_t cache_state::reclaim_for_retry(backend_state& backend) {
  counters_.oom_retries.fetch_add(1, std::memory_order_relaxed);
  // Idle spans (plan arenas no run holds) yield first: their bytes become free ranges, which the
  // trim below gives back with the rest (they are committed again when their arena is held).
  segment_pieces_.yield_idle_spans(backend);
  std::size_t freed = reclaim_idle(backend);
  // A backend whose blocks are whole may have a heap of spans alone: reclaim_idle trimmed the
  // whole-block source, not it.
  if (&source_for(backend) != &segment_pieces_) freed += segment_pieces_.trim(0, &backend, true);
  return freed;
}

std::size_t cache_state::reclaim_idle(backend_state& backend) {
  std::size_t freed = return_idle(backend);
  // An out-of-memory path: a failed trim only means less memory.
  freed += source_for(backend).trim(0, &backend, true);
  return freed;
}

std::size_t cache_state::return_idle(backend_state& backend) noexcept {
  taken_blocks taken;
  try {
    std::lock_guard guard(mutex_);
    taken = take_idle_locked(
        0, [&](const block_key& k) { return k.backend == &backend; }, counters_.reclaimed);
  } catch (...) {
    return 0;  // no host memory for the list: the blocks stay idle
  }
  return free_blocks(taken.blocks);
}

void cache_state::enforce_idle_limit() noexcept {
  const std::size_t limit = max_idle_bytes();
  {
    std::lock_guard guard(mutex_);
    if (closed_.load(std::memory_order_relaxed) || idle_limit_.total() <= limit) return;
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
    for (const auto& s : slots_.all)
      s->buckets.for_each([&](const bucket& bk) { idle += bk.idle.size() * bk.key.bytes; });
    idle_limit_.set(bytes, idle);
    leave_all();
  }
  if (bytes != cache_options::unlimited) enforce_idle_limit();
}

}  // namespace refpool::detail
