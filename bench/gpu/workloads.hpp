// The GPU benchmark workloads, each a template over the allocator interface of allocators.hpp.
// They time host-side allocation cost only: no kernels run, so the numbers are what a training
// loop pays per request, whatever its kernels do.
#pragma once

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#include "../timing.hpp"
#include "allocators.hpp"

namespace refpool::bench {

template <class A>
constexpr bool is_refpool = std::is_same_v<A, refpool_allocator>;

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Makes device 0's primary context current on this thread, as the raw driver anchors need
/// (refpool, CUB and PyTorch make it current themselves).
inline void use_device_0() { check(driver().cuCtxSetCurrent(detail::cuda::context(0)), "cuCtxSetCurrent"); }

/// Device memory in use now (all allocators and contexts), from cuMemGetInfo.
inline std::size_t device_used_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  check(driver().cuMemGetInfo(&free, &total), "cuMemGetInfo");
  return total - free;
}

/// An allocation of `dims` elements of T: a shaped array through refpool, bytes elsewhere
/// (other allocators do not know shapes: reshaping is free for them, and useless).
template <class T, class A>
auto allocate_shaped(A& a, shape dims, CUstream s) {
  if constexpr (is_refpool<A>) {
    return a.template allocate_array<T>(std::move(dims), s);
  } else {
    return a.allocate(detail::checked_bytes(dims, sizeof(T)), s);
  }
}

template <class A, class H>
void release(A& a, H& h, CUstream s) {
  if constexpr (is_refpool<A>) {
    h = {};
  } else {
    a.deallocate(std::move(h), s);
  }
}

/// 1. One alloc + free pair of `bytes`, repeated: median ns per pair.
template <class A>
double hit_path(A& a, std::size_t bytes, std::size_t pairs, CUstream s) {
  a.begin_iteration();
  const double ns = median_ns_per_op(
      [&](std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) {
          auto h = a.allocate(bytes, s);
          keep(h);
          a.deallocate(std::move(h), s);
        }
      },
      pairs, 11);
  a.end_iteration();
  return ns;
}

/// 2. Equal byte sizes in rotating shapes and element types; returns ns per request over the
/// iterations after the first, and the requests per iteration.
template <class A>
std::pair<double, int> reshape_reuse(A& a, int iterations, CUstream s) {
  int requests = 0;
  const auto one_iteration = [&] {
    a.begin_iteration();
    auto v16 = allocate_shaped<float>(a, {16}, s);
    release(a, v16, s);
    auto m44 = allocate_shaped<float>(a, {4, 4}, s);
    auto m28 = allocate_shaped<float>(a, {2, 8}, s);
    release(a, m44, s);
    auto d8 = allocate_shaped<double>(a, {8}, s);
    release(a, m28, s);
    release(a, d8, s);
    auto big = allocate_shaped<float>(a, {1024, 1024}, s);
    auto flat = allocate_shaped<float>(a, {1048576}, s);
    release(a, big, s);
    auto wide = allocate_shaped<float>(a, {512, 2048}, s);
    auto ints = allocate_shaped<std::int32_t>(a, {256, 4096}, s);
    release(a, flat, s);
    auto halves = allocate_shaped<std::uint16_t>(a, {2048, 1024}, s);
    release(a, wide, s);
    release(a, ints, s);
    release(a, halves, s);
    a.end_iteration();
    requests = 10;
  };
  one_iteration();
  const auto start = clock_type::now();
  for (int i = 1; i < iterations; ++i) one_iteration();
  return {seconds_since(start) * 1e9 / ((iterations - 1) * 10.0), requests};
}

/// 3. The allocation sequence of an MLP training step (batch 128, layers 1024-4096-4096-1024):
/// weights persistent, activations and gradients temporary, freed in a mixed order.
struct training_result {
  double us_per_iteration = 0;
  int requests_per_iteration = 0;
  std::vector<std::size_t> used_bytes;          ///< device memory in use above the start, every sample_every
  std::uint64_t steady_driver_allocations = 0;  ///< after iteration 1 (where the allocator tells)
  bool driver_count_known = false;
};

template <class A>
training_result training_trace(A& a, int iterations, int sample_every, CUstream s) {
  constexpr std::size_t B = 128, D_in = 1024, H = 4096, D_out = 1024;
  training_result out;
  const std::size_t baseline = device_used_bytes();
  auto w1 = allocate_shaped<float>(a, {D_in, H}, s);  // persistent: outside any scope
  auto w2 = allocate_shaped<float>(a, {H, H}, s);
  auto w3 = allocate_shaped<float>(a, {H, D_out}, s);
  std::uint64_t driver_after_first = 0;
  const auto step = [&] {
    a.begin_iteration();
    auto x = allocate_shaped<float>(a, {B, D_in}, s);
    auto h1 = allocate_shaped<float>(a, {B, H}, s);
    auto a1 = allocate_shaped<float>(a, {B, H}, s);
    auto h2 = allocate_shaped<float>(a, {B, H}, s);
    auto a2 = allocate_shaped<float>(a, {B, H}, s);
    auto y = allocate_shaped<float>(a, {B, D_out}, s);
    auto dy = allocate_shaped<float>(a, {D_out, B}, s);  // another shape, same bytes as y
    release(a, y, s);
    auto dw3 = allocate_shaped<float>(a, {H, D_out}, s);
    auto da2 = allocate_shaped<float>(a, {B, H}, s);
    release(a, a2, s);
    auto dh2 = allocate_shaped<float>(a, {B * H}, s);
    release(a, da2, s);
    auto dw2 = allocate_shaped<float>(a, {H, H}, s);
    auto da1 = allocate_shaped<float>(a, {H, B}, s);
    release(a, h2, s);
    auto dh1 = allocate_shaped<float>(a, {B, H}, s);
    release(a, da1, s);
    release(a, a1, s);
    auto dw1 = allocate_shaped<float>(a, {D_in, H}, s);  // the bytes of dw3, transposed shape
    release(a, h1, s);
    release(a, x, s);
    release(a, dh1, s);
    release(a, dh2, s);
    release(a, dy, s);
    release(a, dw1, s);  // optimizer step: gradients go in forward order
    release(a, dw2, s);
    release(a, dw3, s);
    a.end_iteration();
    out.requests_per_iteration = 15;
  };
  step();
  if (const auto c = a.report(); c.driver_allocations) driver_after_first = *c.driver_allocations;
  std::vector<double> times;
  const auto start = clock_type::now();
  for (int i = 1; i < iterations; ++i) {
    step();
    if (i % sample_every == 0) out.used_bytes.push_back(device_used_bytes() - std::min(baseline, device_used_bytes()));
  }
  out.us_per_iteration = seconds_since(start) * 1e6 / (iterations - 1);
  if (const auto c = a.report(); c.driver_allocations) {
    out.steady_driver_allocations = *c.driver_allocations - driver_after_first;
    out.driver_count_known = true;
  }
  release(a, w1, s);
  release(a, w2, s);
  release(a, w3, s);
  return out;
}

/// 4. RMM-style random allocations: sizes uniform in [1, max_bytes], allocate with probability
/// 0.73 while under the live cap, else free a random live allocation.
struct random_result {
  double ns_per_op = 0;
  std::size_t peak_live_bytes = 0;
  std::uint64_t allocations = 0;
};

template <class A>
random_result random_allocations(A& a, std::size_t max_bytes, int ops, std::size_t live_cap, CUstream s,
                                 unsigned seed = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> size(1, max_bytes);
  std::bernoulli_distribution allocate_now(0.73);
  using handle = typename A::handle;
  std::vector<std::pair<handle, std::size_t>> live;
  random_result out;
  std::size_t live_bytes = 0;
  a.begin_iteration();
  const auto start = clock_type::now();
  for (int op = 0; op < ops; ++op) {
    if (live.empty() || (allocate_now(rng) && live_bytes < live_cap)) {
      const std::size_t bytes = size(rng);
      live.emplace_back(a.allocate(bytes, s), bytes);
      live_bytes += bytes;
      out.peak_live_bytes = std::max(out.peak_live_bytes, live_bytes);
      ++out.allocations;
    } else {
      const std::size_t i = rng() % live.size();
      live_bytes -= live[i].second;
      a.deallocate(std::move(live[i].first), s);
      live[i] = std::move(live.back());
      live.pop_back();
    }
  }
  out.ns_per_op = seconds_since(start) * 1e9 / ops;
  for (auto& [h, bytes] : live) a.deallocate(std::move(h), s);
  a.end_iteration();
  return out;
}

/// 5. `threads` host threads, each with its own scope (refpool) doing alloc + free pairs of
/// `bytes` on its own stream. Returns total pairs per second.
template <class A>
double threaded_pairs(A& a, int threads, std::size_t bytes, std::size_t pairs_per_thread) {
  std::vector<refpool::cuda::stream> streams;
  for (int t = 0; t < threads; ++t) streams.emplace_back(0);
  const auto body = [&](int t) {
    use_device_0();
    const CUstream s = static_cast<CUstream>(streams[static_cast<std::size_t>(t)].ref().handle);
    std::optional<scope> per_thread;
    if constexpr (is_refpool<A>) per_thread.emplace(a.cache());
    for (std::size_t i = 0; i < pairs_per_thread; ++i) {
      auto h = a.allocate(bytes, s);
      keep(h);
      a.deallocate(std::move(h), s);
    }
  };
  std::vector<double> rates;
  for (int repeat = 0; repeat < 5; ++repeat) {
    std::vector<std::thread> pool;
    const auto start = clock_type::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
    for (auto& t : pool) t.join();
    rates.push_back(static_cast<double>(pairs_per_thread) * threads / seconds_since(start));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace refpool::bench
