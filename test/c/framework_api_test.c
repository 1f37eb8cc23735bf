/* The C API that frameworks and bindings use, from C11, on the host backend: raw pointers freed by
 * address (any thread, zero bytes, double and unknown frees), cache-level allocations, steps (plain
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
  OK(refpool_cache_options_init(&options));
  OK(refpool_cache_create(&options, &cache));
  return cache;
}

static void test_pointers(void) {
  refpool_backend be = {0};
  OK(refpool_backend_new_host(&be));
  refpool_cache cache = exact_cache();
  refpool_scope scope = {0};
  OK(refpool_scope_enter(cache, &scope));
  void* p = NULL;
  OK(refpool_malloc(be, 4096, NULL, &p));
  CHECK(p != NULL);
  memset(p, 7, 4096);
  OK(refpool_free(p));
  void* q = NULL;
  OK(refpool_malloc(be, 4096, NULL, &q));
  CHECK(q == p); /* the scope's idle buffer, reused at once */
  OK(refpool_free(q));

  /* Misuse: a double free and a pointer refpool never handed out are errors, never UB. */
  EXPECT(refpool_free(q), REFPOOL_ERROR_INVALID_ARGUMENT);
  CHECK(error_mentions("double free"));
  int local = 0;
  EXPECT(refpool_free(&local), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_free(NULL));

  /* Zero bytes: NULL, nothing allocated, and freeing it is fine. */
  void* zero = &local;
  OK(refpool_malloc(be, 0, NULL, &zero));
  CHECK(zero == NULL);
  OK(refpool_free(zero));
  OK(refpool_scope_exit(scope));

  refpool_cache_stats stats;
  OK(refpool_cache_get_stats(cache, &stats));
  CHECK(stats.misses == 1 && stats.hits == 1 && stats.live_blocks == 0);
  refpool_backend_stats backend_stats;
  OK(refpool_backend_get_stats(be, &backend_stats));
  CHECK(backend_stats.allocation_count == 1);
  OK(refpool_cache_destroy(cache));
  OK(refpool_backend_get_stats(be, &backend_stats));
  CHECK(backend_stats.outstanding_bytes == 0);
  OK(refpool_backend_release(be));
}

/* Cache-level allocations from two threads: one allocates, the other frees, like PyTorch's
 * forward on the main thread and backward on its autograd thread. */
typedef struct {
  refpool_cache cache;
  refpool_backend be;
  void* pointers[8];
} exchange;

static int free_all(void* arg) {
  exchange* x = (exchange*)arg;
  for (int i = 0; i < 8; ++i) OK(refpool_free(x->pointers[i]));
  return 0;
}

static void test_cache_level_threads(void) {
  exchange x = {exact_cache(), {0}, {0}};
  OK(refpool_backend_new_host(&x.be));
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 8; ++i) OK(refpool_cache_malloc(x.cache, x.be, 1024 * (size_t)(i + 1), NULL, &x.pointers[i]));
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
  void* kept = NULL;
  for (int iteration = 0; iteration < 4; ++iteration) {
    step_box box = {{0}};
    refpool_scope_options planned = {0, "train"};
    OK(refpool_step_begin(cache, &planned, &box.step));
    refpool_step second = {0};
    EXPECT(refpool_step_begin(cache, NULL, &second), REFPOOL_ERROR_SCOPE); /* steps do not nest */
    void* a = NULL;
    void* b = NULL;
    OK(refpool_cache_malloc(cache, be, 1 << 16, NULL, &a));
    OK(refpool_cache_malloc(cache, be, 1 << 12, NULL, &b));
    OK(refpool_free(a));
    if (iteration == 0) {
      kept = b; /* escapes the first step */
    } else {
      OK(refpool_free(b));
    }
    thrd_t t; /* a step may end on another thread */
    CHECK(thrd_create(&t, end_step, &box) == thrd_success);
    thrd_join(t, NULL);
    EXPECT(refpool_step_end(box.step), REFPOOL_ERROR_INVALID_HANDLE); /* ended once */
    if (iteration == 0) OK(refpool_free(kept));
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
  void* big = NULL;
  void* small = NULL;
  OK(refpool_malloc(be, 1 << 20, NULL, &big));
  OK(refpool_free(big));
  OK(refpool_malloc(be, 1 << 10, NULL, &small));
  CHECK(stat(cache, "peak_live_bytes") == 1 << 20);
  CHECK(stat(cache, "peak_held_bytes") == (1 << 20) + (1 << 10));
  OK(refpool_cache_reclaim(cache, 0, NULL));
  OK(refpool_cache_reset_peaks(cache));
  CHECK(stat(cache, "peak_live_bytes") == 1 << 10);
  CHECK(stat(cache, "peak_held_bytes") == 1 << 10);
  OK(refpool_free(small));
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
  OK(refpool_allocator_options_init(&options));
  CHECK(options.runtime == REFPOOL_RUNTIME_CUDA && options.kind == REFPOOL_MEMORY_DEVICE);
  options.runtime = (refpool_runtime)7;
  EXPECT(refpool_allocator_configure(&options), REFPOOL_ERROR_CONFIG);
  options.runtime = REFPOOL_RUNTIME_HOST;
  OK(refpool_allocator_configure(&options));

  /* A rejected configure changes nothing (issue 23 row 5): here a valid runtime with an invalid
   * rounding, then a valid runtime with invalid segments. The host configuration above stays; had
   * the rejected runtime (HIP, CUDA: neither usable on the CI machine) stuck, this allocation
   * would fail with BACKEND_UNAVAILABLE. */
  refpool_allocator_options rejected = options;
  rejected.runtime = REFPOOL_RUNTIME_HIP;
  rejected.cache.rounding.mode = REFPOOL_ROUNDING_STEP;
  rejected.cache.rounding.parameter = 0;
  EXPECT(refpool_allocator_configure(&rejected), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("rounding is step:0"));
  rejected = options;
  rejected.runtime = REFPOOL_RUNTIME_CUDA;
  rejected.kind = REFPOOL_MEMORY_DEVICE_ASYNC;
  rejected.cache.segments = (refpool_segment_policy)9;
  EXPECT(refpool_allocator_configure(&rejected), REFPOOL_ERROR_CONFIG);
  CHECK(error_mentions("segments"));
  void* after_rejection = NULL;
  OK(refpool_allocator_alloc(3000, 0, NULL, &after_rejection)); /* a size no later request has */
  CHECK(after_rejection != NULL);
  if (after_rejection != NULL) memset(after_rejection, 1, 3000); /* host memory: the host runtime stayed */
  OK(refpool_allocator_free(after_rejection));

  refpool_cache cache = {0};
  OK(refpool_allocator_cache(&cache));
  EXPECT(refpool_allocator_configure(&options), REFPOOL_ERROR_CONFIG); /* in use now */
  CHECK(error_mentions("already in use"));
  const uint64_t allocations_before = stat(cache, "backend_allocations"); /* the one after the rejections */
  CHECK(allocations_before == 1);

  /* PyTorch: malloc(size, device, stream), free(ptr, size, device, stream); 0 bytes is NULL. */
  CHECK(refpool_torch_malloc(0, 0, NULL) == NULL);
  refpool_torch_free(NULL, 0, 0, NULL);
  for (int step = 0; step < 3; ++step) {
    refpool_step begun = {0};
    OK(refpool_step_begin(cache, NULL, &begun));
    torch_step s;
    for (int i = 0; i < 4; ++i) s.from_main[i] = refpool_torch_malloc(8192, 0, NULL);
    for (int i = 0; i < 4; ++i) CHECK(s.from_main[i] != NULL);
    thrd_t t;
    CHECK(thrd_create(&t, torch_backward, &s) == thrd_success);
    thrd_join(t, NULL);
    for (int i = 0; i < 4; ++i) refpool_torch_free(s.own[i], 4096 * (i + 1), 0, NULL);
    OK(refpool_step_end(begun));
  }
  /* 8 distinct buffers in the first step, none after: every later request was a hit. */
  CHECK(stat(cache, "backend_allocations") - allocations_before == 8);
  CHECK(stat(cache, "hits") == 16);
  CHECK(stat(cache, "live_blocks") == 0 && stat(cache, "escapes") == 0);

  /* CuPy: malloc(param, size, device), free(param, ptr, device). */
  void* c = refpool_cupy_malloc(NULL, 8192, 0);
  CHECK(c != NULL);
  refpool_cupy_free(NULL, c, 0);
  CHECK(stat(cache, "backend_allocations") - allocations_before == 8); /* CuPy's request hit PyTorch's idle buffer */
  void* bad = refpool_cupy_malloc(NULL, 16, -1);
  CHECK(bad == NULL && error_mentions("device -1"));

  void* p = NULL;
  OK(refpool_allocator_alloc(100, 0, NULL, &p));
  OK(refpool_allocator_free(p));
  EXPECT(refpool_allocator_free(p), REFPOOL_ERROR_INVALID_ARGUMENT);
  OK(refpool_cache_reclaim(cache, 0, NULL));
  CHECK(stat(cache, "held_bytes") == 0);
  OK(refpool_cache_destroy(cache)); /* the handle only */
  refpool_cache again = {0};
  OK(refpool_allocator_cache(&again));
  CHECK(stat(again, "steps") == 3);
  OK(refpool_cache_destroy(again));
}

int main(void) {
  test_pointers();
  test_cache_level_threads();
  test_steps();
  test_stats_by_name();
  test_gpu_backends_here();
  test_framework_allocator();
  return finish("framework_api_test");
}
