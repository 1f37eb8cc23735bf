/* Released private pools kept while their buffers are held (refpool_allocator_release_pool), raced
 * from other threads: buffers freed, pools begun again, takes made and stats read while
 * empty_cache runs; the device limit once a kept pool's buffers are freed; and buffers that a step
 * on a pool's cache serves from outside its blocks. Through the C API on the host runtime (a
 * process of its own: the framework allocator is process-wide); meant for the sanitizer builds
 * too. Threads count their own failures (c_checks.h's count is not atomic). Prints each failed
 * check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "framework_checks.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KIB ((size_t)1024)

static void* const routed = (void*)0x1000; /* the stream a route accepts ("capturing") */
static void* const other = (void*)0x2000;  /* a stream no route accepts */
static void* const* const routed_context = &routed;

static int accepts(void* context, void* stream) { return stream == *(void* const*)context; }

static int begin(refpool_pool_id pool) {
  return refpool_allocator_begin_pool(0, pool, accepts, (void*)routed_context, NULL) == REFPOOL_OK;
}

static int listed(refpool_pool_id pool) {
  refpool_cache cache = {0};
  if (refpool_allocator_pool_cache(pool, &cache) != REFPOOL_OK) return 0;
  OK(refpool_cache_destroy(cache)); /* the handle only */
  return 1;
}

/* Counter `name` of `pool`'s cache, or UINT64_MAX when the pool is not listed. Thread-safe. */
/* ---- buffers of a released pool freed on another thread while empty_cache runs ---------------- */

#define HELD 16
struct freer {
  void* buffers[HELD];
  atomic_int done;
  atomic_int failures;
};

static void* free_all(void* arg) {
  struct freer* f = arg;
  for (int i = 0; i < HELD; ++i) {
    memset(f->buffers[i], i, 4 * KIB); /* still the caller's memory until freed */
    if (refpool_free(f->buffers[i]) != REFPOOL_OK) atomic_fetch_add(&f->failures, 1);
    sched_yield();
  }
  atomic_store(&f->done, 1);
  return NULL;
}

/* Whichever way each free and each look of empty_cache fall, every buffer stays usable until freed
 * (ASan), nothing is freed twice, and the pool is gone at the first empty_cache after the last free. */
static void test_frees_race_empty_cache(void) {
  for (uint64_t round = 0; round < 100; ++round) {
    const refpool_pool_id pool = {100, round + 1};
    struct freer f;
    atomic_init(&f.done, 0);
    atomic_init(&f.failures, 0);
    CHECK(begin(pool));
    for (int i = 0; i < HELD; ++i) f.buffers[i] = alloc(4 * KIB, routed);
    OK(refpool_free(alloc(8 * KIB, routed))); /* idle memory for the reclaims */
    OK(refpool_allocator_end_pool(0, pool));
    OK(refpool_allocator_release_pool(0, pool));
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, free_all, &f) == 0);
    while (!atomic_load(&f.done)) OK(refpool_allocator_empty_cache());
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(atomic_load(&f.failures) == 0);
    OK(refpool_allocator_empty_cache());
    CHECK(!listed(pool));
  }
  CHECK(live_pools() == 0);
}

/* ---- a released pool begun again while empty_cache reclaims it --------------------------------- */

struct reviver {
  refpool_pool_id pool;
  atomic_int done;
  atomic_int failures;
  atomic_int lost; /* rounds whose buffer, freed into the routed pool, left it */
};

static void* revive_again_and_again(void* arg) {
  struct reviver* r = arg;
  for (int round = 0; round < 400; ++round) {
    if (!begin(r->pool)) atomic_fetch_add(&r->failures, 1);
    void* p = NULL;
    if (refpool_allocator_alloc(12 * KIB, 0, routed, &p) != REFPOOL_OK || refpool_free(p) != REFPOOL_OK)
      atomic_fetch_add(&r->failures, 1);
    sched_yield(); /* the other thread's empty_cache may run now: the pool is routed to */
    const uint64_t idle = pool_stat(r->pool, "idle_bytes");
    if (idle == UINT64_MAX || idle < 12 * KIB) atomic_fetch_add(&r->lost, 1);
    if (refpool_allocator_end_pool(0, r->pool) != REFPOOL_OK) atomic_fetch_add(&r->failures, 1);
    if (refpool_allocator_release_pool(0, r->pool) != REFPOOL_OK) atomic_fetch_add(&r->failures, 1);
  }
  atomic_store(&r->done, 1);
  return NULL;
}

/* A pool in use keeps its memory (refpool.h: graphs captured into it replay into those bytes),
 * also when it was released with a buffer held and empty_cache reclaims it as a kept pool while
 * another thread begins a route to it again. The deterministic form of this race is
 * test/gpu/hip_fake_pools_race_test.cpp (a hook inside empty_cache). */
static void test_revive_race_empty_cache(void) {
  struct reviver r = {.pool = {200, 1}};
  atomic_init(&r.done, 0);
  atomic_init(&r.failures, 0);
  atomic_init(&r.lost, 0);
  CHECK(begin(r.pool));
  void* held = alloc(4 * KIB, routed); /* keeps the pool listed once released */
  OK(refpool_allocator_end_pool(0, r.pool));
  OK(refpool_allocator_release_pool(0, r.pool));
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, revive_again_and_again, &r) == 0);
  while (!atomic_load(&r.done)) OK(refpool_allocator_empty_cache());
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(atomic_load(&r.failures) == 0);
  if (atomic_load(&r.lost) != 0) fprintf(stderr, "%d rounds lost the routed pool's memory\n", atomic_load(&r.lost));
  CHECK(atomic_load(&r.lost) == 0);
  OK(refpool_allocator_empty_cache());
  CHECK(listed(r.pool)); /* its buffer is held */
  memset(held, 1, 4 * KIB);
  OK(refpool_free(held));
  OK(refpool_allocator_empty_cache());
  CHECK(!listed(r.pool));
}

/* ---- takes into released pools while empty_cache runs ------------------------------------------ */

struct taker {
  refpool_pool_id pool;
  void* address;
  atomic_int ready;
  atomic_int go;
  refpool_status status;
  void* out;
};

static void* take_when_told(void* arg) {
  struct taker* t = arg;
  atomic_store(&t->ready, 1);
  while (!atomic_load(&t->go)) {}
  t->status = refpool_allocator_pool_take(0, t->pool, t->address, 8 * KIB, routed, &t->out);
  return NULL;
}

/* A take into a released pool races empty_cache: either the take comes first (the buffer is the
 * caller's, and the pool stays listed while it is held) or empty_cache does (the idle buffer goes
 * back; the take is refused). With a buffer held the pool stays either way. */
static void test_take_race_empty_cache(int hold_one) {
  int taken = 0, refused = 0;
  for (uint64_t round = 0; round < 1000; ++round) {
    struct taker t = {.pool = {hold_one ? 301 : 300, round + 1}};
    atomic_init(&t.ready, 0);
    atomic_init(&t.go, 0);
    CHECK(begin(t.pool));
    void* held = hold_one ? alloc(4 * KIB, routed) : NULL;
    t.address = alloc(8 * KIB, routed);
    OK(refpool_free(t.address));
    OK(refpool_allocator_end_pool(0, t.pool));
    OK(refpool_allocator_release_pool(0, t.pool));
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, take_when_told, &t) == 0);
    while (!atomic_load(&t.ready)) sched_yield();
    atomic_store(&t.go, 1);
    for (volatile unsigned spin = 0; spin < (round % 16) * 200; ++spin) {} /* the two calls meet at varying points */
    OK(refpool_allocator_empty_cache());
    CHECK(pthread_join(thread, NULL) == 0);
    if (t.status == REFPOOL_OK) {
      ++taken;
      CHECK(t.out == t.address);
      memset(t.out, 0x33, 8 * KIB); /* the caller's memory (ASan: not given back) */
      if (!listed(t.pool))
        fprintf(stderr, "round %llu: a buffer taken into pool (%llu, %llu) is held, the pool gone\n",
                (unsigned long long)round, (unsigned long long)t.pool.first, (unsigned long long)t.pool.second);
      CHECK(listed(t.pool));
      OK(refpool_free(t.out));
    } else {
      ++refused;
      CHECK(t.status == REFPOOL_ERROR_INVALID_ARGUMENT);
    }
    CHECK(listed(t.pool) == (held != NULL || t.status == REFPOOL_OK));
    if (held != NULL) OK(refpool_free(held));
    OK(refpool_allocator_empty_cache());
    CHECK(!listed(t.pool));
  }
  printf("takes raced with empty_cache (%s): %d taken first, %d refused\n", hold_one ? "a buffer held" : "none held",
         taken, refused);
}

/* ---- the device limit once a kept pool's buffers are freed ------------------------------------- */

/* Kept at empty_cache while its buffer is held, the pool gets that buffer's bytes back idle when it
 * is freed; the device limit counts them. A request of the allocator's cache that needs them runs
 * out of memory, drops the pool (now empty) and is made again: it fits. */
static void test_limit_after_kept_pool_freed(refpool_cache main_cache) {
  const refpool_pool_id pool = {400, 1};
  OK(refpool_allocator_empty_cache());
  CHECK(begin(pool));
  void* held = alloc(64 * KIB, routed);
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(listed(pool));
  OK(refpool_free(held));
  CHECK(pool_stat(pool, "idle_bytes") == 64 * KIB);
  const size_t main_reserved = (size_t)stat(main_cache, "reserved_bytes");
  OK(refpool_allocator_set_device_limit(0, main_reserved + 96 * KIB));
  void* outside = NULL;
  OK(refpool_allocator_alloc(64 * KIB, 0, other, &outside)); /* 64 + 64 KiB past the cap: the pool goes */
  CHECK(!listed(pool));
  OK(refpool_free(outside));
  OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
  OK(refpool_allocator_empty_cache());
  /* Again with the pool's buffer still held: its idle bytes go back, the pool stays, and what its
   * buffer holds still counts against the cap. */
  CHECK(begin(pool));
  held = alloc(64 * KIB, routed);
  OK(refpool_free(alloc(32 * KIB, routed)));
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  const size_t now_reserved = (size_t)stat(main_cache, "reserved_bytes");
  OK(refpool_allocator_set_device_limit(0, now_reserved + 96 * KIB));
  void* fits = NULL;
  OK(refpool_allocator_alloc(32 * KIB, 0, other, &fits)); /* 64 held + 32 */
  void* refused = &refused;
  EXPECT(refpool_allocator_alloc(8 * KIB, 0, other, &refused), REFPOOL_ERROR_OUT_OF_MEMORY); /* 104 KiB > 96 */
  CHECK(listed(pool));
  OK(refpool_free(fits));
  OK(refpool_free(held));
  OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
  OK(refpool_allocator_empty_cache());
  CHECK(!listed(pool));
}

/* ---- a request out of memory while another thread empties the cache -------------------------- */

static atomic_int emptier_ready, emptier_go;

static void* empty_cache_when_told(void* arg) {
  (void)arg;
  atomic_store(&emptier_ready, 1);
  while (!atomic_load(&emptier_go)) {}
  if (refpool_allocator_empty_cache() != REFPOOL_OK) fprintf(stderr, "empty_cache failed: %s\n", refpool_last_error());
  return NULL;
}

/* A request past the cap fits once a kept pool's idle memory goes back. When another thread's
 * empty_cache gave it back between the request's attempt and its own drop of the released pools,
 * that drop freed nothing, and the request failed out of memory without a second attempt (309 of
 * 2,000 rounds): it is now made again whatever the drop freed. */
static void test_out_of_memory_while_another_thread_empties(refpool_cache main_cache) {
  int failed = 0;
  const int rounds = 1000;
  for (int r = 0; r < rounds; ++r) {
    const refpool_pool_id pool = {600, (uint64_t)r + 1};
    CHECK(begin(pool));
    void* held = alloc(4 * KIB, routed);
    OK(refpool_free(alloc(64 * KIB, routed)));
    OK(refpool_allocator_end_pool(0, pool));
    OK(refpool_allocator_release_pool(0, pool));
    const size_t reserved = (size_t)stat(main_cache, "reserved_bytes");
    OK(refpool_allocator_set_device_limit(0, reserved + 68 * KIB)); /* exactly what is held now */
    atomic_store(&emptier_go, 0);
    atomic_store(&emptier_ready, 0);
    pthread_t emptier;
    CHECK(pthread_create(&emptier, NULL, empty_cache_when_told, NULL) == 0);
    while (!atomic_load(&emptier_ready)) sched_yield();
    atomic_store(&emptier_go, 1);
    void* outside = NULL;
    if (refpool_allocator_alloc(64 * KIB, 0, other, &outside) != REFPOOL_OK) ++failed;
    pthread_join(emptier, NULL);
    if (outside != NULL) OK(refpool_free(outside));
    OK(refpool_free(held));
    OK(refpool_allocator_set_device_limit(0, SIZE_MAX));
    OK(refpool_allocator_empty_cache());
  }
  if (failed != 0) fprintf(stderr, "%d of %d requests out of memory though the cap had room\n", failed, rounds);
  CHECK(failed == 0);
  CHECK(live_pools() == 0);
}

/* ---- buffers a pool's cache serves outside its blocks ------------------------------------------- */

/* A step opened on a pool's cache (refpool_step_begin on its handle) serves the requests routed
 * to the pool: a warm-up step from the backend (uncached_live_bytes), a planned one from its arena
 * (plan_live_bytes). Those buffers are the pool's as much as its blocks: released, the pool stays
 * while they are held, as it does for a held block. */
static void test_step_buffers_keep_the_pool(int planned) {
  const refpool_pool_id pool = {600, (uint64_t)planned + 1};
  CHECK(begin(pool));
  refpool_cache cache = {0};
  OK(refpool_allocator_pool_cache(pool, &cache));
  refpool_scope_options options = {0};
  options.uncached_warmup_entries = planned ? 0 : 1;
  options.plan = planned ? "hostile" : NULL;
  void* held = NULL;
  for (int run = 0; run < (planned ? 4 : 1); ++run) { /* a plan is made once a sequence repeats */
    refpool_step step = {0};
    OK(refpool_step_begin(cache, &options, sizeof options, &step));
    if (held != NULL) OK(refpool_free(held));
    held = alloc(16 * KIB, routed);
    OK(refpool_step_end(step));
  }
  CHECK(stat(cache, "live_bytes") == 0); /* none of it in the pool's blocks */
  CHECK(stat(cache, planned ? "plan_live_bytes" : "uncached_live_bytes") == 16 * KIB);
  OK(refpool_cache_destroy(cache));
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  CHECK(listed(pool)); /* its buffer is held */
  if (listed(pool)) CHECK(pool_stat(pool, "allocated_bytes") == 16 * KIB);
  memset(held, 3, 16 * KIB);
  OK(refpool_free(held));
  OK(refpool_allocator_empty_cache());
  CHECK(!listed(pool));
}

/* ---- stats and listings under traffic ---------------------------------------------------------- */

struct traffic {
  atomic_int stop;
  atomic_int failures;
  uint64_t first;
};

static void traffic_failed(struct traffic* t, const char* what) {
  fprintf(stderr, "%s: %s\n", what, refpool_last_error());
  atomic_fetch_add(&t->failures, 1);
}

static void* pools_traffic(void* arg) {
  struct traffic* t = arg;
  for (uint64_t round = 1; !atomic_load(&t->stop); ++round) {
    const refpool_pool_id pool = {t->first, round};
    if (!begin(pool)) traffic_failed(t, "begin");
    void* kept = NULL;
    void* freed = NULL;
    if (refpool_allocator_alloc(4 * KIB, 0, routed, &kept) != REFPOOL_OK ||
        refpool_allocator_alloc(8 * KIB, 0, routed, &freed) != REFPOOL_OK || refpool_free(freed) != REFPOOL_OK)
      traffic_failed(t, "requests in the pool");
    if (refpool_allocator_end_pool(0, pool) != REFPOOL_OK || refpool_allocator_release_pool(0, pool) != REFPOOL_OK)
      traffic_failed(t, "end or release");
    void* main_buffer = NULL;
    if (refpool_allocator_alloc(16 * KIB, 0, other, &main_buffer) != REFPOOL_OK) traffic_failed(t, "alloc");
    sched_yield();
    if (refpool_free(kept) != REFPOOL_OK || refpool_free(main_buffer) != REFPOOL_OK) traffic_failed(t, "free");
  }
  return NULL;
}

static void* read_stats(void* arg) {
  struct traffic* t = arg;
  while (!atomic_load(&t->stop)) {
    refpool_pool_id ids[64];
    size_t count = 0;
    if (refpool_allocator_pool_ids(ids, 64, &count) != REFPOOL_OK) traffic_failed(t, "pool_ids");
    for (size_t i = 0; i < count && i < 64; ++i) {
      refpool_cache cache = {0};
      if (refpool_allocator_pool_cache(ids[i], &cache) != REFPOOL_OK) continue; /* dropped meanwhile */
      refpool_cache_stats stats;
      if (refpool_cache_get_stats(cache, &stats, sizeof stats) != REFPOOL_OK) traffic_failed(t, "get_stats");
      (void)refpool_cache_destroy(cache);
    }
  }
  return NULL;
}

/* Routes, frees and stats on three threads while this one empties the cache (for TSan: the pools'
 * lock is taken before a cache's, never after). */
static void test_stats_under_traffic(void) {
  struct traffic t;
  atomic_init(&t.stop, 0);
  atomic_init(&t.failures, 0);
  t.first = 500;
  struct traffic u;
  atomic_init(&u.stop, 0);
  atomic_init(&u.failures, 0);
  u.first = 501;
  pthread_t a, b, reader;
  CHECK(pthread_create(&a, NULL, pools_traffic, &t) == 0);
  CHECK(pthread_create(&b, NULL, pools_traffic, &u) == 0);
  CHECK(pthread_create(&reader, NULL, read_stats, &t) == 0);
  for (int i = 0; i < 2000; ++i) {
    OK(refpool_allocator_empty_cache());
    if (i % 16 == 0) sched_yield();
  }
  atomic_store(&t.stop, 1);
  atomic_store(&u.stop, 1);
  CHECK(pthread_join(a, NULL) == 0);
  CHECK(pthread_join(b, NULL) == 0);
  CHECK(pthread_join(reader, NULL) == 0);
  CHECK(atomic_load(&t.failures) == 0 && atomic_load(&u.failures) == 0);
  OK(refpool_allocator_empty_cache());
  CHECK(live_pools() == 0);
}

int main(void) {
  refpool_cache main_cache = configure_exact_host_allocator();
  test_frees_race_empty_cache();
  test_revive_race_empty_cache();
  test_take_race_empty_cache(0);
  test_take_race_empty_cache(1);
  test_limit_after_kept_pool_freed(main_cache);
  test_out_of_memory_while_another_thread_empties(main_cache);
  test_step_buffers_keep_the_pool(0);
  test_step_buffers_keep_the_pool(1);
  test_stats_under_traffic();
  OK(refpool_allocator_empty_cache());
  CHECK(stat(main_cache, "live_bytes") == 0 && stat(main_cache, "held_bytes") == 0);
  OK(refpool_cache_destroy(main_cache));
  return finish("framework_pools_hostile_test");
}
