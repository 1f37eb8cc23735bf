// The reference model's rules for planned scopes and steps, written from docs/design.md
// ("Planned scopes"), none of it copied from lib/plan:
//
// - A run of a key matches its n-th request (backend, exact bytes, stream) with the n-th request
//   of the key's most recently used plan that matches all of its requests so far; a request that
//   no plan matches diverges: the rest of the run is served by the plain cache, recorded (tracked)
//   unless the key is paused.
// - A matched request gets its region (arena base + planned offset) unless a live region can
//   reach one of its bytes, other than this run's regions that the recording had alive at this
//   point (placed apart by construction): then it falls back to the plain cache, a miss; when the
//   region in the way is one of this run's own, released later than recorded, the plan is stale.
// - At its end a run pins its live regions (escapes), and records a plan when it diverged, ended
//   short, or was stale: greedy by size in request positions.
// - A recording of a sequence the key has a plan of replaces it; of a new sequence it is kept
//   pending (16 per key, the oldest dropped: a re-recording); of a pending sequence (it came
//   again), it and every pending recording of the key become plans, largest first (ties: in the
//   order recorded, the new one last). Before an arena is made for a plan (or replaced by a
//   larger one), the cache's idle memory of its backend is freed, as on out-of-memory, uncounted.
// - Plans go to one arena per (backend, stream), shared by keys until a run finds it held by
//   another key's run. An arena is a span of a heap of spans alone (model_span_heap.cpp): made at
//   its first claim, idle between runs, given back when nothing reaches it. A plan that needs more
//   grows it at its next claim; pinned by a live region, it is extended now or replaced (the old
//   one goes with its last pinned region). 16 plans per key; 4 re-recordings in 16 runs pause the
//   key for 64 runs, doubling.
// - A key whose last 32 runs in learn repeated fewer than 4 times (a run repeats when it replayed a
//   plan to its end or hashes like one of the last 16) passes: its plans and pending recordings
//   go, its runs get no router for 64 runs, then 32 probe (the plain cache, hashed); 4 repeats and
//   it learns again, else the pass doubles (up to 4096) (model_plan_store.cpp, observe_repeats).
//
// This file: plans, arenas and runs; model_plan_store.cpp: a run's end and the store.
#include <algorithm>

#include <fmt/format.h>

#include "model.hpp"
#include "model_trace.hpp"

namespace refpool::test::fuzz {

namespace {

constexpr std::size_t region_alignment = 256;

std::size_t round256(std::size_t bytes) { return (bytes + region_alignment - 1) / region_alignment * region_alignment; }

bool overlap(std::size_t a, std::size_t an, std::size_t b, std::size_t bn) { return a < b + bn && b < a + an; }

// Greedy by size: largest first (ties: first used first), each at the lowest offset where it
// overlaps no request alive at the same time that is placed already. The lowest such offset is 0
// or the end of one of those requests.
std::pair<std::vector<std::size_t>, std::size_t> place(
    const std::vector<std::size_t>& spans, const std::vector<std::pair<std::uint64_t, std::uint64_t>>& life) {
  const std::size_t n = spans.size();
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return spans[a] != spans[b] ? spans[a] > spans[b] : life[a].first < life[b].first;
  });
  std::vector<std::size_t> offsets(n, 0);
  std::vector<bool> placed(n, false);
  std::size_t arena = 0;
  for (std::size_t i : order) {
    std::vector<std::size_t> together;
    for (std::size_t j = 0; j < n; ++j)
      if (placed[j] && life[j].first < life[i].second && life[i].first < life[j].second) together.push_back(j);
    std::size_t best = SIZE_MAX;
    std::vector<std::size_t> tries{0};
    for (std::size_t j : together) tries.push_back(offsets[j] + spans[j]);
    for (std::size_t at : tries) {
      const bool free = std::none_of(together.begin(), together.end(),
                                     [&](std::size_t j) { return overlap(at, spans[i], offsets[j], spans[j]); });
      if (free) best = std::min(best, at);
    }
    offsets[i] = best;
    placed[i] = true;
    arena = std::max(arena, best + spans[i]);
  }
  return {offsets, arena};
}

}  // namespace

// ---- plans and arenas -----------------------------------------------------------------------

int model::make_plan(int ci, std::vector<model_request> requests,
                     const std::vector<std::pair<std::uint64_t, std::uint64_t>>& life) {
  model_plan p;
  p.cache = ci;
  p.requests = std::move(requests);
  const std::size_t n = p.requests.size();
  for (const model_request& r : p.requests) p.spans.push_back(round256(r.bytes));
  std::tie(p.offsets, p.bytes_needed) = place(p.spans, life);
  for (const auto& l : life) p.released_at.push_back(l.second);
  // The peak of live bytes: at each allocation, what is alive then.
  for (std::size_t t = 0; t < n; ++t) {
    std::size_t live = 0;
    for (std::size_t j = 0; j < n; ++j)
      if (life[j].first <= life[t].first && life[t].first < life[j].second) live += p.requests[j].bytes;
    p.peak = std::max(p.peak, live);
  }
  p.regions.resize(n);
  plans.push_back(std::move(p));
  model_trace("plan {} made: {} requests, {} B", plans.size() - 1, n, plans.back().bytes_needed);
  for (std::size_t i = 0; i < n; ++i)
    model_trace("  request {}: {} B at {}, alive [{}, {})", i, plans.back().requests[i].bytes, plans.back().offsets[i],
                life[i].first, life[i].second);
  return static_cast<int>(plans.size()) - 1;
}

int model::copy_plan(int from, int arena) {
  model_plan p = plans[static_cast<std::size_t>(from)];
  p.arena = arena;
  arenas[static_cast<std::size_t>(arena)].plans.push_back(static_cast<int>(plans.size()));
  p.regions.assign(p.requests.size(), model_region{});
  p.in_store = false;
  plans.push_back(std::move(p));
  model_trace("plan {} is plan {} in arena {}", plans.size() - 1, from, arena);
  return static_cast<int>(plans.size()) - 1;
}

// A new arena for (backend, stream) whose plans need `bytes`: no memory yet (its span is made at
// its first claim, model_span_heap.cpp).
bool model::new_arena(int ci, int backend, void* stream, std::size_t bytes, int& arena) {
  model_arena a;
  a.cache = ci;
  a.backend = backend;
  a.stream = stream;
  a.needed = bytes;
  arenas.push_back(a);
  arena = static_cast<int>(arenas.size()) - 1;
  model_trace("arena {} ({} B) for backend {} stream {}", arena, bytes, backend, stream);
  return true;
}

// A plan is alive while its store keeps it, a running run started with it, or a region of it is
// pinned (live past its run). `counting_foreign`: also while a running run may still look at one
// of its regions (the run lets go of those lazily, at the latest at its end).
bool model::plan_held(int p, bool counting_foreign) const {
  const model_plan& plan = plans[static_cast<std::size_t>(p)];
  if (plan.in_store) return true;
  for (const model_region& r : plan.regions)
    if (r.live && r.pinned) return true;
  for (int i : active_runs) {
    const model_run& run = runs[static_cast<std::size_t>(i)];
    if (std::find(run.candidates.begin(), run.candidates.end(), p) != run.candidates.end()) return true;
    if (counting_foreign && std::find(run.foreign_plans.begin(), run.foreign_plans.end(), p) != run.foreign_plans.end())
      return true;
  }
  return false;
}

// An arena that no plan, run or pinned region reaches any more gives its span back (~arena):
// its range goes free, and every free segment of its heap goes to the backend. The library does
// that when its last reference goes, which the model does not follow call by call: a
// deallocation of a segment of a heap with such an arena is one of theirs.
void model::settle_arenas(bool at_end_of_operation) {
  using span = model_arena::span_state;
  const auto unreachable = [&](std::size_t a, bool counting_foreign) {
    if (arenas[a].in_group || arenas[a].claimed_by >= 0) return false;
    for (int p : arenas[a].plans)
      if (plan_held(p, counting_foreign)) return false;
    return true;
  };
  const auto going = [&](const model_span_heap& h, bool counting_foreign) {
    std::vector<int> out;
    for (std::size_t a = first_live_arena; a < arenas.size(); ++a)
      if (arenas[a].cache == h.cache && arenas[a].backend == h.backend && arenas[a].span != span::none &&
          arenas[a].span != span::gone && unreachable(a, counting_foreign))
        out.push_back(static_cast<int>(a));
    return out;
  };
  // Their spans free their ranges (no call): the heap's free segments then go.
  const auto give_back = [&](model_span_heap& h, const std::vector<int>& list) {
    for (int a : list) {
      model_arena& x = arenas[static_cast<std::size_t>(a)];
      if (x.memory) {
        for (model_heap_segment& seg : h.segments)
          for (std::size_t r = 0; r < seg.ranges.size(); ++r)
            if (seg.ranges[r].arena == a) {
              std::vector<void*> used{x.stream};
              for (void* s : x.waits)
                if (std::find(used.begin(), used.end(), s) == used.end()) used.push_back(s);
              free_range(h, seg, r, used);
              break;
            }
      }
      x.span = span::gone;
      x.memory = false;
      model_trace("arena {} given back", a);
    }
  };
  for (;;) {
    // The next deallocation (after the order_streams a segment's release makes).
    std::size_t i = 0;
    while (log_.peek_pending(i) != nullptr && log_.peek_pending(i)->what == backend_event::kind::order_streams) ++i;
    const backend_event* e = log_.peek_pending(i);
    if (e == nullptr || e->what != backend_event::kind::deallocate) break;
    model_span_heap* h = nullptr;
    for (model_span_heap& x : span_heaps)
      for (const model_heap_segment& seg : x.segments)
        if (x.backend == e->backend && seg.base == e->ptr) h = &x;
    if (h == nullptr) break;
    const std::vector<int> list = going(*h, false);
    if (list.empty() && !h->settling) break;  // not this one's time: the caller expects something else
    give_back(*h, list);
    h->settling = true;
    std::size_t s = 0;
    while (s < h->segments.size() && h->segments[s].base != e->ptr) ++s;
    if (h->segments[s].ranges.size() != 1 || h->segments[s].ranges[0].arena >= 0)
      fail(fmt::format("segment {} of backend {} freed, but a span of it is still held or idle", e->ptr, e->backend));
    free_segment(*h, s);
  }
  while (first_live_arena < arenas.size() &&
         (arenas[first_live_arena].span == span::gone ||
          (arenas[first_live_arena].span == span::none && !arenas[first_live_arena].in_group &&
           arenas[first_live_arena].plans.empty())))
    ++first_live_arena;
  if (!at_end_of_operation) return;
  for (model_span_heap& h : span_heaps) {
    const std::vector<int> list = going(h, true);
    if (list.empty() && !h.settling) continue;
    give_back(h, list);
    h.settling = false;
    for (const model_heap_segment& seg : h.segments)
      if (seg.ranges.size() == 1 && seg.ranges[0].arena < 0) {
        std::string pending;
        for (std::size_t k = 0; k < 4 && log_.peek_pending(k) != nullptr; ++k)
          pending += " " + describe(*log_.peek_pending(k));
        fail(
            fmt::format("arenas given back (no plan, run or region reaches them), but segment {} ({} B) of backend "
                        "{} is still allocated; next calls:{}",
                        seg.base, seg.bytes, h.backend, pending.empty() ? " none" : pending));
      }
  }
}

// ---- runs -----------------------------------------------------------------------------------

int model::begin_run(int ci, const std::string& key, bool shared) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  auto k = std::find_if(store.keys.begin(), store.keys.end(), [&](const model_key& x) { return x.name == key; });
  if (k == store.keys.end()) {
    store.keys.push_back(model_key{});
    store.keys.back().name = key;
    k = store.keys.end() - 1;
  }
  model_run r;
  r.cache = ci;
  r.key = static_cast<int>(k - store.keys.begin());
  r.shared = shared;
  std::vector<std::pair<std::uint64_t, int>> order;
  for (std::size_t i = 0; i < k->plans.size(); ++i) order.emplace_back(k->last_used[i], k->plans[i]);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // A key in pass: its runs have no router (the plain path serves them) until `pass_until`, then
  // 32 probes: the plain cache, their sizes hashed. Neither has candidates or records.
  if (k->passing) {
    r.how = k->runs < k->pass_until ? model_run::mode::pass : model_run::mode::probe;
    r.may_record = false;
    order.clear();
  }
  for (const auto& [used, p] : order) r.candidates.push_back(p);
  if (!k->passing) r.may_record = !store.closed && k->runs >= k->paused_until;
  runs.push_back(std::move(r));
  active_runs.push_back(static_cast<int>(runs.size()) - 1);
  plan_totals.runs += 1;
  model_trace("run {} of key {} begins with {} candidates", runs.size() - 1, key, runs.back().candidates.size());
  return static_cast<int>(runs.size()) - 1;
}

// The run's position: requests served so far. Regions released now record it (through their
// arena, which the run holds).
void model::advance(model_run& r, std::uint64_t to) {
  r.position = to;
  if (r.arena >= 0) arenas[static_cast<std::size_t>(r.arena)].position = to;
}

void model::track(model_run& r, int run, std::uint64_t gid, const model_request& request, std::uint64_t at) {
  model_block& b = blocks.at(gid);
  b.run = run;
  b.tracked = r.tracked.size();
  model_tracked t;
  t.request = request;
  t.position = at;
  t.cached = b.kind == block_kind::cached;
  r.tracked.push_back(t);
  if (!t.cached) r.uncached_live += 1;
}

void model::observe_release(const model_block& b) {
  model_run& r = runs[static_cast<std::size_t>(b.run)];
  model_tracked& t = r.tracked[b.tracked];
  if (r.how != model_run::mode::finished) {  // after its end the recording has its lifetimes
    t.released_at = r.position;
    t.live = false;
  }
  if (!t.cached) r.uncached_live -= 1;
}

outcome model::fallback(int run, int lease, const model_request& request, bool tracked, std::uint64_t& gid,
                        std::size_t& oom_bytes) {
  model_run& r = runs[static_cast<std::size_t>(run)];
  const outcome o = lease >= 0
                        ? slot_acquire(r.cache, lease, request.backend, request.bytes, request.stream, gid, oom_bytes)
                        : uncached_acquire(r.cache, request.backend, request.bytes, request.stream, gid, oom_bytes);
  if (o == outcome::ok && tracked) track(runs[static_cast<std::size_t>(run)], run, gid, request, r.position);
  return o;
}

outcome model::run_acquire(int run, int lease, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                           std::size_t& oom_bytes) {
  model_run& r = runs[static_cast<std::size_t>(run)];
  const model_request request{backend, bytes, stream};
  const std::uint64_t at = r.position;
  using mode = model_run::mode;
  if (r.how == mode::pass) return slot_acquire(r.cache, lease, backend, bytes, stream, gid, oom_bytes);
  if (r.how != mode::finished) r.asked = true;
  if (r.how == mode::replay) {
    const model_plan& p = plans[static_cast<std::size_t>(r.current)];
    if (at < p.requests.size() && p.requests[at] == request) return replay_one(run, lease, request, at, gid, oom_bytes);
    if (!switch_to(r, request, at)) {  // no plan of the key matches the run so far: it diverges
      r.misses += 1;
      r.replayed_to = at;
      r.how = r.may_record ? mode::record : mode::plain;
      if (r.how == mode::plain)  // hashed from its start: the requests so far are the plan's
        for (std::uint64_t i = 0; i < at; ++i) r.probed.push_back(p.requests[i].bytes);
      plan_totals.divergences += 1;
    }
  } else if (r.how == mode::start) {
    begin_with(r, request);
  }
  switch (r.how) {
    case mode::replay: return replay_one(run, lease, request, at, gid, oom_bytes);
    case mode::record: {  // recorded: the plain cache serves it, tracked
      const outcome o = fallback(run, lease, request, true, gid, oom_bytes);
      if (o == outcome::ok) advance(runs[static_cast<std::size_t>(run)], at + 1);
      return o;
    }
    case mode::probe:
    case mode::plain: {
      r.probed.push_back(bytes);  // asked for: a failed probe hashes it too (a plain run's, its whole run)
      const outcome o = fallback(run, lease, request, lease < 0, gid, oom_bytes);
      model_run& now = runs[static_cast<std::size_t>(run)];
      if (o == outcome::ok) advance(now, at + 1);
      if (o != outcome::ok && now.how == mode::probe) plan_totals.failed_probes += 1;
      return o;
    }
    default: return fallback(run, lease, request, false, gid, oom_bytes);  // a late request after the run's end
  }
}

// The first request: the most recently used plan whose first request it is, if its arena is not
// held by another run; none: a new sequence (a miss if the key has plans).
void model::begin_with(model_run& r, const model_request& request) {
  for (int c : r.candidates) {
    const model_plan& p = plans[static_cast<std::size_t>(c)];
    if (p.requests.empty() || !(p.requests[0] == request)) continue;
    model_arena& a = arenas[static_cast<std::size_t>(p.arena)];
    if (a.retired || a.claimed_by >= 0) {
      r.busy = true;
      r.busy_other_key = !a.retired && a.claimed_key != r.key;
      r.how = model_run::mode::plain;
      plan_totals.busy += 1;
      return;
    }
    const int self = static_cast<int>(&r - runs.data());
    const int ai = p.arena;
    a.claimed_by = self;
    a.claimed_key = r.key;
    // Its span: made at the first claim, held again, extended (out of memory: the plain cache).
    if (!take_arena(ai)) {
      arenas[static_cast<std::size_t>(ai)].claimed_by = -1;
      r.how = model_run::mode::plain;
      return;
    }
    arenas[static_cast<std::size_t>(ai)].generation += 1;
    r.arena = p.arena;
    r.generation = arenas[static_cast<std::size_t>(ai)].generation;
    r.current = c;
    r.segment_from = 0;
    r.how = model_run::mode::replay;
    // Regions of earlier runs still live in this arena: the run may look at them until its end.
    for (int q : arenas[static_cast<std::size_t>(ai)].plans) {
      for (const model_region& reg : plans[static_cast<std::size_t>(q)].regions)
        if (reg.live) {
          r.foreign_plans.push_back(q);
          break;
        }
    }
    return;
  }
  if (!r.candidates.empty()) {
    r.misses += 1;
    plan_totals.divergences += 1;
  }
  r.how = r.may_record ? model_run::mode::record : model_run::mode::plain;
}

// Another plan of the key that matches every request so far and this one, in the same arena.
bool model::switch_to(model_run& r, const model_request& request, std::uint64_t at) {
  const model_plan& now = plans[static_cast<std::size_t>(r.current)];
  for (int c : r.candidates) {
    const model_plan& p = plans[static_cast<std::size_t>(c)];
    if (c == r.current || p.requests.size() <= at || p.arena != r.arena || !(p.requests[at] == request)) continue;
    if (!std::equal(p.requests.begin(), p.requests.begin() + static_cast<std::ptrdiff_t>(at), now.requests.begin()))
      continue;
    r.foreign_plans.push_back(r.current);
    r.segments.push_back({r.current, r.segment_from, at});
    r.current = c;
    r.segment_from = at;
    return true;
  }
  return false;
}

outcome model::replay_one(int run, int lease, const model_request& request, std::uint64_t at, std::uint64_t& gid,
                          std::size_t& oom_bytes) {
  model_run& r = runs[static_cast<std::size_t>(run)];
  model_plan& p = plans[static_cast<std::size_t>(r.current)];
  model_arena& a = arenas[static_cast<std::size_t>(r.arena)];
  advance(r, at + 1);
  // May a live handle reach a byte of this region?
  const std::size_t from = p.offsets[at], span = p.spans[at];
  bool blocked = p.regions[at].live;
  bool stale = false;
  if (!blocked) {
    for (int q : a.plans) {
      const model_plan& o = plans[static_cast<std::size_t>(q)];
      for (std::size_t j = 0; j < o.regions.size(); ++j) {
        const model_region& reg = o.regions[j];
        if (!reg.live || !overlap(from, span, o.offsets[j], o.spans[j])) continue;
        const bool mine = q == r.current && reg.generation == r.generation && !reg.pinned;
        if (mine && o.released_at[j] > at) continue;  // alive together in the recording: placed apart
        blocked = true;
        stale = stale || mine;  // this run's own, released later than recorded
      }
    }
  }
  if (!blocked) {
    // Streams recorded on released regions of this arena: a region handed out waits for them
    // (a blocked one leaves them pending for the next).
    for (void* s : a.waits)
      if (s != request.stream)
        expect_order_streams(a.backend, s, request.stream, fmt::format("before a region of arena {}", r.arena));
    a.waits.clear();
    model_region& reg = p.regions[at];
    model_block& b = add_held_block(block_kind::region, static_cast<char*>(a.base) + p.offsets[at], p.spans[at],
                                    request.bytes, request.backend, request.stream);
    b.plan = r.current;
    b.region = at;
    reg.live = true;
    reg.pinned = false;
    reg.generation = r.generation;
    reg.gid = b.gid;
    r.hits += 1;
    plan_totals.region_hits += 1;
    gid = b.gid;
    return outcome::ok;
  }
  if (stale && !r.stale) plan_totals.stale += 1;
  r.stale = r.stale || stale;
  r.misses += 1;
  plan_totals.conflicts += 1;
  const outcome o = fallback(run, lease, request, true, gid, oom_bytes);
  if (o != outcome::ok) {  // nothing served: the next request takes this position again
    advance(runs[static_cast<std::size_t>(run)], at);
  } else {
    model_tracked& t = runs[static_cast<std::size_t>(run)].tracked.back();
    t.position = at;
  }
  return o;
}

void model::put_back_region(model_block& b, bool via_unsafe_free) {
  model_plan& p = plans[static_cast<std::size_t>(b.plan)];
  model_region& reg = p.regions[b.region];
  model_arena& a = arenas[static_cast<std::size_t>(p.arena)];
  if (via_unsafe_free) caches[static_cast<std::size_t>(p.cache)].extra_unsafe_frees += 1;
  for (void* s : b.extra_streams)
    if (s != a.stream && std::find(a.waits.begin(), a.waits.end(), s) == a.waits.end()) a.waits.push_back(s);
  const bool was_pinned = reg.pinned;
  reg.live = false;
  reg.pinned = false;
  reg.released_at = a.position;
  reg.gid = 0;
  blocks.erase(b.gid);
  // The last pinned region of an arena no run holds: its span idles (arena::idle_if_unpinned).
  const int ai = p.arena;
  if (was_pinned && a.claimed_by < 0 && !a.retired && arena_unpinned(ai)) idle_span(ai);
}

}  // namespace refpool::test::fuzz
