// The plan store: keys, their plans and the policy against thrashing (arena groups: store_arena_groups.cpp).
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
  // At most the pending ones and two: room made first, so that no branch throws.
  std::vector<recording*> dropped;
  try {
    dropped.reserve(repeat_detector::ring + 2);
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
        // The oldest never came again (more than one where the capacity shrank: longer runs).
        while (key.pending.size() >= key.repeats.capacity()) {
          dropped.push_back(key.pending.front());
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

void plan_store::drop(key_state& key, std::size_t i, std::vector<plan*>& dropped) noexcept {
  dropped.push_back(key.plans[i]);
  key.plans.erase(key.plans.begin() + static_cast<std::ptrdiff_t>(i));
  key.last_used.erase(key.last_used.begin() + static_cast<std::ptrdiff_t>(i));
  evictions_ += 1;
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
      }
      // Beyond its capacity (more than one where the capacity shrank: longer runs).
      while (key.plans.size() >= key.repeats.capacity()) {
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

void plan_store::install(key_state& key, plan* made) noexcept {
  key.plans.push_back(made);  // room was reserved
  key.last_used.push_back(++clock_);
  key.reclaim_at_replay = true;
  made->memory().reclaim_before_next_take();
  recordings_ += 1;
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
