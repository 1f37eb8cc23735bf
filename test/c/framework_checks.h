/* What the framework allocator's C tests share (host runtime, device 0): a request that fills its
 * bytes, a private pool's counter by name, how many pools the allocator lists, the allocator
 * configured exactly (with a device limit, or never evicting), and whether a request fits now. */
#ifndef REFPOOL_TEST_C_FRAMEWORK_CHECKS_H
#define REFPOOL_TEST_C_FRAMEWORK_CHECKS_H

#include "c_checks.h"

static inline void* alloc(size_t bytes, void* stream) {
  void* p = NULL;
  OK(refpool_allocator_alloc(bytes, 0, stream, &p));
  CHECK(p != NULL);
  if (p != NULL) memset(p, 0x5A, bytes); /* host memory: really there */
  return p;
}

static inline uint64_t pool_stat(refpool_pool_id pool, const char* name) {
  refpool_cache cache = {0};
  OK(refpool_allocator_pool_cache(pool, &cache));
  const uint64_t value = stat(cache, name);
  OK(refpool_cache_destroy(cache)); /* the handle only */
  return value;
}

static inline size_t live_pools(void) {
  size_t count = 99;
  OK(refpool_allocator_pool_ids(NULL, 0, &count));
  return count;
}

/* The framework allocator on the host runtime, caching exactly and never evicting for an idle
 * limit; its cache's handle. */
static inline refpool_cache configure_exact_host_allocator(void) {
  refpool_cache_options cache_options = exact_cache_options();
  cache_options.max_idle_bytes = SIZE_MAX;
  configure_host_allocator(&cache_options);
  refpool_cache main_cache = {0};
  OK(refpool_allocator_cache(&main_cache));
  return main_cache;
}

/* The framework allocator on the host runtime, exact sizes, with `segments` (OFF: whole blocks, so
 * held bytes are the requests'), its device 0 limited to `limit` bytes; its cache's handle. */
static inline refpool_cache configure_limited_host_allocator(refpool_segment_policy segments, size_t limit) {
  refpool_cache_options cache_options = exact_cache_options();
  cache_options.segments = segments;
  configure_host_allocator(&cache_options);
  OK(refpool_allocator_set_device_limit(0, limit));
  refpool_cache main_cache = {0};
  OK(refpool_allocator_cache(&main_cache));
  return main_cache;
}

/* True when `bytes` can be allocated on device 0 now (with the allocator's current setting), and
 * frees it again. */
static inline int fits(size_t bytes) {
  void* p = NULL;
  const refpool_status status = refpool_allocator_alloc(bytes, 0, NULL, &p);
  if (status == REFPOOL_OK) OK(refpool_free(p));
  return status == REFPOOL_OK;
}

#endif
