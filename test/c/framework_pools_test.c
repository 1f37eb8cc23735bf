/* The framework allocator's private pools, device limit, empty_cache and record_stream by pointer,
 * through the C API on the host runtime, called as PyTorch's hooks call them during CUDA graph
 * capture (a process of its own: the framework allocator is process-wide). The "capturing" stream
 * is a made-up address; the filter accepts it, as PyTorch's accepts a stream capturing into the
 * graph. The GPU half (real captures through PyTorch) is test/python/test_torch.py.
 * Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "framework_checks.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void* const capturing = (void*)0x1000; /* the stream being "captured" */
static void* const other = (void*)0x2000;     /* a stream that is not */
static int drops = 0;

static int captures(void* context, void* stream) { return stream == *(void* const*)context; }
static void drop(void* context) {
  (void)context;
  ++drops;
}

static void test_capture_into_a_pool(refpool_cache main_cache) {
  const refpool_pool_id pool = {7, 0};
  void* const* context = &capturing;
  CHECK(refpool_allocator_routing_to_pools() == 0);
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, drop));
  CHECK(refpool_allocator_routing_to_pools() == 1);
  CHECK(live_pools() == 1);

  /* In capture: the capturing stream's requests go to the pool, the others' to the cache. */
  void* a = alloc(4096, capturing);
  void* outside = alloc(4096, other);
  CHECK(pool_stat(pool, "live_bytes") == 4096);
  CHECK(stat(main_cache, "live_bytes") == 4096);
  /* Freed in capture: reused inside the pool, never by the cache. */
  OK(refpool_free(a));
  void* again = alloc(4096, capturing);
  CHECK(again == a);
  OK(refpool_free(outside));
  void* from_pool = alloc(4096, capturing); /* the cache's idle block is not the pool's to take */
  CHECK(from_pool != outside && from_pool != a);
  OK(refpool_free(from_pool));
  OK(refpool_allocator_end_pool(0, pool));
  CHECK(refpool_allocator_routing_to_pools() == 0);
  CHECK(drops == 1); /* the route's context, dropped at its end */

  /* After capture: the pool's memory stays reserved; the cache never hands it out, and
   * empty_cache leaves it (graphs replay into it). */
  void* after = alloc(4096, capturing);
  CHECK(after != a && after != from_pool);
  OK(refpool_free(after));
  OK(refpool_free(again)); /* a "graph output" freed after capture: back to the pool */
  OK(refpool_allocator_empty_cache());
  CHECK(stat(main_cache, "idle_bytes") == 0);
  CHECK(pool_stat(pool, "idle_bytes") == 8192);

  /* A second graph sharing the pool (PyTorch's pool=g1.pool()) reuses its memory. */
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  void* second = alloc(4096, capturing);
  CHECK(second == a || second == from_pool);
  void* kept = alloc(16384, capturing); /* outlives both graphs */
  OK(refpool_free(second));
  OK(refpool_allocator_end_pool(0, pool));
  CHECK(pool_stat(pool, "backend_allocations") + pool_stat(pool, "segment_grows") >= 2);

  /* Two graphs used the pool: freeable at the second release, gone at the next empty_cache; a
   * buffer still held stays valid. */
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool)); /* released already: ignored */
  CHECK(live_pools() == 1);
  memset(kept, 1, 16384);
  OK(refpool_free(kept));
  CHECK(pool_stat(pool, "idle_bytes") >= 16384); /* freed during a later capture, a graph may use it */
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
  OK(refpool_allocator_release_pool(0, pool)); /* gone: ignored, as PyTorch's MemPool needs */
  refpool_cache gone = {0};
  EXPECT(refpool_allocator_pool_cache(pool, &gone), REFPOOL_ERROR_INVALID_ARGUMENT);
}

static void test_pool_misuse(void) {
  const refpool_pool_id pool = {0, 3};
  const refpool_pool_id none = {0, 0};
  void* const* context = &capturing;
  drops = 0;
  EXPECT(refpool_allocator_begin_pool(0, pool, NULL, (void*)context, drop), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_begin_pool(0, none, captures, (void*)context, drop), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_begin_pool(-1, pool, captures, (void*)context, drop), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(drops == 3); /* refpool owns the context also when it refuses */
  CHECK(live_pools() == 0);
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, drop));
  EXPECT(refpool_allocator_begin_pool(0, pool, captures, (void*)context, drop), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(drops == 4);                                                               /* the refused context too */
  EXPECT(refpool_allocator_release_pool(0, pool), REFPOOL_ERROR_INVALID_ARGUMENT); /* still routed to */
  EXPECT(refpool_allocator_end_pool(1, pool), REFPOOL_ERROR_INVALID_ARGUMENT);     /* not on device 1 */
  OK(refpool_allocator_end_pool(0, pool));
  EXPECT(refpool_allocator_end_pool(0, pool), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_allocator_release_pool(0, pool));
  CHECK(drops == 5 && live_pools() == 1); /* freeable */
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
  size_t count = 0;
  EXPECT(refpool_allocator_pool_ids(NULL, 1, &count), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_pool_ids(NULL, 0, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
}

static void test_nested_routes(void) {
  /* Nested use_mem_pool on one thread (PyTorch's test_nested_mempool): every route accepts the
   * request; the latest begun takes it, and the outer one again once the inner ends. */
  const refpool_pool_id outer = {11, 0};
  const refpool_pool_id inner = {12, 0};
  void* const* context = &capturing;
  OK(refpool_allocator_begin_pool(0, outer, captures, (void*)context, NULL));
  void* a = alloc(4096, capturing);
  OK(refpool_allocator_begin_pool(0, inner, captures, (void*)context, NULL));
  void* b = alloc(4096, capturing);
  OK(refpool_allocator_end_pool(0, inner));
  void* c = alloc(4096, capturing);
  OK(refpool_allocator_end_pool(0, outer));
  CHECK(pool_stat(outer, "live_bytes") == 8192);
  CHECK(pool_stat(inner, "live_bytes") == 4096);
  OK(refpool_free(a));
  OK(refpool_free(b));
  OK(refpool_free(c));
  OK(refpool_allocator_release_pool(0, outer));
  OK(refpool_allocator_release_pool(0, inner));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
}

static void test_device_limit(refpool_cache main_cache) {
  const refpool_pool_id pool = {9, 0};
  void* const* context = &capturing;
  OK(refpool_allocator_empty_cache());
  OK(refpool_allocator_set_device_limit(0, 64 * 1024));
  void* a = alloc(32 * 1024, other);
  void* refused = &refused;
  EXPECT(refpool_allocator_alloc(64 * 1024, 0, other, &refused), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(strstr(refpool_last_error(), "out of memory") != NULL);
  OK(refpool_free(a));
  /* 32 KiB idle + 48 KiB is past the cap: the idle block is reclaimed, then the request fits. */
  void* b = alloc(48 * 1024, other);
  CHECK(stat(main_cache, "idle_bytes") == 0);

  /* Private pools charge the same cap, and their idle memory is never reclaimed for a request. */
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  void* in_pool = alloc(8 * 1024, capturing);
  OK(refpool_free(in_pool));
  EXPECT(refpool_allocator_alloc(12 * 1024, 0, capturing, &refused), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(strstr(refpool_last_error(), "private pool") != NULL);
  CHECK(pool_stat(pool, "idle_bytes") == 8 * 1024);
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  /* Released, the pool keeps its memory until a request runs out of memory: then it goes, and
   * the request (48 + 8 + 16 KiB past the cap, 48 + 16 within it) is made again and fits. */
  CHECK(live_pools() == 1);
  void* d = alloc(16 * 1024, other);
  CHECK(live_pools() == 0);
  OK(refpool_free(d));

  EXPECT(refpool_allocator_set_device_limit(-1, 0), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
  void* c = alloc(64 * 1024, other);
  OK(refpool_free(c));
  OK(refpool_free(b));
}

/* While any route is in force a capture may run and use memory a released pool got back during it:
 * neither empty_cache nor a request out of memory drops the released pool then (PyTorch frees
 * released pools only while no capture is underway), and the request's own error is returned. */
static void test_released_pool_kept_while_routed(void) {
  const refpool_pool_id released = {11, 0};
  const refpool_pool_id routed = {12, 0};
  void* const* context = &capturing;
  OK(refpool_allocator_empty_cache());
  OK(refpool_allocator_begin_pool(0, released, captures, (void*)context, NULL));
  void* freed_later = alloc(16 * 1024, capturing);
  OK(refpool_allocator_end_pool(0, released));
  OK(refpool_allocator_release_pool(0, released));
  OK(refpool_allocator_begin_pool(0, routed, captures, (void*)context, NULL));
  OK(refpool_free(freed_later)); /* "during the capture": back to the released pool */
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 2);
  OK(refpool_allocator_set_device_limit(0, 16 * 1024));
  void* refused = &refused;
  EXPECT(refpool_allocator_alloc(8 * 1024, 0, capturing, &refused), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(strstr(refpool_last_error(), "private pool (12, 0)") != NULL); /* the request's own error */
  CHECK(live_pools() == 2);
  OK(refpool_allocator_end_pool(0, routed));
  OK(refpool_allocator_release_pool(0, routed));
  void* after = alloc(8 * 1024, other); /* no route now: out of memory drops both, then fits */
  CHECK(live_pools() == 0);
  OK(refpool_free(after));
  OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
}

/* A released pool begun again (a graph captured into g.pool() after g.reset()) is in use again:
 * empty_cache leaves it and its memory, which the new capture reuses. */
static void test_released_pool_revived(void) {
  const refpool_pool_id pool = {13, 0};
  void* const* context = &capturing;
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  void* first = alloc(8 * 1024, capturing);
  OK(refpool_free(first));
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool)); /* freeable */
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 1);
  CHECK(pool_stat(pool, "idle_bytes") == 8 * 1024);
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  void* again = alloc(8 * 1024, capturing);
  CHECK(again == first);
  OK(refpool_free(again));
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  CHECK(live_pools() == 1); /* three begins, two releases: in use still */
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
}

/* A released pool whose buffers are still held (a graph's outputs used after the graph is gone:
 * PyTorch's test_graph_memory_stats_and_use_result_after_destroy_graph) gives back its idle memory
 * but stays listed, the bytes its buffers hold in its stats (memory_reserved(), snapshots), until
 * they are freed: PyTorch's allocator keeps such a pool until its last block is freed. Dropped at
 * once, those bytes left every figure while the device limit still counted them. */
static void test_released_pool_with_held_buffers(refpool_cache main_cache) {
  const refpool_pool_id pool = {14, 0};
  void* const* context = &capturing;
  OK(refpool_allocator_empty_cache());
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  void* held = alloc(16 * 1024, capturing);
  void* freed = alloc(32 * 1024, capturing);
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_free(freed));
  OK(refpool_allocator_release_pool(0, pool));
  /* Out of memory, the released pool's idle 32 KiB go back and the request is made again. */
  const size_t main_reserved = (size_t)stat(main_cache, "reserved_bytes");
  OK(refpool_allocator_set_device_limit(0, main_reserved + 48 * 1024));
  void* outside = alloc(24 * 1024, other);
  CHECK(pool_stat(pool, "idle_bytes") == 0);
  OK(refpool_free(outside));
  OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 1);
  CHECK(pool_stat(pool, "live_bytes") == 16 * 1024);
  CHECK(pool_stat(pool, "reserved_bytes") >= 16 * 1024);
  memset(held, 2, 16 * 1024);
  OK(refpool_free(held));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
}

static void test_record_stream_by_pointer(void) {
  void* a = alloc(1024, other);
  OK(refpool_allocator_record_stream(a, capturing));
  OK(refpool_free(a));
  EXPECT(refpool_allocator_record_stream(a, capturing), REFPOOL_ERROR_INVALID_ARGUMENT); /* freed */
  int local = 0;
  EXPECT(refpool_allocator_record_stream(&local, capturing), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_record_stream(NULL, capturing), REFPOOL_ERROR_INVALID_ARGUMENT);
}

int main(void) {
  refpool_cache main_cache = configure_exact_host_allocator();
  test_capture_into_a_pool(main_cache);
  test_pool_misuse();
  test_nested_routes();
  test_device_limit(main_cache);
  test_released_pool_kept_while_routed();
  test_released_pool_revived();
  test_released_pool_with_held_buffers(main_cache);
  test_record_stream_by_pointer();
  OK(refpool_allocator_empty_cache());
  CHECK(stat(main_cache, "live_bytes") == 0 && stat(main_cache, "held_bytes") == 0);
  OK(refpool_cache_destroy(main_cache));
  return finish("framework_pools_test");
}
