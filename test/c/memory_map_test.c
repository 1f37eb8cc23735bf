/* refpool_cache_memory_map from C: a cache with segments (live, idle and free ranges, and reclaim
 * taking the idle and free ones), one without (idle buffers as segments of their own), arrays too
 * small, an older caller's smaller structs, bad arguments, and a private pool's map through a
 * handle taken before the pool was released and emptied, while another thread maps it. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "c_checks.h"

enum { max_segments = 64, max_ranges = 256 };

static refpool_memory_segment segments[max_segments];
static refpool_memory_range ranges[max_ranges];
static size_t segment_count, range_count;

/* Takes the map of `cache` into the arrays above and checks its shape: each segment's ranges are
 * its own, in address order, inside it, adding up to its committed bytes. */
static void take_map(refpool_cache cache) {
  OK(refpool_cache_memory_map(cache, segments, max_segments, sizeof(refpool_memory_segment), &segment_count, ranges,
                              max_ranges, sizeof(refpool_memory_range), &range_count));
  CHECK(segment_count <= max_segments && range_count <= max_ranges);
  size_t next = 0;
  for (size_t i = 0; i < segment_count && i < max_segments; ++i) {
    const refpool_memory_segment* s = &segments[i];
    CHECK(s->first_range == next);
    uint64_t sum = 0, end = s->address;
    for (size_t k = s->first_range; k < s->first_range + s->range_count && k < max_ranges; ++k) {
      CHECK(ranges[k].segment == i);
      CHECK(ranges[k].address >= end && ranges[k].address + ranges[k].bytes <= s->address + s->reserved_bytes);
      CHECK(ranges[k].unused == 0);
      end = ranges[k].address + ranges[k].bytes;
      sum += ranges[k].bytes;
    }
    CHECK(sum == s->committed_bytes);
    CHECK(s->memory_kind == REFPOOL_MEMORY_HOST);
    next += s->range_count;
  }
  CHECK(next == range_count);
}

/* The range at `address`, or NULL. */
static const refpool_memory_range* range_at(void* address) {
  for (size_t k = 0; k < range_count && k < max_ranges; ++k)
    if (ranges[k].address == (uint64_t)(uintptr_t)address) return &ranges[k];
  return NULL;
}

static uint64_t bytes_in(refpool_range_state state) {
  uint64_t sum = 0;
  for (size_t k = 0; k < range_count && k < max_ranges; ++k)
    if (ranges[k].state == (int32_t)state) sum += ranges[k].bytes;
  return sum;
}

static refpool_cache make_cache(refpool_segment_policy policy) {
  refpool_cache_options options;
  OK(refpool_cache_options_init(&options, sizeof options));
  options.segments = policy;
  refpool_cache cache = {0};
  OK(refpool_cache_create(&options, sizeof options, &cache));
  return cache;
}

static refpool_buffer alloc_bytes(refpool_backend be, refpool_cache cache, size_t bytes) {
  refpool_alloc_options options = {NULL, 0, cache};
  refpool_buffer out = {0};
  OK(refpool_alloc(be, &bytes, 1, 1, &options, sizeof options, &out));
  return out;
}

static void* data_of(refpool_buffer b) {
  void* p = NULL;
  OK(refpool_data(b, &p));
  return p;
}

static void test_segments(refpool_backend be) {
  refpool_cache cache = make_cache(REFPOOL_SEGMENTS_ON);
  take_map(cache);
  CHECK(segment_count == 0 && range_count == 0);
  refpool_buffer a = alloc_bytes(be, cache, 3000), b = alloc_bytes(be, cache, 9000),
                 c = alloc_bytes(be, cache, 3 << 20);
  void* b_at = data_of(b);
  take_map(cache);
  CHECK(segment_count >= 2); /* a small pool's segment and a large pool's */
  CHECK(range_at(data_of(a)) != NULL && range_at(data_of(a))->state == REFPOOL_RANGE_LIVE);
  CHECK(range_at(data_of(c)) != NULL && range_at(data_of(c))->bytes >= (3u << 20));
  CHECK(bytes_in(REFPOOL_RANGE_LIVE) == stat(cache, "live_bytes"));
  CHECK(bytes_in(REFPOOL_RANGE_IDLE) == 0);

  OK(refpool_release(b));
  take_map(cache);
  CHECK(range_at(b_at) != NULL && range_at(b_at)->state == REFPOOL_RANGE_IDLE);
  CHECK(bytes_in(REFPOOL_RANGE_IDLE) == stat(cache, "idle_bytes"));
  CHECK(bytes_in(REFPOOL_RANGE_FREE) == stat(cache, "segment_free_bytes"));
  CHECK(bytes_in(REFPOOL_RANGE_FREE) > 0);

  /* Too small: the counts say how much there is; what fits is written. */
  size_t few_segments = 0, few_ranges = 0;
  refpool_memory_range one[1];
  OK(refpool_cache_memory_map(cache, NULL, 0, sizeof(refpool_memory_segment), &few_segments, one, 1,
                              sizeof(refpool_memory_range), &few_ranges));
  CHECK(few_segments == segment_count && few_ranges == range_count && one[0].address == ranges[0].address);

  /* An older caller's range struct of 16 bytes (address and bytes): written 16 bytes apart, no more. */
  uint64_t older[2 * max_ranges + 1];
  older[2 * range_count] = 0xfeedu;
  OK(refpool_cache_memory_map(cache, NULL, 0, sizeof(refpool_memory_segment), &few_segments,
                              (refpool_memory_range*)older, max_ranges, 16, &few_ranges));
  for (size_t k = 0; k < range_count; ++k)
    CHECK(older[2 * k] == ranges[k].address && older[2 * k + 1] == ranges[k].bytes);
  CHECK(older[2 * range_count] == 0xfeedu);

  /* A newer caller's range struct of 40 bytes: the field this library lacks is zeroed. */
  uint64_t newer[5 * max_ranges];
  memset(newer, 0xff, sizeof newer);
  OK(refpool_cache_memory_map(cache, NULL, 0, sizeof(refpool_memory_segment), &few_segments,
                              (refpool_memory_range*)newer, max_ranges, 40, &few_ranges));
  for (size_t k = 0; k < range_count; ++k)
    CHECK(newer[5 * k] == ranges[k].address && newer[5 * k + 2] == ranges[k].segment && newer[5 * k + 4] == 0);

  /* Reclaim: the idle pieces go, and with them every segment no live piece keeps; what stays
   * free lies in a commit a live piece shares (a commit goes back whole). */
  void* c_at = data_of(c);
  OK(refpool_release(c));
  take_map(cache);
  const uint64_t free_before = bytes_in(REFPOOL_RANGE_FREE);
  CHECK(range_at(c_at)->state == REFPOOL_RANGE_IDLE);
  size_t reclaimed = 0;
  OK(refpool_cache_reclaim(cache, 0, &reclaimed));
  take_map(cache);
  CHECK(bytes_in(REFPOOL_RANGE_IDLE) == 0 && range_at(c_at) == NULL);
  CHECK(bytes_in(REFPOOL_RANGE_FREE) < free_before);
  CHECK(bytes_in(REFPOOL_RANGE_FREE) == stat(cache, "segment_free_bytes"));
  for (size_t i = 0; i < segment_count; ++i) {
    int has_live = 0;
    for (size_t k = segments[i].first_range; k < segments[i].first_range + segments[i].range_count; ++k)
      has_live |= ranges[k].state == REFPOOL_RANGE_LIVE;
    CHECK(has_live);
  }
  CHECK(range_at(data_of(a))->state == REFPOOL_RANGE_LIVE);
  OK(refpool_release(a));
  OK(refpool_cache_reclaim(cache, 0, &reclaimed));
  take_map(cache);
  CHECK(segment_count == 0 && range_count == 0);
  OK(refpool_cache_destroy(cache));
}

static void test_whole_blocks(refpool_backend be) {
  refpool_cache cache = make_cache(REFPOOL_SEGMENTS_OFF);
  refpool_buffer kept = alloc_bytes(be, cache, 5000), gone = alloc_bytes(be, cache, 70000);
  void* gone_at = data_of(gone);
  OK(refpool_release(gone));
  take_map(cache);
  CHECK(segment_count == 1 && range_count == 1);
  CHECK(segments[0].pool == REFPOOL_SEGMENT_BLOCK && segments[0].address == (uint64_t)(uintptr_t)gone_at);
  CHECK(ranges[0].state == REFPOOL_RANGE_IDLE && ranges[0].bytes == stat(cache, "idle_bytes"));
  CHECK(range_at(data_of(kept)) == NULL); /* live whole blocks are not listed */
  OK(refpool_release(kept));
  OK(refpool_cache_destroy(cache));
}

static void test_bad_arguments(void) {
  refpool_cache cache = make_cache(REFPOOL_SEGMENTS_ON);
  size_t n = 0, m = 0;
  const size_t seg = sizeof(refpool_memory_segment), rng = sizeof(refpool_memory_range);
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, NULL, NULL, 0, rng, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("segment_count is NULL"));
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, &n, NULL, 0, rng, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_memory_map(cache, NULL, 3, seg, &n, NULL, 0, rng, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("segments is NULL but segment_capacity is 3"));
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, 3, &n, NULL, 0, rng, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("refpool_memory_segment"));
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, &n, NULL, 0, 0, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("refpool_memory_range"));
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, &n, NULL, 0, (size_t)1 << 20, &m),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  /* A capacity no array can have (capacity times size overflows): refused, nothing written. */
  refpool_memory_range few[2];
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, &n, few, SIZE_MAX / 8, rng, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("range_capacity"));
  EXPECT(refpool_cache_memory_map(cache, (refpool_memory_segment*)few, SIZE_MAX / seg + 1, seg, &n, NULL, 0, rng, &m),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("overflows"));
  uint64_t room[8];
  EXPECT(refpool_cache_memory_map(cache, (refpool_memory_segment*)((char*)room + 4), 1, seg, &n, NULL, 0, rng, &m),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("not aligned"));
  OK(refpool_cache_destroy(cache));
  EXPECT(refpool_cache_memory_map(cache, NULL, 0, seg, &n, NULL, 0, rng, &m), REFPOOL_ERROR_INVALID_HANDLE);
  refpool_cache none = {0};
  EXPECT(refpool_cache_memory_map(none, NULL, 0, seg, &n, NULL, 0, rng, &m), REFPOOL_ERROR_INVALID_ARGUMENT);
}

/* A thread that maps `cache` until told to stop, each map consistent (its own arrays: the static
 * ones are the main thread's). */
struct mapper {
  refpool_cache cache;
  atomic_int stop, maps;
  int bad;
};

static void* map_until_stopped(void* arg) {
  struct mapper* m = arg;
  static refpool_memory_segment segs[max_segments];
  static refpool_memory_range rngs[max_ranges];
  while (!atomic_load(&m->stop)) {
    size_t n = 0, k = 0;
    if (refpool_cache_memory_map(m->cache, segs, max_segments, sizeof segs[0], &n, rngs, max_ranges, sizeof rngs[0],
                                 &k) != REFPOOL_OK ||
        n > max_segments || k > max_ranges) {
      ++m->bad;
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      uint64_t sum = 0;
      for (size_t r = segs[i].first_range; r < segs[i].first_range + segs[i].range_count; ++r) sum += rngs[r].bytes;
      if (sum != segs[i].committed_bytes) ++m->bad;
    }
    atomic_fetch_add(&m->maps, 1);
  }
  return NULL;
}

static int accept_all(void* context, void* stream) {
  (void)context;
  (void)stream;
  return 1;
}

/* The framework allocator (host runtime): a private pool's cache through a handle taken while the
 * pool was in use. Released and emptied while its buffers are held, the pool stays in the
 * allocator (PyTorch's allocator keeps a graph pool until its last block is freed), and its map
 * lists the buffer held and the one freed since, idle. Once both are freed, empty_cache drops the
 * pool from the allocator, and the handle keeps its cache open until it is destroyed. */
static void test_released_pool(void) {
  refpool_allocator_options options;
  OK(refpool_allocator_options_init(&options, sizeof options));
  options.runtime = REFPOOL_RUNTIME_HOST;
  refpool_cache_options cache_options;
  OK(refpool_cache_options_init(&cache_options, sizeof cache_options));
  cache_options.segments = REFPOOL_SEGMENTS_ON;
  OK(refpool_allocator_configure(&options, sizeof options, &cache_options, sizeof cache_options));
  const refpool_pool_id pool = {9, 1};
  OK(refpool_allocator_begin_pool(0, pool, accept_all, NULL, NULL));
  void *held = NULL, *freed = NULL;
  OK(refpool_allocator_alloc(20000, 0, NULL, &held));
  OK(refpool_allocator_alloc(3 << 20, 0, NULL, &freed));
  OK(refpool_allocator_end_pool(0, pool));
  struct mapper m = {{0}, 0, 0, 0};
  OK(refpool_allocator_pool_cache(pool, &m.cache));
  pthread_t thread;
  CHECK(pthread_create(&thread, NULL, map_until_stopped, &m) == 0);
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  refpool_cache still = {0};
  OK(refpool_allocator_pool_cache(pool, &still)); /* its buffers are held: it stays */
  OK(refpool_cache_destroy(still));
  OK(refpool_free(freed));
  while (atomic_load(&m.maps) < 100) sched_yield();
  atomic_store(&m.stop, 1);
  pthread_join(thread, NULL);
  CHECK(m.bad == 0);
  take_map(m.cache);
  CHECK(range_at(held) != NULL && range_at(held)->state == REFPOOL_RANGE_LIVE);
  CHECK(range_at(freed) != NULL && range_at(freed)->state == REFPOOL_RANGE_IDLE);
  CHECK(bytes_in(REFPOOL_RANGE_LIVE) == stat(m.cache, "live_bytes"));
  OK(refpool_free(held));
  OK(refpool_allocator_empty_cache());
  refpool_cache gone = {0};
  EXPECT(refpool_allocator_pool_cache(pool, &gone), REFPOOL_ERROR_INVALID_ARGUMENT); /* left the allocator */
  take_map(m.cache); /* the handle keeps the pool's cache open */
  CHECK(bytes_in(REFPOOL_RANGE_LIVE) == 0 && stat(m.cache, "live_bytes") == 0);
  OK(refpool_cache_destroy(m.cache)); /* the last owner of the pool's cache: it closes */
}

int main(void) {
  refpool_backend be = {0};
  OK(refpool_backend_host(&be));
  test_segments(be);
  test_whole_blocks(be);
  test_bad_arguments();
  test_released_pool();
  OK(refpool_backend_release(be));
  return finish("memory_map_test");
}
