/* The C API from C11: the seed case (16 floats, then 4x4 floats, one buffer), use after
 * unsafe_free, double release and every other stale handle, stats, errors, scope options (warm-up,
 * planned scopes), scopes across threads, the stats as text (refpool_cache_summary).
 * Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "c_checks.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <threads.h>

static refpool_cache exact_cache(void) {
  refpool_cache_options options;
  refpool_cache cache = {0};
  OK(refpool_cache_options_init(&options, sizeof options));
  OK(refpool_cache_create(&options, sizeof options, &cache));
  return cache;
}

static refpool_buffer alloc_floats(refpool_backend be, const size_t* dims, size_t rank) {
  refpool_buffer buffer = {0};
  OK(refpool_alloc(be, dims, rank, sizeof(float), NULL, 0, &buffer));
  return buffer;
}

static void* data_of(refpool_buffer buffer) {
  void* data = NULL;
  OK(refpool_data(buffer, &data));
  return data;
}

static void test_seed_case(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  void* first = NULL;
  for (int iteration = 0; iteration < 3; ++iteration) {
    refpool_scope scope = {0};
    OK(refpool_scope_enter(cache, &scope));

    const size_t flat[] = {16};
    refpool_buffer a = alloc_floats(be, flat, 1);
    float* values = data_of(a);
    if (first == NULL) first = values;
    CHECK(values == first);
    for (int i = 0; i < 16; ++i) values[i] = (float)i;
    size_t dims[4] = {0};
    size_t rank = 0;
    OK(refpool_dims(a, dims, 4, &rank));
    CHECK(rank == 1 && dims[0] == 16);
    OK(refpool_release(a));

    /* 64 bytes again, another shape: the same buffer, with the dims asked for. */
    const size_t square[] = {4, 4};
    refpool_buffer b = alloc_floats(be, square, 2);
    CHECK(data_of(b) == first);
    OK(refpool_dims(b, dims, 4, &rank));
    CHECK(rank == 2 && dims[0] == 4 && dims[1] == 4);
    refpool_buffer_info info;
    OK(refpool_buffer_get_info(b, &info, sizeof info));
    CHECK(info.rank == 2 && info.element_count == 16 && info.element_size == 4 && info.bytes == 64 &&
          info.is_freed == 0);
    OK(refpool_release(b));

    /* Another element type of 64 bytes. */
    const size_t eight[] = {8};
    refpool_buffer c = {0};
    OK(refpool_alloc(be, eight, 1, sizeof(double), NULL, 0, &c));
    CHECK(data_of(c) == first);
    OK(refpool_release(c));

    OK(refpool_scope_exit(scope));
  }
  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.backend_allocations == 1);
  CHECK(stats.misses == 1);
  CHECK(stats.hits == 8);
  CHECK(stats.scope_entries == 3);
  CHECK(stats.live_blocks == 0 && stats.idle_blocks == 1 && stats.idle_bytes == 64);
  refpool_backend_stats backend_stats;
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.allocation_count == 1 && backend_stats.outstanding_bytes == 64);

  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.outstanding_bytes == 0 && backend_stats.deallocation_count == 1);
  OK(refpool_backend_release(be));
}

static void test_use_after_unsafe_free(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));

  const size_t flat[] = {16};
  refpool_buffer a = alloc_floats(be, flat, 1);
  refpool_buffer shared = {0};
  OK(refpool_retain(a, &shared));
  long count = -1;
  OK(refpool_use_count(a, &count));
  CHECK(count == 2);
  CHECK(data_of(shared) == data_of(a));

  OK(refpool_unsafe_free(a));
  OK(refpool_use_count(a, &count));
  CHECK(count == 0);
  OK(refpool_use_count(shared, &count));
  CHECK(count == 1);
  void* data = NULL;
  EXPECT(refpool_data(a, &data), REFPOOL_ERROR_USE_AFTER_FREE);
  CHECK(error_mentions("unsafe_free"));
  CHECK(data == NULL); /* out-parameters are untouched on failure */
  refpool_buffer copy = {0};
  EXPECT(refpool_retain(a, &copy), REFPOOL_ERROR_USE_AFTER_FREE);
  const size_t square[] = {4, 4};
  EXPECT(refpool_reshape(a, square, 2, &copy), REFPOOL_ERROR_USE_AFTER_FREE);
  CHECK(copy.id == 0);
  OK(refpool_unsafe_free(a)); /* idempotent */
  refpool_buffer_info info;
  OK(refpool_buffer_get_info(a, &info, sizeof info));
  CHECK(info.is_freed == 1 && info.rank == 1 && info.element_count == 16);
  OK(refpool_release(shared)); /* the last reference: back to the cache, not via unsafe_free */

  /* unsafe_free of the only handle: the buffer is reusable at once, and the freed handle can
   * never reach the buffer handed out next. */
  refpool_buffer b = alloc_floats(be, flat, 1);
  void* b_data = data_of(b);
  OK(refpool_unsafe_free(b));
  refpool_buffer c = alloc_floats(be, square, 2);
  CHECK(data_of(c) == b_data);
  EXPECT(refpool_data(b, &data), REFPOOL_ERROR_USE_AFTER_FREE);

  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.unsafe_frees == 1);
  CHECK(stats.backend_allocations == 1);
  CHECK(stats.live_blocks == 1);

  OK(refpool_release(a));
  OK(refpool_release(b));
  OK(refpool_release(c));
  OK(refpool_scope_exit(scope));
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

static void test_stale_handles(void) {
  refpool_backend be = {0};
  OK(refpool_backend_host(&be));
  const size_t flat[] = {16};
  refpool_buffer a = alloc_floats(be, flat, 1);
  OK(refpool_release(a));
  EXPECT(refpool_release(a), REFPOOL_ERROR_INVALID_HANDLE);
  CHECK(error_mentions("already released"));
  void* data = NULL;
  EXPECT(refpool_data(a, &data), REFPOOL_ERROR_INVALID_HANDLE);
  EXPECT(refpool_unsafe_free(a), REFPOOL_ERROR_INVALID_HANDLE);

  /* The slot is reused by the next handle; the old id still cannot reach it. */
  refpool_buffer b = alloc_floats(be, flat, 1);
  CHECK(b.id != a.id);
  EXPECT(refpool_release(a), REFPOOL_ERROR_INVALID_HANDLE);
  long count = 0;
  OK(refpool_use_count(b, &count));
  CHECK(count == 1);
  OK(refpool_release(b));

  refpool_buffer null_buffer = {0};
  EXPECT(refpool_release(null_buffer), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("null buffer handle"));

  refpool_cache cache = exact_cache();
  refpool_buffer not_a_buffer = {cache.id};
  EXPECT(refpool_release(not_a_buffer), REFPOOL_ERROR_INVALID_HANDLE);
  CHECK(error_mentions("not a buffer handle (cache)"));
  refpool_buffer forged = {(UINT64_C(4) << 56) | (UINT64_C(1) << 28) | UINT64_C(0xfffffff)};
  EXPECT(refpool_release(forged), REFPOOL_ERROR_INVALID_HANDLE);
  CHECK(error_mentions("never handed out"));

  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  OK(refpool_scope_exit(scope));
  EXPECT(refpool_scope_exit(scope), REFPOOL_ERROR_INVALID_HANDLE);
  CHECK(error_mentions("already exited"));
  OK(refpool_cache_destroy(cache));
  EXPECT(refpool_cache_destroy(cache), REFPOOL_ERROR_INVALID_HANDLE);
  CHECK(error_mentions("already destroyed"));
  EXPECT(refpool_scope_enter(cache, &scope), REFPOOL_ERROR_INVALID_HANDLE);
  OK(refpool_backend_release(be));
  EXPECT(refpool_backend_release(be), REFPOOL_ERROR_INVALID_HANDLE);
  EXPECT(refpool_alloc(be, flat, 1, 4, NULL, 0, &a), REFPOOL_ERROR_INVALID_HANDLE);
}

static void test_stats_escapes_reclaim(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  const size_t dims[] = {256};
  refpool_buffer kept = alloc_floats(be, dims, 1);
  refpool_buffer dropped = alloc_floats(be, dims, 1);
  OK(refpool_release(dropped));
  OK(refpool_scope_exit(scope)); /* `kept` escapes */

  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.escapes == 1);
  CHECK(stats.live_blocks == 1 && stats.live_bytes == 1024);
  CHECK(stats.idle_blocks == 1 && stats.idle_bytes == 1024);
  CHECK(stats.held_bytes == 2048 && stats.peak_held_bytes == 2048);
  CHECK(data_of(kept) != NULL); /* an escaped buffer stays valid */
  OK(refpool_release(kept));

  size_t freed = 0;
  OK(refpool_cache_reclaim(cache, 0, &freed));
  CHECK(freed == 2048);
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.idle_bytes == 0 && stats.reclaimed_blocks == 2 && stats.backend_frees == 2);

  /* An idle limit evicts the oldest idle blocks. */
  OK(refpool_cache_set_max_idle_bytes(cache, 1024));
  OK(refpool_scope_enter(cache, &scope));
  refpool_buffer x = alloc_floats(be, dims, 1);
  refpool_buffer y = alloc_floats(be, dims, 1);
  OK(refpool_release(x));
  OK(refpool_release(y));
  OK(refpool_scope_exit(scope));
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.evictions == 1 && stats.idle_bytes == 1024);

  OK(refpool_cache_destroy(cache));
  refpool_backend_stats backend_stats;
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.outstanding_bytes == 0);
  OK(refpool_backend_release(be));
}

static void test_errors(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  const size_t flat[] = {16};
  refpool_buffer a = alloc_floats(be, flat, 1);
  refpool_buffer other = {0};
  const size_t bad[] = {5, 3};
  EXPECT(refpool_reshape(a, bad, 2, &other), REFPOOL_ERROR_SHAPE);
  CHECK(error_mentions("(16,)") && error_mentions("(5, 3)"));
  const size_t square[] = {4, 4};
  OK(refpool_reshape(a, square, 2, &other));
  CHECK(data_of(other) == data_of(a));
  long count = 0;
  OK(refpool_use_count(a, &count));
  CHECK(count == 2);
  OK(refpool_release(other));
  OK(refpool_release(a));

  const size_t huge[] = {SIZE_MAX, 2};
  EXPECT(refpool_alloc(be, huge, 2, 1, NULL, 0, &a), REFPOOL_ERROR_SIZE);
  const size_t big[] = {SIZE_MAX / 2 + 1};
  EXPECT(refpool_alloc(be, big, 1, 4, NULL, 0, &a), REFPOOL_ERROR_SIZE);
  EXPECT(refpool_alloc(be, flat, 1, 0, NULL, 0, &a), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_alloc(be, NULL, 2, 4, NULL, 0, &a), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_alloc(be, flat, 1, 4, NULL, 0, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("out is NULL"));
  EXPECT(refpool_cache_create(NULL, 0, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);

  /* Scalars and zero elements. */
  refpool_buffer scalar = {0};
  OK(refpool_alloc(be, NULL, 0, sizeof(double), NULL, 0, &scalar));
  refpool_buffer_info info;
  OK(refpool_buffer_get_info(scalar, &info, sizeof info));
  CHECK(info.rank == 0 && info.element_count == 1 && info.bytes == 8);
  OK(refpool_release(scalar));
  const size_t none[] = {0, 4};
  refpool_buffer empty = {0};
  OK(refpool_alloc(be, none, 2, 4, NULL, 0, &empty));
  void* data = &empty;
  OK(refpool_data(empty, &data));
  CHECK(data == NULL);
  OK(refpool_use_count(empty, &count));
  CHECK(count == 0);
  size_t rank = 0;
  size_t one_dim[1];
  EXPECT(refpool_dims(empty, one_dim, 1, &rank), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(rank == 2); /* set even when the array is too small */
  OK(refpool_dims(empty, NULL, 0, &rank));
  OK(refpool_release(empty));

  /* Out of memory: a 1 KiB backend, inside a scope (reclaim and retry first). */
  refpool_backend small = {0};
  OK(refpool_backend_new_host_limited(1024, &small));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  const size_t fits[] = {256};
  refpool_buffer in = alloc_floats(small, fits, 1);
  const size_t more[] = {1};
  EXPECT(refpool_alloc(small, more, 1, 4, NULL, 0, &a), REFPOOL_ERROR_OUT_OF_MEMORY);
  CHECK(error_mentions("out of memory"));
  OK(refpool_release(in));
  OK(refpool_scope_exit(scope));
  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.oom_retries == 1);
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(small));

  /* Bad options (more in cache_options_test.c). */
  refpool_cache_options options;
  OK(refpool_cache_options_init(&options, sizeof options));
  options.segments = (refpool_segment_policy)9;
  EXPECT(refpool_cache_create(&options, sizeof options, &cache), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("refpool_cache_options.segments is 9") && error_mentions("REFPOOL_SEGMENTS_OFF"));
  /* Segments on for the host backend: the miss carves a piece out of a segment. */
  options.segments = REFPOOL_SEGMENTS_ON;
  OK(refpool_cache_create(&options, sizeof options, &cache));
  {
    refpool_scope scope = {0};
    const size_t dims[] = {1024};
    OK(refpool_scope_enter(cache, &scope));
    OK(refpool_release(alloc_floats(be, dims, 1)));
    OK(refpool_scope_exit(scope));
    OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
    CHECK(stats.segments == 1 && stats.segment_grows == 1 && stats.backend_allocations == 0);
  }
  OK(refpool_cache_destroy(cache));
  options.segments = REFPOOL_SEGMENTS_OFF;
  options.rounding.mode = REFPOOL_ROUNDING_POW2;
  options.rounding.parameter = 3;
  EXPECT(refpool_cache_create(&options, sizeof options, &cache), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("rounding is pow2:3") && error_mentions("power of two"));
  options.rounding.mode = REFPOOL_ROUNDING_STEP;
  options.rounding.parameter = 0;
  EXPECT(refpool_cache_create(&options, sizeof options, &cache), REFPOOL_ERROR_CONFIG);
  options.rounding.mode = (refpool_rounding)7;
  EXPECT(refpool_cache_create(&options, sizeof options, &cache), REFPOOL_ERROR_CONFIG);
  options.rounding.mode = REFPOOL_ROUNDING_STEP;
  options.rounding.parameter = 512;
  OK(refpool_cache_create(&options, sizeof options, &cache));
  OK(refpool_cache_destroy(cache));
  OK(refpool_cache_options_from_environment(&options, sizeof options));

  CHECK(strcmp(refpool_status_name(REFPOOL_ERROR_SHAPE), "REFPOOL_ERROR_SHAPE") == 0);
  CHECK(strcmp(refpool_status_name((refpool_status)99), "REFPOOL_UNKNOWN_STATUS") == 0);
  CHECK(strlen(refpool_version()) > 0);
  OK(refpool_backend_release(be));
}

/* Scope options: warm-up entries run uncached; a planned scope records its first run and replays
 * it from one arena. */
static void test_scope_options(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  const size_t flat[] = {16};
  const size_t square[] = {4, 4};

  refpool_scope_options warmup = {1, NULL};
  for (int run = 0; run < 2; ++run) {
    refpool_scope scope = {0};
    OK(refpool_scope_enter_with_options(cache, &warmup, sizeof warmup, &scope));
    OK(refpool_release(alloc_floats(be, flat, 1)));
    OK(refpool_scope_exit(scope));
  }
  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.scope_entries == 2 && stats.uncached_entries == 1);
  CHECK(stats.misses == 1 && stats.hits == 0);

  refpool_scope_options planned = {0, "c-api-step"};
  for (int run = 0; run < 4; ++run) { /* a new sequence (pending), recorded, replayed twice */
    refpool_scope scope = {0};
    OK(refpool_scope_enter_with_options(cache, &planned, sizeof planned, &scope));
    refpool_buffer a = alloc_floats(be, flat, 1);
    refpool_buffer b = alloc_floats(be, square, 2); /* both live: two regions */
    CHECK(data_of(a) != data_of(b));
    OK(refpool_release(a));
    OK(refpool_release(b));
    OK(refpool_scope_exit(scope));
  }
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.plan_recordings == 1 && stats.plans == 1);
  CHECK(stats.plan_hits == 4 && stats.plan_misses == 0);
  CHECK(stats.arena_bytes >= 128 && stats.planned_peak_live_bytes == 128);

  refpool_scope scope = {0};
  EXPECT(refpool_scope_enter_with_options(cache, &planned, sizeof planned, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("refpool_scope_enter_with_options"));
  OK(refpool_scope_enter_with_options(cache, NULL, 0, &scope)); /* NULL options: a plain scope */
  OK(refpool_scope_exit(scope));
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

/* Scope order on one thread, and a scope exited on another thread. */
static refpool_scope shared_scope;
static refpool_status other_thread_status;

static int exit_shared_scope(void* unused) {
  (void)unused;
  other_thread_status = refpool_scope_exit(shared_scope);
  return 0;
}

static void test_scope_order(void) {
  refpool_cache outer_cache = exact_cache();
  refpool_cache inner_cache = exact_cache();
  refpool_scope outer = {0};
  refpool_scope inner = {0};
  OK(refpool_scope_enter(outer_cache, &outer));
  OK(refpool_scope_enter(inner_cache, &inner));
  EXPECT(refpool_scope_exit(outer), REFPOOL_ERROR_SCOPE);
  CHECK(error_mentions("out of order"));
  OK(refpool_scope_exit(inner));
  OK(refpool_scope_exit(outer));

  OK(refpool_scope_enter(outer_cache, &shared_scope));
  thrd_t thread;
  CHECK(thrd_create(&thread, exit_shared_scope, NULL) == thrd_success);
  CHECK(thrd_join(thread, NULL) == thrd_success);
  CHECK(other_thread_status == REFPOOL_ERROR_SCOPE);
  OK(refpool_scope_exit(shared_scope)); /* still active here */

  /* A cache destroyed under an active scope: the scope runs on, uncached, until it exits. */
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  OK(refpool_scope_enter(inner_cache, &inner));
  const size_t dims[] = {64};
  refpool_buffer live = alloc_floats(be, dims, 1);
  OK(refpool_cache_destroy(inner_cache));
  refpool_buffer after = alloc_floats(be, dims, 1);
  OK(refpool_release(after));
  OK(refpool_scope_exit(inner));
  OK(refpool_release(live));
  refpool_backend_stats backend_stats;
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.outstanding_bytes == 0);
  OK(refpool_backend_release(be));
  OK(refpool_cache_destroy(outer_cache));
}

/* Threads, each in its own scope on one cache, allocating and releasing through handles. */
enum { thread_count = 4, rounds = 200 };
static refpool_cache threads_cache;
static refpool_backend threads_backend;

static int worker(void* unused) {
  (void)unused;
  int bad = 0;
  for (int round = 0; round < 20; ++round) {
    refpool_scope scope = {0};
    bad |= refpool_scope_enter(threads_cache, &scope) != REFPOOL_OK;
    for (int i = 0; i < rounds / 20; ++i) {
      const size_t dims[] = {32, 2};
      refpool_buffer buffer = {0};
      refpool_buffer copy = {0};
      bad |= refpool_alloc(threads_backend, dims, 2, sizeof(float), NULL, 0, &buffer) != REFPOOL_OK;
      bad |= refpool_retain(buffer, &copy) != REFPOOL_OK;
      bad |= refpool_release(buffer) != REFPOOL_OK;
      bad |= refpool_release(copy) != REFPOOL_OK;
      bad |= refpool_release(copy) != REFPOOL_ERROR_INVALID_HANDLE;
    }
    bad |= refpool_scope_exit(scope) != REFPOOL_OK;
  }
  return bad;
}

static void test_threads(void) {
  OK(refpool_backend_new_host(&threads_backend));
  threads_cache = exact_cache();
  thrd_t threads[thread_count];
  for (int i = 0; i < thread_count; ++i) CHECK(thrd_create(&threads[i], worker, NULL) == thrd_success);
  for (int i = 0; i < thread_count; ++i) {
    int result = 1;
    CHECK(thrd_join(threads[i], &result) == thrd_success);
    CHECK(result == 0);
  }
  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(threads_cache, &stats, sizeof stats));
  CHECK(stats.hits + stats.misses == (uint64_t)thread_count * rounds);
  CHECK(stats.live_blocks == 0 && stats.escapes == 0);
  CHECK(stats.backend_allocations <= thread_count);
  OK(refpool_cache_destroy(threads_cache));
  OK(refpool_backend_release(threads_backend));
}

/* The stats as text for people, into a caller's buffer: sized first with NULL, refused when too
 * small (nothing written, the length still given), and the full table. */
static void test_summary(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  const size_t dims[] = {3 << 20}; /* 3 MiB of bytes */
  refpool_buffer b = {0};
  OK(refpool_alloc(be, dims, 1, 1, NULL, 0, &b));
  OK(refpool_release(b));
  OK(refpool_scope_exit(scope));

  size_t length = 0;
  OK(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, NULL, 0, &length));
  CHECK(length > 100 && length < 2000);
  char text[4096];
  memset(text, 'x', sizeof text);
  EXPECT(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, text, length, &length), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(text[0] == 'x' && error_mentions("room for"));
  size_t exact = 0;
  OK(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, text, length + 1, &exact));
  CHECK(exact == length && text[length] == '\0' && strlen(text) == length);
  CHECK(strstr(text, "requests") != NULL && strstr(text, "reserved") != NULL);
  CHECK(strstr(text, "3 MiB") != NULL && strstr(text, "3145728") == NULL); /* binary units */

  size_t full_length = 0;
  OK(refpool_cache_summary(cache, REFPOOL_SUMMARY_FULL, text, sizeof text, &full_length));
  CHECK(full_length > length && strstr(text, "backend_allocations") != NULL);
  CHECK(strstr(text, "held_bytes") == NULL); /* live + idle: one name per figure */

  EXPECT(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, text, sizeof text, NULL), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, NULL, 8, &length), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_summary(cache, (refpool_summary_detail)7, text, sizeof text, &length),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("REFPOOL_SUMMARY_SHORT"));
  OK(refpool_cache_destroy(cache));
  EXPECT(refpool_cache_summary(cache, REFPOOL_SUMMARY_SHORT, text, sizeof text, &length),
         REFPOOL_ERROR_INVALID_HANDLE);
  OK(refpool_backend_release(be));
}

int main(void) {
  test_seed_case();
  test_use_after_unsafe_free();
  test_stale_handles();
  test_stats_escapes_reclaim();
  test_errors();
  test_scope_options();
  test_scope_order();
  test_threads();
  test_summary();
  return finish("c_api_test");
}
