/* What the C tests share: a failure count, CHECK / EXPECT / OK that print what failed and go on,
 * and error_mentions. Each test is one translation unit, so the static count is the test's. */
#ifndef REFPOOL_TEST_C_CHECKS_H
#define REFPOOL_TEST_C_CHECKS_H

#include <refpool/refpool.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* Checks that `call` returns `expected`; prints the status and last error otherwise. */
#define EXPECT(call, expected)                                                                            \
  do {                                                                                                    \
    const refpool_status got_ = (call);                                                                   \
    if (got_ != (expected)) {                                                                             \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, __LINE__, #call, \
              refpool_status_name(got_), refpool_status_name(expected), refpool_last_error());            \
      ++failures;                                                                                         \
    }                                                                                                     \
  } while (0)

#define OK(call) EXPECT(call, REFPOOL_OK)

/* True when the last error message contains `part`. */
static inline int error_mentions(const char* part) { return strstr(refpool_last_error(), part) != NULL; }

/* The value of counter `name` of `cache`, through the by-name interface bindings use. */
static inline uint64_t stat(refpool_cache cache, const char* name) {
  uint64_t values[128];
  size_t count = 0;
  OK(refpool_cache_get_stat_values(cache, values, 128, &count));
  for (size_t i = 0; i < count && i < 128; ++i)
    if (strcmp(refpool_stat_name(i), name) == 0) return values[i];
  fprintf(stderr, "no counter named %s\n", name);
  ++failures;
  return 0;
}

/* Cache options with their defaults but exact sizes: every request its own key. */
static inline refpool_cache_options exact_cache_options(void) {
  refpool_cache_options cache_options;
  OK(refpool_cache_options_init(&cache_options, sizeof cache_options));
  cache_options.rounding.mode = REFPOOL_ROUNDING_EXACT;
  return cache_options;
}

/* Configures the framework allocator on the host runtime with `cache_options`. */
static inline void configure_host_allocator(const refpool_cache_options* cache_options) {
  refpool_allocator_options options;
  OK(refpool_allocator_options_init(&options, sizeof options));
  options.runtime = REFPOOL_RUNTIME_HOST;
  OK(refpool_allocator_configure(&options, sizeof options, cache_options, sizeof *cache_options));
}

/* Ends the test: 1 if any check failed, else prints that `test` passed. */
static inline int finish(const char* test) {
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("%s: all checks passed\n", test);
  return 0;
}

#endif
