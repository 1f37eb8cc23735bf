// A loop in a cache scope through refpool's C++ API, built by test/consumer (refpool as a Meson
// subproject) and by test/pkgconfig (pkg-config). Exits 0 when the second iteration makes no
// backend allocation and the 4x4 request reuses the 16-float buffer.
#include <cstdio>

#include <refpool/refpool.hpp>

int main() {
  const refpool::backend be = refpool::make_host_backend();
  refpool::alloc_cache cache{refpool::cache_options{}};
  const void* first = nullptr;
  bool same_buffer = true;
  for (int step = 0; step < 2; ++step) {
    refpool::scope s(cache);
    auto x = refpool::empty<float>(be, {16});
    if (first == nullptr) first = x.data();
    x.unsafe_free();
    auto y = refpool::empty<float>(be, {4, 4});
    same_buffer = same_buffer && y.data() == first && y.dims() == refpool::shape{4, 4};
  }
  const refpool::cache_stats stats = cache.stats();
  const bool ok = same_buffer && stats.backend_allocations == 1 && stats.hits == 3 && stats.unsafe_frees == 2;
  std::printf("refpool %s consumer (C++ API): %s\n", REFPOOL_VERSION, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
