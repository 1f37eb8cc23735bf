/* A hostile review of the C ABI's structs that grow (refpool.h, "Structs that grow"), from C11:
 * every function that takes a struct with its size, given sizes no refpool.h declares (0, odd,
 * huge, or ending inside a field), misaligned pointers, NULL with a size, and newer headers'
 * structs with fields set; older callers' structs read back; the last error kept per thread.
 * Each bad call is refused with INVALID_ARGUMENT, writes nothing and makes nothing; ASan and UBSan
 * see every byte the library touches. Prints each failed check and exits 1 if any failed. */
#include <refpool/refpool.h>

#include "c_checks.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { fill = 0xEE, room = 1024 };

/* Room for any struct, 16-byte aligned, filled with `fill`; `at(offset)` is a pointer into it. */
typedef struct {
  unsigned char* bytes;
} arena;

static arena arena_new(void) {
  arena a = {aligned_alloc(16, room)};
  memset(a.bytes, fill, room);
  return a;
}

static int untouched(arena a) {
  for (size_t i = 0; i < room; ++i)
    if (a.bytes[i] != fill) return 0;
  return 1;
}

/* Sizes no header declares for a struct aligned to `align`: 0, odd, a negative int's, huge. */
static size_t bad_size(size_t i, size_t align) {
  const size_t sizes[] = {0, 3, align + 1, (size_t)0 - align, (size_t)1 << 40};
  return sizes[i];
}
enum { bad_sizes = 5 };

static refpool_backend be;
static refpool_cache cache;

static void test_outputs_refuse_bad_sizes_and_pointers(void) {
  refpool_buffer buffer = {0};
  const size_t one = 64;
  OK(refpool_alloc(be, &one, 1, 1, NULL, 0, &buffer));
  for (int misaligned = 0; misaligned <= 1; ++misaligned) {
    for (size_t i = 0; i < bad_sizes + 1; ++i) {
      arena a = arena_new();
      /* The last round: the right size, at a misaligned address (or aligned: must succeed). */
      const int right = i == bad_sizes;
      if (right && !misaligned) {
        free(a.bytes);
        continue;
      }
      void* at = a.bytes + (misaligned ? 1 : 0);
      const size_t s8 = right ? 0 : bad_size(i, 8);
#define OUT(call)                              \
  EXPECT(call, REFPOOL_ERROR_INVALID_ARGUMENT); \
  CHECK(untouched(a));
      OUT(refpool_cache_get_stats(cache, at, right ? sizeof(refpool_cache_stats) : s8))
      OUT(refpool_backend_get_stats(be, at, right ? sizeof(refpool_backend_stats) : s8))
      OUT(refpool_buffer_get_info(buffer, at, right ? sizeof(refpool_buffer_info) : s8))
      OUT(refpool_cache_option_info(0, at, right ? sizeof(refpool_option_info) : s8))
      OUT(refpool_cache_options_init(at, right ? sizeof(refpool_cache_options) : s8))
      OUT(refpool_cache_options_from_environment(at, right ? sizeof(refpool_cache_options) : s8))
      OUT(refpool_allocator_options_init((void*)(a.bytes + (misaligned ? 2 : 0)),
                                         right ? sizeof(refpool_allocator_options) : bad_size(i, 4)))
#undef OUT
      free(a.bytes);
    }
  }
  /* NULL with a size: refused, naming the pointer. */
  EXPECT(refpool_cache_get_stats(cache, NULL, sizeof(refpool_cache_stats)), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_option_info(0, NULL, sizeof(refpool_option_info)), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_init(NULL, sizeof(refpool_cache_options)), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_options_init(NULL, sizeof(refpool_allocator_options)), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_release(buffer));
}

/* refpool_cache_options starts with a 16-byte rounding policy: 8 bytes would be half of it. */
static void test_cache_options_ending_inside_a_field(void) {
  arena a = arena_new();
  refpool_cache_options* half = (refpool_cache_options*)a.bytes;
  EXPECT(refpool_cache_options_init(half, 8), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("8 bytes"));
  EXPECT(refpool_cache_options_from_environment(half, 8), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(untouched(a));
  memset(a.bytes, 0, room);
  half->rounding.mode = REFPOOL_ROUNDING_POW2;
  refpool_cache made = {0};
  EXPECT(refpool_cache_create(half, 8, &made), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(made.id == 0);
  EXPECT(refpool_cache_options_set(half, 8, "max_idle_bytes", "1M"), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_cache_options_parse(half, 8, "rounding:pow2"), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_allocator_configure(NULL, 0, half, 8), REFPOOL_ERROR_INVALID_ARGUMENT);
  /* The sizes older headers had: rounding, then max_idle_bytes too. */
  OK(refpool_cache_options_init(half, 16));
  OK(refpool_cache_options_init(half, 24));
  OK(refpool_cache_create(half, 24, &made));
  OK(refpool_cache_destroy(made));
  free(a.bytes);
}

static void test_inputs_refuse_bad_sizes_and_pointers(void) {
  for (int misaligned = 0; misaligned <= 1; ++misaligned) {
    for (size_t i = 0; i < bad_sizes + 1; ++i) {
      const int right = i == bad_sizes;
      if (right && !misaligned) continue;
      arena a = arena_new();
      memset(a.bytes, 0, room); /* zero: every field its default, a newer header's fields unset */
      const void* at = a.bytes + (misaligned ? 1 : 0);
      const size_t s8 = right ? 0 : bad_size(i, 8);
      refpool_cache made = {0};
      EXPECT(refpool_cache_create(at, right ? sizeof(refpool_cache_options) : s8, &made),
             REFPOOL_ERROR_INVALID_ARGUMENT);
      CHECK(made.id == 0);
      refpool_scope scope = {0};
      EXPECT(refpool_scope_enter_with_options(cache, at, right ? sizeof(refpool_scope_options) : s8, &scope),
             REFPOOL_ERROR_INVALID_ARGUMENT);
      CHECK(scope.id == 0);
      refpool_step step = {0};
      EXPECT(refpool_step_begin(cache, at, right ? sizeof(refpool_scope_options) : s8, &step),
             REFPOOL_ERROR_INVALID_ARGUMENT);
      CHECK(step.id == 0);
      refpool_buffer buffer = {0};
      const size_t one = 64;
      EXPECT(refpool_alloc(be, &one, 1, 1, at, right ? sizeof(refpool_alloc_options) : s8, &buffer),
             REFPOOL_ERROR_INVALID_ARGUMENT);
      CHECK(buffer.id == 0);
      const void* at4 = a.bytes + (misaligned ? 2 : 0);
      EXPECT(refpool_allocator_configure(at4, right ? sizeof(refpool_allocator_options) : bad_size(i, 4), NULL, 0),
             REFPOOL_ERROR_INVALID_ARGUMENT);
      free(a.bytes);
    }
  }
  /* NULL with a size: the defaults (a NULL options pointer's size is ignored). */
  refpool_scope scope = {0};
  OK(refpool_scope_enter_with_options(cache, NULL, 12345, &scope));
  OK(refpool_scope_exit(scope));
  refpool_step step = {0};
  OK(refpool_step_begin(cache, NULL, 3, &step));
  OK(refpool_step_end(step));
  refpool_cache made = {0};
  OK(refpool_cache_create(NULL, (size_t)-8, &made));
  OK(refpool_cache_destroy(made));
}

/* A newer header's struct: each input with its one appended field set is refused, naming the byte. */
static void test_newer_inputs_with_fields_set(void) {
  arena a = arena_new();
  memset(a.bytes, 0, room);
  const size_t one = 64;
  refpool_buffer buffer = {0};
  a.bytes[sizeof(refpool_alloc_options)] = 1;
  EXPECT(refpool_alloc(be, &one, 1, 1, (const void*)a.bytes, sizeof(refpool_alloc_options) + 8, &buffer),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(buffer.id == 0 && error_mentions("newer refpool.h"));
  memset(a.bytes, 0, room);
  a.bytes[sizeof(refpool_scope_options) + 7] = 1;
  refpool_step step = {0};
  EXPECT(refpool_step_begin(cache, (const void*)a.bytes, sizeof(refpool_scope_options) + 8, &step),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(step.id == 0);
  memset(a.bytes, 0, room);
  a.bytes[sizeof(refpool_allocator_options)] = 1;
  EXPECT(refpool_allocator_configure((const void*)a.bytes, sizeof(refpool_allocator_options) + 4, NULL, 0),
         REFPOOL_ERROR_INVALID_ARGUMENT);
  free(a.bytes);
}

/* An older header's refpool_option_info (name, kind, offset) and refpool_allocator_options
 * (runtime only): the fields it has, nothing past it. */
typedef struct option_info_older {
  const char* name;
  const char* kind;
  size_t offset;
} option_info_older;

static void test_older_outputs(void) {
  option_info_older* older = malloc(sizeof *older);
  OK(refpool_cache_option_info(1, (refpool_option_info*)older, sizeof *older));
  CHECK(strcmp(older->name, "max_idle_bytes") == 0 && strcmp(older->kind, "byte_limit") == 0);
  CHECK(older->offset == offsetof(refpool_cache_options, max_idle_bytes));
  free(older);
  refpool_runtime* runtime = malloc(sizeof *runtime);
  OK(refpool_allocator_options_init((refpool_allocator_options*)runtime, sizeof *runtime));
  CHECK(*runtime == REFPOOL_RUNTIME_CUDA);
  free(runtime);
}

/* Each thread keeps its own last error; a thread's end leaves the others' messages alone. */
static void* fail_once(void* message_out) {
  int not_refpools = 0;
  if (refpool_free(&not_refpools) == REFPOOL_ERROR_INVALID_ARGUMENT)
    strncpy(message_out, refpool_last_error(), 255);
  return NULL;
}

static void test_last_error_per_thread(void) {
  EXPECT(refpool_cache_get_stats(cache, NULL, 8), REFPOOL_ERROR_INVALID_ARGUMENT);
  const char* mine = refpool_last_error();
  char copy[256] = {0};
  strncpy(copy, mine, 255);
  char theirs[256] = {0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, fail_once, theirs) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  CHECK(strstr(theirs, "refpool_free") != NULL || strstr(theirs, "free") != NULL);
  CHECK(refpool_last_error() == mine && strcmp(mine, copy) == 0);
  OK(refpool_cache_reclaim(cache, 0, NULL)); /* success leaves it unchanged */
  CHECK(strcmp(refpool_last_error(), copy) == 0);
}

int main(void) {
  OK(refpool_backend_new_host(&be));
  OK(refpool_cache_create(NULL, 0, &cache));
  test_outputs_refuse_bad_sizes_and_pointers();
  test_cache_options_ending_inside_a_field();
  test_inputs_refuse_bad_sizes_and_pointers();
  test_newer_inputs_with_fields_set();
  test_older_outputs();
  test_last_error_per_thread();
  OK(refpool_cache_destroy(cache));
  refpool_backend_stats stats;
  OK(refpool_backend_get_stats(be, &stats, sizeof stats));
  CHECK(stats.outstanding_bytes == 0);
  OK(refpool_backend_release(be));
  return finish("hostile_abi_test");
}
