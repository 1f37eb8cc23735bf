// Helpers shared by the CUDA tests: the test kernels' module, launches sized for n elements,
// and copies between host vectors and device arrays.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/gpu_modules.hpp"

namespace refpool::test {

/// The PTX built from test/gpu/kernels.cu (path compiled in by Meson), loaded once on device 0.
inline const gpu_modules::cuda_module& kernels() {
  static const gpu_modules::cuda_module m = [] {
    std::ifstream file(REFPOOL_TEST_PTX);
    if (!file) throw std::runtime_error("cannot read " REFPOOL_TEST_PTX);
    std::stringstream text;
    text << file.rdbuf();
    return gpu_modules::cuda_module(0, text.str());
  }();
  return m;
}

/// How long the slow writer kernel (wait_then_fill_u32) waits before it writes: far longer than
/// any launch gap, so its write lands last unless another stream was ordered after it.
inline constexpr std::uint64_t long_wait_ns = 50'000'000;
/// The buffers of the stream tests: 4 MiB of u32 (the segments' large pool).
inline constexpr std::uint32_t words = 1 << 20;

inline bool all_equal(const std::vector<std::uint32_t>& v, std::uint32_t value) {
  return std::all_of(v.begin(), v.end(), [&](std::uint32_t x) { return x == value; });
}

/// Whether [a, a + an) and [b, b + bn) share a byte.
inline bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

/// Writes `value` into `n` words at `p` on `s` at once (kernel fill_u32).
inline void fill_now(refpool::stream_ref s, std::uint32_t* p, std::uint32_t n, std::uint32_t value) {
  gpu_modules::launch_with(kernels().function("fill_u32"), {64}, {256}, s, p, n, value);
}

/// The same after waiting long_wait_ns on the device (kernel wait_then_fill_u32): a late write.
inline void fill_late(refpool::stream_ref s, std::uint32_t* p, std::uint32_t n, std::uint32_t value) {
  gpu_modules::launch_with(kernels().function("wait_then_fill_u32"), {64}, {256}, s, p, n, value, long_wait_ns);
}

inline gpu_modules::dims3 grid_for(std::size_t n, unsigned block = 256) {
  return {static_cast<unsigned>((n + block - 1) / block), 1, 1};
}

template <class T>
void upload(const refpool::array<T>& dst, const std::vector<T>& src, refpool::stream_ref s) {
  refpool::cuda::copy(dst.data(), src.data(), src.size() * sizeof(T), s);
}

template <class T>
std::vector<T> download(const refpool::array<T>& src, refpool::stream_ref s) {
  std::vector<T> out(src.size());
  refpool::cuda::copy(out.data(), src.data(), out.size() * sizeof(T), s);
  refpool::cuda::synchronize(s);
  return out;
}

/// The control of the stream tests: one buffer written with 1 on `a` after long_wait_ns and with 2
/// on `b` at once, nothing ordering the two. Returns what the buffer holds at the end: all 1 shows
/// the race that the tests' waits prevent (the late write lands last).
inline std::vector<std::uint32_t> unordered_writes(const refpool::backend& be, refpool::cuda::stream& a,
                                                   refpool::cuda::stream& b) {
  auto shared = refpool::empty<std::uint32_t>(be, {words}, a);
  fill_late(a, shared.data(), words, 1);
  fill_now(b, shared.data(), words, 2);
  b.synchronize();
  a.synchronize();
  return download(shared, b);
}

}  // namespace refpool::test
