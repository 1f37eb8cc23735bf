// The plan store's arena groups: which arena a key's plans share on a backend and stream, how an
// arena grows or is replaced when a plan needs more, and a key's move to an arena of its own.
#include <algorithm>

#include "plan/run.hpp"
#include "plan/store.hpp"

namespace refpool::detail {

plan_store::arena_group* plan_store::group_for(const backend_state* backend, stream_ref stream,
                                               const key_state* owner) noexcept {
  for (arena_group& g : groups_)
    if (g.backend == backend && g.stream == stream && g.owner == owner) return &g;
  return nullptr;
}

std::size_t plan_store::needed_by(const arena* a) const noexcept {
  std::size_t needed = 0;
  for (const auto& k : keys_)
    for (const plan* p : k->plans)
      if (&p->memory() == a) needed = std::max(needed, p->bytes_needed());
  return needed;
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

}  // namespace refpool::detail
