// Helpers shared by the CUDA tests: the test kernels' module, launches sized for n elements,
// and copies between host vectors and device arrays.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

namespace gpu_test {

/// The PTX built from test/gpu/kernels.cu (path compiled in by Meson), loaded once on device 0.
inline const refpool::cuda::module& kernels() {
  static const refpool::cuda::module m = [] {
    std::ifstream file(REFPOOL_TEST_PTX);
    if (!file) throw std::runtime_error("cannot read " REFPOOL_TEST_PTX);
    std::stringstream text;
    text << file.rdbuf();
    return refpool::cuda::module(0, text.str());
  }();
  return m;
}

inline refpool::cuda::dims3 grid_for(std::size_t n, unsigned block = 256) {
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

}  // namespace gpu_test
