// refpool-demo: a loop whose body allocates arrays of changing shapes (the same byte sizes)
// inside a cache scope. From the second iteration on, every request is a hit.
#include <cstdio>
#include <numeric>

#include <fmt/format.h>

#include <refpool/refpool.hpp>

namespace {

// One "training step": temporaries of equal byte sizes in rotating shapes and element types.
float step(const refpool::backend& be, int iteration) {
  using refpool::empty;
  auto a = empty<float>(be, {16});          // 64 B
  auto b = empty<float>(be, {4, 4});        // 64 B, another shape
  auto c = empty<double>(be, {8});          // 64 B, another element type
  auto big = empty<float>(be, {1024, 1024});  // 4 MiB
  std::iota(a.data(), a.data() + a.size(), static_cast<float>(iteration));
  std::copy_n(a.data(), b.size(), b.data());
  c.unsafe_free();                          // released early: reusable at once
  auto flat = big.reshape({1048576});       // same buffer, another shape
  flat.data()[0] = b.data()[15];
  return flat.data()[0];
}

}  // namespace

int main() {
  const refpool::backend be = refpool::host_backend();
  refpool::alloc_cache cache;
  constexpr int iterations = 10;
  float checksum = 0;
  for (int i = 0; i < iterations; ++i) {
    const auto before = cache.stats();
    checksum += refpool::cached(cache, [&] { return step(be, i); });
    const auto after = cache.stats();
    fmt::print("iteration {:2}: {} hits, {} misses, {} backend allocations\n", i, after.hits - before.hits,
               after.misses - before.misses, after.backend_allocations - before.backend_allocations);
  }
  fmt::print("\nbackend: {} (checksum {})\n{}", be.name(), checksum, cache.stats());
  return 0;
}
