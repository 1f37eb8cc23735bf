// Planned runs: serving a request (the inlined replay path, then by the run's mode), falling back
// to the plain cache, and tracking what is not a region. The mode machine (a run's start, plan
// switches, divergence): run_modes.cpp; what a run leaves behind at its end: run_end.cpp.
#include "plan/run.hpp"

#include <utility>

#include "cache/hit_path.hpp"

namespace refpool::detail {

plan_run* plan_run::open(cache_state& cache, std::string_view key, bool shared, pass_ticket& passing) {
  return plan_store::of(cache).begin_run(key, shared, passing);
}

plan_run::plan_run(cache_state& cache, plan_store& store, key_state* key, run_kind kind, std::vector<plan*> candidates,
                   bool may_record, bool shared)
    : cache_(cache),
      store_(store),
      key_(key),
      shared_(shared),
      mode_{kind == run_kind::probe ? mode::probe : mode::start, may_record},
      candidates_(std::move(candidates)),
      cursor_(shared ? nullptr : this_thread_token()) {
  for (plan* p : candidates_) p->retain();
  cache_.retain();  // until its end (finish)
}

plan_run::~plan_run() {
  if (mode_.now != mode::finished) {  // never started (a step that could not open): no run to count
    store_.abandon_run(this);
    for (plan* p : candidates_) p->release();
    recorder_.release_backend();
    cache_.release();  // a finished run gave both back at its end
  }
}

// ---- serving requests ---------------------------------------------------------------------

block* plan_run::acquire(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (shared_) {
    const serving_section serving(serving_);
    return serve(lease, backend, bytes, stream);
  }
  return serve(lease, backend, bytes, stream);
}

// The replay path: the request is the one the plan recorded at this position. serve, replay_one
// and the cursor's take_region are inlined into acquire: as calls, their prologues, epilogues and
// the try's set-up cost 51 of a replayed request's 469 instructions (callgrind,
// bench/host/instructions.sh).
[[gnu::always_inline]] inline block* plan_run::serve(slot* lease, backend_state& backend, std::size_t bytes,
                                                     stream_ref stream) {
  const std::uint64_t at = cursor_.position();
  if (mode_.now == mode::replay && at < cursor_.current()->size()) [[likely]] {
    const planned_request& want = cursor_.request(at);
    if (want.key.bytes == bytes && want.key.backend == &backend && want.stream == stream) [[likely]]
      return replay_one(lease, backend, bytes, stream, at);
  }
  return serve_slow(lease, backend, bytes, stream);
}

[[gnu::always_inline]] inline block* plan_run::replay_one(slot* lease, backend_state& backend, std::size_t bytes,
                                                          stream_ref stream, std::uint64_t at) {
  cursor_.advance(at + 1);
  try {
    if (block* b = cursor_.take_region(at, stream, [this](std::uint64_t a) { return blocked(a); })) [[likely]] {
      hits.store(hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      return b;
    }
    // A live handle can still reach these bytes, or the streams they were lent to cannot be
    // ordered before this one now (a graph capture): this request alone goes to the plain cache.
    misses.store(misses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    recorder_.reserve();
    block* b = fallback(lease, backend, bytes, stream);
    track(b, cursor_.request(at), at);
    return b;
  } catch (...) {
    cursor_.advance(at);  // nothing was served: the next request takes this position again
    throw;
  }
}

block* plan_run::serve_slow(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  if (mode_.now == mode::probe && lease != nullptr) {
    // Does the key repeat again? Only the sizes are seen: nothing is tracked or matched, and the
    // request takes the plain path as a step without a run does (the inlined hit first: through
    // acquire alone a probed request cost 1.2x a plain one, callgrind).
    recorder_.probed(bytes);  // asked for, served or not: probes that fail are no repeats of each other
    const block_key key = cache_.key_of(backend, bytes);
    block* b = cache_.try_hit(*lease, key, stream);
    if (b != nullptr) [[likely]] {
      b->requested = bytes;
      b->refs.reset(1);
    } else {
      b = cache_.acquire(*lease, backend, key, bytes, stream);
    }
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
      // Hashed as a probe is: a run plain from its start (its key paused, its arena busy) still
      // tells the detector whether its sequence came before (docs/design.md, "A key that does not repeat").
      recorder_.probed(bytes);
      block* b = fallback(lease, backend, bytes, stream);
      if (lease == nullptr) track(b, request, at);  // its escape is counted by the run
      cursor_.advance(at + 1);
      return b;
    }
    default: return fallback(lease, backend, bytes, stream);  // a step's late request after its end
  }
}

bool plan_run::blocked(std::uint64_t at) { return cursor_.blocked(at); }

block* plan_run::fallback(slot* lease, backend_state& backend, std::size_t bytes, stream_ref stream) {
  return lease != nullptr ? cache_.acquire(*lease, backend, cache_.key_of(backend, bytes), bytes, stream)
                          : cache_.allocate_uncached(backend, bytes, stream);
}

void plan_run::track(block* b, const planned_request& request, std::uint64_t at) noexcept {
  retain();  // released by observe_release
  recorder_.track(b, request, at, this);
}

void plan_run::observe_release(block* b, bool) noexcept {
  recorder_.released(b->observer_index, cursor_);
  release();
}

}  // namespace refpool::detail
