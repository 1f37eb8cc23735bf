// Scopes, uncached guards and steps: opening them, closing them in order, and closing them
// out of order or from the other thread (a scope_error that changes nothing).
#include "session.hpp"

namespace refpool::test::fuzz {

void session::op_scope(int t) {
  const int c = in_.byte() & 1;
  const std::size_t warmup = in_.below(8) == 0 ? 1 + in_.below(2) : 0;
  const std::string key = pick_key();
  if (frames_[t].size() >= max_depth) return op_close(t);
  trace("thread {}: scope on cache {} (warm-up {}{}{})", t, c, warmup, key.empty() ? "" : ", plan ", key);
  bool caching = false, active = false;
  expect(on(t,
            [&] {
              real_frame f;
              f.scope = std::make_unique<rp::scope>(*cache_[c], rp::scope_options{warmup, key});
              caching = f.scope->caching();
              active = rp::caching_active();
              frames_[t].push_back(std::move(f));
            }),
         outcome::ok, "scope");
  m_.enter_scope(t, cur_[c], warmup, key);
  const bool want = m_.frames[t].back().lease >= 0;
  if (caching != want || active != want)
    fail(fmt::format("scope::caching() {} caching_active() {}, the model expected {}", caching, active, want));
}

// Opens a step on a cache (planned or not, sometimes a warm-up step), or ends the open one, on
// either thread. A second step on one cache is a scope_error.
void session::op_step(int t) {
  const int c = in_.byte() & 1;
  if (!old_steps_.empty() && in_.below(4) == 0) {
    trace("thread {}: end a step of a destroyed cache", t);
    expect(on(t, [&] { old_steps_.front().first->end(); }), outcome::ok, "step end after its cache");
    m_.end_step(old_steps_.front().second);
    old_steps_.erase(old_steps_.begin());
    return;
  }
  if (open_steps_[c] && in_.below(4) != 0) {
    trace("thread {}: end the step of cache {}", t, c);
    expect(on(t,
              [&] {
                open_steps_[c]->end();
                open_steps_[c]->end();  // idempotent
                open_steps_[c].reset();
              }),
           outcome::ok, "step end");
    m_.end_step(step_cache_[c]);
    step_cache_[c] = -1;
    return;
  }
  const std::size_t warmup = in_.below(8) == 0 ? 1 + in_.below(3) : 0;
  const std::string key = pick_key();
  trace("thread {}: step on cache {} (warm-up {}{}{})", t, c, warmup, key.empty() ? "" : ", plan ", key);
  std::unique_ptr<rp::step> made;
  const result r = on(t, [&] { made = std::make_unique<rp::step>(*cache_[c], rp::scope_options{warmup, key}); });
  const outcome want = m_.open_step(cur_[c], warmup, key);
  expect(r, want, open_steps_[c] ? "a second step on one cache" : "step");
  if (want != outcome::ok) return;
  if (open_steps_[c]) fail("model: a step opened where one was open");
  open_steps_[c] = std::move(made);
  step_cache_[c] = cur_[c];
}

void session::op_guard(int t) {
  if (frames_[t].size() >= max_depth) return op_close(t);
  trace("thread {}: uncached_guard", t);
  bool active = true;
  expect(on(t,
            [&] {
              real_frame f;
              f.guard = std::make_unique<rp::uncached_guard>();
              active = rp::caching_active();
              frames_[t].push_back(std::move(f));
            }),
         outcome::ok, "uncached_guard");
  m_.enter_guard(t);
  if (active) fail("caching_active() inside an uncached_guard");
}

void session::op_close(int t) {
  if (frames_[t].empty()) return;
  trace("thread {}: close its innermost {}", t, m_.frames[t].back().guard ? "guard" : "scope");
  bool active = false;
  expect(on(t,
            [&] {
              frames_[t].back().close();
              frames_[t].back().close();  // idempotent
              frames_[t].pop_back();
              active = rp::caching_active();
            }),
         outcome::ok, "close");
  if (m_.close_frame(t, t, m_.frames[t].size() - 1) != outcome::ok) fail("model: closing the innermost frame failed");
  const bool want = !m_.frames[t].empty() && m_.frames[t].back().lease >= 0;
  if (active != want) fail(fmt::format("caching_active() {} after close, the model expected {}", active, want));
}

// Closing a scope or guard that is not the closing thread's innermost: scope_error, nothing changes.
void session::op_close_misuse(int t) {
  int owner = in_.byte() & 1;
  if (frames_[owner].empty()) owner = 1 - owner;
  if (frames_[owner].empty()) return;
  std::size_t index = in_.below(frames_[owner].size());
  if (owner == t && index + 1 == frames_[owner].size()) {
    if (index == 0) {
      if (frames_[1 - t].empty()) return;
      owner = 1 - t;
      index = frames_[owner].size() - 1;
    } else {
      index -= 1;
    }
  }
  trace("thread {}: close frame {} of thread {} (misuse)", t, index, owner);
  const result r = on(t, [&] { frames_[owner][index].close(); });
  const outcome want = m_.close_frame(t, owner, index);
  expect(r, want, "closing a scope out of order or on another thread");
  const char* says = owner == t ? "still open" : "on the thread that opened them";
  if (r.message.find("out of order") == std::string::npos || r.message.find(says) == std::string::npos)
    fail(fmt::format("scope_error message does not say why (\"{}\"): {}", says, r.message));
}

}  // namespace refpool::test::fuzz
