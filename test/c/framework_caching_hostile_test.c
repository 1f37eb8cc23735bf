/* Hostile cases for the framework allocator's caching turned off and on (refpool_allocator_set_caching):
 * the device limit over cached and uncached buffers at once, the out-of-memory message while off,
 * record_stream, pool_take and steps on uncached buffers, configuring after an uncached request, and
 * a race of toggles, empty_cache, private pools and requests near the limit (sanitizer builds too:
 * POSIX threads, which TSan follows; it does not follow C11's thrd_create here).
 * On the host runtime, a process of its own per mode (the framework allocator is process-wide):
 * "main" (whole blocks), "segments" (segment pieces), "configure" (configure after an uncached
 * request), "no-caching" (run with REFPOOL_NO_CACHING=1), "race-steps" (steps in the race, round after
 * round: see run_race_steps).
 * Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "framework_checks.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>

enum { kib = 1024, limit = 32 * kib };

static void* const routed_stream = (void*)0x2000; /* the stream private pools take */

static int takes_routed_stream(void* context, void* stream) {
  (void)context;
  return stream == routed_stream;
}

/* The limit counts cached and uncached live bytes together, from either setting. */
static void test_limit_counts_both_at_once(refpool_cache cache) {
  void* cached = alloc(8 * kib, NULL);
  refpool_allocator_set_caching(0);
  void* uncached = alloc(24 * kib, NULL);
  void* over = NULL;
  EXPECT(refpool_allocator_alloc(kib, 0, NULL, &over), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(over == NULL);
  refpool_allocator_set_caching(1);
  EXPECT(refpool_allocator_alloc(kib, 0, NULL, &over), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(over == NULL);
  CHECK(stat(cache, "live_bytes") == 8 * kib);
  OK(refpool_free(uncached)); /* caching is on: still the runtime's */
  CHECK(fits(24 * kib));      /* a cached 24 KiB now: the uncached bytes went back */
  OK(refpool_free(cached));
  OK(refpool_allocator_empty_cache());
  CHECK(stat(cache, "held_bytes") == 0);
}

/* Out of memory while off: the message says what was tried, not advice that does not apply. */
static void test_out_of_memory_message_while_off(void) {
  refpool_allocator_set_caching(0);
  void* p = NULL;
  EXPECT(refpool_allocator_alloc(limit + 1, 0, NULL, &p), REFPOOL_ERROR_OUT_OF_MEMORY);
  fprintf(stderr, "message while off: %s\n", refpool_last_error());
  /* The cache's idle memory was given back before the retry: "no cache to reclaim" is not so, and
   * REFPOOL_NO_CACHING is not why the request was uncached. */
  CHECK(!error_mentions("no cache to reclaim"));
  CHECK(error_mentions("refpool_allocator_set_caching"));
  refpool_allocator_set_caching(1);
  EXPECT(refpool_allocator_alloc(limit + 1, 0, NULL, &p), REFPOOL_ERROR_OUT_OF_MEMORY);
  fprintf(stderr, "message while on: %s\n", refpool_last_error());
}

/* Steps on the framework cache make a plan (auto_plans, the default), whose arena stays committed
 * between runs. While off no run can use it: out of memory, it goes back as the cache's idle blocks
 * do (the cache's own out-of-memory path yields it too). */
static void test_idle_plan_arenas_go_back_while_off(refpool_cache cache) {
  for (int run = 0; run < 3; ++run) {
    refpool_step step = {0};
    OK(refpool_step_begin(cache, NULL, 0, &step));
    void* a = alloc(8 * kib, NULL);
    void* b = alloc(8 * kib, NULL);
    OK(refpool_free(a));
    OK(refpool_free(b));
    OK(refpool_step_end(step));
  }
  CHECK(stat(cache, "plans") >= 1);
  CHECK(stat(cache, "arena_bytes") > 0);
  OK(refpool_allocator_empty_cache());
  fprintf(stderr, "arena bytes after empty_cache: %llu\n", (unsigned long long)stat(cache, "arena_bytes"));
  refpool_allocator_set_caching(0);
  const int fitted_off = fits(limit);
  if (!fitted_off) fprintf(stderr, "while off: %s\n", refpool_last_error());
  CHECK(fitted_off);
  refpool_allocator_set_caching(1);
  CHECK(fits(limit)); /* the cache's own path: idle arena spans yield */
  refpool_allocator_set_caching(0);
  CHECK(fits(limit));
  refpool_allocator_set_caching(1);
}

/* record_stream on an uncached buffer is accepted, and its free still gives the bytes back. */
static void test_record_stream_on_an_uncached_buffer(refpool_cache cache) {
  refpool_allocator_set_caching(0);
  void* p = alloc(16 * kib, (void*)0x10);
  OK(refpool_allocator_record_stream(p, (void*)0x20));
  OK(refpool_allocator_record_stream(p, (void*)0x30));
  refpool_allocator_set_caching(1);
  OK(refpool_free(p));
  EXPECT(refpool_allocator_record_stream(p, (void*)0x20), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(stat(cache, "held_bytes") == 0);
  refpool_allocator_set_caching(0);
  CHECK(fits(limit));
  refpool_allocator_set_caching(1);
}

/* pool_take at the address of a live uncached buffer is refused and leaves the buffer as it was. */
static void test_pool_take_of_an_uncached_address(void) {
  const refpool_pool_id pool = {31, 0};
  OK(refpool_allocator_begin_pool(0, pool, takes_routed_stream, NULL, NULL));
  void* in_pool = NULL;
  OK(refpool_allocator_alloc(4 * kib, 0, routed_stream, &in_pool));
  refpool_allocator_set_caching(0);
  void* uncached = alloc(4 * kib, NULL);
  void* taken = NULL;
  EXPECT(refpool_allocator_pool_take(0, pool, uncached, 4 * kib, routed_stream, &taken),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(taken == NULL);
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_free(uncached));
  EXPECT(refpool_free(uncached), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_free(in_pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
  CHECK(fits(limit));
  refpool_allocator_set_caching(1);
}

/* A step open on the framework cache: uncached requests are not its, so they are no escapes. */
static void test_a_step_does_not_take_uncached_requests(refpool_cache cache) {
  const uint64_t escapes = stat(cache, "escapes");
  refpool_step step = {0};
  OK(refpool_step_begin(cache, NULL, 0, &step));
  refpool_allocator_set_caching(0);
  void* uncached = alloc(4 * kib, NULL);
  refpool_allocator_set_caching(1);
  void* cached = alloc(4 * kib, NULL);
  OK(refpool_step_end(step));
  CHECK(stat(cache, "escapes") == escapes + 1); /* the cached one only */
  CHECK(stat(cache, "live_bytes") == 4 * kib);
  OK(refpool_free(uncached));
  OK(refpool_free(cached));
  OK(refpool_allocator_empty_cache());
  refpool_allocator_set_caching(0);
  CHECK(fits(limit));
  refpool_allocator_set_caching(1);
}

/* Toggles, empty_cache, private pools begun, ended and released, and requests near the limit on
 * both routes, all at once: every request is freed, every byte comes back, no pool is left. */
static atomic_int running;
static atomic_int refused; /* requests out of memory: the retry paths ran under the race */

static void* request_near_the_limit(void* arg) {
  void* stream = arg;
  for (int i = 0; i < 1500; ++i) {
    void* held[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; ++k) {
      if (refpool_allocator_alloc((size_t)(2 + (i + k) % 7) * kib, 0, stream, &held[k]) != REFPOOL_OK) {
        atomic_fetch_add(&refused, 1);
        continue;
      }
      memset(held[k], 0x3C, 2 * kib);
    }
    for (int k = 0; k < 3; ++k)
      if (held[k] != NULL) OK(refpool_free(held[k]));
  }
  return NULL;
}

static void* toggle_and_empty(void* arg) {
  (void)arg;
  for (int i = 0; atomic_load(&running); ++i) {
    refpool_allocator_set_caching(i % 3 != 0);
    if (i % 5 == 0) OK(refpool_allocator_empty_cache());
    sched_yield();
  }
  return NULL;
}

static void* cycle_pools(void* arg) {
  (void)arg;
  for (int n = 0; atomic_load(&running); ++n) {
    const refpool_pool_id pool = {41, (uint64_t)n};
    if (refpool_allocator_begin_pool(0, pool, takes_routed_stream, NULL, NULL) != REFPOOL_OK) continue;
    sched_yield();
    OK(refpool_allocator_end_pool(0, pool));
    OK(refpool_allocator_release_pool(0, pool));
  }
  return NULL;
}

/* Steps on the framework cache, begun and ended under the traffic: cached requests belong to them,
 * uncached ones never do (mode "race-steps" only: see there). */
static void* cycle_steps(void* arg) {
  refpool_cache cache = *(refpool_cache*)arg;
  while (atomic_load(&running)) {
    refpool_step step = {0};
    OK(refpool_step_begin(cache, NULL, 0, &step));
    sched_yield();
    OK(refpool_step_end(step));
  }
  return NULL;
}

/* Returns whether the whole limit fits after the race (uncached: the OOM path gives back what the
 * cache holds idle). */
static int race(refpool_cache cache, int with_steps) {
  atomic_store(&running, 1);
  atomic_store(&refused, 0);
  pthread_t toggle;
  pthread_t pools;
  pthread_t steps;
  pthread_t requests[3];
  CHECK(pthread_create(&toggle, NULL, toggle_and_empty, NULL) == 0);
  CHECK(pthread_create(&pools, NULL, cycle_pools, NULL) == 0);
  if (with_steps) CHECK(pthread_create(&steps, NULL, cycle_steps, &cache) == 0);
  CHECK(pthread_create(&requests[0], NULL, request_near_the_limit, NULL) == 0);
  CHECK(pthread_create(&requests[1], NULL, request_near_the_limit, NULL) == 0);
  CHECK(pthread_create(&requests[2], NULL, request_near_the_limit, routed_stream) == 0);
  for (int i = 0; i < 3; ++i) pthread_join(requests[i], NULL);
  atomic_store(&running, 0);
  pthread_join(toggle, NULL);
  pthread_join(pools, NULL);
  if (with_steps) pthread_join(steps, NULL);
  refpool_allocator_set_caching(1);
  CHECK(stat(cache, "live_bytes") == 0);
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
  CHECK(stat(cache, "live_bytes") == 0 && stat(cache, "plan_live_bytes") == 0);
  refpool_allocator_set_caching(0);
  const int whole = fits(limit);
  refpool_allocator_set_caching(1);
  return whole;
}

static void test_race(refpool_cache cache) {
  CHECK(race(cache, 0));
  printf("race: %d requests out of memory\n", atomic_load(&refused));
}

static int run_main(void) {
  refpool_cache cache = configure_limited_host_allocator(REFPOOL_SEGMENTS_OFF, limit);
  test_limit_counts_both_at_once(cache);
  test_out_of_memory_message_while_off();
  test_idle_plan_arenas_go_back_while_off(cache);
  test_record_stream_on_an_uncached_buffer(cache);
  test_pool_take_of_an_uncached_address();
  test_a_step_does_not_take_uncached_requests(cache);
  test_race(cache);
  OK(refpool_cache_destroy(cache));
  return finish("framework_caching_hostile_test main");
}

/* Segment pieces: a segment's idle bytes go back when an uncached request runs out of memory (a
 * limit of a few segments: the host runtime's small segments are 2 MiB). */
static int run_segments(void) {
  const size_t segment_limit = (size_t)8 << 20;
  refpool_cache cache = configure_limited_host_allocator(REFPOOL_SEGMENTS_ON, segment_limit);
  void* a = alloc(64 * kib, NULL);
  void* b = alloc(64 * kib, NULL);
  CHECK(stat(cache, "segment_bytes") > 0);
  OK(refpool_free(a));
  refpool_allocator_set_caching(0);
  void* uncached = alloc(64 * kib, NULL);
  CHECK(uncached != a); /* not the idle piece */
  CHECK(stat(cache, "live_bytes") == 64 * kib);
  OK(refpool_free(uncached));
  OK(refpool_free(b));
  CHECK(fits(segment_limit)); /* only once the idle segment went back */
  CHECK(stat(cache, "segment_bytes") == 0);
  refpool_allocator_set_caching(1);
  OK(refpool_cache_destroy(cache));
  return finish("framework_caching_hostile_test segments");
}

/* An uncached request uses the allocator: its configuration is fixed from then on, as after a
 * cached one (refpool.h: configure before the first use). */
static int run_configure(void) {
  refpool_cache_options options = exact_cache_options();
  configure_host_allocator(&options);
  refpool_allocator_set_caching(0);
  void* p = alloc(4 * kib, NULL);
  refpool_allocator_options other;
  OK(refpool_allocator_options_init(&other, sizeof other));
  other.runtime = REFPOOL_RUNTIME_CUDA;
  EXPECT(refpool_allocator_configure(&other, sizeof other, &options, sizeof options), REFPOOL_ERROR_CONFIG);
  refpool_allocator_set_caching(1);
  void* q = NULL;
  OK(refpool_allocator_alloc(4 * kib, 0, NULL, &q)); /* still the host runtime */
  if (q != NULL) memset(q, 0x11, 4 * kib);
  OK(refpool_free(q));
  OK(refpool_free(p));
  return finish("framework_caching_hostile_test configure");
}

/* REFPOOL_NO_CACHING=1 and the setting together: every request is the runtime's either way, the
 * limit counts them all, and every byte comes back. */
static int run_no_caching(void) {
  refpool_cache cache = configure_limited_host_allocator(REFPOOL_SEGMENTS_OFF, limit);
  CHECK(refpool_allocator_caching() == 0); /* what the hooks read: nothing caches, nothing is counted */
  void* on = alloc(8 * kib, NULL);
  CHECK(stat(cache, "live_bytes") == 0); /* bypassed by the environment */
  refpool_allocator_set_caching(0);
  void* off = alloc(24 * kib, NULL);
  void* over = NULL;
  EXPECT(refpool_allocator_alloc(kib, 0, NULL, &over), REFPOOL_ERROR_OUT_OF_MEMORY);
  refpool_allocator_set_caching(1);
  EXPECT(refpool_allocator_alloc(kib, 0, NULL, &over), REFPOOL_ERROR_OUT_OF_MEMORY);
  OK(refpool_free(off));
  OK(refpool_free(on));
  CHECK(fits(limit));
  refpool_allocator_set_caching(0);
  CHECK(fits(limit));
  refpool_allocator_set_caching(1);
  CHECK(refpool_allocator_caching() == 0); /* turned on again, still bypassed by the environment */
  CHECK(stat(cache, "held_bytes") == 0);
  OK(refpool_cache_destroy(cache));
  return finish("framework_caching_hostile_test no-caching");
}

/* The race with steps on the framework cache too, `rounds` times in a row (argument 2; 40 by default,
 * a few seconds). It found an arena of the steps' plans held for good after every step ended with
 * nothing live (neither empty_cache, the cache's own out-of-memory path nor later steps gave it back):
 * a run that went plain when it could not take its arena (plan/run_modes.cpp), or a replay that
 * ended with a region pinning its arena (plan/replay_cursor.cpp), left the span held when that
 * region went while the run held the claim. Before the fixes about one round in 30 to 220 (ASan,
 * TSan), none in 600 (ASan) and 250 (TSan) after; stops at the first such round. */
static int run_race_steps(int rounds) {
  refpool_cache cache = configure_limited_host_allocator(REFPOOL_SEGMENTS_OFF, limit);
  for (int round = 1; round <= rounds; ++round) {
    if (race(cache, 1)) continue;
    fprintf(stderr, "round %d: %s\nthe cache holds %llu arena bytes in %llu plans, %llu held, nothing live\n", round,
            refpool_last_error(), (unsigned long long)stat(cache, "arena_bytes"),
            (unsigned long long)stat(cache, "plans"), (unsigned long long)stat(cache, "held_bytes"));
    CHECK(!"the whole limit fits after the race");
    break;
  }
  OK(refpool_cache_destroy(cache));
  return finish("framework_caching_hostile_test race-steps");
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "main";
  if (strcmp(mode, "segments") == 0) return run_segments();
  if (strcmp(mode, "configure") == 0) return run_configure();
  if (strcmp(mode, "no-caching") == 0) return run_no_caching();
  if (strcmp(mode, "race-steps") == 0) return run_race_steps(argc > 2 ? atoi(argv[2]) : 40);
  return run_main();
}
