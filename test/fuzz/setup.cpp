// An input's start: the backends, the two caches and their options as the input's bytes decode
// them, and the operation loop; also the decoding of array dims shared by the operations.
#include "session.hpp"

namespace refpool::test::fuzz {

void session::make_backends() {
  constexpr std::size_t small[] = {2048, 4096, 8192, 16384, 65536};
  const std::size_t caps[backends] = {backend0_capacity, small[in_.below(std::size(small))]};
  for (int b = 0; b < backends; ++b) {
    limited_[b] = std::make_shared<rp::limiting_resource>(rp::make_host_resource(), caps[b]);
    failing_[b] = std::make_shared<rp::failing_resource>(limited_[b]);
    be_[b] = rp::backend(std::make_shared<tracking_resource>(failing_[b], b, log_, gate_));
    m_.be[b].capacity = caps[b];
  }
}

rp::cache_options session::decode_options(int t, model_rounding& rounding) {
  rp::cache_options options;
  const std::size_t choice = in_.below(12);
  rounding = {};
  switch (choice) {
    case 0:
    case 1: options.auto_plans = false; break;  // key-less steps plain (the input's bytes decode as before)
    case 2:
    case 3: break;
    case 4: rounding = {model_rounding::mode::step, 8}; break;
    case 5: rounding = {model_rounding::mode::step, 64}; break;
    case 6: rounding = {model_rounding::mode::step, 100}; break;
    case 7: rounding = {model_rounding::mode::step, 512}; break;
    case 8: rounding = {model_rounding::mode::pow2, 1}; break;
    case 9: rounding = {model_rounding::mode::pow2, 2}; break;
    case 10: rounding = {model_rounding::mode::pow2, 4}; break;
    default: {  // a bad policy first: config_error, then exact
      const std::size_t bad = in_.below(4);
      const result r = on(t, [&] {
        if (bad == 0) (void)rp::rounding_policy::step(0);
        if (bad == 1) (void)rp::rounding_policy::pow2(0);
        if (bad == 2) (void)rp::rounding_policy::pow2(3);
        if (bad == 3) (void)rp::rounding_policy::pow2(128);
      });
      expect(r, outcome::config_error, "a bad rounding policy");
      break;
    }
  }
  if (rounding.how == model_rounding::mode::step) options.rounding = rp::rounding_policy::step(rounding.parameter);
  if (rounding.how == model_rounding::mode::pow2)
    options.rounding = rp::rounding_policy::pow2(static_cast<unsigned>(rounding.parameter));
  options.max_idle_bytes = limits[in_.below(std::size(limits))];
  return options;
}

std::vector<std::size_t> session::make_dims(std::size_t count) {
  std::vector<std::size_t> dims;
  if (count == 0) {
    const std::size_t rank = 1 + in_.below(3);
    for (std::size_t i = 0; i < rank; ++i) dims.push_back(in_.below(5));
    dims[in_.below(rank)] = 0;
    return dims;
  }
  std::size_t rank = in_.below(5);
  if (rank == 0 && count != 1) rank = 1;
  std::size_t rest = count;
  for (std::size_t k = 0; k + 1 < rank; ++k) {
    std::size_t divisors[64];
    std::size_t n = 0;
    for (std::size_t d = 1; d <= rest && n < 64; ++d)
      if (rest % d == 0) divisors[n++] = d;
    const std::size_t d = divisors[in_.below(n)];
    dims.push_back(d);
    rest /= d;
  }
  if (rank > 0) dims.push_back(rest);
  return dims;
}

std::vector<std::size_t> session::overflow_dims() {
  switch (in_.below(3)) {
    case 0: return {huge / 2 + 1, 3};
    case 1: return {std::size_t{1} << 33, std::size_t{1} << 33};
    default: return {huge, 2, 1};
  }
}

void session::run() {
  seed_ = in_.byte();
  shadow_ = std::make_unique<segment_shadow>(seed_, [](int t, const std::function<void()>& job) {
    if (t == 0)
      job();
    else
      helper().run(job);
  });
  make_backends();
  for (int c = 0; c < 2; ++c) {
    model_rounding rounding;
    const rp::cache_options options = decode_options(0, rounding);
    cache_[c] = std::make_unique<rp::alloc_cache>(options);
    cur_[c] = m_.new_cache(rounding, options.max_idle_bytes, options.auto_plans);
  }
  // Most inputs start inside a scope on each thread, as code using a cache does.
  for (int t = 0; t < threads; ++t)
    if (in_.below(4) != 0) op_scope(t);
  trace("input: backend 1 holds {} B; caches: {} / {}", m_.be[1].capacity, cache_[0]->rounding().to_string(),
        cache_[1]->rounding().to_string());
  while (steps_ < max_operations && !in_.empty()) step();
  cleanup();
  all.inputs += 1;
}

}  // namespace refpool::test::fuzz
