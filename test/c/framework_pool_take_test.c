/* refpool_allocator_pool_take: a private pool hands a freed buffer back at its address, as PyTorch's
 * setCheckpointPoolState needs to restore a pool to a checkpoint. Through the C API on the host
 * runtime (a process of its own: the framework allocator is process-wide), run twice: with argument
 * "plain" the pool keeps whole blocks, with "segments" it carves pieces from segments, where bytes of
 * freed buffers that joined in their segment can be taken back too. Prints each failed check and
 * exits 1 if any failed. */
#include <refpool/refpool.h>

#include "c_checks.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KIB ((size_t)1024)
#define STAT_CAPACITY 128

static void* const capturing = (void*)0x1000; /* the stream being "captured" */
static const refpool_pool_id pool = {21, 0};
static int segments = 0;

static int captures(void* context, void* stream) { return stream == *(void* const*)context; }

/* Every counter of the pool's cache, in refpool_stat_name order; returns how many. */
static size_t pool_stats(uint64_t* values) {
  refpool_cache cache = {0};
  OK(refpool_allocator_pool_cache(pool, &cache));
  size_t count = 0;
  OK(refpool_cache_get_stat_values(cache, values, STAT_CAPACITY, &count));
  OK(refpool_cache_destroy(cache)); /* the handle only */
  return count < STAT_CAPACITY ? count : STAT_CAPACITY;
}

static uint64_t pool_stat(const char* name) {
  refpool_cache cache = {0};
  OK(refpool_allocator_pool_cache(pool, &cache));
  const uint64_t value = stat(cache, name);
  OK(refpool_cache_destroy(cache));
  return value;
}

/* A buffer of the pool (the route is in force throughout), filled with `fill`. */
static unsigned char* pool_alloc(size_t bytes, int fill) {
  void* p = NULL;
  OK(refpool_allocator_alloc(bytes, 0, capturing, &p));
  CHECK(p != NULL);
  if (p != NULL) memset(p, fill, bytes);
  return (unsigned char*)p;
}

static void* take(void* address, size_t bytes) {
  void* out = NULL;
  OK(refpool_allocator_pool_take(0, pool, address, bytes, capturing, &out));
  CHECK(out == address);
  if (out != NULL) memset(out, 0x77, bytes); /* usable: host memory, poisoned under ASan while idle */
  return out;
}

/* A take that must fail with INVALID_ARGUMENT, naming `why`, and change no counter of the pool. */
static void refused_take(void* address, size_t bytes, const char* why) {
  uint64_t before[STAT_CAPACITY], after[STAT_CAPACITY];
  const size_t count = pool_stats(before);
  void* out = &out;
  EXPECT(refpool_allocator_pool_take(0, pool, address, bytes, capturing, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(out == (void*)&out); /* untouched */
  if (!error_mentions(why)) fprintf(stderr, "expected \"%s\" in: %s\n", why, refpool_last_error());
  CHECK(error_mentions(why));
  CHECK(pool_stats(after) == count);
  for (size_t i = 0; i < count; ++i) {
    if (before[i] != after[i])
      fprintf(stderr, "counter %s changed: %llu -> %llu\n", refpool_stat_name(i), (unsigned long long)before[i],
              (unsigned long long)after[i]);
    CHECK(before[i] == after[i]);
  }
}

/* Free B, take it back: same pointer, counted as before the free, freed again, taken again. */
static void test_take_a_freed_buffer(void) {
  unsigned char* a = pool_alloc(4 * KIB, 1);
  unsigned char* b = pool_alloc(4 * KIB, 2);
  unsigned char* c = pool_alloc(4 * KIB, 3);
  const uint64_t live_bytes = pool_stat("live_bytes");
  const uint64_t live_blocks = pool_stat("live_blocks");
  OK(refpool_free(b));
  CHECK(pool_stat("live_bytes") == live_bytes - 4 * KIB);
  const uint64_t hits = pool_stat("hits");
  CHECK(take(b, 4 * KIB) == b);
  CHECK(pool_stat("live_bytes") == live_bytes);
  CHECK(pool_stat("live_blocks") == live_blocks);
  CHECK(pool_stat("idle_bytes") == 0);
  CHECK(pool_stat("hits") == hits + 1); /* the idle block itself, as a hit hands it out */
  OK(refpool_free(b));
  CHECK(take(b, 4 * KIB) == b);
  CHECK(a[0] == 1 && a[4 * KIB - 1] == 1 && c[0] == 3 && c[4 * KIB - 1] == 3); /* neighbours untouched */

  /* Live bytes, bytes that are no pool's, an unknown pool, bad arguments: refused, nothing changed. */
  refused_take(a, 4 * KIB, "live");
  refused_take(b + 512, 512, segments ? "live" : "not the pool's");
  int local = 0;
  refused_take(&local, sizeof local, "not the pool's");
  void* out = NULL;
  const refpool_pool_id unknown = {99, 0};
  EXPECT(refpool_allocator_pool_take(0, unknown, b, 4 * KIB, capturing, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("no such pool") && error_mentions("(99, 0)"));
  EXPECT(refpool_allocator_pool_take(1, pool, b, 4 * KIB, capturing, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("never served device 1"));
  refused_take(b, 0, "0 bytes");
  refused_take(NULL, 4 * KIB, "NULL");
  EXPECT(refpool_allocator_pool_take(0, pool, b, 4 * KIB, capturing, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);

  /* A freed buffer taken with another size: plain blocks hold what they held; segments carve the
   * smaller piece there, and the rest of the freed bytes stays free. */
  OK(refpool_free(b));
  if (segments) {
    CHECK(take(b, 2 * KIB) == b);
    CHECK(pool_stat("live_bytes") == live_bytes - 2 * KIB);
    CHECK(take(b + 2 * KIB, 2 * KIB) == b + 2 * KIB);
    OK(refpool_free(b + 2 * KIB));
  } else {
    refused_take(b, 2 * KIB, "holds 4 KiB");
    CHECK(take(b, 4 * KIB) == b);
  }
  OK(refpool_free(b));
  OK(refpool_free(a));
  OK(refpool_free(c));
  CHECK(pool_stat("live_bytes") == 0);
}

/* Segments: freed neighbours join in their segment once a miss gives idle pieces back; each is
 * taken back at its address from the joined free bytes, and a take over live bytes changes nothing. */
static void test_take_joined_neighbours(void) {
  const size_t big = 512 * KIB; /* large pieces: every large miss gives the idle ones back first */
  const uint64_t idle_small = pool_stat("idle_bytes"); /* small pieces stay idle in the slot */
  unsigned char* a = pool_alloc(big, 1);
  unsigned char* b = pool_alloc(big, 2);
  unsigned char* c = pool_alloc(big, 3);
  CHECK(b == a + big && c == b + big); /* carved one after another */
  OK(refpool_free(a));
  OK(refpool_free(b));
  unsigned char* other = pool_alloc(3 * big, 4); /* a miss: a and b go back to the heap and join */
  CHECK(other != a && other != b);
  CHECK(pool_stat("idle_bytes") == idle_small);
  const uint64_t free_bytes = pool_stat("segment_free_bytes");
  const uint64_t misses = pool_stat("misses");
  CHECK(take(b, big) == b); /* from the joined free range: carved there, as a miss */
  CHECK(take(a, big) == a);
  CHECK(pool_stat("misses") == misses + 2);
  CHECK(pool_stat("segment_free_bytes") == free_bytes - 2 * big);
  CHECK(pool_stat("live_bytes") == 3 * big + 3 * big);
  CHECK(c[0] == 3 && c[big - 1] == 3);

  /* Partly live: b idle, c live after it. Refused, and b stays idle, c live. */
  OK(refpool_free(b));
  refused_take(b, 2 * big, "live");
  OK(refpool_free(c)); /* still live: freed once */
  CHECK(take(b, big) == b);
  CHECK(take(c, big) == c); /* both idle pieces again, each taken as a hit */
  OK(refpool_free(a));
  OK(refpool_free(b));
  OK(refpool_free(c));
  OK(refpool_free(other));
  CHECK(pool_stat("live_bytes") == 0);
}

static void* const other_stream = (void*)0x2000; /* captured into a second pool */

/* Hostile review: bytes of the main cache and of another pool are not the pool's; a double free
 * after a take is refused; overflowing sizes change nothing; a released (freeable) pool still takes
 * back its idle bytes, and a buffer taken then outlives the pool's drop by empty_cache; after the
 * drop the pool is no more. */
static void test_take_across_pools_and_lifetimes(void) {
  /* The main cache's freed buffer (a stream no route accepts). */
  void* main_buffer = NULL;
  OK(refpool_allocator_alloc(4 * KIB, 0, NULL, &main_buffer));
  OK(refpool_free(main_buffer));
  refused_take(main_buffer, 4 * KIB, "not the pool's");

  /* Another pool's freed buffer: not this pool's; that pool takes it back. */
  const refpool_pool_id second = {22, 0};
  void* const* second_context = &other_stream;
  OK(refpool_allocator_begin_pool(0, second, captures, (void*)second_context, NULL));
  void* theirs = NULL;
  OK(refpool_allocator_alloc(8 * KIB, 0, other_stream, &theirs));
  OK(refpool_free(theirs));
  refused_take(theirs, 8 * KIB, "not the pool's");
  void* out = NULL;
  OK(refpool_allocator_pool_take(0, second, theirs, 8 * KIB, other_stream, &out));
  CHECK(out == theirs);

  /* Double free after a take; use after free of the pointer. */
  OK(refpool_free(theirs));
  EXPECT(refpool_free(theirs), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_record_stream(theirs, other_stream), REFPOOL_ERROR_INVALID_ARGUMENT);

  /* Overflowing sizes: refused, nothing changed. */
  void* mine = pool_alloc(4 * KIB, 5);
  OK(refpool_free(mine));
  uint64_t before[STAT_CAPACITY], after[STAT_CAPACITY];
  const size_t count = pool_stats(before);
  out = &out;
  CHECK(refpool_allocator_pool_take(0, pool, mine, SIZE_MAX, capturing, &out) != REFPOOL_OK);
  CHECK(refpool_allocator_pool_take(0, pool, mine, SIZE_MAX - 4 * KIB, capturing, &out) != REFPOOL_OK);
  CHECK(refpool_allocator_pool_take(0, pool, (void*)(UINTPTR_MAX - 4095), 8 * KIB, capturing, &out) != REFPOOL_OK);
  CHECK(out == (void*)&out);
  CHECK(pool_stats(after) == count);
  CHECK(memcmp(before, after, count * sizeof before[0]) == 0);
  EXPECT(refpool_allocator_pool_take(-1, pool, mine, 4 * KIB, capturing, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_pool_take(64, pool, mine, 4 * KIB, capturing, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(take(mine, 4 * KIB) == mine);
  OK(refpool_free(mine));

  /* The second pool released (freeable, its memory kept): its idle bytes still come back. */
  OK(refpool_allocator_end_pool(0, second));
  OK(refpool_allocator_release_pool(0, second));
  out = NULL;
  OK(refpool_allocator_pool_take(0, second, theirs, 8 * KIB, other_stream, &out));
  CHECK(out == theirs);
  if (out != NULL) memset(out, 0x66, 8 * KIB);
  /* empty_cache drops no pool while a route (the first pool's) is in force; end it for a moment. */
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_empty_cache());
  size_t pools = 0;
  refpool_pool_id ids[4];
  OK(refpool_allocator_pool_ids(ids, 4, &pools));
  /* The second pool stays while its taken buffer is held, as PyTorch's. */
  CHECK(pools == 2);
  if (out != NULL) memset(out, 0x67, 8 * KIB); /* still the caller's memory */
  OK(refpool_free(theirs));
  OK(refpool_allocator_empty_cache()); /* empty now: dropped, its memory back to the driver */
  OK(refpool_allocator_pool_ids(ids, 4, &pools));
  CHECK(pools == 1 && ids[0].first == pool.first);
  EXPECT(refpool_allocator_pool_take(0, second, theirs, 8 * KIB, other_stream, &out), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("no such pool"));
  OK(refpool_allocator_release_pool(0, pool)); /* freeable for a moment: the begin below counts the use again */
  void* const* context = &capturing;
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
}

/* Hostile review: a pool that served two devices; an idle buffer of device 1 taken on device 0 is
 * refused, and the message says it is another device's, not a size mismatch ("holds 4 KiB, but a
 * request of 4 KiB gets 4 KiB" before). */
static void test_take_on_another_device(void) {
  void* const* context = &capturing;
  OK(refpool_allocator_begin_pool(1, pool, captures, (void*)context, NULL));
  void* theirs = NULL;
  OK(refpool_allocator_alloc(4 * KIB, 1, capturing, &theirs));
  OK(refpool_free(theirs));
  refused_take(theirs, 4 * KIB, "another device");
  if (error_mentions("but a request of")) fprintf(stderr, "misleading message: %s\n", refpool_last_error());
  CHECK(!error_mentions("but a request of"));
  void* out = NULL;
  OK(refpool_allocator_pool_take(1, pool, theirs, 4 * KIB, capturing, &out));
  CHECK(out == theirs);
  OK(refpool_free(theirs));
  OK(refpool_allocator_end_pool(1, pool)); /* its use is released with device 0's, in main */
}

int main(int argc, char** argv) {
  segments = argc > 1 && strcmp(argv[1], "segments") == 0;
  refpool_cache_options cache_options = exact_cache_options();
  cache_options.segments = segments ? REFPOOL_SEGMENTS_ON : REFPOOL_SEGMENTS_OFF;
  configure_host_allocator(&cache_options);
  void* const* context = &capturing;
  OK(refpool_allocator_begin_pool(0, pool, captures, (void*)context, NULL));
  test_take_a_freed_buffer();
  if (segments) test_take_joined_neighbours();
  test_take_across_pools_and_lifetimes();
  test_take_on_another_device();
  OK(refpool_allocator_end_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool));
  OK(refpool_allocator_release_pool(0, pool)); /* the use of test_take_on_another_device's begin */
  OK(refpool_allocator_empty_cache());
  size_t pools = 99;
  OK(refpool_allocator_pool_ids(NULL, 0, &pools));
  CHECK(pools == 0);
  return finish(segments ? "framework_pool_take_test segments" : "framework_pool_take_test plain");
}
