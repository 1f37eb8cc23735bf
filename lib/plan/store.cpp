// The plan store: keys, their plans, the arenas they share, and the policy against thrashing.
#include "plan/store.hpp"

#include <algorithm>
#include <bit>

#include "plan/run.hpp"

namespace refpool::detail {

plan_store::~plan_store() { close(); }

plan_store& plan_store::of(cache_state& cache) {
  return static_cast<plan_store&>(cache.extension(
      [](cache_state& c) -> std::unique_ptr<cache_extension> { return std::make_unique<plan_store>(c); }));
}

// ---- adding plans -------------------------------------------------------------------------

bool plan_store::adopt(key_state& key, recording* made, std::vector<plan*>& plans) noexcept {
  std::vector<recording*> now;  // owned: become plans
  std::vector<recording*> dropped;  // at most two: room made first, so that no branch throws
  try {
    dropped.reserve(2);
  } catch (...) {
    delete made;  // a plan is an optimisation
    return false;
  }
  bool rerecorded = false;
  {
    std::lock_guard guard(mutex_);
    const auto same_plan = [&](const plan* p) { return p->requests() == made->requests; };
    const auto same = [&](const recording* r) { return r->requests == made->requests; };
    if (closed_ || key.repeats.passing()) {
      dropped.push_back(made);  // a run open at the key's pass entry: a key in pass keeps nothing
    } else if (std::any_of(key.plans.begin(), key.plans.end(), same_plan)) {
      now.push_back(made);  // a plan of its sequence went stale: replaced at once
    } else if (auto again = std::find_if(key.pending.begin(), key.pending.end(), same); again != key.pending.end()) {
      // The sequence came again: the key's loop repeats. The newer recording replaces the pending
      // one, and every pending sequence becomes a plan, into one arena of their largest need.
      dropped.push_back(*again);
      key.pending.erase(again);
      try {
        key.pending.reserve(key.pending.size() + 1);
        now = std::move(key.pending);
        now.push_back(made);  // room was reserved
        key.pending.clear();
      } catch (...) {
        dropped.push_back(made);  // the pending ones stay pending
      }
    } else {
      try {
        key.pending.reserve(key.pending.size() + 1);
        if (key.pending.size() >= plans_per_key) {
          dropped.push_back(key.pending.front());  // the oldest never came again
          key.pending.erase(key.pending.begin());
          rerecorded = true;
        }
        key.pending.push_back(made);
      } catch (...) {
        dropped.push_back(made);
      }
    }
  }
  for (recording* d : dropped) delete d;
  for (recording* r : now) {
    try {
      plans.reserve(now.size());
      plans.push_back(new plan(cache_, std::move(r->requests), r->lifetimes));  // placed here
    } catch (...) {
      // A plan is an optimisation: failing to make one (no host memory, a size that would wrap)
      // leaves the cache correct.
    }
    delete r;
  }
  // Largest first: the first makes (or grows) the arena, the others fit in it.
  std::stable_sort(plans.begin(), plans.end(),
                   [](const plan* a, const plan* b) { return a->bytes_needed() > b->bytes_needed(); });
  return rerecorded;
}

plan_store::arena_group* plan_store::group_for(const backend_state* backend, stream_ref stream,
                                               const key_state* owner) noexcept {
  for (arena_group& g : groups_)
    if (g.backend == backend && g.stream == stream && g.owner == owner) return &g;
  return nullptr;
}

void plan_store::drop(key_state& key, std::size_t i, std::vector<plan*>& dropped) noexcept {
  dropped.push_back(key.plans[i]);
  key.plans.erase(key.plans.begin() + static_cast<std::ptrdiff_t>(i));
  key.last_used.erase(key.last_used.begin() + static_cast<std::ptrdiff_t>(i));
  evictions_ += 1;
}

std::size_t plan_store::needed_by(const arena* a) const noexcept {
  std::size_t needed = 0;
  for (const auto& k : keys_)
    for (const plan* p : k->plans)
      if (&p->memory() == a) needed = std::max(needed, p->bytes_needed());
  return needed;
}

// A new plan takes the place of what the plain path holds idle for its requests (a recording is
// served by the plain cache): that goes back, before an arena is made or grown, so the two are not
// held at once, and after a plan joins an arena that had room, so the steady state holds the
// arena alone (H200, GPT-2 with 13 sequence lengths: 7.5 GB of idle segment bytes stayed).
void plan_store::reclaim_plain_memory(const backend_state& backend) noexcept {
  try {
    cache_.reclaim_idle(const_cast<backend_state&>(backend));
  } catch (...) {
    // Only more memory held.
  }
}

bool plan_store::add_plan(key_state& key, plan* made) noexcept {
  const backend_state* backend = made->request(0).key.backend;
  const stream_ref stream = made->request(0).stream;
  std::vector<plan*> dropped;
  bool rerecorded = false;
  arena* old = nullptr;
  std::size_t needed = made->bytes_needed();
  bool reclaim = false;
  {
    std::lock_guard guard(mutex_);
    if (closed_ || key.repeats.passing()) {
      dropped.push_back(made);  // a run open at the key's pass entry: a key in pass keeps nothing
      made = nullptr;
    } else {
      auto same = std::find_if(key.plans.begin(), key.plans.end(),
                               [&](const plan* p) { return p->requests() == made->requests(); });
      if (same != key.plans.end()) {
        drop(key, static_cast<std::size_t>(same - key.plans.begin()), dropped);  // stale: replaced
        rerecorded = true;
      } else if (key.plans.size() >= plans_per_key) {
        const auto oldest = std::min_element(key.last_used.begin(), key.last_used.end());
        drop(key, static_cast<std::size_t>(oldest - key.last_used.begin()), dropped);
        rerecorded = true;
      }
      try {
        key.plans.reserve(key.plans.size() + 1);
        key.last_used.reserve(key.last_used.size() + 1);
        groups_.reserve(groups_.size() + 1);
      } catch (...) {
        dropped.push_back(made);
        made = nullptr;
      }
      if (made != nullptr) {
        arena_group* g = group_for(backend, stream, key.own_arena ? &key : nullptr);
        // Room is read from its capacity: a decommitted arena (fresh, lent, or decommitted after
        // out of memory) commits 0 bytes and has room all the same (issue 35).
        if (g != nullptr && g->memory->capacity() >= made->bytes_needed()) {
          if (bind(*made, *g->memory)) {
            install(key, made);
            reclaim = true;
          } else {
            dropped.push_back(made);
          }
          made = nullptr;
        } else if (g != nullptr) {
          old = g->memory;
          old->retain();
          needed = std::max(needed, needed_by(old));
        }
      }
    }
  }
  if (made != nullptr) grow_and_install(key, made, old, needed, dropped);
  if (reclaim) reclaim_plain_memory(*backend);
  if (old != nullptr) old->release();
  for (plan* d : dropped) d->release();
  return rerecorded;
}

// Region blocks for `made` in `a`; false when they could not be made (out of host memory).
bool plan_store::bind(plan& made, arena& a) noexcept {
  try {
    made.bind(a);
    return true;
  } catch (...) {
    return false;
  }
}

void plan_store::install(key_state& key, plan* made) noexcept {
  key.plans.push_back(made);  // room was reserved
  key.last_used.push_back(++clock_);
  key.reclaim_at_replay = true;
  recordings_ += 1;
}

// Makes room for `needed` bytes in `made`'s group (whose arena is `old`, or none yet): in place
// when the arena can grow there, else a new arena, freeing the old one first when no region can
// reach it (so old and new are not held at once). Caller holds growth_mutex_ only.
void plan_store::grow_and_install(key_state& key, plan* made, arena* old, std::size_t needed,
                                  std::vector<plan*>& dropped) noexcept {
  reclaim_plain_memory(*made->request(0).key.backend);
  try {
    // Counted as a growth when the heap gives the bytes (arena::take, or now when pinned).
    const growth_in_place growth = old != nullptr ? old->grow_in_place(needed, this) : growth_in_place::cannot;
    if (growth != growth_in_place::cannot) {
      std::lock_guard guard(mutex_);
      if (closed_) {  // the cache closed while the arena grew: no plan any more
        dropped.push_back(made);
        return;
      }
      made->bind(*old);
      install(key, made);
      return;
    }
  } catch (...) {
    // The backend failed: no plan this time; the old arena is unchanged.
    dropped.push_back(made);
    return;
  }
  backend_state& backend = *const_cast<backend_state*>(made->request(0).key.backend);
  const stream_ref stream = made->request(0).stream;
  bool old_freed = false;
  if (old != nullptr && old->claim(this, nullptr)) {
    if (old->unpinned()) {
      old->free_memory();  // no run holds it and nothing is pinned: no handle reaches its bytes
      old_freed = true;
    } else {
      old->unclaim();
    }
  }
  arena* fresh = nullptr;
  bool allocated = false;
  try {
    fresh = new arena(arenas_, backend, stream);
    allocated = fresh->allocate(needed);
  } catch (...) {
    allocated = false;
  }
  std::lock_guard guard(mutex_);
  if (closed_) {  // the cache closed while the arena was made: close() let the groups go already
    dropped.push_back(made);
    if (fresh != nullptr) fresh->release();
    return;
  }
  arena_group* g = group_for(&backend, stream, key.own_arena ? &key : nullptr);
  if (!allocated) {
    dropped.push_back(made);
    if (old_freed) {  // its plans have no memory now
      for (auto& k : keys_)
        for (std::size_t i = k->plans.size(); i-- > 0;)
          if (&k->plans[i]->memory() == old) drop(*k, i, dropped);
      if (g != nullptr) {
        g->memory->release();
        *g = groups_.back();
        groups_.pop_back();
      }
    }
    if (fresh != nullptr) fresh->release();
    return;
  }
  if (old != nullptr) {
    // Every plan of the old arena, of any key, moves to the new one (a copy: the old plan may
    // still have live regions, in the old arena, that runs or escapes hold).
    for (auto& k : keys_) {
      for (std::size_t i = k->plans.size(); i-- > 0;) {
        if (&k->plans[i]->memory() != old) continue;
        try {
          plan* moved = new plan(*k->plans[i], *fresh);
          dropped.push_back(k->plans[i]);
          k->plans[i] = moved;
        } catch (...) {
          drop(*k, i, dropped);
        }
      }
    }
    old->retire();
    replacements_ += 1;
  }
  if (bind(*made, *fresh))
    install(key, made);
  else
    dropped.push_back(made);  // the moved plans keep the new arena
  if (g != nullptr) {
    g->memory->release();
    g->memory = fresh;
  } else {
    groups_.push_back({&backend, stream, key.own_arena ? &key : nullptr, fresh});  // room was reserved
  }
}

// A run of `key` found its arena held by a run of another key: their runs overlap in time, so
// they cannot share memory. The key's plans move to an arena of their own.
void plan_store::move_to_own_arena(key_state& key) noexcept {
  std::vector<std::pair<const backend_state*, stream_ref>> places;
  std::vector<plan*> dropped;
  {
    std::lock_guard guard(mutex_);
    if (closed_ || key.own_arena) return;
    key.own_arena = true;
    for (const plan* p : key.plans) {
      const std::pair<const backend_state*, stream_ref> place{p->request(0).key.backend, p->request(0).stream};
      if (std::find(places.begin(), places.end(), place) == places.end()) places.push_back(place);
    }
  }
  for (const auto& [backend, stream] : places) {
    std::size_t needed = 0;
    {
      std::lock_guard guard(mutex_);
      for (const plan* p : key.plans)
        if (p->request(0).key.backend == backend && p->request(0).stream == stream)
          needed = std::max(needed, p->bytes_needed());
    }
    arena* fresh = nullptr;
    bool allocated = false;
    try {
      fresh = new arena(arenas_, *const_cast<backend_state*>(backend), stream);
      allocated = fresh->allocate(needed);
    } catch (...) {
      allocated = false;
    }
    std::lock_guard guard(mutex_);
    if (closed_) {  // the cache closed while the arena was made: close() let the groups go already
      if (fresh != nullptr) fresh->release();
      break;
    }
    try {
      if (allocated) groups_.push_back({backend, stream, &key, fresh});
    } catch (...) {
      allocated = false;
    }
    if (!allocated) {  // the plans stay where they are; its runs may meet the other key's again
      if (fresh != nullptr) fresh->release();
      continue;
    }
    for (std::size_t i = key.plans.size(); i-- > 0;) {
      plan* p = key.plans[i];
      if (p->request(0).key.backend != backend || p->request(0).stream != stream) continue;
      try {
        key.plans[i] = new plan(*p, *fresh);
        dropped.push_back(p);
      } catch (...) {
        drop(key, i, dropped);
      }
    }
  }
  for (plan* d : dropped) d->release();
}

// ---- the cache's view ---------------------------------------------------------------------

void plan_store::close() noexcept {
  std::vector<plan*> plans;
  std::vector<arena*> arenas;
  {
    std::lock_guard guard(mutex_);
    closed_ = true;
    for (auto& k : keys_) {
      plans.insert(plans.end(), k->plans.begin(), k->plans.end());
      for (recording* r : k->pending) delete r;
      k->pending.clear();
      k->plans.clear();
      k->last_used.clear();
    }
    for (const arena_group& g : groups_) arenas.push_back(g.memory);
    groups_.clear();
  }
  for (plan* p : plans) p->release();
  for (arena* a : arenas) a->release();
}

}  // namespace refpool::detail
