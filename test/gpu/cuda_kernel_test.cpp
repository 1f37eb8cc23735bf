// Kernels that take their inputs, outputs and temporaries from the pool, checked against the
// host; and the cross-stream race that stream ordering must prevent.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include <refpool/refpool.hpp>

#include "device_helpers.hpp"
#include "support/gpu_modules.hpp"

using namespace refpool;
using refpool::test::download;
using refpool::test::grid_for;
using refpool::test::kernels;
using refpool::test::upload;
using refpool::test::words;

namespace {

// Writes `first` on stream a after a long wait, then `second` on stream b into the buffer that
// `second_buffer` returns. Returns what the buffer holds at the end.
template <class Reuse>
std::vector<std::uint32_t> write_twice(cuda::stream& a, cuda::stream& b, Reuse second_buffer) {
  array<std::uint32_t> buffer = second_buffer(nullptr, a);
  refpool::test::fill_late(a, buffer.data(), words, 1);
  array<std::uint32_t> reused = second_buffer(&buffer, b);  // released while a still writes
  refpool::test::fill_now(b, reused.data(), words, 2);
  b.synchronize();
  a.synchronize();
  return download(reused, b);
}

}  // namespace

TEST_CASE("reuse on another stream waits for the old stream's work", "[cuda][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{cache_options{}};
  // Through the cache: the reused block's new stream waits for the long write on a.
  const auto through_cache = write_twice(a, b, [&](array<std::uint32_t>* old, cuda::stream& s) {
    scope sc(cache);
    if (old != nullptr) *old = {};
    return empty<std::uint32_t>(be, {words}, s);
  });
  CHECK(cache.stats().cross_stream_reuses == 1);
  CHECK(cache.stats().misses == 1);
  CHECK(std::all_of(through_cache.begin(), through_cache.end(), [](std::uint32_t v) { return v == 2; }));
  // Control: the same reuse without stream ordering shows the race this test is built to catch
  // (the late write of 1 lands after the write of 2), so a missing wait above would fail it.
  const auto raw = write_twice(a, b, [&](array<std::uint32_t>* old, cuda::stream&) {
    return old != nullptr ? *old : empty<std::uint32_t>(be, {words});
  });
  CHECK(std::all_of(raw.begin(), raw.end(), [](std::uint32_t v) { return v == 1; }));
}

TEST_CASE("record_stream makes reuse wait for every stream that used the buffer", "[cuda][streams]") {
  const backend be = cuda::device(0);
  cuda::stream a;
  cuda::stream b;
  cuda::stream c;
  alloc_cache cache{cache_options{}};
  std::vector<std::uint32_t> result;
  {
    scope sc(cache);
    auto buffer = empty<std::uint32_t>(be, {words}, a);
    buffer.record_stream(b);  // also used on b: a long write there
    refpool::test::fill_late(b, buffer.data(), words, 1);
    buffer = {};
    auto reused = empty<std::uint32_t>(be, {words}, c);  // last used on a, recorded on b
    refpool::test::fill_now(c, reused.data(), words, 2);
    c.synchronize();
    b.synchronize();
    result = download(reused, c);
  }
  CHECK(std::all_of(result.begin(), result.end(), [](std::uint32_t v) { return v == 2; }));
}

TEST_CASE("stream-ordered memory is reused across streams safely", "[cuda][streams]") {
  const backend be = cuda::device(0, memory_kind::device_async);
  cuda::stream a;
  cuda::stream b;
  alloc_cache cache{cache_options{}};
  const auto result = write_twice(a, b, [&](array<std::uint32_t>* old, cuda::stream& s) {
    scope sc(cache);
    if (old != nullptr) *old = {};
    return empty<std::uint32_t>(be, {words}, s);
  });
  CHECK(std::all_of(result.begin(), result.end(), [](std::uint32_t v) { return v == 2; }));
  CHECK(cache.stats().cross_stream_reuses == 1);
}

TEST_CASE("saxpy and a reduction on pool buffers match the host", "[cuda][kernels]") {
  const backend be = cuda::device(0);
  cuda::stream s;
  alloc_cache cache{cache_options{}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  const std::uint32_t n = 1'000'003;
  for (int iteration = 0; iteration < 5; ++iteration) {
    scope sc(cache);
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = dist(rng);
    for (auto& v : y) v = dist(rng);
    const float alpha = dist(rng);
    auto dx = empty<float>(be, {n}, s);
    auto dy = empty<float>(be, {n}, s);
    upload(dx, x, s);
    upload(dy, y, s);
    refpool::test::gpu_modules::launch_with(kernels().function("saxpy"), grid_for(n), {256}, s, n, alpha, dx.data(),
                                            dy.data());
    const unsigned blocks = 512;
    auto partial = empty<double>(be, {blocks}, s);
    refpool::test::gpu_modules::launch_with(kernels().function("partial_sums"), {blocks}, {256}, s, n,
                                            static_cast<const float*>(dy.data()), partial.data());
    const auto got = download(dy, s);
    const auto sums = download(partial, s);
    double expected_sum = 0;
    for (std::uint32_t i = 0; i < n; ++i) {
      const float want = std::fma(alpha, x[i], y[i]);  // the GPU contracts a * x + y into one FMA
      if (got[i] != want) FAIL("saxpy element " << i << ": " << got[i] << " != " << want);
      expected_sum += want;
    }
    CHECK(std::accumulate(sums.begin(), sums.end(), 0.0) == Approx(expected_sum).epsilon(1e-9));
  }
  CHECK(cache.stats().misses == 3);
}

namespace {

// Host reference of the kernel's C = op(A) op(B).
std::vector<float> host_matmul(std::size_t m, std::size_t n, std::size_t k, const std::vector<float>& a, bool ta,
                               const std::vector<float>& b, bool tb) {
  std::vector<float> c(m * n, 0.0f);
  for (std::size_t row = 0; row < m; ++row)
    for (std::size_t col = 0; col < n; ++col) {
      float acc = 0;
      for (std::size_t i = 0; i < k; ++i)
        acc += (ta ? a[i * m + row] : a[row * k + i]) * (tb ? b[col * k + i] : b[i * n + col]);
      c[row * n + col] = acc;
    }
  return c;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("MLP forward and backward: equal byte sizes in other shapes, no driver calls after step 1",
          "[cuda][kernels][mlp]") {
  // X: B x D, W1: D x H, W2: H x D, Y: B x D. With B = H = 256 and D = 1024, X, W1, W2, Y, their
  // gradients and the loss gradient are all 1 MiB, in shapes 256x1024 and 1024x256.
  constexpr std::uint32_t B = 256, D = 1024, H = 256;
  const backend be = cuda::device(0);
  cuda::stream s;
  alloc_cache cache{cache_options{}};
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0, 0.05f);
  std::vector<float> x(B * D), t(B * D), w1(D * H), w2(H * D);
  for (auto* v : {&x, &t, &w1, &w2})
    for (auto& e : *v) e = dist(rng);
  auto d_w1 = empty<float>(be, {D, H}, s);  // persistent weights: outside any scope
  auto d_w2 = empty<float>(be, {H, D}, s);
  upload(d_w1, w1, s);
  upload(d_w2, w2, s);
  const auto mm = kernels().function("matmul");
  const auto matmul = [&](std::uint32_t m, std::uint32_t n, std::uint32_t k, const array<float>& a, int ta,
                          const array<float>& b, int tb, const array<float>& c) {
    refpool::test::gpu_modules::launch_with(mm, {(n + 15) / 16, (m + 15) / 16}, {16, 16}, s, m, n, k,
                                            static_cast<const float*>(a.data()), ta,
                                            static_cast<const float*>(b.data()), tb, c.data());
  };
  const auto elementwise = [&](const char* name, auto... args) {
    refpool::test::gpu_modules::launch_with(kernels().function(name), grid_for(B * D), {256}, s, args...);
  };
  std::uint64_t driver_allocations_after_first = 0;
  std::uint64_t misses_after_first = 0;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> got_dw1, got_dw2;
    {
      scope sc(cache);
      auto d_x = empty<float>(be, {B, D}, s);
      auto d_t = empty<float>(be, {B * D}, s);  // flat, same bytes
      upload(d_x, x, s);
      upload(d_t, t, s);
      auto pre = empty<float>(be, {B, H}, s);
      matmul(B, H, D, d_x, 0, d_w1, 0, pre);
      auto act = empty<float>(be, {B, H}, s);
      elementwise("relu", B * H, static_cast<const float*>(pre.data()), act.data());
      auto y = empty<float>(be, {B, D}, s);
      matmul(B, D, H, act, 0, d_w2, 0, y);
      auto dy = empty<float>(be, {D, B}, s).reshape({B, D});  // allocated in another shape
      elementwise("difference", B * D, static_cast<const float*>(y.data()), static_cast<const float*>(d_t.data()),
                  2.0f / (B * D), dy.data());
      y = {};
      auto dw2 = empty<float>(be, {H, D}, s);  // y's block, reshaped
      matmul(H, D, B, act, 1, dy, 0, dw2);
      auto dact = empty<float>(be, {B, H}, s);
      matmul(B, H, D, dy, 0, d_w2, 1, dact);
      auto dpre = empty<float>(be, {B, H}, s);
      elementwise("relu_backward", B * H, static_cast<const float*>(pre.data()), static_cast<const float*>(dact.data()),
                  dpre.data());
      auto dw1 = empty<float>(be, {D, H}, s);
      matmul(D, H, B, d_x, 1, dpre, 0, dw1);
      if (step == 0 || step == 3) {
        got_dw1 = download(dw1, s);
        got_dw2 = download(dw2, s);
      }
    }
    if (step == 0) {
      driver_allocations_after_first = be.allocation_count();
      misses_after_first = cache.stats().misses;
    }
    if (!got_dw1.empty()) {  // host reference of the same step (weights are not updated)
      auto pre = host_matmul(B, H, D, x, false, w1, false);
      std::vector<float> act(pre.size());
      for (std::size_t i = 0; i < pre.size(); ++i) act[i] = pre[i] > 0 ? pre[i] : 0;
      auto y = host_matmul(B, D, H, act, false, w2, false);
      std::vector<float> dy(y.size());
      for (std::size_t i = 0; i < y.size(); ++i) dy[i] = (y[i] - t[i]) * (2.0f / (B * D));
      auto dw2 = host_matmul(H, D, B, act, true, dy, false);
      auto dact = host_matmul(B, H, D, dy, false, w2, true);
      std::vector<float> dpre(dact.size());
      for (std::size_t i = 0; i < dact.size(); ++i) dpre[i] = pre[i] > 0 ? dact[i] : 0;
      auto dw1 = host_matmul(D, H, B, x, true, dpre, false);
      CHECK(relative_error(got_dw2, dw2) < 1e-5);
      CHECK(relative_error(got_dw1, dw1) < 1e-5);
    }
  }
  CHECK(be.allocation_count() == driver_allocations_after_first);
  const auto st = cache.stats();
  CHECK(st.escapes == 0);
  CHECK(st.hits + st.misses == 4 * 10);    // ten requests a step
  CHECK(st.misses == misses_after_first);  // steps 2..4: every request a hit
  CHECK(st.misses < 10);                   // released temporaries were reused inside step 1
}
