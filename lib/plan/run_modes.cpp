// A planned run's mode machine (run.hpp): a request past the inlined replay path starts the run
// (replay a plan whose arena it can claim, else record or serve plainly), switches plans, or
// diverges from the plan into recording; probes only fingerprint.
#include <exception>

#include "plan/run.hpp"

namespace refpool::detail {

block* plan_run::serve_slow(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (mode_.now == mode::probe && lease != nullptr) {
    // Does the key repeat again? Only the sizes are seen: nothing is tracked or matched.
    recorder_.probed(bytes);  // asked for, served or not: probes that fail are no repeats of each other
    block* b = cache_.acquire(*lease, backend, cache_.key_of(backend, bytes), bytes, stream);
    cursor_.advance(cursor_.position() + 1);
    return b;
  }
  if (mode_.now != mode::finished) mode_.asked = true;
  const backend_state& bs = backend;
  const planned_request request{{&bs, bs.device(), bs.kind(), bs.alignment(), bytes}, stream};
  const std::uint64_t at = cursor_.position();
  if (mode_.now == mode::start) {
    begin_with(request);
  } else if (mode_.now == mode::replay && !cursor_.switch_to(candidates_, request, at)) {
    diverge();
  }
  switch (mode_.now) {
    case mode::replay: return replay_one(lease, backend, bytes, stream, at);
    case mode::record: {
      // A new sequence: served by the plain cache, as the default path would serve it (no
      // driver call a request, no memory beside the cache's), and tracked, since it may become a
      // plan at the end (the store keeps it pending until the sequence comes again).
      recorder_.reserve();
      block* b = fallback(lease, backend, bytes, stream);
      track(b, request, at);  // only now that it succeeded: a request that threw is no part of it
      cursor_.advance(at + 1);
      return b;
    }
    case mode::probe:  // without a lease (not a step's or scope's request)
    case mode::plain: {
      if (lease == nullptr) recorder_.reserve();
      if (mode_.now == mode::probe) recorder_.probed(bytes);
      block* b = fallback(lease, backend, bytes, stream);
      if (lease == nullptr) track(b, request, at);  // its escape is counted by the run
      cursor_.advance(at + 1);
      return b;
    }
    default: return fallback(lease, backend, bytes, stream);  // a step's late request after its end
  }
}

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
  cursor_.stop();
  mode_.now = mode_.may_record ? mode::record : mode::plain;
}

}  // namespace refpool::detail
