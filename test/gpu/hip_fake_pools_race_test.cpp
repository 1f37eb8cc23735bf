// Released private pools kept while their buffers are held (private_pools::drop_freeable), on the
// fake HIP runtime: raced with a route begun again on one of them (the fake's hook on hipFree opens
// the moment between drop_freeable's look at the pools and its reclaim of those it keeps), and a
// kept pool whose reclaim fails. Each case is a process of its own (its meson test names its tag):
// the framework allocator is process-wide, and each case configures it.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>

#include <refpool/refpool.h>

#include "fake_hip/app.hpp"
#include "fake_hip/app_stream.hpp"

using fake_hip::app_stream;
using fake_hip::fake;

namespace {

int same_stream(void* context, void* stream) { return stream == *static_cast<hipStream_t*>(context) ? 1 : 0; }

void* allocate(std::size_t bytes, hipStream_t stream) {
  void* ptr = nullptr;
  REQUIRE(refpool_allocator_alloc(bytes, 0, stream, &ptr) == REFPOOL_OK);
  return ptr;
}

std::uint64_t pool_stat(refpool_pool_id pool, const char* name) {
  refpool_cache cache{};
  REQUIRE(refpool_allocator_pool_cache(pool, &cache) == REFPOOL_OK);
  std::uint64_t values[128];
  std::size_t count = 0;
  REQUIRE(refpool_cache_get_stat_values(cache, values, 128, &count) == REFPOOL_OK);
  REQUIRE(refpool_cache_destroy(cache) == REFPOOL_OK);
  for (std::size_t i = 0; i < count && i < 128; ++i)
    if (std::string_view(refpool_stat_name(i)) == name) return values[i];
  FAIL("no counter named " << name);
  return 0;
}

std::size_t live_pools() {
  std::size_t count = 0;
  REQUIRE(refpool_allocator_pool_ids(nullptr, 0, &count) == REFPOOL_OK);
  return count;
}

// A released pool with a buffer still held, and `idle` bytes freed into it (none for 0).
void* released_pool_holding(refpool_pool_id pool, hipStream_t stream, std::size_t idle) {
  hipStream_t captured = stream;
  REQUIRE(refpool_allocator_begin_pool(0, pool, same_stream, &captured, nullptr) == REFPOOL_OK);
  void* held = allocate(4000, stream);
  if (idle != 0) REQUIRE(refpool_free(allocate(idle, stream)) == REFPOOL_OK);
  REQUIRE(refpool_allocator_end_pool(0, pool) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, pool) == REFPOOL_OK);
  return held;
}

// Another thread begins a route to `pool` again (use_mem_pool, or a capture into g.pool()) and
// frees a buffer into it while it is routed to: memory the pool's graphs may replay into. Run by
// the hook on hipFree; waits at most half a second for the thread (it may wait for a lock the hooked
// call holds).
namespace revive {
std::atomic<bool> armed{false};
std::atomic<bool> done{false};
std::atomic<int> failures{0};
refpool_pool_id pool{};
hipStream_t stream = nullptr;
void* freed_in_route = nullptr;
std::thread reviver;
void begin_from_another_thread() {
  if (!armed.exchange(false)) return;
  reviver = std::thread([] {  // no Catch2 macro here: Catch2 2 is not thread-safe
    static hipStream_t routed = stream;
    if (refpool_allocator_begin_pool(0, pool, same_stream, &routed, nullptr) != REFPOOL_OK) ++failures;
    void* p = nullptr;
    if (refpool_allocator_alloc(12000, 0, stream, &p) != REFPOOL_OK || refpool_free(p) != REFPOOL_OK) ++failures;
    freed_in_route = p;
    done = true;
  });
  for (int waited = 0; waited < 500 && !done; ++waited) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
}  // namespace revive

// The framework allocator on the fake HIP runtime with `segments`, the runtime loaded (as PyTorch's
// first tensor loads it).
void configure_hip_allocator(refpool_segment_policy segments) {
  refpool_allocator_options options;
  REQUIRE(refpool_allocator_options_init(&options, sizeof options) == REFPOOL_OK);
  options.runtime = REFPOOL_RUNTIME_HIP;
  refpool_cache_options cache_options;
  REQUIRE(refpool_cache_options_init(&cache_options, sizeof cache_options) == REFPOOL_OK);
  cache_options.segments = segments;
  REQUIRE(refpool_allocator_configure(&options, sizeof options, &cache_options, sizeof cache_options) == REFPOOL_OK);
  void* loaded = nullptr;
  REQUIRE(refpool_allocator_alloc(256, 0, nullptr, &loaded) == REFPOOL_OK);
  REQUIRE(refpool_free(loaded) == REFPOOL_OK);
}

}  // namespace

TEST_CASE("a released pool begun again while empty_cache reclaims the kept pools keeps what it got since",
          "[hip-7][whole-blocks]") {
  // empty_cache looks at the pools under their lock and keeps a released pool whose buffer is held;
  // reclaimed after the lock was let go, a pool begun again meanwhile lost the memory freed into it
  // under its new route (a graph captured then replays into that memory). Whole blocks (segments
  // off): their frees reach the runtime with no lock of refpool held.
  configure_hip_allocator(REFPOOL_SEGMENTS_OFF);
  app_stream s;
  fake().clear_violations();
  // Two released pools, each with a buffer held (kept, not dropped); the first has idle memory,
  // whose hipFree at empty_cache comes before the second pool's reclaim (pools in id order).
  const refpool_pool_id first{1, 1};
  const refpool_pool_id second{2, 1};
  void* held_first = released_pool_holding(first, s.handle, 8000);
  void* held_second = released_pool_holding(second, s.handle, 0);
  revive::pool = second;
  revive::stream = s.handle;
  revive::armed = true;
  fake().before_calls("hipFree", revive::begin_from_another_thread);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  fake().before_calls("hipFree", nullptr);
  REQUIRE(revive::reviver.joinable());
  revive::reviver.join();
  CHECK(revive::done);
  CHECK(revive::failures == 0);
  // The second pool is in use again: the buffer freed into it since is its memory, which a graph
  // captured into it replays into. empty_cache must leave it (refpool.h: pools in use keep theirs).
  CHECK(pool_stat(second, "idle_bytes") >= 12000);
  CHECK(pool_stat(second, "reclaimed_blocks") == 0);
  void* again = allocate(12000, s.handle);
  CHECK(again == revive::freed_in_route);
  REQUIRE(refpool_free(again) == REFPOOL_OK);
  REQUIRE(refpool_allocator_end_pool(0, second) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, second) == REFPOOL_OK);
  REQUIRE(refpool_free(held_first) == REFPOOL_OK);
  REQUIRE(refpool_free(held_second) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(live_pools() == 0);
  CHECK(fake().device_bytes_in_use(0) == 0);
  CHECK(fake().violations().empty());
}

namespace {
// A route that accepts requests on either of two streams (`context`: hipStream_t[2]).
int either_stream(void* context, void* stream) {
  const auto* streams = static_cast<hipStream_t*>(context);
  return stream == streams[0] || stream == streams[1] ? 1 : 0;
}
}  // namespace

TEST_CASE("a kept pool whose reclaim fails neither fails the request out of memory nor keeps the others",
          "[hip-7][segments-no-vm]") {
  // A request out of memory drops the released pools and is made again. A pool kept for a buffer
  // still held is reclaimed instead, and a reclaim may fail (here the event that orders a freed
  // segment's two streams, as a driver error would); before the kept pools, a drop never failed.
  // That failure must not end the drop: the pools after it still go, and the request is made again,
  // as the cache's own out-of-memory path trims quietly. Segments without virtual memory (the
  // fake's REFPOOL_FAKE_HIP_VMM=0): a free segment used on two streams is ordered before its free.
  configure_hip_allocator(REFPOOL_SEGMENTS_ON);
  app_stream s1;
  app_stream s2;
  fake().clear_violations();
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  // The kept pool: a large buffer held (a segment of its own), two small ones of one segment, used
  // on two streams and freed.
  const refpool_pool_id kept{1, 2};
  hipStream_t both[2] = {s1.handle, s2.handle};
  REQUIRE(refpool_allocator_begin_pool(0, kept, either_stream, both, nullptr) == REFPOOL_OK);
  void* held = allocate(std::size_t{4} << 20, s1.handle);
  void* on_first = allocate(4096, s1.handle);
  void* on_second = allocate(4096, s2.handle);
  REQUIRE(refpool_free(on_first) == REFPOOL_OK);
  REQUIRE(refpool_free(on_second) == REFPOOL_OK);
  REQUIRE(refpool_allocator_end_pool(0, kept) == REFPOOL_OK);
  REQUIRE(refpool_allocator_release_pool(0, kept) == REFPOOL_OK);
  // A released pool with nothing held, listed after it: its segment is what the request needs.
  const refpool_pool_id emptied{2, 2};
  void* idle = released_pool_holding(emptied, s1.handle, 0);
  REQUIRE(refpool_free(idle) == REFPOOL_OK);
  REQUIRE(refpool_allocator_set_device_limit(0, fake().device_bytes_in_use(0)) == REFPOOL_OK);
  fake().fail_calls("hipEventRecord", hipErrorInvalidValue, 1);
  void* request = nullptr;
  const refpool_status got = refpool_allocator_alloc(4096, 0, s1.handle, &request);
  fake().fail_calls("hipEventRecord", hipSuccess, 0);
  INFO("last error: " << refpool_last_error());
  CHECK(got == REFPOOL_OK);
  CHECK(live_pools() == 1);  // the kept pool, its buffer held
  if (request != nullptr) REQUIRE(refpool_free(request) == REFPOOL_OK);
  REQUIRE(refpool_allocator_set_device_limit(0, SIZE_MAX) == REFPOOL_OK);
  REQUIRE(refpool_free(held) == REFPOOL_OK);
  REQUIRE(refpool_allocator_empty_cache() == REFPOOL_OK);
  CHECK(live_pools() == 0);
  CHECK(fake().device_bytes_in_use(0) == 0);
  CHECK(fake().violations().empty());
}
