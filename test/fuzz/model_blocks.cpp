// The reference model's rules for blocks: which idle block a request gets (own slot, oldest, same
// stream first; then another slot's), cache-level requests and steps, where a released block goes,
// and what reclaim, eviction and out-of-memory free. Each function says which documented rule it
// follows; none of it is copied from lib/.
#include <algorithm>

#include <fmt/format.h>

#include "model.hpp"

namespace refpool::test::fuzz {

// ---- handing out --------------------------------------------------------------------------

// Among idle blocks of one key: the oldest last used on the requesting stream, else the oldest.
std::uint64_t model::take(model_slot& s, std::pair<int, std::size_t> key, void* stream) {
  auto it = s.idle.find(key);
  if (it == s.idle.end() || it->second.empty()) return 0;
  std::vector<std::uint64_t>& v = it->second;
  for (std::size_t i = v.size(); i-- > 0;) {
    if (blocks.at(v[i]).last_stream == stream) {
      const std::uint64_t gid = v[i];
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      return gid;
    }
  }
  const std::uint64_t gid = v.back();
  v.pop_back();
  return gid;
}

void model::mark_live(model_slot& s, model_block& b, bool hit) {
  (hit ? s.hits : s.misses) += 1;
  s.live_blocks += 1;
  s.live_bytes += b.capacity;
  s.live_in_epoch += 1;
  b.epoch = s.epoch;
  b.idle = false;
}

void model::add_idle(model_cache& c, model_slot& s, model_block& b) {
  b.idle = true;
  b.idle_since = c.clock;
  b.idle_seq = ++s.releases;
  std::vector<std::uint64_t>& v = s.idle[{b.backend, b.capacity}];
  const auto pos = std::upper_bound(v.begin(), v.end(), b.id,
                                    [&](std::uint64_t id, std::uint64_t g) { return id > blocks.at(g).id; });
  v.insert(pos, b.gid);
  s.idle_blocks += 1;
  s.idle_bytes += b.capacity;
}

void model::remove_idle(model_slot& s, model_block& b) {
  b.idle = false;
  s.idle_blocks -= 1;
  s.idle_bytes -= b.capacity;
}

std::size_t model::idle_total(const model_cache& c) const {
  std::size_t sum = 0;
  for (const model_slot& s : c.slots)
    if (!s.erased) sum += s.idle_bytes;
  return sum;
}

// A block reused on another stream waits for its last stream and any recorded streams.
void model::wait_for_streams(model_block& b, void* stream) {
  auto expect_order = [&](void* producer) {
    expect_order_streams(b.backend, producer, stream, fmt::format("for block {}", b.gid));
  };
  expect_order(b.last_stream);
  for (void* s : b.extra_streams)
    if (s != stream) expect_order(s);
  b.extra_streams.clear();
}

model_block& model::add_held_block(block_kind kind, void* ptr, std::size_t capacity, std::size_t requested, int backend,
                                   void* stream) {
  model_block b;
  b.gid = next_gid++;
  b.kind = kind;
  b.ptr = ptr;
  b.capacity = capacity;
  b.requested = requested;
  b.backend = backend;
  b.last_stream = stream;
  b.refs = 1;
  return blocks.emplace(b.gid, std::move(b)).first->second;
}

outcome model::allocate(int thread, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                        std::size_t& oom_bytes) {
  const model_frame* f = frames[thread].empty() ? nullptr : &frames[thread].back();
  if (f == nullptr || f->lease < 0) return allocate_direct(backend, bytes, stream, gid, oom_bytes);  // no active cache
  if (f->run >= 0) return run_acquire(f->run, f->lease, backend, bytes, stream, gid, oom_bytes);
  return slot_acquire(f->cache, f->lease, backend, bytes, stream, gid, oom_bytes);
}

outcome model::allocate_direct(int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                               std::size_t& oom_bytes) {
  void* ptr = nullptr;
  const backend_result r = backend_allocate(backend, bytes, ptr);
  if (r == backend_result::error) return outcome::backend_error;
  if (r == backend_result::out_of_memory) {
    oom_bytes = bytes;
    return outcome::out_of_memory;
  }
  gid = add_held_block(block_kind::direct, ptr, bytes, bytes, backend, stream).gid;
  return outcome::ok;
}

// The out-of-memory ladder: this cache's idle blocks of the backend are freed and the request
// retried once. Counted as a retry, and as an out-of-memory when the retry fails too.
model::backend_result model::allocate_or_reclaim(int ci, int backend, std::size_t bytes, void*& ptr, bool count_oom) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  backend_result r = backend_allocate(backend, bytes, ptr);
  if (r != backend_result::out_of_memory) return r;
  reclaim_for_retry(ci, backend);
  r = backend_allocate(backend, bytes, ptr);
  if (r == backend_result::out_of_memory && count_oom) c.ooms += 1;
  return r;
}

outcome model::slot_acquire(int ci, int si, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                            std::size_t& oom_bytes) {
  void* ptr = nullptr;
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  std::size_t rounded = 0;
  if (!c.rounding.round(bytes, rounded)) return outcome::size_error;
  if (c.slots[static_cast<std::size_t>(si)].ambient && c.slots[static_cast<std::size_t>(si)].epoch != c.step_epoch)
    roll_epoch(c.slots[static_cast<std::size_t>(si)], c.step_epoch);  // a step began or ended since its last request
  const std::pair<int, std::size_t> key{backend, rounded};
  bool other_stream = false;
  std::uint64_t g = take(c.slots[static_cast<std::size_t>(si)], key, stream);
  if (g != 0) {
    model_block& b = blocks.at(g);
    remove_idle(c.slots[static_cast<std::size_t>(si)], b);
    mark_live(c.slots[static_cast<std::size_t>(si)], b, true);
    other_stream = b.last_stream != stream || !b.extra_streams.empty();
    if (other_stream) c.slots[static_cast<std::size_t>(si)].cross_stream += 1;
  } else {
    // Local miss: an idle block of the same key from another slot, in slot creation order.
    for (std::size_t v = 0; v < c.slots.size() && g == 0; ++v) {
      if (static_cast<int>(v) == si || c.slots[v].erased) continue;
      g = take(c.slots[v], key, stream);
      if (g == 0) continue;
      model_block& b = blocks.at(g);
      remove_idle(c.slots[v], b);
      b.slot = si;
      other_stream = b.last_stream != stream || !b.extra_streams.empty();
      model_slot& thief = c.slots[static_cast<std::size_t>(si)];
      mark_live(thief, b, true);
      thief.steals += 1;
      if (other_stream) thief.cross_stream += 1;
    }
  }
  if (g == 0) {
    const backend_result r = allocate_or_reclaim(ci, backend, rounded, ptr, true);
    if (r == backend_result::error) return outcome::backend_error;
    if (r == backend_result::out_of_memory) {
      oom_bytes = rounded;
      return outcome::out_of_memory;
    }
    model_block& placed = add_held_block(block_kind::cached, ptr, rounded, bytes, backend, stream);
    placed.cache = ci;
    placed.slot = si;
    placed.id = c.next_id++;
    g = placed.gid;
    c.backend_allocations += 1;
    c.held += rounded;
    c.peak = std::max(c.peak, c.held);
    mark_live(c.slots[static_cast<std::size_t>(si)], placed, false);
  } else if (other_stream) {
    wait_for_streams(blocks.at(g), stream);
  }
  model_block& b = blocks.at(g);
  b.last_stream = stream;
  b.requested = bytes;
  b.refs = 1;
  gid = g;
  return outcome::ok;
}

outcome model::uncached_acquire(int ci, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                                std::size_t& oom_bytes) {
  void* ptr = nullptr;
  const backend_result r = allocate_or_reclaim(ci, backend, bytes, ptr, true);
  if (r == backend_result::error) return outcome::backend_error;
  if (r == backend_result::out_of_memory) {
    oom_bytes = bytes;
    return outcome::out_of_memory;
  }
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  model_block& b = add_held_block(block_kind::uncached, ptr, bytes, bytes, backend, stream);
  b.uncached_for = ci;
  gid = b.gid;
  c.uncached_allocations += 1;
  c.uncached_live += bytes;
  return outcome::ok;
}

// ---- cache-level requests and steps ---------------------------------------------------------

// A thread's slot for cache-level requests: leased at its first one, kept while the thread runs.
int model::ambient_slot(model_cache& c, int thread) {
  if (c.ambient[thread] >= 0) return c.ambient[thread];
  c.slots.emplace_back();
  model_slot& s = c.slots.back();
  s.ambient = true;
  s.leased = true;
  s.last_thread = thread;
  s.epoch = c.step_epoch;
  c.ambient[thread] = static_cast<int>(c.slots.size()) - 1;
  return c.ambient[thread];
}

// Buffers a slot handed out in a step and still live when it ended have escaped.
void model::roll_epoch(model_slot& s, std::uint64_t epoch) {
  if (s.epoch % 2 == 1) s.escapes += s.live_in_epoch;
  s.live_in_epoch = 0;
  s.epoch = epoch;
}

outcome model::cache_allocate(int thread, int ci, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                              std::size_t& oom_bytes) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  const int si = ambient_slot(c, thread);
  if (c.step_open && c.step_run >= 0) return run_acquire(c.step_run, si, backend, bytes, stream, gid, oom_bytes);
  if (c.step_open && c.step_uncached) return uncached_acquire(ci, backend, bytes, stream, gid, oom_bytes);
  return slot_acquire(ci, si, backend, bytes, stream, gid, oom_bytes);
}

outcome model::open_step(int ci, std::size_t warmup, const std::string& key) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  if (c.step_open) return outcome::scope_error;  // steps of one cache do not nest
  const bool warm = c.steps < warmup;
  c.steps += 1;
  c.step_epoch += 1;
  c.step_open = true;
  c.step_uncached = warm;
  static const std::string automatic("\0step", 5);  // the cache's own key (auto_plans)
  const std::string& planned = key.empty() && c.auto_plans ? automatic : key;
  if (!warm && !planned.empty()) c.step_run = begin_run(ci, planned, true);
  return outcome::ok;
}

void model::end_step(int ci) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  c.step_epoch += 1;
  c.step_open = false;
  c.step_uncached = false;
  for (model_slot& s : c.slots)
    if (!s.erased && s.ambient && s.epoch != c.step_epoch) roll_epoch(s, c.step_epoch);
  const int run = std::exchange(c.step_run, -1);
  if (run >= 0) finish_run(run);
}

void model::add_ref(std::uint64_t gid) { blocks.at(gid).refs += 1; }

void model::record_stream(std::uint64_t gid, void* stream) {
  model_block& b = blocks.at(gid);
  if (stream != b.last_stream &&
      std::find(b.extra_streams.begin(), b.extra_streams.end(), stream) == b.extra_streams.end())
    b.extra_streams.push_back(stream);
}

// ---- giving back --------------------------------------------------------------------------

void model::free_block(model_cache& c, std::uint64_t gid) {
  const model_block& b = blocks.at(gid);
  c.held -= b.capacity;
  c.backend_frees += 1;
  backend_free(b);
  blocks.erase(gid);
}

// The last handle went: idle in its home slot (then the idle limit), or freed when uncached or
// when its cache is gone.
void model::drop_ref(std::uint64_t gid, bool via_unsafe_free) {
  model_block& b = blocks.at(gid);
  if (b.refs <= 0) fail(fmt::format("model: block {} released with no references", gid));
  if (--b.refs > 0) return;
  if (b.run >= 0) {  // a planned run learns the lifetime first, once: a cached block is handed out again
    observe_release(b);
    b.run = -1;
  }
  switch (b.kind) {
    case block_kind::region: put_back_region(b, via_unsafe_free); return;
    case block_kind::direct:
      backend_free(b);
      blocks.erase(gid);
      return;
    case block_kind::uncached: {
      model_cache& owner = caches[static_cast<std::size_t>(b.uncached_for)];
      owner.uncached_live -= b.capacity;
      if (via_unsafe_free) owner.extra_unsafe_frees += 1;
      backend_free(b);
      blocks.erase(gid);
      return;
    }
    case block_kind::cached: break;
  }
  const int ci = b.cache;
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  model_slot& s = c.slots[static_cast<std::size_t>(b.slot)];
  s.live_blocks -= 1;
  s.live_bytes -= b.capacity;
  if (b.epoch == s.epoch && s.leased) s.live_in_epoch -= 1;
  if (via_unsafe_free) s.unsafe_frees += 1;
  if (s.orphaned) {
    const bool remove = s.live_blocks == 0 && !s.leased;
    free_block(c, gid);
    if (remove) s.erased = true;
    return;
  }
  add_idle(c, s, b);
  if (c.max_idle != unlimited && idle_total(c) > c.max_idle) enforce_limit(ci);
}

std::size_t model::free_idle(int ci, std::size_t keep, int backend, std::uint64_t& counter) {
  std::size_t idle_left = 0;
  std::size_t freed = free_idle_blocks(ci, keep, backend, counter, idle_left);
  if (backend >= 0) return freed;  // an out-of-memory path or a plan's: the plain blocks' source only
  // Free memory the sources keep is idle memory too: the heaps of spans get what `keep` leaves
  // after the idle blocks, in the order they were made.
  std::size_t allowance = keep > idle_left ? keep - idle_left : 0;
  for (std::size_t h = 0; h < span_heaps.size(); ++h) {
    if (span_heaps[h].cache != ci) continue;
    const std::size_t before = span_heap_bytes(ci, span_heaps[h].backend);
    const std::size_t free_after = trim_span_heap(ci, span_heaps[h].backend, allowance);
    freed += before - span_heap_bytes(ci, span_heaps[h].backend);
    allowance -= std::min(allowance, free_after);
  }
  return freed;
}

std::size_t model::free_idle_blocks(int ci, std::size_t keep, int backend, std::uint64_t& counter,
                                    std::size_t& idle_left) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  struct candidate {
    std::uint64_t since, seq, gid;
    std::size_t slot;
  };
  std::vector<candidate> candidates;
  std::size_t matching = 0;
  for (std::size_t si = 0; si < c.slots.size(); ++si) {
    if (c.slots[si].erased) continue;
    for (const auto& [key, ids] : c.slots[si].idle) {
      if (backend >= 0 && key.first != backend) continue;
      for (std::uint64_t gid : ids) {
        const model_block& b = blocks.at(gid);
        candidates.push_back({b.idle_since, b.idle_seq, gid, si});
        matching += b.capacity;
      }
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const candidate& x, const candidate& y) {
    return x.since != y.since ? x.since < y.since : x.seq < y.seq;
  });
  std::size_t freed = 0;
  for (std::size_t i = 0; i < candidates.size();) {
    std::size_t j = i;
    while (j < candidates.size() && candidates[j].since == candidates[i].since &&
           candidates[j].seq == candidates[i].seq)
      ++j;
    // Blocks released at the same moment in different slots: the cache may free them in any
    // order, so the log says which came first.
    std::vector<candidate> group(candidates.begin() + static_cast<std::ptrdiff_t>(i),
                                 candidates.begin() + static_cast<std::ptrdiff_t>(j));
    while (!group.empty()) {
      if (matching - freed <= keep) {
        idle_left = matching - freed;
        return freed;
      }
      std::size_t pick = 0;
      if (group.size() > 1) {
        settle_arenas(false);
        const backend_event* e = pending_free();
        pick = group.size();
        for (std::size_t k = 0; e != nullptr && k < group.size(); ++k)
          if (e->what == backend_event::kind::deallocate && e->ptr == blocks.at(group[k].gid).ptr) pick = k;
        if (pick == group.size())
          fail(fmt::format(
              "reclaim/eviction: expected one of {} equally old idle blocks to be freed next, refpool made {}",
              group.size(), e != nullptr ? describe(*e) : std::string("no call")));
      }
      const candidate chosen = group[pick];
      group.erase(group.begin() + static_cast<std::ptrdiff_t>(pick));
      model_block& b = blocks.at(chosen.gid);
      model_slot& s = c.slots[chosen.slot];
      std::vector<std::uint64_t>& ids = s.idle[{b.backend, b.capacity}];
      ids.erase(std::find(ids.begin(), ids.end(), chosen.gid));
      remove_idle(s, b);
      freed += b.capacity;
      counter += 1;
      free_block(c, chosen.gid);
    }
    i = j;
  }
  idle_left = matching - freed;
  return freed;
}

void model::enforce_limit(int ci) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  if (c.closed || idle_total(c) <= c.max_idle) return;
  free_idle(ci, c.max_idle, -1, c.evictions);
}

std::size_t model::reclaim(int ci, std::size_t keep) {
  return free_idle(ci, keep, -1, caches[static_cast<std::size_t>(ci)].reclaimed);
}

void model::set_max_idle(int ci, std::size_t bytes) {
  caches[static_cast<std::size_t>(ci)].max_idle = bytes;
  if (bytes != unlimited) enforce_limit(ci);
}

}  // namespace refpool::test::fuzz
