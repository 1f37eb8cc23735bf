/* The framework allocator with its caching turned off and on again (refpool_allocator_set_caching,
 * PyTorch's caching_allocator_enable): requests then bypass the cache, are freed to the runtime when
 * given back, run out of memory only after the cache's idle memory went back, and private pools
 * keep their routes. On the host runtime, under a device limit that makes "freed to the runtime"
 * observable: the limit counts every byte the runtime holds for the allocator. A process of its
 * own (the framework allocator is process-wide). Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "framework_checks.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <threads.h>

enum { kib = 1024, limit = 32 * kib };

static int accept_all(void* context, void* stream) {
  (void)context;
  (void)stream;
  return 1;
}

static void test_off_bypasses_the_cache(refpool_cache cache) {
  CHECK(refpool_allocator_caching() == 1);
  void* cached = alloc(8 * kib, NULL);
  OK(refpool_free(cached)); /* idle in the cache: 8 KiB of the limit stay taken */
  const uint64_t misses = stat(cache, "misses");
  const uint64_t hits = stat(cache, "hits");
  CHECK(stat(cache, "held_bytes") == 8 * kib);

  refpool_allocator_set_caching(0);
  CHECK(refpool_allocator_caching() == 0);
  void* a = alloc(8 * kib, NULL);
  CHECK(a != cached); /* not the idle buffer: the cache serves nothing */
  CHECK(stat(cache, "hits") == hits && stat(cache, "misses") == misses);
  CHECK(stat(cache, "live_bytes") == 0 && stat(cache, "held_bytes") == 8 * kib);
  OK(refpool_free(a));
  CHECK(stat(cache, "held_bytes") == 8 * kib); /* freed to the runtime, not kept */
  EXPECT(refpool_free(a), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("double free"));

  /* 24 KiB fit beside the idle 8 KiB; 32 KiB only once the cache gave its idle memory back, which
   * the request does itself before it gives up. */
  CHECK(fits(24 * kib));
  CHECK(fits(24 * kib)); /* the first was freed to the runtime: room again */
  CHECK(fits(32 * kib));
  CHECK(stat(cache, "held_bytes") == 0);
  void* too_much = NULL;
  EXPECT(refpool_allocator_alloc(32 * kib + 1, 0, NULL, &too_much), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(too_much == NULL);
  refpool_allocator_set_caching(1);
}

/* A buffer is freed the way it was served, whatever the setting at its free. */
static void test_buffers_keep_how_they_were_served(refpool_cache cache) {
  refpool_allocator_set_caching(0);
  void* uncached = alloc(4 * kib, NULL);
  refpool_allocator_set_caching(1);
  void* cached = alloc(4 * kib, NULL);
  CHECK(stat(cache, "live_bytes") == 4 * kib);
  OK(refpool_free(uncached)); /* caching is on again: still freed to the runtime */
  CHECK(stat(cache, "held_bytes") == 4 * kib);
  refpool_allocator_set_caching(0);
  OK(refpool_free(cached)); /* caching is off: still the cache's, idle in it */
  CHECK(stat(cache, "live_bytes") == 0 && stat(cache, "held_bytes") == 4 * kib);
  refpool_allocator_set_caching(1);
  void* again = alloc(4 * kib, NULL);
  CHECK(again == cached); /* the cache's hit */
  OK(refpool_free(again));
  OK(refpool_allocator_empty_cache());
  CHECK(stat(cache, "held_bytes") == 0);
}

/* A private pool's route wins over the setting: a graph replays into its pool's memory. */
static void test_pools_keep_their_routes(refpool_cache cache) {
  const refpool_pool_id pool = {11, 0};
  refpool_allocator_set_caching(0);
  OK(refpool_allocator_begin_pool(0, pool, accept_all, NULL, NULL));
  void* routed = alloc(4 * kib, NULL);
  CHECK(pool_stat(pool, "live_bytes") == 4 * kib);
  OK(refpool_allocator_end_pool(0, pool));
  void* unrouted = alloc(4 * kib, NULL);
  CHECK(pool_stat(pool, "live_bytes") == 4 * kib && stat(cache, "live_bytes") == 0);
  OK(refpool_free(unrouted));
  OK(refpool_free(routed));
  CHECK(pool_stat(pool, "live_bytes") == 0);
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
  refpool_allocator_set_caching(1);
}

/* A scope the calling thread has open on a cache of its own does not take the request either. */
static void test_a_scope_on_the_thread_is_bypassed(void) {
  refpool_cache_options options = exact_cache_options();
  refpool_cache own = {0};
  OK(refpool_cache_create(&options, sizeof options, &own));
  refpool_scope scope = {0};
  OK(refpool_scope_enter(own, &scope));
  refpool_allocator_set_caching(0);
  void* p = alloc(4 * kib, NULL);
  OK(refpool_free(p));
  refpool_allocator_set_caching(1);
  OK(refpool_scope_exit(scope));
  CHECK(stat(own, "misses") == 0 && stat(own, "held_bytes") == 0);
  OK(refpool_cache_destroy(own));
}

/* Requests and frees on threads while another turns caching off and on (TSan builds too): every
 * buffer is freed the way it was served, and every byte comes back. */
static atomic_int running;

static int requester(void* arg) {
  (void)arg;
  for (int i = 0; i < 2000; ++i) {
    void* p = NULL;
    if (refpool_allocator_alloc((size_t)(1 + i % 4) * kib, 0, NULL, &p) != REFPOOL_OK) continue; /* the limit */
    memset(p, 0x3C, kib);
    OK(refpool_free(p));
  }
  return 0;
}

static int toggler(void* arg) {
  (void)arg;
  for (int i = 0; atomic_load(&running); ++i) refpool_allocator_set_caching(i % 2);
  refpool_allocator_set_caching(1);
  return 0;
}

static void test_toggled_under_traffic(refpool_cache cache) {
  atomic_store(&running, 1);
  thrd_t toggle;
  thrd_t requests[3];
  CHECK(thrd_create(&toggle, toggler, NULL) == thrd_success);
  for (int i = 0; i < 3; ++i) CHECK(thrd_create(&requests[i], requester, NULL) == thrd_success);
  for (int i = 0; i < 3; ++i) thrd_join(requests[i], NULL);
  atomic_store(&running, 0);
  thrd_join(toggle, NULL);
  CHECK(refpool_allocator_caching() == 1);
  CHECK(stat(cache, "live_bytes") == 0);
  OK(refpool_allocator_empty_cache());
  CHECK(stat(cache, "held_bytes") == 0);
  refpool_allocator_set_caching(0);
  CHECK(fits(limit)); /* nothing is left held: the whole limit is free */
  refpool_allocator_set_caching(1);
}

int main(void) {
  refpool_cache cache = configure_limited_host_allocator(REFPOOL_SEGMENTS_OFF, limit);
  test_off_bypasses_the_cache(cache);
  test_buffers_keep_how_they_were_served(cache);
  test_pools_keep_their_routes(cache);
  test_a_scope_on_the_thread_is_bypassed();
  test_toggled_under_traffic(cache);
  OK(refpool_cache_destroy(cache)); /* the handle only */
  return finish("framework_caching_test");
}
