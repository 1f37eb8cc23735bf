/* The same loop through refpool's C API, from C11 (test/consumer and test/pkgconfig build it).
 * Exits 0 on success. */
#include <refpool/refpool.h>

#include <stdio.h>

#define TRY(call)                                                      \
  do {                                                                 \
    if ((call) != REFPOOL_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, refpool_last_error()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int main(void) {
  refpool_backend be;
  refpool_cache cache;
  void* first = NULL;
  TRY(refpool_backend_new_host(&be));
  TRY(refpool_cache_create(NULL, 0, &cache));
  for (int step = 0; step < 2; ++step) {
    refpool_scope scope;
    refpool_buffer x, y;
    void* data = NULL;
    const size_t flat[] = {16};
    const size_t square[] = {4, 4};
    TRY(refpool_scope_enter(cache, &scope));
    TRY(refpool_alloc(be, flat, 1, sizeof(float), NULL, 0, &x));
    TRY(refpool_data(x, &data));
    if (first == NULL) first = data;
    TRY(refpool_release(x));
    TRY(refpool_alloc(be, square, 2, sizeof(float), NULL, 0, &y));
    TRY(refpool_data(y, &data));
    TRY(refpool_release(y));
    TRY(refpool_scope_exit(scope));
    if (data != first) {
      fprintf(stderr, "the 4x4 request did not reuse the 16-float buffer\n");
      return 1;
    }
  }
  refpool_cache_stats stats;
  TRY(refpool_cache_get_stats(cache, &stats, sizeof stats));
  TRY(refpool_cache_destroy(cache));
  TRY(refpool_backend_release(be));
  if (stats.backend_allocations != 1 || stats.hits != 3) {
    fprintf(stderr, "expected 1 backend allocation and 3 hits, got %llu and %llu\n",
            (unsigned long long)stats.backend_allocations, (unsigned long long)stats.hits);
    return 1;
  }
  printf("refpool %s consumer (C API): ok\n", refpool_version());
  return 0;
}
