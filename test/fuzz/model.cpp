// The reference model's rules: outcomes, rounding, backend calls, caches and scopes, stats (blocks
// handed out and given back: model_blocks.cpp; plans: model_plans.cpp). Each function says which
// documented rule it follows; none of it is copied from lib/.
#include "model.hpp"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

namespace refpool::test::fuzz {

const char* to_string(outcome o) noexcept {
  switch (o) {
    case outcome::ok: return "ok";
    case outcome::size_error: return "size_error";
    case outcome::shape_error: return "shape_error";
    case outcome::use_after_free: return "use_after_free";
    case outcome::out_of_memory: return "out_of_memory";
    case outcome::backend_error: return "backend_error";
    case outcome::scope_error: return "scope_error";
    case outcome::config_error: return "config_error";
    case outcome::invalid_argument: return "invalid_argument";
    case outcome::error: return "refpool::error";
    case outcome::other: return "another exception";
  }
  return "?";
}

std::string describe(const backend_event& e) {
  switch (e.what) {
    case backend_event::kind::allocate:
      return fmt::format("allocate({} B) on backend {} -> {}{}", e.bytes, e.backend, e.ptr, e.threw ? " (threw)" : "");
    case backend_event::kind::deallocate:
      return fmt::format("deallocate({}, {} B) on backend {}", e.ptr, e.bytes, e.backend);
    case backend_event::kind::order_streams:
      return fmt::format("order_streams({} -> {}) on backend {}", e.producer, e.consumer, e.backend);
  }
  return "?";
}

namespace {

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

// rounding.hpp: exact; step: up to a multiple; pow2:d: [2^k, 2^(k+1)) in d steps.
bool model_rounding::round(std::size_t bytes, std::size_t& out) const noexcept {
  std::size_t step = 1;
  switch (how) {
    case mode::exact: out = bytes; return true;
    case mode::step: step = parameter; break;
    case mode::pow2: {
      const std::size_t floor = std::bit_floor(bytes);
      if (floor == bytes) {
        out = bytes;
        return true;
      }
      step = std::max<std::size_t>(floor / parameter, 1);
      break;
    }
  }
  const std::size_t rest = bytes % step;
  if (rest == 0) {
    out = bytes;
    return true;
  }
  return !__builtin_add_overflow(bytes, step - rest, &out);
}

// ---- backend calls ------------------------------------------------------------------------

const backend_event& model::next_event(const char* expected) {
  settle_arenas(false);  // an arena that may go now may be freed before the call expected
  const backend_event* e = log_.next();
  if (e == nullptr) fail(fmt::format("model expected a backend call ({}), but refpool made none", expected));
  return *e;
}

void model::expect_order_streams(int backend, void* producer, void* consumer, const std::string& before) {
  const backend_event& e = next_event("order_streams");
  if (e.what != backend_event::kind::order_streams || e.backend != backend || e.producer != producer ||
      e.consumer != consumer)
    fail(fmt::format("model expected order_streams({} -> {}) {}, refpool made {}", producer, consumer, before,
                     describe(e)));
}

void model::expect_no_more_events(const char* where) {
  settle_arenas(true);
  if (const backend_event* e = log_.peek_pending(0))
    fail(fmt::format("{}: refpool made a backend call the model did not expect: {} ({} unexpected calls)", where,
                     describe(*e), log_.pending()));
}

// failing_resource: calls first..first+count-1 since arm() fail; limiting_resource: nullptr past
// its capacity; the host resource otherwise succeeds.
model::backend_result model::backend_allocate(int backend, std::size_t bytes, void*& ptr) {
  // An arena freed before this call (its last holder went, a cache closed) gave its bytes back
  // first: the limit below reads what is outstanding after it.
  settle_arenas(false);
  model_backend& m = be[backend];
  m.calls += 1;
  backend_result expect = backend_result::ok;
  if (m.calls >= m.first && m.calls < m.first + m.count) {
    m.injected += 1;
    expect = m.inject_backend_error ? backend_result::error : backend_result::out_of_memory;
  } else if (bytes > m.capacity || m.outstanding > m.capacity - bytes) {
    m.limit_failures += 1;
    expect = backend_result::out_of_memory;
  }
  const backend_event& e = next_event("allocate");
  if (e.what != backend_event::kind::allocate || e.backend != backend || e.bytes != bytes)
    fail(fmt::format("model expected allocate({} B) on backend {}, refpool made {}", bytes, backend, describe(e)));
  switch (expect) {
    case backend_result::error:
      if (!e.threw) fail(fmt::format("injected backend_error did not happen: {}", describe(e)));
      return expect;
    case backend_result::out_of_memory:
      if (e.threw || e.ptr != nullptr) fail(fmt::format("expected out of memory, got {}", describe(e)));
      return expect;
    case backend_result::ok:
      if (e.threw || e.ptr == nullptr) fail(fmt::format("expected a successful allocation, got {}", describe(e)));
      break;
  }
  if (reinterpret_cast<std::uintptr_t>(e.ptr) % 256 != 0) fail(fmt::format("misaligned block {}", e.ptr));
  for (const auto& [gid, b] : blocks)
    if (b.kind != block_kind::region && overlaps(e.ptr, bytes, b.ptr, b.capacity))
      fail(fmt::format("the backend returned {} ({} B), overlapping block {} at {} ({} B) that is still allocated",
                       e.ptr, bytes, gid, b.ptr, b.capacity));
  for (const model_span_heap& h : span_heaps)
    for (const model_heap_segment& seg : h.segments)
      if (h.backend == backend && overlaps(e.ptr, bytes, seg.base, seg.bytes))
        fail(fmt::format("the backend returned {} ({} B), overlapping a segment of arenas at {} ({} B) still allocated",
                         e.ptr, bytes, seg.base, seg.bytes));
  m.outstanding += bytes;
  ptr = e.ptr;
  return expect;
}

const backend_event* model::pending_free() const {
  for (std::size_t i = 0;; ++i) {
    const backend_event* e = log_.peek_pending(i);
    if (e == nullptr || e->what != backend_event::kind::order_streams) return e;
  }
}

void model::backend_free(const model_block& b) {
  // Streams recorded on the block are ordered before its free on its last stream.
  for (void* s : b.extra_streams)
    if (s != b.last_stream)
      expect_order_streams(b.backend, s, b.last_stream, fmt::format("before freeing block {}", b.gid));
  const backend_event& e = next_event("deallocate");
  if (e.what != backend_event::kind::deallocate || e.backend != b.backend || e.ptr != b.ptr || e.bytes != b.capacity)
    fail(fmt::format("model expected deallocate({}, {} B) on backend {} (block {}), refpool made {}", b.ptr, b.capacity,
                     b.backend, b.gid, describe(e)));
  be[b.backend].outstanding -= b.capacity;
}

std::size_t model::allocated_bytes(int backend) const {
  std::size_t sum = arena_bytes(backend);
  for (const auto& [gid, b] : blocks)
    if (b.backend == backend && b.kind != block_kind::region) sum += b.capacity;
  return sum;
}

std::size_t model::arena_bytes(int backend) const { return span_heap_bytes(-1, backend); }

// ---- caches and scopes --------------------------------------------------------------------

int model::new_cache(model_rounding rounding, std::size_t max_idle, bool auto_plans) {
  model_cache c;
  c.rounding = rounding;
  c.max_idle = max_idle;
  c.auto_plans = auto_plans;
  caches.push_back(std::move(c));
  return static_cast<int>(caches.size()) - 1;
}

// A scope gets back the slot its thread used last when free, else any free slot, else a new one.
int model::lease(model_cache& c, int thread) {
  if (c.closed) return -1;
  int s = -1;
  for (std::size_t i = c.free_slots.size(); i-- > 0;) {
    if (c.slots[static_cast<std::size_t>(c.free_slots[i])].last_thread == thread) {
      s = c.free_slots[i];
      c.free_slots.erase(c.free_slots.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  if (s < 0 && !c.free_slots.empty()) {
    s = c.free_slots.back();
    c.free_slots.pop_back();
  }
  if (s < 0) {
    c.slots.emplace_back();
    s = static_cast<int>(c.slots.size()) - 1;
  }
  model_slot& slot = c.slots[static_cast<std::size_t>(s)];
  slot.leased = true;
  slot.last_thread = thread;
  return s;
}

// Escapes: blocks handed out by this lease and still referenced when it ends.
void model::end_lease(model_cache& c, int s) {
  model_slot& slot = c.slots[static_cast<std::size_t>(s)];
  slot.escapes += slot.live_in_epoch;
  slot.live_in_epoch = 0;
  slot.epoch += 1;
  slot.leased = false;
  if (slot.orphaned) {
    if (slot.live_blocks == 0) slot.erased = true;
  } else {
    c.free_slots.push_back(s);
  }
  c.clock += 1;
}

void model::enter_scope(int thread, int c, std::size_t warmup, const std::string& key) {
  model_frame f;
  f.cache = c;
  bool nested = false;
  for (auto it = frames[thread].rbegin(); it != frames[thread].rend(); ++it) {
    if (!it->guard && it->cache == c) {  // nesting on a cache in use here shares its state (and run)
      f.lease = it->lease;
      f.run = it->run;
      nested = true;
      break;
    }
  }
  if (!nested) {
    model_cache& cache = caches[static_cast<std::size_t>(c)];
    const bool warm = cache.scope_entries < warmup;
    cache.scope_entries += 1;
    if (warm) {
      cache.uncached_entries += 1;
    } else {
      f.lease = lease(cache, thread);
      f.owns = f.lease >= 0;
    }
    if (f.lease >= 0 && !key.empty()) {  // a planned scope on a cache that serves it
      f.run = begin_run(c, key, false);
      f.owns_run = true;
    }
  }
  frames[thread].push_back(f);
}

void model::enter_guard(int thread) {
  model_frame f;
  f.guard = true;
  frames[thread].push_back(f);
}

outcome model::close_frame(int closer, int owner, std::size_t index) {
  if (closer != owner || index + 1 != frames[owner].size()) return outcome::scope_error;
  const model_frame f = frames[owner].back();
  frames[owner].pop_back();
  if (f.owns_run) finish_run(f.run);  // the run ends before its scope gives its slot back
  if (!f.guard && f.owns) end_lease(caches[static_cast<std::size_t>(f.cache)], f.lease);
  return outcome::ok;
}

// Destroying a cache frees its idle blocks; slots still leased or holding live blocks live on.
void model::close_cache(int ci) {
  model_cache& c = caches[static_cast<std::size_t>(ci)];
  c.closed = true;
  close_plans(ci);  // the store lets its plans go first; arenas go with their last region
  c.free_slots.clear();
  std::vector<std::uint64_t> idle;
  for (model_slot& s : c.slots) {
    if (s.erased) continue;
    for (auto& [key, ids] : s.idle) idle.insert(idle.end(), ids.begin(), ids.end());
    s.idle.clear();
    s.idle_blocks = 0;
    s.idle_bytes = 0;
    if (s.leased || s.live_blocks != 0) s.orphaned = true;
  }
  for (std::size_t n = idle.size(); n > 0; --n) {  // in an order the model does not fix
    settle_arenas(false);
    const backend_event* e = pending_free();
    auto it = std::find_if(idle.begin(), idle.end(), [&](std::uint64_t g) {
      return e != nullptr && e->what == backend_event::kind::deallocate && e->ptr == blocks.at(g).ptr;
    });
    if (it == idle.end())
      fail(fmt::format("destroying a cache: expected one of its {} idle blocks to be freed, refpool made {}", n,
                       e != nullptr ? describe(*e) : std::string("no call")));
    const std::uint64_t gid = *it;
    idle.erase(it);
    free_block(c, gid);
  }
  for (model_slot& s : c.slots)
    if (!s.orphaned) s.erased = true;
  // The arenas its closed store let go went with the cache's state, and their heaps' free segments
  // with them. The loop above follows those frees only while idle blocks are left: with none (or
  // after the last), the next call the model expects (another cache's close) would meet them first.
  settle_arenas(false);
  // Its heaps of spans give their free segments back (the rest goes with the last span).
  for (int b = 0; b < backends; ++b) trim_span_heap(ci, b, 0);
}

refpool::cache_stats model::stats(int ci) const {
  const model_cache& c = caches[static_cast<std::size_t>(ci)];
  refpool::cache_stats out;
  for (const model_slot& s : c.slots) {
    if (s.erased) continue;
    out.hits += s.hits;
    out.misses += s.misses;
    out.steals += s.steals;
    out.unsafe_frees += s.unsafe_frees;
    out.escapes += s.escapes;
    out.cross_stream_reuses += s.cross_stream;
    out.live_blocks += s.live_blocks;
    out.idle_blocks += s.idle_blocks;
    out.live_bytes += s.live_bytes;
    out.idle_bytes += s.idle_bytes;
  }
  out.backend_allocations = c.backend_allocations;
  out.backend_frees = c.backend_frees;
  out.evictions = c.evictions;
  out.reclaimed_blocks = c.reclaimed;
  out.oom_retries = c.oom_retries;
  out.scope_entries = c.scope_entries;
  out.uncached_entries = c.uncached_entries;
  out.held_bytes = c.held;
  out.peak_held_bytes = c.peak;
  out.unsafe_frees += c.extra_unsafe_frees;
  out.escapes += c.extra_escapes;
  out.ooms = c.ooms;
  out.steps = c.steps;
  out.uncached_allocations = c.uncached_allocations;
  out.uncached_live_bytes = c.uncached_live;
  const model_plan_store& store = c.plans;
  out.plan_hits = store.hits;
  out.plan_misses = store.misses;
  for (int i : active_runs) {
    const model_run& r = runs[static_cast<std::size_t>(i)];
    if (r.cache != ci) continue;
    out.plan_hits += r.hits;
    out.plan_misses += r.misses;
  }
  out.plan_recordings = store.recordings;
  for (const model_key& k : store.keys) {
    std::size_t peak = 0;
    for (int p : k.plans) peak = std::max(peak, plans[static_cast<std::size_t>(p)].peak);
    out.plans += k.plans.size();
    out.planned_peak_live_bytes += peak;
  }
  // Every arena's placed span (held or idle): one replaced but still pinned by a live region too.
  for (const model_arena& a : arenas)
    if (a.cache == ci && a.memory) out.arena_bytes += a.bytes;
  // Regions held by handles, of every plan: kept, or dropped or moved while a region is live.
  for (const model_plan& plan : plans)
    if (plan.cache == ci)
      for (std::size_t i = 0; i < plan.regions.size(); ++i)
        if (plan.regions[i].live) out.plan_live_bytes += plan.spans[i];
  out.allocated_bytes = out.live_bytes + out.plan_live_bytes + out.uncached_live_bytes;
  // Arenas' heaps of spans count whole: free segments (yielded spans not trimmed yet) too.
  out.reserved_bytes = out.held_bytes + span_heap_bytes(ci, -1) + out.uncached_live_bytes;
  out.plan_evictions = store.evictions;
  out.plan_pauses = store.pauses;
  out.plan_unrecorded_runs = store.unrecorded;
  out.plan_busy_runs = store.busy;
  out.plan_pass_runs = store.pass_runs;
  out.plan_probe_runs = store.probe_runs;
  out.plan_pass_entries = store.pass_entries;
  out.arena_growths = store.growths;
  out.arena_replacements = store.replacements;
  return out;
}

}  // namespace refpool::test::fuzz
