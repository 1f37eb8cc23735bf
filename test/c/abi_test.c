/* Structs that grow (refpool.h, "Structs that grow"), from C11: programs built against older and
 * newer headers than this library's, with copies of those headers' structs. Each caller struct lives
 * in a heap block of exactly its size under ASan, which reports a write past it
 * (heap-buffer-overflow), and is followed by guard bytes that are checked in other builds; the
 * fields it knows must be right and the fields only a newer header has must be 0.
 *
 * stats_0_2 is refpool_cache_stats as refpool 0.2 first shipped it, 46 counters (before
 * peak_plan_live_bytes, arena_lendings, segment_trims and segment_trimmed_bytes were appended with
 * the same soname): refpool 0.2.0 of a41efcd wrote 32 bytes past it. stats_a41efcd is the struct of
 * a41efcd's header, 50 counters: a program built against it must keep working when counters are
 * appended. Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "c_checks.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The counters of refpool 0.2's first header, in order (a copy: never generated from today's). */
#define STATS_0_2(X)                                                                                                \
  X(uint64_t, hits) X(uint64_t, misses) X(uint64_t, steals) X(uint64_t, backend_allocations)                        \
  X(uint64_t, backend_frees) X(uint64_t, unsafe_frees) X(uint64_t, escapes) X(uint64_t, evictions)                  \
  X(uint64_t, reclaimed_blocks) X(uint64_t, oom_retries) X(uint64_t, cross_stream_reuses) X(uint64_t, scope_entries) \
  X(uint64_t, uncached_entries) X(size_t, live_blocks) X(size_t, idle_blocks) X(size_t, live_bytes)                 \
  X(size_t, idle_bytes) X(size_t, held_bytes) X(size_t, peak_held_bytes) X(uint64_t, plan_hits)                     \
  X(uint64_t, plan_misses) X(uint64_t, plan_recordings) X(size_t, plans) X(size_t, arena_bytes)                     \
  X(size_t, planned_peak_live_bytes) X(uint64_t, ooms) X(size_t, peak_live_bytes) X(uint64_t, steps)                \
  X(uint64_t, uncached_allocations) X(size_t, uncached_live_bytes) X(size_t, plan_live_bytes)                       \
  X(size_t, allocated_bytes) X(size_t, reserved_bytes) X(size_t, peak_allocated_bytes)                              \
  X(size_t, peak_reserved_bytes) X(uint64_t, plan_evictions) X(uint64_t, plan_pauses)                               \
  X(uint64_t, plan_unrecorded_runs) X(uint64_t, plan_busy_runs) X(uint64_t, arena_growths)                          \
  X(uint64_t, arena_replacements) X(size_t, segments) X(size_t, segment_bytes) X(size_t, segment_free_bytes)        \
  X(uint64_t, segment_grows) X(uint64_t, splits) X(uint64_t, merges)
/* a41efcd's header: four more at the end. */
#define STATS_A41EFCD(X)                                                                                  \
  STATS_0_2(X)                                                                                            \
  X(size_t, peak_plan_live_bytes) X(uint64_t, arena_lendings) X(uint64_t, segment_trims)                  \
  X(uint64_t, segment_trimmed_bytes)

#define FIELD(type, name) type name;
typedef struct stats_0_2 {
  STATS_0_2(FIELD)
} stats_0_2;
typedef struct stats_a41efcd {
  STATS_A41EFCD(FIELD)
} stats_a41efcd;
#undef FIELD

/* A header newer than this library's: its struct with counters appended. */
typedef struct stats_newer {
  refpool_cache_stats known;
  uint64_t appended[3];
} stats_newer;

/* Under ASan the block is exactly the struct, so its redzone follows the struct directly; in other
 * builds guard bytes follow it in the same block and are checked. */
#if defined(__SANITIZE_ADDRESS__)
#define GUARD_BYTES 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GUARD_BYTES 0
#endif
#endif
#ifndef GUARD_BYTES
#define GUARD_BYTES 64
#endif
enum { guard_bytes = GUARD_BYTES, guard_value = 0xA5 };

/* A heap block for a caller's struct of `size` bytes, filled with `fill`, and its guards. */
typedef struct caller_struct {
  unsigned char* bytes;
  size_t size;
} caller_struct;

static caller_struct caller_new(size_t size, unsigned char fill) {
  caller_struct made = {malloc(size + guard_bytes), size};
  memset(made.bytes, fill, size);
  memset(made.bytes + size, guard_value, guard_bytes);
  return made;
}

/* Checks nothing was written past the caller's struct, and frees it. */
static void caller_free(caller_struct s, const char* what) {
  const size_t guards = guard_bytes;
  for (size_t i = 0; i < guards; ++i) {
    if (s.bytes[s.size + i] != guard_value) {
      fprintf(stderr, "%s: byte %zu past the caller's %zu-byte struct was written\n", what, i, s.size);
      ++failures;
      break;
    }
  }
  free(s.bytes);
}

/* The value of counter `name` as the library lists it. */
static uint64_t library_value(const uint64_t* values, size_t count, const char* name) {
  for (size_t i = 0; i < count; ++i)
    if (strcmp(refpool_stat_name(i), name) == 0) return values[i];
  fprintf(stderr, "the library has no counter %s\n", name);
  ++failures;
  return 0;
}

/* A cache with hits, misses, idle and live bytes, so that most counters differ from 0 and each other. */
static refpool_cache busy_cache(refpool_backend be, refpool_buffer* kept) {
  refpool_cache cache = {0};
  OK(refpool_cache_create(NULL, 0, &cache));
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  for (int round = 0; round < 3; ++round) {
    refpool_buffer a = {0}, b = {0};
    const size_t small = 1000, large = 70000;
    OK(refpool_alloc(be, &small, 1, 1, NULL, 0, &a));
    OK(refpool_alloc(be, &large, 1, 1, NULL, 0, &b));
    OK(refpool_release(a));
    OK(refpool_release(b));
  }
  const size_t live = 4096;
  OK(refpool_alloc(be, &live, 1, 1, NULL, 0, kept));
  OK(refpool_scope_exit(scope));
  return cache;
}

#define CHECK_KNOWN(type, name)                                                                        \
  if (old->name != library_value(values, count, #name)) {                                              \
    fprintf(stderr, "%s.%s is %llu, the library says %llu\n", what, #name, (unsigned long long)old->name, \
            (unsigned long long)library_value(values, count, #name));                                  \
    ++failures;                                                                                        \
  }

static void check_stats_0_2(const stats_0_2* old, const uint64_t* values, size_t count, const char* what) {
  STATS_0_2(CHECK_KNOWN)
}

static void check_stats_a41efcd(const stats_a41efcd* old, const uint64_t* values, size_t count, const char* what) {
  STATS_A41EFCD(CHECK_KNOWN)
}
#undef CHECK_KNOWN

static void test_stats_of_other_headers(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_buffer kept = {0};
  refpool_cache cache = busy_cache(be, &kept);
  uint64_t values[256];
  size_t count = 0;
  OK(refpool_cache_get_stat_values(cache, values, 256, &count));
  CHECK(count >= 50 && count <= 256);

  caller_struct early = caller_new(sizeof(stats_0_2), 0xEE);
  OK(refpool_cache_get_stats(cache, (refpool_cache_stats*)early.bytes, early.size));
  check_stats_0_2((const stats_0_2*)early.bytes, values, count, "stats_0_2");
  CHECK(((const stats_0_2*)early.bytes)->hits > 0 && ((const stats_0_2*)early.bytes)->live_bytes == 4096);
  caller_free(early, "refpool_cache_get_stats into refpool 0.2's first struct");

  caller_struct last = caller_new(sizeof(stats_a41efcd), 0xEE);
  OK(refpool_cache_get_stats(cache, (refpool_cache_stats*)last.bytes, last.size));
  check_stats_a41efcd((const stats_a41efcd*)last.bytes, values, count, "stats_a41efcd");
  caller_free(last, "refpool_cache_get_stats into a41efcd's struct");

  /* A newer header: the library's counters, and 0 for the counters it does not have. */
  caller_struct newer = caller_new(sizeof(stats_newer), 0xEE);
  OK(refpool_cache_get_stats(cache, (refpool_cache_stats*)newer.bytes, newer.size));
  const stats_newer* n = (const stats_newer*)newer.bytes;
  CHECK(n->known.hits == library_value(values, count, "hits"));
  CHECK(n->known.segment_trimmed_bytes == library_value(values, count, "segment_trimmed_bytes"));
  CHECK(n->appended[0] == 0 && n->appended[1] == 0 && n->appended[2] == 0);
  caller_free(newer, "refpool_cache_get_stats into a newer header's struct");

  /* Sizes no header ever had: refused, nothing written. */
  refpool_cache_stats whole;
  memset(&whole, 0xEE, sizeof whole);
  EXPECT(refpool_cache_get_stats(cache, &whole, 0), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("0 bytes is not the size of a refpool_cache_stats"));
  EXPECT(refpool_cache_get_stats(cache, &whole, 12), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(whole.hits == 0xEEEEEEEEEEEEEEEEull);
  EXPECT(refpool_cache_get_stats(cache, NULL, sizeof whole), REFPOOL_ERROR_INVALID_ARGUMENT);

  /* The backend's counters into a struct that has only the first. */
  caller_struct one = caller_new(sizeof(size_t), 0xEE);
  OK(refpool_backend_get_stats(be, (refpool_backend_stats*)one.bytes, one.size));
  CHECK(*(const size_t*)one.bytes > 0);
  caller_free(one, "refpool_backend_get_stats into a one-field struct");

  /* A buffer's info into a struct of rank and element count only. */
  caller_struct info = caller_new(2 * sizeof(size_t), 0xEE);
  OK(refpool_buffer_get_info(kept, (refpool_buffer_info*)info.bytes, info.size));
  CHECK(((const size_t*)info.bytes)[0] == 1 && ((const size_t*)info.bytes)[1] == 4096);
  caller_free(info, "refpool_buffer_get_info into a two-field struct");

  OK(refpool_release(kept));
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

/* refpool_cache_options of a header that had only rounding and max_idle_bytes. */
typedef struct options_older {
  refpool_rounding_policy rounding;
  refpool_byte_limit max_idle_bytes;
} options_older;

/* One newer than this library's: an option appended. */
typedef struct options_newer {
  refpool_cache_options known;
  uint64_t appended;
} options_newer;

static void test_options_of_other_headers(void) {
  caller_struct older = caller_new(sizeof(options_older), 0xEE);
  refpool_cache_options* as_options = (refpool_cache_options*)older.bytes;
  OK(refpool_cache_options_init(as_options, older.size));
  const options_older* o = (const options_older*)older.bytes;
  CHECK(o->rounding.mode == REFPOOL_ROUNDING_EXACT && o->max_idle_bytes == REFPOOL_UNLIMITED);
  OK(refpool_cache_options_parse(as_options, older.size, "rounding:step:256,max_idle_bytes:1M"));
  CHECK(o->rounding.mode == REFPOOL_ROUNDING_STEP && o->rounding.parameter == 256);
  CHECK(o->max_idle_bytes == 1048576);
  /* An option the struct has no field for cannot be set in it: refused, naming it; nothing written. */
  EXPECT(refpool_cache_options_set(as_options, older.size, "auto_plans", "off"), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("auto_plans") && error_mentions("older refpool.h"));
  EXPECT(refpool_cache_options_parse(as_options, older.size, "max_idle_bytes:2M,segments:on"), REFPOOL_ERROR_CONFIG);
  CHECK(o->max_idle_bytes == 1048576);
  /* Setting one to the value it has anyway (REFPOOL_CONF's, else the default) is fine. */
  OK(refpool_cache_options_set(as_options, older.size, "auto_plans", "on"));
  OK(refpool_cache_options_from_environment(as_options, older.size));

  /* A cache from the older struct: its options as given, the rest from REFPOOL_CONF's defaults. */
  OK(refpool_cache_options_parse(as_options, older.size, "rounding:step:256"));
  refpool_cache cache = {0};
  OK(refpool_cache_create(as_options, older.size, &cache));
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  refpool_buffer b = {0};
  const size_t hundred = 100;
  OK(refpool_alloc(be, &hundred, 1, 1, NULL, 0, &b));
  OK(refpool_release(b));
  OK(refpool_scope_exit(scope));
  CHECK(stat(cache, "idle_bytes") == 256); /* rounded by the older struct's rounding */
  OK(refpool_cache_destroy(cache));
  caller_free(older, "cache options of an older header");

  /* A newer struct: init zeroes what this library does not know; unset, it is taken. */
  caller_struct newer = caller_new(sizeof(options_newer), 0xEE);
  options_newer* n = (options_newer*)newer.bytes;
  OK(refpool_cache_options_init(&n->known, newer.size));
  CHECK(n->appended == 0 && n->known.auto_plans == REFPOOL_ON);
  OK(refpool_cache_create(&n->known, newer.size, &cache));
  OK(refpool_cache_destroy(cache));
  /* Set, it would be ignored: refused, naming the byte. */
  n->appended = 1;
  cache.id = 0;
  EXPECT(refpool_cache_create(&n->known, newer.size, &cache), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("byte 32") && error_mentions("newer refpool.h") && cache.id == 0);
  caller_free(newer, "cache options of a newer header");

  refpool_cache_options whole;
  memset(&whole, 0, sizeof whole);
  EXPECT(refpool_cache_options_init(&whole, 0), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_init(&whole, sizeof whole - 1), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_create(&whole, 2, &cache), REFPOOL_ERROR_INVALID_ARGUMENT);

  /* An option's info into a struct that has only the name. */
  caller_struct name_only = caller_new(sizeof(const char*), 0xEE);
  OK(refpool_cache_option_info(0, (refpool_option_info*)name_only.bytes, name_only.size));
  CHECK(strcmp(*(const char* const*)name_only.bytes, "rounding") == 0);
  caller_free(name_only, "refpool_cache_option_info into a one-field struct");
  OK(refpool_backend_release(be));
}

/* refpool_scope_options and refpool_alloc_options of a header with only their first field: the
 * others take their defaults (no plan; the backend's alignment, the thread's scope). */
static void test_input_structs_of_an_older_header(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = {0};
  OK(refpool_cache_create(NULL, 0, &cache));
  caller_struct scope_options = caller_new(sizeof(size_t), 0);
  refpool_scope scope = {0};
  OK(refpool_scope_enter_with_options(cache, (const refpool_scope_options*)scope_options.bytes, scope_options.size,
                                      &scope));
  caller_struct alloc_options = caller_new(sizeof(void*), 0);
  refpool_buffer b = {0};
  const size_t bytes = 512;
  OK(refpool_alloc(be, &bytes, 1, 1, (const refpool_alloc_options*)alloc_options.bytes, alloc_options.size, &b));
  OK(refpool_release(b));
  OK(refpool_scope_exit(scope));
  CHECK(stat(cache, "misses") == 1 && stat(cache, "plan_recordings") == 0);
  caller_free(alloc_options, "refpool_alloc_options of an older header");
  caller_free(scope_options, "refpool_scope_options of an older header");
  refpool_alloc_options whole = {0};
  EXPECT(refpool_alloc(be, &bytes, 1, 1, &whole, 4, &b), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

int main(void) {
  test_stats_of_other_headers();
  test_options_of_other_headers();
  test_input_structs_of_an_older_header();
  return finish("abi_test");
}
