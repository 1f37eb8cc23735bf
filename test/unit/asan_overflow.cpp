// Writes one element past an array allocated in a scope on a rounding cache. Cached, the write
// lands inside the rounded block and nothing notices; with REFPOOL_NO_CACHING=1 the block has
// the array's exact bounds and AddressSanitizer reports the overflow. asan_overflow.sh runs both.
#include <cstdio>

#include <refpool/refpool.hpp>

int main() {
  refpool::cache_options options;
  options.rounding = refpool::rounding_policy::step(512);
  refpool::alloc_cache cache{options};
  refpool::scope s(cache);
  auto a = refpool::empty<float>(refpool::host_backend(), {10});
  volatile float* p = a.data();
  p[10] = 1.0f;  // one element past the end
  std::puts("wrote past the end unnoticed");
  return 0;
}
