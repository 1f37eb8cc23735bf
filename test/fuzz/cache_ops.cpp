// Operations on a cache or a backend as a whole: reclaim, a new idle limit, faults armed in a
// backend, and a cache destroyed and made again.
#include "session.hpp"

namespace refpool::test::fuzz {

void session::op_reclaim(int t) {
  const int c = in_.byte() & 1;
  const std::size_t keep = keeps[in_.below(std::size(keeps))];
  trace("thread {}: cache {}.reclaim({})", t, c, keep);
  std::size_t freed = 0;
  expect(on(t, [&] { freed = cache_[c]->reclaim(keep); }), outcome::ok, "reclaim");
  const std::size_t want = m_.reclaim(cur_[c], keep);
  if (freed != want) fail(fmt::format("reclaim({}) freed {} B, the model expected {} B", keep, freed, want));
}

void session::op_set_limit(int t) {
  const int c = in_.byte() & 1;
  const std::size_t limit = limits[in_.below(std::size(limits))];
  trace("thread {}: cache {}.set_max_idle_bytes({})", t, c, limit);
  std::size_t now = 0;
  expect(on(t,
            [&] {
              cache_[c]->set_max_idle_bytes(limit);
              now = cache_[c]->max_idle_bytes();
            }),
         outcome::ok, "set_max_idle_bytes");
  m_.set_max_idle(cur_[c], limit);
  if (now != limit) fail(fmt::format("max_idle_bytes() is {} after setting {}", now, limit));
}

void session::op_arm(int) {
  const int b = in_.byte() & 1;
  model_backend& m = m_.be[b];
  if (in_.below(4) == 0) {
    trace("backend {}: disarm", b);
    failing_[b]->disarm();
    m.count = 0;
    return;
  }
  m.first = 1 + in_.below(16);
  m.count = 1 + in_.below(3);
  m.inject_backend_error = in_.below(2) == 0;
  m.calls = 0;
  trace("backend {}: fail calls {}..{} with {}", b, m.first, m.first + m.count - 1,
        m.inject_backend_error ? "backend_error" : "out of memory");
  failing_[b]->arm(m.first, m.count,
                   m.inject_backend_error ? rp::failing_resource::failure::backend_error
                                          : rp::failing_resource::failure::out_of_memory);
}

// Destroys a cache (scopes on it may still be open, buffers from it still live) and makes another.
void session::op_recreate(int t) {
  const int c = in_.byte() & 1;
  if (in_.below(4) != 0) return op_verify(t);
  model_rounding rounding;
  const rp::cache_options options = decode_options(t, rounding);
  trace("thread {}: destroy cache {}, make one with rounding {} and max_idle_bytes {}", t, c,
        options.rounding.to_string(), options.max_idle_bytes);
  expect(on(t,
            [&] {
              cache_[c].reset();
              cache_[c] = std::make_unique<rp::alloc_cache>(options);
            }),
         outcome::ok, "destroy and make a cache");
  m_.close_cache(cur_[c]);
  cur_[c] = m_.new_cache(rounding, options.max_idle_bytes, options.auto_plans);
  if (cache_[c]->rounding() != options.rounding || cache_[c]->max_idle_bytes() != options.max_idle_bytes)
    fail("a new cache does not report the options it was made with");
  if (open_steps_[c]) {  // a step still open on the destroyed cache: ended later, by op_step or cleanup
    old_steps_.emplace_back(std::move(open_steps_[c]), step_cache_[c]);
    step_cache_[c] = -1;
  }
}

}  // namespace refpool::test::fuzz
