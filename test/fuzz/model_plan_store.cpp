// The reference model's rules for planned scopes and steps, continued (the rules themselves are
// listed in model_plans.cpp): what a run's end records, pins and pauses, and the store of each key's
// plans and pending recordings, with the arenas they go to.
#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "model.hpp"
#include "model_trace.hpp"

namespace refpool::test::fuzz {

namespace {

constexpr unsigned thrash_window = 16;
constexpr unsigned thrash_rerecordings = 4;
constexpr std::uint64_t longest_pause = 4096;
constexpr std::uint64_t first_pause = 64;  // a key's first pause, again after it learns again

// A run's fingerprint: a 64-bit hash of its request sizes in order, never 0 (0: unknown).
std::uint64_t model_fingerprint(const std::vector<std::size_t>& sizes) {
  std::uint64_t f = 0;
  for (std::size_t bytes : sizes) f = (f + bytes) * 0x100000001B3ull;
  return f == 0 ? 1 : f;
}

}  // namespace

// ---- the end of a run -----------------------------------------------------------------------

void model::finish_run(int run) {
  using mode = model_run::mode;
  model_run& r = runs[static_cast<std::size_t>(run)];
  if (r.how == mode::finished) return;
  const mode was = r.how;
  std::erase(active_runs, run);
  model_trace("run {} ends at {} (mode {}, plan {}, arena {})", run, r.position, static_cast<int>(was), r.current,
              r.arena);
  r.how = mode::finished;
  model_cache& c0 = caches[static_cast<std::size_t>(r.cache)];
  if (was == mode::pass) {  // no router served it: its key only counts it
    c0.plans.pass_runs += 1;
    plan_totals.pass_runs += 1;
    model_key& k = c0.plans.keys[static_cast<std::size_t>(r.key)];
    k.runs += 1;
    observe_repeats(c0.plans, r.key, 0, false);
    return;
  }
  const std::uint64_t end = r.position;
  if (was == mode::replay) r.replayed_to = end;
  const bool complete = was == mode::replay && end == plans[static_cast<std::size_t>(r.current)].requests.size();
  if (was == mode::replay && !complete) r.misses += 1;  // it ended before its plan did
  const bool record =
      r.may_record && end != 0 && (was == mode::record || (was == mode::replay && (!complete || r.stale)));
  // Its regions still live are pinned (escapes); the others' lifetimes are the recording's.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> life(end, {0, 0});
  std::vector<model_request> sequence(end);
  std::vector<bool> known(end, false);
  std::size_t escapes = 0;
  if (r.arena >= 0) {
    r.segments.push_back({r.current, r.segment_from, std::min(end, r.replayed_to)});
    for (const model_segment& s : r.segments) {
      model_plan& p = plans[static_cast<std::size_t>(s.plan)];
      for (std::uint64_t q = s.from; q < s.to; ++q) {
        model_region& reg = p.regions[q];
        if (reg.generation != r.generation) continue;  // not handed out by this run
        sequence[q] = p.requests[q];
        known[q] = true;
        if (reg.live) {
          reg.pinned = true;
          escapes += 1;
          life[q] = {q, end + 1};
        } else {
          life[q] = {q, reg.released_at};
        }
      }
    }
    // No region of the arena pinned (this run's or an earlier one's): its span idles.
    if (arena_unpinned(r.arena)) idle_span(r.arena);
    arenas[static_cast<std::size_t>(r.arena)].claimed_by = -1;
  }
  for (const model_tracked& t : r.tracked) {
    if (t.position >= end) continue;
    sequence[t.position] = t.request;
    life[t.position] = {t.position, t.live ? end + 1 : t.released_at};
    known[t.position] = true;
  }
  model_cache& c = caches[static_cast<std::size_t>(r.cache)];
  c.extra_escapes += escapes + r.uncached_live;
  plan_totals.escapes += escapes + r.uncached_live;
  int made = -1;
  if (record) {
    bool plannable = true;
    for (std::uint64_t q = 0; q < end && plannable; ++q) {
      plannable = known[q] && sequence[q].stream == sequence[0].stream && sequence[q].backend == sequence[0].backend;
      life[q].second = std::clamp<std::uint64_t>(life[q].second, q + 1, end + 1);
    }
    if (plannable) made = make_plan(r.cache, sequence, life);
  }
  // The store's part: counters, the plan used, the recording, the policy.
  model_plan_store& store = c.plans;
  store.hits += r.hits;
  store.misses += r.misses;
  store.busy += r.busy ? 1 : 0;
  const bool unrecorded = !r.may_record && !r.busy && was == mode::plain;
  store.unrecorded += unrecorded ? 1 : 0;
  store.probe_runs += was == mode::probe ? 1 : 0;
  model_key& k = store.keys[static_cast<std::size_t>(r.key)];
  k.runs += 1;
  k.longest_run = std::max<std::size_t>(k.longest_run, end);
  if (complete) {
    auto it = std::find(k.plans.begin(), k.plans.end(), r.current);
    if (it != k.plans.end()) k.last_used[static_cast<std::size_t>(it - k.plans.begin())] = ++store.clock;
  }
  // Its fingerprint: the sizes it asked for in order, where it saw them all (a probe, failed
  // requests included; a complete replay, a recording; a run asked for nothing: the empty
  // sequence). Unknown otherwise (a learning run whose requests all failed among them).
  std::vector<std::size_t> sizes;
  bool hashed = end == 0 && !r.asked;
  if (was == mode::probe || (was == mode::plain && end != 0)) {  // a plain run, hashed from its start
    sizes = r.probed;
    hashed = true;
  }
  if (was == mode::replay && !complete && !r.may_record && end != 0) {  // paused, short: the plan's so far
    for (std::uint64_t q = 0; q < end; ++q) sizes.push_back(plans[static_cast<std::size_t>(r.current)].requests[q].bytes);
    hashed = true;
  }
  if (complete || made >= 0) {
    for (const model_request& q : plans[static_cast<std::size_t>(complete ? r.current : made)].requests)
      sizes.push_back(q.bytes);
    hashed = true;
  }
  const int change = observe_repeats(store, r.key, hashed ? model_fingerprint(sizes) : 0, complete);
  const bool passes = change == 1;
  if (change == 2 || change == 3) {  // learning again, or more plans kept: no pause from before holds it back
    plan_totals.pauses_lifted += k.paused_until > k.runs ? 1 : 0;
    k.paused_until = k.runs;
    k.next_pause = first_pause;
    k.rerecordings = 0;
  }
  // The first complete replay after a plan joined gives the plain path's idle memory back.
  const bool reclaim = complete && k.reclaim_at_replay;
  if (complete) k.reclaim_at_replay = false;
  if (reclaim) free_idle(r.cache, 0, plans[static_cast<std::size_t>(r.current)].requests[0].backend, c.reclaimed);
  if (passes) {  // its recording is no plan: the key's sequences do not repeat
    enter_pass(r.cache, r.key);
    return;
  }
  unsigned rerecorded = 0;  // plans (or pending recordings) its recording replaced or dropped
  if (made >= 0) {
    plan_totals.recordings += 1;
    rerecorded = adopt(r.cache, r.key, made);
  }
  if (r.busy_other_key) move_to_own_arena(r.cache, r.key);
  model_key& key = c.plans.keys[static_cast<std::size_t>(runs[static_cast<std::size_t>(run)].key)];
  // One bit a run, or one a re-recording (a run that turns its pending recordings into plans may drop several).
  const unsigned n = std::min<unsigned>(rerecorded, thrash_window);
  key.rerecordings = (key.rerecordings << std::max(n, 1u) | ((1u << n) - 1)) & ((1u << thrash_window) - 1);
  if (static_cast<unsigned>(std::popcount(key.rerecordings)) >= thrash_rerecordings) {
    key.paused_until = key.runs + key.next_pause;
    key.next_pause = std::min(key.next_pause * 2, longest_pause);
    key.rerecordings = 0;
    c.plans.pauses += 1;
    plan_totals.pauses += 1;
  }
}

// ---- repeats ------------------------------------------------------------------------------

// A run repeated when it replayed a plan to its end or its fingerprint is one of the last
// `capacity` runs' (16 at first); one that came further back (up to 64 runs) is a far repeat.
// Learning, after 32 runs in learn: if 4 or more of the last 32 were far repeats within a larger
// capacity (the power of two that reaches the farthest, at most 64 and 2^18 planned requests over
// its longest run), it keeps that many plans and learns on; else if they repeated fewer than 4
// times it passes for 64 runs. Passing, 32 probes follow; 4 repeats among them (or far repeats,
// as above, which also grow it) and it learns again, else it passes twice as long (up to 4096
// runs) and probes again.
// Returns 1 (passes), 2 (learns again), 3 (grew, learning) or 0.
int model::observe_repeats(model_plan_store& store, int key, std::uint64_t fp, bool replayed) {
  model_key& k = store.keys[static_cast<std::size_t>(key)];
  // The key's budget: 2^18 planned requests over its longest run, 16 to 64 plans. It holds from
  // now on: a key whose runs became longer since it grew keeps fewer.
  const std::size_t budget =
      std::clamp<std::size_t>((std::size_t{1} << 18) / std::max<std::size_t>(k.longest_run, 1), 16, 64);
  k.capacity = std::min(k.capacity, budget);
  bool repeated = replayed;
  std::size_t far = 0;
  if (!replayed && fp != 0) {
    for (std::size_t back = 1; back <= k.fingerprints.size(); ++back) {
      if (k.fingerprints[k.fingerprints.size() - back] != fp) continue;
      repeated = back <= k.capacity;
      far = repeated ? 0 : back;
      break;
    }
  }
  k.fingerprints.push_back(fp);
  k.repeated.push_back(repeated);
  k.far.push_back(far);
  if (k.fingerprints.size() > 64) {
    k.fingerprints.erase(k.fingerprints.begin());
    k.repeated.erase(k.repeated.begin());
    k.far.erase(k.far.begin());
  }
  k.runs_in_mode += 1;
  const std::size_t window = std::min<std::size_t>(32, k.repeated.size());
  const auto repeats = std::count(k.repeated.end() - static_cast<std::ptrdiff_t>(window), k.repeated.end(), true);
  // The capacity the window's far repeats ask for, where it is larger than now (else 0): the
  // power of two that reaches the farthest, or the budget, if 4 of them come within it.
  const auto grown = [&]() -> std::size_t {
    std::size_t farthest = 0;
    for (std::size_t i = k.far.size() - window; i < k.far.size(); ++i) farthest = std::max(farthest, k.far[i]);
    const std::size_t to = std::min(std::bit_ceil(farthest), budget);
    const auto within = std::count_if(k.far.end() - static_cast<std::ptrdiff_t>(window), k.far.end(),
                                      [&](std::size_t d) { return d != 0 && d <= to; });
    return within >= 4 && to > k.capacity ? to : 0;
  };
  if (!k.passing) {
    if (k.runs_in_mode < 32) return 0;
    if (const std::size_t to = grown(); to != 0) {  // near repeats many or few
      model_trace("key {} keeps {} plans (was {})", key, to, k.capacity);
      k.capacity = to;
      k.runs_in_mode = 0;
      plan_totals.capacity_growths += 1;
      return 3;
    }
    if (repeats >= 4) return 0;
    k.passing = true;
    k.runs_in_mode = 0;
    k.pass_until = k.runs + k.next_pass;
    store.pass_entries += 1;
    plan_totals.pass_entries += 1;
    model_trace("key {} passes until run {}", key, k.pass_until);
    return 1;
  }
  if (k.runs < k.pass_until + 32) return 0;
  const std::size_t to = grown();
  if (repeats < 4 && to == 0) {
    k.next_pass = std::min<std::uint64_t>(2 * k.next_pass, 4096);
    k.pass_until = k.runs + k.next_pass;
    return 0;
  }
  if (to != 0) {
    model_trace("key {} keeps {} plans (was {})", key, to, k.capacity);
    k.capacity = to;
    plan_totals.capacity_growths += 1;
  }
  k.passing = false;
  k.runs_in_mode = 0;
  k.next_pass = 64;
  plan_totals.learned_again += 1;
  model_trace("key {} learns again", key);
  return 2;
}

// Entering pass: the key's pending recordings and plans go, and so does the group of every arena
// no plan of any key is placed in any more (its memory once no run or pinned region reaches it).
void model::enter_pass(int ci, int key) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  model_key& k = store.keys[static_cast<std::size_t>(key)];
  k.pending.clear();
  for (std::size_t i = k.plans.size(); i-- > 0;) drop_plan(store, key, i);
  store.keys[static_cast<std::size_t>(key)].rerecordings = 0;
  for (std::size_t g = store.groups.size(); g-- > 0;) {
    bool placed = false;
    for (const model_key& other : store.keys)
      for (int p : other.plans) placed = placed || plans[static_cast<std::size_t>(p)].arena == store.groups[g].arena;
    if (placed) continue;
    arenas[static_cast<std::size_t>(store.groups[g].arena)].in_group = false;
    store.groups[g] = store.groups.back();
    store.groups.pop_back();
  }
}

// ---- the store ------------------------------------------------------------------------------

void model::install(model_plan_store& store, int key, int plan) {
  model_trace("plan {} joins key {} in arena {}", plan, key, plans[static_cast<std::size_t>(plan)].arena);
  model_key& k = store.keys[static_cast<std::size_t>(key)];
  k.plans.push_back(plan);
  k.last_used.push_back(++store.clock);
  k.reclaim_at_replay = true;
  arenas[static_cast<std::size_t>(plans[static_cast<std::size_t>(plan)].arena)].reclaim_before_take = true;
  plans[static_cast<std::size_t>(plan)].in_store = true;
  store.recordings += 1;
}

void model::drop_plan(model_plan_store& store, int key, std::size_t i) {
  model_key& k = store.keys[static_cast<std::size_t>(key)];
  plans[static_cast<std::size_t>(k.plans[i])].in_store = false;
  k.plans.erase(k.plans.begin() + static_cast<std::ptrdiff_t>(i));
  k.last_used.erase(k.last_used.begin() + static_cast<std::ptrdiff_t>(i));
  store.evictions += 1;
  plan_totals.evictions += 1;
}

// A run's recording: a plan at once if the key has one of its sequence; pending if new; if
// pending already, it and the key's pending recordings become plans, largest first.
unsigned model::adopt(int ci, int key, int made) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  model_key& k = store.keys[static_cast<std::size_t>(key)];
  if (store.closed) return false;
  if (k.passing) {  // a run open at its key's pass entry: a key in pass keeps nothing
    plan_totals.passing_recordings += 1;
    return false;
  }
  const auto same = [&](int p) {
    return plans[static_cast<std::size_t>(p)].requests == plans[static_cast<std::size_t>(made)].requests;
  };
  if (std::any_of(k.plans.begin(), k.plans.end(), same)) return add_plan(ci, key, made);
  auto again = std::find_if(k.pending.begin(), k.pending.end(), same);
  if (again == k.pending.end()) {
    unsigned rerecorded = 0;
    while (k.pending.size() >= k.capacity) {  // more than one where the capacity shrank
      k.pending.erase(k.pending.begin());
      rerecorded = 1;  // one, as refpool counts a run's pending drops
    }
    k.pending.push_back(made);
    model_trace("plan {} pending for key {}", made, key);
    return rerecorded;
  }
  k.pending.erase(again);
  std::vector<int> now = std::move(k.pending);
  k.pending.clear();
  now.push_back(made);
  std::stable_sort(now.begin(), now.end(), [&](int a, int b) {
    return plans[static_cast<std::size_t>(a)].bytes_needed > plans[static_cast<std::size_t>(b)].bytes_needed;
  });
  model_trace("key {} repeats: {} recordings become plans", key, now.size());
  unsigned rerecorded = 0;
  for (int p : now) rerecorded += add_plan(ci, key, p) ? 1 : 0;
  return rerecorded;
}

// A recording joins its key: it replaces the plan of its sequence, or the least recently used one
// beyond 16 (either is a re-recording), then goes to its (backend, stream) arena.
bool model::add_plan(int ci, int key, int made) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  if (store.closed) return false;
  bool rerecorded = false;
  {
    model_key& k = store.keys[static_cast<std::size_t>(key)];
    const model_plan& m = plans[static_cast<std::size_t>(made)];
    auto same = std::find_if(k.plans.begin(), k.plans.end(),
                             [&](int p) { return plans[static_cast<std::size_t>(p)].requests == m.requests; });
    if (same != k.plans.end()) {
      drop_plan(store, key, static_cast<std::size_t>(same - k.plans.begin()));
      rerecorded = true;
    }
    while (k.plans.size() >= k.capacity) {  // more than one where the capacity shrank
      drop_plan(
          store, key,
          static_cast<std::size_t>(std::min_element(k.last_used.begin(), k.last_used.end()) - k.last_used.begin()));
      rerecorded = true;
    }
  }
  const model_plan& m = plans[static_cast<std::size_t>(made)];
  const int owner = store.keys[static_cast<std::size_t>(key)].own_arena ? key : -1;
  auto g = std::find_if(store.groups.begin(), store.groups.end(), [&](const model_group& x) {
    return x.backend == m.requests[0].backend && x.stream == m.requests[0].stream && x.owner == owner;
  });
  if (g != store.groups.end() && arenas[static_cast<std::size_t>(g->arena)].needed >= m.bytes_needed) {
    plans[static_cast<std::size_t>(made)].arena = g->arena;
    arenas[static_cast<std::size_t>(g->arena)].plans.push_back(made);
    const auto backend = m.requests[0].backend;
    install(store, key, made);
    // The plain path's idle memory of the backend goes: the arena holds these requests now.
    free_idle(ci, 0, backend, caches[static_cast<std::size_t>(ci)].reclaimed);
    return rerecorded;
  }
  std::size_t needed = m.bytes_needed;
  int old = -1;
  if (g != store.groups.end()) {
    old = g->arena;
    for (const model_key& k : store.keys)
      for (int p : k.plans)
        if (plans[static_cast<std::size_t>(p)].arena == old)
          needed = std::max(needed, plans[static_cast<std::size_t>(p)].bytes_needed);
  }
  grow_and_install(ci, key, made, old, needed);
  return rerecorded;
}

// A plan that needs more than its group's arena has: the arena grows in place (its next claim
// extends its span) when a run holds it or no region of it is pinned; pinned, its span is
// extended now when it has room or a free range follows it. Otherwise a new arena replaces it
// (no memory until its first claim), its plans copied; the old one goes with its last pinned region.
void model::grow_and_install(int ci, int key, int made, int old, std::size_t needed) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  const model_request first = plans[static_cast<std::size_t>(made)].requests[0];
  // The plain path's idle memory of the backend goes first: the arena takes its place.
  free_idle(ci, 0, first.backend, caches[static_cast<std::size_t>(ci)].reclaimed);
  if (old >= 0) {
    model_arena& o = arenas[static_cast<std::size_t>(old)];
    bool grown = o.claimed_by >= 0 || arena_unpinned(old);
    if (!grown && o.memory) {
      grown = o.bytes >= needed || extend_span(old, needed);
      if (grown) store.growths += 1;
    }
    if (grown) {
      model_arena& g = arenas[static_cast<std::size_t>(old)];
      g.needed = std::max(g.needed, needed);
      plans[static_cast<std::size_t>(made)].arena = old;
      g.plans.push_back(made);
      install(store, key, made);
      return;
    }
  }
  int fresh = -1;
  new_arena(ci, first.backend, first.stream, needed, fresh);  // no memory yet: nothing fails
  const int owner = store.keys[static_cast<std::size_t>(key)].own_arena ? key : -1;
  auto g = std::find_if(store.groups.begin(), store.groups.end(), [&](const model_group& x) {
    return x.backend == first.backend && x.stream == first.stream && x.owner == owner;
  });
  if (old >= 0) {
    for (model_key& k : store.keys) {
      for (std::size_t i = k.plans.size(); i-- > 0;) {
        if (plans[static_cast<std::size_t>(k.plans[i])].arena != old) continue;
        const int moved = copy_plan(k.plans[i], fresh);
        plans[static_cast<std::size_t>(k.plans[i])].in_store = false;
        plans[static_cast<std::size_t>(moved)].in_store = true;
        k.plans[i] = moved;
      }
    }
    arenas[static_cast<std::size_t>(old)].retired = true;
    arenas[static_cast<std::size_t>(old)].in_group = false;
    store.replacements += 1;
  }
  plans[static_cast<std::size_t>(made)].arena = fresh;
  arenas[static_cast<std::size_t>(fresh)].plans.push_back(made);
  install(store, key, made);
  arenas[static_cast<std::size_t>(fresh)].in_group = true;
  if (g != store.groups.end()) {
    g->arena = fresh;
  } else {
    store.groups.push_back({first.backend, first.stream, owner, fresh});
  }
}

// A run found its arena held by another key's run: the key's plans move to arenas of their own.
void model::move_to_own_arena(int ci, int key) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  if (store.closed || store.keys[static_cast<std::size_t>(key)].own_arena) return;
  store.keys[static_cast<std::size_t>(key)].own_arena = true;
  std::vector<std::pair<int, void*>> places;
  for (int p : store.keys[static_cast<std::size_t>(key)].plans) {
    const std::pair<int, void*> at{plans[static_cast<std::size_t>(p)].requests[0].backend,
                                   plans[static_cast<std::size_t>(p)].requests[0].stream};
    if (std::find(places.begin(), places.end(), at) == places.end()) places.push_back(at);
  }
  for (const auto& [backend, stream] : places) {
    std::size_t needed = 0;
    for (int p : store.keys[static_cast<std::size_t>(key)].plans) {
      const model_plan& plan = plans[static_cast<std::size_t>(p)];
      if (plan.requests[0].backend == backend && plan.requests[0].stream == stream)
        needed = std::max(needed, plan.bytes_needed);
    }
    int fresh = -1;
    if (!new_arena(ci, backend, stream, needed, fresh)) continue;  // they stay where they are
    store.groups.push_back({backend, stream, key, fresh});
    arenas[static_cast<std::size_t>(fresh)].in_group = true;
    model_key& k = store.keys[static_cast<std::size_t>(key)];
    for (std::size_t i = k.plans.size(); i-- > 0;) {
      const model_plan& plan = plans[static_cast<std::size_t>(k.plans[i])];
      if (plan.requests[0].backend != backend || plan.requests[0].stream != stream) continue;
      const int moved = copy_plan(k.plans[i], fresh);
      plans[static_cast<std::size_t>(k.plans[i])].in_store = false;
      plans[static_cast<std::size_t>(moved)].in_store = true;
      k.plans[i] = moved;
    }
  }
}

// The cache is destroyed: its store lets every plan and arena go; what runs and pinned regions
// still hold goes with them.
void model::close_plans(int ci) {
  model_plan_store& store = caches[static_cast<std::size_t>(ci)].plans;
  store.closed = true;
  for (model_key& k : store.keys) {
    for (int p : k.plans) plans[static_cast<std::size_t>(p)].in_store = false;
    k.plans.clear();
    k.pending.clear();
    k.last_used.clear();
  }
  for (const model_group& g : store.groups) arenas[static_cast<std::size_t>(g.arena)].in_group = false;
  store.groups.clear();
}

}  // namespace refpool::test::fuzz
