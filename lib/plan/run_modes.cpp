// A planned run's mode machine (run.hpp): its first request starts it (replay a plan whose arena
// it can claim, else record or serve plainly); a request its plan did not record switches plans
// (the cursor) or diverges into recording. serve_slow (run.cpp) serves each mode.
#include "plan/run.hpp"

namespace refpool::detail {

void plan_run::begin_with(const planned_request& request) {
  for (plan* c : candidates_) {
    if (c->size() == 0 || !(c->request(0) == request)) continue;
    arena& a = c->memory();
    if (!a.claim(this, key_)) {
      // Another run holds the arena (or it was just replaced): the plain cache serves this one.
      mode_.busy = true;
      // Null: the store holds it (or the claimer has not named its key yet), no other key's run.
      const void* holder = a.claimed_key();
      mode_.busy_other_key = !a.retired() && holder != nullptr && holder != key_;
      mode_.now = mode::plain;
      return;
    }
    bool usable = false;  // its span: made, held again or extended (out of memory: the plain cache)
    try {
      usable = a.take();
    } catch (...) {
      usable = false;
    }
    if (!usable) {
      a.unclaim();
      // take() may leave the span held for a region that pins it; if that region went while this
      // run held the claim, its release could not idle the span (idle_if_unpinned found the arena
      // claimed), and no end of this run will: idled here, or held for good.
      a.idle_if_unpinned();
      mode_.now = mode::plain;
      return;
    }
    cursor_.start(*c, a);  // throws with the claim given up
    mode_.now = mode::replay;
    return;
  }
  if (!candidates_.empty()) misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  mode_.now = mode_.may_record ? mode::record : mode::plain;
}

void plan_run::diverge() {
  misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // Plain from here, and hashed as a plain run is, so the detector still learns whether the whole
  // sequence came before (a paused key's runs mostly begin as replays, and a loop that partly
  // repeats nearby grows on them).
  if (!mode_.may_record) hash_replayed();
  cursor_.stop();
  mode_.now = mode_.may_record ? mode::record : mode::plain;
}

void plan_run::hash_replayed() noexcept {
  const plan& replayed = *cursor_.current();
  for (std::uint64_t p = 0, end = cursor_.position(); p < end; ++p) recorder_.probed(replayed.request(p).key.bytes);
}

}  // namespace refpool::detail
