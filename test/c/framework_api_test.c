/* The C API that frameworks and bindings use, from C11, on the host backend: refpool_alloc's options
 * (stream, alignment, a cache without a scope), frees by address (zero bytes, double and unknown
 * frees), cache-level allocations released on other threads, steps (plain
 * and planned, begun and ended on different threads), counters by name and peaks, the framework
 * allocator's options, and the PyTorch- and CuPy-shaped entry points called exactly as those
 * frameworks call them. GPU backends are checked to fail clearly without a GPU here; the GPU
 * suite runs them on a device. Prints each failed check and exits 1 if any failed. */
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

/* A buffer of `bytes` bytes through refpool_alloc with `options` (NULL: the defaults). */
static refpool_buffer bytes_buffer(refpool_backend be, size_t bytes, const refpool_alloc_options* options) {
  refpool_buffer b = {0};
  OK(refpool_alloc(be, &bytes, 1, 1, options, sizeof *options, &b));
  return b;
}

static void* data_of(refpool_buffer b) {
  void* p = NULL;
  OK(refpool_data(b, &p));
  return p;
}

static void test_alloc_options(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  refpool_buffer a = bytes_buffer(be, 4096, NULL);
  void* p = data_of(a);
  CHECK(p != NULL);
  memset(p, 7, 4096);
  OK(refpool_release(a));
  refpool_alloc_options on_default_stream = {NULL, 256, {0}}; /* explicit stream and alignment */
  refpool_buffer b = bytes_buffer(be, 4096, &on_default_stream);
  CHECK(data_of(b) == p); /* the scope's idle buffer, reused at once */
  OK(refpool_release(b));

  /* Alignment: a power of two up to the backend's (256 B); above it, or not a power of two, refused. */
  const size_t n = 64;
  refpool_buffer refused = {0};
  refpool_alloc_options over_aligned = {NULL, 512, {0}};
  EXPECT(refpool_alloc(be, &n, 1, 1, &over_aligned, sizeof over_aligned, &refused), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("alignment 512 is above backend"));
  refpool_alloc_options odd = {NULL, 48, {0}};
  EXPECT(refpool_alloc(be, &n, 1, 1, &odd, sizeof odd, &refused), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("not a power of two"));
  CHECK(refused.id == 0);

  /* Zero bytes: a buffer that owns nothing and has no address. */
  refpool_buffer zero = bytes_buffer(be, 0, NULL);
  CHECK(data_of(zero) == NULL);
  OK(refpool_release(zero));
  OK(refpool_scope_exit(scope));

  /* Free by address: NULL does nothing; a pointer refpool never handed out is an error, never UB. */
  OK(refpool_free(NULL));
  int local = 0;
  EXPECT(refpool_free(&local), REFPOOL_ERROR_INVALID_ARGUMENT);

  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats, sizeof stats));
  CHECK(stats.misses == 1 && stats.hits == 1 && stats.live_blocks == 0);
  refpool_backend_stats backend_stats;
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.allocation_count == 1);
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_get_stats(be, &backend_stats, sizeof backend_stats));
  CHECK(backend_stats.outstanding_bytes == 0);
  OK(refpool_backend_release(be));
}

/* Cache-level allocations from two threads: one allocates, the other frees, like PyTorch's
 * forward on the main thread and backward on its autograd thread. */
typedef struct {
  refpool_cache cache;
  refpool_backend be;
  refpool_buffer buffers[8];
} exchange;

static int free_all(void* arg) {
  exchange* x = (exchange*)arg;
  for (int i = 0; i < 8; ++i) OK(refpool_release(x->buffers[i]));
  return 0;
}

static void test_cache_level_threads(void) {
  exchange x = {exact_cache(), {0}, {{0}}};
  OK(refpool_backend_new_host(&x.be));
  const refpool_alloc_options through_cache = {NULL, 0, x.cache};
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 8; ++i) x.buffers[i] = bytes_buffer(x.be, 1024 * (size_t)(i + 1), &through_cache);
    thrd_t t;
    CHECK(thrd_create(&t, free_all, &x) == thrd_success);
    thrd_join(t, NULL);
  }
  CHECK(stat(x.cache, "misses") == 8);
  CHECK(stat(x.cache, "hits") == 32);
  CHECK(stat(x.cache, "backend_allocations") == 8);
  CHECK(stat(x.cache, "live_blocks") == 0 && stat(x.cache, "idle_blocks") == 8);
  OK(refpool_cache_destroy(x.cache));
  OK(refpool_backend_release(x.be));
}

typedef struct {
  refpool_step step;
} step_box;

static int end_step(void* arg) {
  OK(refpool_step_end(((step_box*)arg)->step));
  return 0;
}

static void test_steps(void) {
  refpool_cache cache = exact_cache();
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_buffer kept = {0};
  const refpool_alloc_options through_cache = {NULL, 0, cache};
  for (int iteration = 0; iteration < 4; ++iteration) {
    step_box box = {{0}};
    refpool_scope_options planned = {0, "train"};
    OK(refpool_step_begin(cache, &planned, sizeof planned, &box.step));
    refpool_step second = {0};
    EXPECT(refpool_step_begin(cache, NULL, 0, &second), REFPOOL_ERROR_SCOPE); /* steps do not nest */
    refpool_buffer a = bytes_buffer(be, 1 << 16, &through_cache);
    refpool_buffer b = bytes_buffer(be, 1 << 12, &through_cache);
    OK(refpool_release(a));
    if (iteration == 0) {
      kept = b; /* escapes the first step */
    } else {
      OK(refpool_release(b));
    }
    thrd_t t; /* a step may end on another thread */
    CHECK(thrd_create(&t, end_step, &box) == thrd_success);
    thrd_join(t, NULL);
    EXPECT(refpool_step_end(box.step), REFPOOL_ERROR_INVALID_HANDLE); /* ended once */
    if (iteration == 0) OK(refpool_release(kept));
  }
  CHECK(stat(cache, "steps") == 4);
  CHECK(stat(cache, "escapes") == 1);
  CHECK(stat(cache, "plan_hits") >= 2); /* steps 3 and 4 replay a plan made from an earlier one */
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

static void test_stats_by_name(void) {
  const size_t count = refpool_stat_count();
  CHECK(count == sizeof(refpool_cache_stats) / sizeof(uint64_t));
  CHECK(strcmp(refpool_stat_name(0), "hits") == 0);
  CHECK(refpool_stat_name(count) == NULL && refpool_stat_description(count) == NULL);
  for (size_t i = 0; i < count; ++i) CHECK(refpool_stat_description(i) != NULL && refpool_stat_description(i)[0] != 0);

  refpool_cache cache = exact_cache();
  size_t needed = 0;
  OK(refpool_cache_get_stat_values(cache, NULL, 0, &needed));
  CHECK(needed == count);
  uint64_t one = 0;
  EXPECT(refpool_cache_get_stat_values(cache, NULL, 1, &needed), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_cache_get_stat_values(cache, &one, 1, &needed)); /* a short array gets the first counters */

  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  OK(refpool_release(bytes_buffer(be, 1 << 20, NULL)));
  refpool_buffer small = bytes_buffer(be, 1 << 10, NULL);
  CHECK(stat(cache, "peak_live_bytes") == 1 << 20);
  CHECK(stat(cache, "peak_held_bytes") == (1 << 20) + (1 << 10));
  OK(refpool_cache_reclaim(cache, 0, NULL));
  OK(refpool_cache_reset_peaks(cache));
  CHECK(stat(cache, "peak_live_bytes") == 1 << 10);
  CHECK(stat(cache, "peak_held_bytes") == 1 << 10);
  OK(refpool_release(small));
  OK(refpool_scope_exit(scope));
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_release(be));
}

static void test_gpu_backends_here(void) {
  /* No GPU on the CI machine: a clear BACKEND_UNAVAILABLE; a host kind is refused outright. */
  refpool_backend be = {0};
  const refpool_status cuda = refpool_backend_cuda(0, REFPOOL_MEMORY_DEVICE, &be);
  if (cuda == REFPOOL_OK) {
    OK(refpool_backend_release(be)); /* a real GPU: the GPU suite tests it */
  } else {
    CHECK(cuda == REFPOOL_ERROR_BACKEND_UNAVAILABLE);
    CHECK(error_mentions("CUDA"));
  }
  EXPECT(refpool_backend_cuda(0, REFPOOL_MEMORY_HOST, &be), REFPOOL_ERROR_INVALID_ARGUMENT);
  EXPECT(refpool_backend_hip(0, (refpool_memory_kind)9, &be), REFPOOL_ERROR_INVALID_ARGUMENT);
}

/* Runs as PyTorch's autograd thread would: frees what the main thread allocated, allocates its own. */
typedef struct {
  void* from_main[4];
  void* own[4];
} torch_step;

static int torch_backward(void* arg) {
  torch_step* s = (torch_step*)arg;
  for (int i = 0; i < 4; ++i) s->own[i] = refpool_torch_malloc(4096 * (i + 1), 0, NULL);
  for (int i = 0; i < 4; ++i) refpool_torch_free(s->from_main[i], 8192, 0, NULL);
  return 0;
}

static void test_framework_allocator(void) {
  refpool_allocator_options options;
  OK(refpool_allocator_options_init(&options, sizeof options));
  CHECK(options.runtime == REFPOOL_RUNTIME_CUDA && options.kind == REFPOOL_MEMORY_DEVICE);
  options.runtime = (refpool_runtime)7;
  EXPECT(refpool_allocator_configure(&options, sizeof options, NULL, 0), REFPOOL_ERROR_CONFIG);
  options.runtime = REFPOOL_RUNTIME_HOST;
  refpool_cache_options cache_options;
  OK(refpool_cache_options_from_environment(&cache_options, sizeof cache_options));
  OK(refpool_allocator_configure(&options, sizeof options, &cache_options, sizeof cache_options));

  /* A rejected configure changes nothing (issue 23 row 5): here a valid runtime with an invalid
   * rounding, then a valid runtime with invalid segments. The host configuration above stays; had
   * the rejected runtime (HIP, CUDA: neither usable on the CI machine) stuck, this allocation
   * would fail with BACKEND_UNAVAILABLE. */
  refpool_allocator_options rejected = options;
  refpool_cache_options rejected_cache = cache_options;
  rejected.runtime = REFPOOL_RUNTIME_HIP;
  rejected_cache.rounding.mode = REFPOOL_ROUNDING_STEP;
  rejected_cache.rounding.parameter = 0;
  EXPECT(refpool_allocator_configure(&rejected, sizeof rejected, &rejected_cache, sizeof rejected_cache),
         REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("rounding is step:0"));
  rejected = options;
  rejected_cache = cache_options;
  rejected.runtime = REFPOOL_RUNTIME_CUDA;
  rejected.kind = REFPOOL_MEMORY_DEVICE_ASYNC;
  rejected_cache.segments = (refpool_segment_policy)9;
  EXPECT(refpool_allocator_configure(&rejected, sizeof rejected, &rejected_cache, sizeof rejected_cache),
         REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("segments"));
  /* A bad size is refused before anything is taken, too. */
  EXPECT(refpool_allocator_configure(&rejected, 3, NULL, 0), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("3 bytes is not the size of a refpool_allocator_options"));
  void* after_rejection = NULL;
  OK(refpool_allocator_alloc(3000, 0, NULL, &after_rejection)); /* a size no later request has */
  CHECK(after_rejection != NULL);
  if (after_rejection != NULL) memset(after_rejection, 1, 3000); /* host memory: the host runtime stayed */
  OK(refpool_free(after_rejection));

  refpool_cache cache = {0};
  OK(refpool_allocator_cache(&cache));
  EXPECT(refpool_allocator_configure(&options, sizeof options, NULL, 0), REFPOOL_ERROR_CONFIG); /* in use now */
  CHECK(error_mentions("already in use"));
  const uint64_t allocations_before = stat(cache, "backend_allocations"); /* the one after the rejections */
  CHECK(allocations_before == 1);

  /* PyTorch: malloc(size, device, stream), free(ptr, size, device, stream); 0 bytes is NULL. */
  CHECK(refpool_torch_malloc(0, 0, NULL) == NULL);
  refpool_torch_free(NULL, 0, 0, NULL);
  for (int step = 0; step < 4; ++step) {
    refpool_step begun = {0};
    OK(refpool_step_begin(cache, NULL, 0, &begun));
    torch_step s;
    for (int i = 0; i < 4; ++i) s.from_main[i] = refpool_torch_malloc(8192, 0, NULL);
    for (int i = 0; i < 4; ++i) CHECK(s.from_main[i] != NULL);
    thrd_t t;
    CHECK(thrd_create(&t, torch_backward, &s) == thrd_success);
    thrd_join(t, NULL);
    for (int i = 0; i < 4; ++i) refpool_torch_free(s.own[i], 4096 * (i + 1), 0, NULL);
    OK(refpool_step_end(begun));
  }
  /* Steps without a key plan by themselves (auto_plans): 8 distinct buffers in the first step,
   * hits in the second, whose end saw the sequence repeat and packed it into one arena (the idle
   * buffers went back), and regions of that arena in the last two. */
  CHECK(stat(cache, "backend_allocations") - allocations_before == 8);
  CHECK(stat(cache, "arena_bytes") == 4 * 8192 + 4096 * (1 + 2 + 3 + 4)); /* the peak: main's and backward's */
  CHECK(stat(cache, "hits") == 8);
  CHECK(stat(cache, "plans") == 1 && stat(cache, "plan_hits") == 16 && stat(cache, "plan_misses") == 0);
  CHECK(stat(cache, "live_blocks") == 0 && stat(cache, "escapes") == 0);

  /* CuPy: malloc(param, size, device), free(param, ptr, device). Outside a step: the plain cache. */
  for (int i = 0; i < 2; ++i) {
    void* c = refpool_cupy_malloc(NULL, 8192, 0);
    CHECK(c != NULL);
    refpool_cupy_free(NULL, c, 0);
  }
  CHECK(stat(cache, "backend_allocations") - allocations_before == 9); /* the second CuPy request hit the first's */
  void* bad = refpool_cupy_malloc(NULL, 16, -1);
  CHECK(bad == NULL && error_mentions("device -1"));

  void* p = NULL;
  OK(refpool_allocator_alloc(100, 0, NULL, &p));
  OK(refpool_free(p));
  EXPECT(refpool_free(p), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("double free"));
  OK(refpool_cache_reclaim(cache, 0, NULL));
  CHECK(stat(cache, "held_bytes") == 0);
  OK(refpool_cache_destroy(cache)); /* the handle only */
  refpool_cache again = {0};
  OK(refpool_allocator_cache(&again));
  CHECK(stat(again, "steps") == 4);
  OK(refpool_cache_destroy(again));
}

int main(void) {
  test_alloc_options();
  test_cache_level_threads();
  test_steps();
  test_stats_by_name();
  test_gpu_backends_here();
  test_framework_allocator();
  return finish("framework_api_test");
}
