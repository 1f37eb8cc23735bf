// Requests in flight: a request on the helper thread held inside its backend call (the call
// gate, tracking_resource.hpp) while the main thread acts on what the request will reach when it
// completes (docs/design.md, "Lifetimes"): it destroys the request's cache, ends the step the
// request routes through, reclaims, or releases a buffer (a handle dropped, a hand-over freed by
// pointer). The request is a cache-level one (its thread's slot, or the open step's router) or
// one through the helper's innermost scope (its lease; uncached under a guard or a warm-up entry).
//
// The model applies the effects in the order they land. The main thread's come first: they are
// logged before the request's backend call, the request found nothing idle before them, and a
// buffer they release is never one the request could take. The request follows (its block is
// then homed in a slot its cache orphaned, if the cache went). Only a step's end comes after a
// cache-level request in the model, which was made in the step. A request that needs no backend
// call (a hit) is not held: it completes first, and the main thread acts after it.
//
// Not held: requests of planned scopes and steps. A run serves under its own lock and may grow an
// arena under the arena's, which the main thread's operations take too.
#include <refpool/pointer.hpp>

#include "session.hpp"

namespace refpool::test::fuzz {

namespace {

enum class meanwhile { destroy_cache, end_step, reclaim, nothing, drop_handle, free_pointer };
constexpr meanwhile actions[] = {meanwhile::destroy_cache, meanwhile::end_step,    meanwhile::reclaim,
                                 meanwhile::nothing,       meanwhile::drop_handle, meanwhile::free_pointer};

const char* describe(meanwhile a) {
  switch (a) {
    case meanwhile::destroy_cache: return "destroys the cache";
    case meanwhile::end_step: return "ends its step";
    case meanwhile::reclaim: return "reclaims";
    case meanwhile::nothing: return "waits";
    case meanwhile::drop_handle: return "drops a handle";
    case meanwhile::free_pointer: return "frees a buffer by pointer";
  }
  return "?";
}

}  // namespace

void session::op_in_flight(int) {
  const int chosen = in_.byte() & 1;
  const bool cache_level = in_.below(2) == 0;
  const meanwhile action = actions[in_.below(std::size(actions))];
  const model_frame* frame = m_.frames[1].empty() ? nullptr : &m_.frames[1].back();
  if (cache_level && (loop_cache_ >= 0 || m_.caches[static_cast<std::size_t>(cur_[chosen])].step_run >= 0))
    return op_cache_alloc(1);
  if (!cache_level && frame != nullptr && frame->run >= 0) return op_alloc_raw(1);
  // The model cache the request goes to (-1: none, it goes straight to the backend), and which
  // of the harness's caches the main thread acts on: that one, while it is not destroyed yet.
  const int target = cache_level ? cur_[chosen] : frame != nullptr && frame->lease >= 0 ? frame->cache : -1;
  const int c = !cache_level && target >= 0 && cur_[1 - chosen] == target ? 1 - chosen : chosen;
  const int hi = pick_handle();
  const int b = pick_backend();
  const std::size_t bytes = raw_sizes[in_.below(std::size(raw_sizes))];
  void* stream = pick_stream();
  const std::uint64_t stamp = next_stamp();
  const int victim = static_cast<int>(in_.below(handle_count));
  const std::size_t pointer_pick = in_.below(16);
  trace("thread 1: {}({} B, backend {}, stream {}) -> handle {}, held in the backend while thread 0 {}",
        cache_level ? fmt::format("cache {}.allocate", c) : std::string("allocate"), bytes, b, stream, hi,
        describe(action));
  pre_drop_verify(hi);

  // A buffer whose release the request could have been served from, had the release come first.
  std::size_t rounded = 0;
  const bool has_key = target >= 0 && m_.caches[static_cast<std::size_t>(target)].rounding.round(bytes, rounded);
  const auto takeable = [&](std::uint64_t gid) {
    if (gid == 0 || !has_key) return false;
    const model_block& blk = m_.blocks.at(gid);
    return blk.kind == block_kind::cached && blk.cache == target && blk.backend == b && blk.capacity == rounded;
  };

  void* got = nullptr;
  result r;
  rp::alloc_cache* cache = cache_[c].get();
  const std::function<void()> job = [&] {
    r = attempt([&] {
      rp::data_ref ref = cache_level ? cache->allocate(be_[b], bytes, rp::stream_ref{stream})
                                     : rp::allocate(be_[b], bytes, rp::stream_ref{stream});
      got = ref.data();
      fill(got, 0, bytes, stamp);
      h_[hi] = std::move(ref);
    });
  };
  // What thread 0 does, for real and in the model (apart: the step a cache-level request routes
  // through ends for real while the request is held, but in the model after it).
  bool ended_step = false;
  bool released = false;
  const auto act = [&] {
    op_thread = 0;
    switch (action) {
      case meanwhile::destroy_cache:
        if (cache_level) m_.lease_ambient(target, 1);  // the request leased its thread's slot before it missed
        expect(on(0, [&] { cache_[c] = std::make_unique<rp::alloc_cache>(rp::cache_options{}); }), outcome::ok,
               "destroy a cache while a request is in flight");
        m_.close_cache(cur_[c]);
        cur_[c] = m_.new_cache(model_rounding{}, unlimited, true);
        if (open_steps_[c]) {  // ended later, by op_step or cleanup
          old_steps_.emplace_back(std::move(open_steps_[c]), step_cache_[c]);
          step_cache_[c] = -1;
        }
        break;
      case meanwhile::end_step:
        if (!open_steps_[c]) break;
        expect(on(0, [&] { open_steps_[c].reset(); }), outcome::ok, "end a step while a request is in flight");
        ended_step = true;
        if (!cache_level) {  // not the request's router: its effects (a plan's arena) land first
          m_.end_step(step_cache_[c]);
          step_cache_[c] = -1;
        }
        break;
      case meanwhile::reclaim: {
        const std::size_t keep = keeps[pointer_pick % std::size(keeps)];
        std::size_t freed = 0;
        expect(on(0, [&] { freed = cache_[c]->reclaim(keep); }), outcome::ok, "reclaim while a request is in flight");
        const std::size_t want = m_.reclaim(cur_[c], keep);
        if (freed != want) fail(fmt::format("reclaim({}) freed {} B, the model expected {} B", keep, freed, want));
        break;
      }
      case meanwhile::nothing: break;
      case meanwhile::drop_handle: {
        const model_handle& m = mh_[victim];
        if (victim == hi || (takeable(m.gid) && m_.blocks.at(m.gid).refs == 1)) break;
        trace("drop handle {}", victim);
        pre_drop_verify(victim);
        expect(on(0, [&] { h_[victim] = std::monostate{}; }), outcome::ok, "drop while a request is in flight");
        drop_model(victim);
        released = true;
        break;
      }
      case meanwhile::free_pointer: {
        if (pointers_.empty()) break;
        const std::size_t i = pointer_pick % pointers_.size();
        const std::uint64_t gid = pointers_[i].gid;
        if (takeable(gid) && m_.blocks.at(gid).refs == 1) break;
        free_kept(0, i);
        released = true;
        break;
      }
    }
  };

  gate_.arm();
  op_thread = 1;
  helper().start(job);
  while (!gate_.parked() && !helper().finished()) std::this_thread::yield();
  const bool held = gate_.disarm();
  if (held) {  // while the request waits in the backend
    act();
    all.held_destroyed += action == meanwhile::destroy_cache;
    all.held_step_ended += ended_step;
    all.held_reclaimed += action == meanwhile::reclaim;
    all.held_released += released;
    all.held_in_scopes += !cache_level;
  }
  gate_.let_go();
  helper().finish();
  op_thread = 1;
  std::uint64_t gid = 0;
  std::size_t oom = 0;
  const outcome want = cache_level ? m_.cache_allocate(1, target, b, bytes, stream, gid, oom)
                                   : m_.allocate(1, b, bytes, stream, gid, oom);
  const auto model_step_end = [&] {
    if (!ended_step || !cache_level) return;
    m_.end_step(step_cache_[c]);
    step_cache_[c] = -1;
  };
  if (held) model_step_end();  // before the handle's old buffer goes: that went after the step
  all.cache_level += cache_level;
  expect(r, want, cache_level ? "alloc_cache::allocate in flight" : "allocate in flight");
  if (want == outcome::out_of_memory) check_oom(r, oom);
  if (want == outcome::ok) {
    accept_block(gid, got, stamp, "a request in flight");
    drop_model(hi);
    mh_[hi] = model_handle{};
    mh_[hi].kind = ref_kind;
    mh_[hi].gid = gid;
  }
  if (!held) {  // a request that needed no backend call completed first
    act();
    model_step_end();
  }
}

}  // namespace refpool::test::fuzz
