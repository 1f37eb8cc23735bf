// The deferred frees of refpool's PyTorch hooks (python/refpool/_torch_hooks_deferred.cpp:
// Tensor.record_stream under install()), built without PyTorch against stand-ins for the c10
// headers it includes (torch_hooks_stub/) and run over a fault-injecting fake CUDA runtime defined
// here: events complete after a set number of queries, fail on demand, and refuse a stream of
// another device, as CUDA does. The real runtime and PyTorch run these paths in
// test/python/test_torch.py on a GPU; this test keeps their bookkeeping (every block back to
// refpool exactly once, never before its events, with its device and size; its free counted once,
// before it goes back, into the hooks' real counters: active until it is back) checked in CI's
// plain, ASan and TSan builds, wherever CUDA's runtime header is found (test/meson.build).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <c10/cuda/CUDAFunctions.h>
#include "_torch_hooks.hpp"
#include "_torch_hooks_counters.hpp"

// ---- host memory that runs out on demand ----------------------------------------------------------

namespace {
thread_local int allocations_until_failure = -1;  // the next this many succeed, then one fails; < 0: none fails
}  // namespace

void* operator new(std::size_t bytes) {
  if (allocations_until_failure == 0) {
    allocations_until_failure = -1;
    throw std::bad_alloc();
  }
  if (allocations_until_failure > 0) --allocations_until_failure;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return ::operator new(bytes); }
// All four through malloc and free, so that ASan sees one kind of allocation. GCC takes the
// operator new it inlines for the standard one and warns that free does not match it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// ---- the fake runtime --------------------------------------------------------------------------

struct CUevent_st {
  std::atomic<int> queries_left{0};  // "not ready" this many more times
  std::atomic<bool> poisoned{false};  // a query fails while queries are left and failures are on
  int device = 0;
};
struct CUstream_st {
  int device;
};

namespace {
thread_local int current_device = 0;
std::atomic<int> next_queries{0};  // queries_left of the next recorded event; < 0: random 0..3
std::atomic<bool> failures_on{false};
std::atomic<int> events_made{0};
std::atomic<int> events_destroyed{0};
std::array<std::atomic<int>, 16> events_alive_on{};  // by device: made, not destroyed (idle, recorded or lost)
std::atomic<int> failing_queries{0};  // the next this many queries and synchronizations fail, ready or not

int random_below(int n) {
  thread_local std::mt19937 random(std::random_device{}());
  return static_cast<int>(random() % static_cast<unsigned>(n));
}
}  // namespace

extern "C" {
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 2;
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st;  // never destroyed: the hooks keep their events for the process
  (*event)->device = current_device;
  ++events_made;
  ++events_alive_on[current_device];
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {  // where host memory ran out to keep it idle
  --events_alive_on[event->device];
  delete event;
  ++events_destroyed;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  const bool default_stream = stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  if ((default_stream ? current_device : stream->device) != event->device) return cudaErrorInvalidResourceHandle;
  const int queries = next_queries.load();
  event->queries_left = queries < 0 ? random_below(4) : queries;
  event->poisoned = queries < 0 && random_below(5) == 0;
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (failing_queries.fetch_sub(1) > 0) return cudaErrorLaunchFailure;
  failing_queries = 0;
  if (failures_on && event->poisoned && event->queries_left > 0) return cudaErrorLaunchFailure;
  return event->queries_left.fetch_sub(1) > 0 ? cudaErrorNotReady : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (failing_queries.fetch_sub(1) > 0) return cudaErrorLaunchFailure;
  failing_queries = 0;
  if (failures_on && event->poisoned && event->queries_left > 0) return cudaErrorLaunchFailure;
  event->queries_left = 0;
  return cudaSuccess;
}
}

namespace refpool_torch {
bool capturing(void*) { return false; }  // _torch_hooks.cpp's; no capture here
}  // namespace refpool_torch
namespace c10::cuda {
bool hasPrimaryContext(DeviceIndex) { return true; }
}  // namespace c10::cuda

// ---- refpool's side: which blocks it holds, and the hooks' counters -------------------------------

namespace {

struct block_state {
  bool taken = false;     // held by a tensor (or pending); false: back in refpool
  bool deferred = false;  // its free deferred, and counted, not yet back
  std::size_t size = 0;   // of its request, as the hooks see it
  int device = 0;
};

std::mutex blocks_mutex;
// Never destroyed, as the blocks and the hooks' state: they outlive static destruction, when a
// leak check runs.
std::unordered_map<void*, block_state>& served = *new std::unordered_map<void*, block_state>;
std::atomic<int> double_frees{0};
std::atomic<int> miscounted{0};  // a deferred free counted twice, or a block back uncounted or with others' figures
refpool_torch::device_counters& counters = *new refpool_torch::device_counters;  // device 0's; 1's share it

// refpool's free (the hooks' free_to_refpool).
void give_back(block_state& b) {
  if (!b.taken) ++double_frees;
  b.taken = false;
}

// The free hook's path for a free it does not defer: counted freed and inactive, then back.
void free_now(void* block) {
  std::lock_guard guard(blocks_mutex);
  block_state& b = served[block];
  counters.on_free(b.size, false);
  give_back(b);
}

// defer_free's `counted` (the hooks' count_deferred_free): freed, still active.
void count_deferred(void* block, int device, std::size_t size) noexcept {
  std::lock_guard guard(blocks_mutex);
  block_state& b = served[block];
  if (!b.taken || b.deferred || b.size != size || b.device != device) ++miscounted;
  b.deferred = true;
  counters.on_free(size, true);
}

// free_completed's and free_all_pending's `free_now` (the hooks' free_deferred): inactive, then back.
void free_deferred(void* block, int device, std::size_t size) noexcept {
  std::lock_guard guard(blocks_mutex);
  block_state& b = served[block];
  if (!b.deferred || b.size != size || b.device != device) ++miscounted;
  b.deferred = false;
  counters.on_inactive(size);
  give_back(b);
}

bool held(void* block) {
  std::lock_guard guard(blocks_mutex);
  return served[block].taken;
}

// A block for a new tensor of `size` bytes on `device`: one refpool holds, or a new one. Blocks live
// for the process. Counted allocated and active.
void* serve(std::mt19937& random, std::size_t size = 1000, int device = 0) {
  std::lock_guard guard(blocks_mutex);
  void* block = nullptr;
  for (auto& [address, b] : served)
    if (!b.taken && random() % 2 == 0) {
      block = address;
      break;
    }
  if (block == nullptr) block = new std::uint64_t[2];
  served[block] = {true, false, size, device};
  counters.on_alloc(size);
  return block;
}

std::int64_t counted(refpool_torch::device_counters::kind kind,
                     refpool_torch::device_counters::field field = refpool_torch::device_counters::current) {
  using c = refpool_torch::device_counters;
  std::int64_t values[c::values];
  counters.read(values, c::values);
  return values[(kind * c::classes + c::all_classes) * c::fields + field];
}

// Active blocks beyond the allocated ones: the deferred frees not yet back.
std::int64_t active_not_allocated() {
  using c = refpool_torch::device_counters;
  return counted(c::active) - counted(c::allocation);
}

CUstream_st compute{0}, side{0}, other_device{1};

// The free hook's path: the block's recorded streams, then deferred (and counted by defer_free) or
// freed now.
void free_hook(void* block, cudaStream_t allocated_on) {
  std::size_t size = 0;
  int device = 0;
  {
    std::lock_guard guard(blocks_mutex);
    size = served[block].size;
    device = served[block].device;
  }
  std::vector<void*> uses = refpool_torch::take_stream_uses(block);
  if (uses.empty() || !refpool_torch::defer_free(block, device, size, allocated_on, uses, count_deferred))
    free_now(block);
}

// A tensor's life as the hooks see it: served on `compute` (the malloc hook forgets any note for
// the address), recorded on `used_on`, freed. Returns its block.
void* record_and_free(std::mt19937& random, cudaStream_t used_on) {
  void* block = serve(random);
  refpool_torch::forget_stream_uses(block);
  refpool_torch::note_stream_use(block, used_on);
  free_hook(block, &compute);
  return block;
}

// A deferred block still pending: kept from refpool, counted active and not allocated.
void check_pending(void* block) {
  CHECK(held(block));
  CHECK(active_not_allocated() == 1);
}

// The block went back to refpool, counted inactive, and nothing is pending any more.
void check_given_back(void* block) {
  CHECK_FALSE(held(block));
  CHECK_FALSE(refpool_torch::frees_pending());
  CHECK(active_not_allocated() == 0);
}

void drain() {
  failures_on = false;
  refpool_torch::free_all_pending(free_deferred);
  REQUIRE_FALSE(refpool_torch::frees_pending());
  CHECK(active_not_allocated() == 0);
}

}  // namespace

TEST_CASE("a block recorded on another stream goes back to refpool once its event completed, not before",
          "[torch][record_stream]") {
  std::mt19937 random(1);
  next_queries = 2;
  void* block = record_and_free(random, &side);
  CHECK(refpool_torch::frees_pending());
  CHECK(active_not_allocated() == 1);
  refpool_torch::free_completed(free_deferred);  // not ready
  refpool_torch::free_completed(free_deferred);  // not ready
  check_pending(block);
  refpool_torch::free_completed(free_deferred);
  check_given_back(block);
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("a deferred free: no longer allocated at the free, active until it is back, with its device and size",
          "[torch][record_stream][counters]") {
  using c = refpool_torch::device_counters;
  std::mt19937 random(6);
  next_queries = 1;
  const std::int64_t bytes = counted(c::active_bytes), allocated = counted(c::allocated_bytes);
  const std::int64_t active_freed = counted(c::active, c::freed), freed = counted(c::allocation, c::freed);
  void* small = serve(random, 100, 0);
  void* large = serve(random, (std::size_t{3} << 20) + 1, 1);  // device 1's free: its event on side's device 0
  refpool_torch::forget_stream_uses(small);
  refpool_torch::forget_stream_uses(large);
  refpool_torch::note_stream_use(small, &side);
  refpool_torch::note_stream_use(large, &side);
  free_hook(small, &compute);
  free_hook(large, &compute);
  CHECK(counted(c::allocated_bytes) == allocated);  // both freed
  CHECK(counted(c::allocation, c::freed) == freed + 2);
  CHECK(counted(c::active_bytes) == bytes + 512 + (3 << 20) + 512);  // both still active
  CHECK(counted(c::active, c::freed) == active_freed);
  CHECK(counted(c::active_bytes, c::peak) >= counted(c::active_bytes));
  refpool_torch::free_completed(free_deferred);  // not ready
  CHECK(active_not_allocated() == 2);
  refpool_torch::free_completed(free_deferred);
  CHECK_FALSE(held(small));
  CHECK_FALSE(held(large));
  CHECK(counted(c::active_bytes) == bytes);
  CHECK(counted(c::active, c::freed) == active_freed + 2);
  CHECK(miscounted == 0);  // free_deferred got each block's own device and size
  CHECK(double_frees == 0);
}

TEST_CASE("a record on the allocation's own stream defers nothing; empty_cache's wait frees every pending block",
          "[torch][record_stream]") {
  std::mt19937 random(2);
  next_queries = 1000;
  void* own = record_and_free(random, &compute);
  CHECK_FALSE(held(own));
  CHECK(active_not_allocated() == 0);  // inactive at once
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(record_and_free(random, &side));
  refpool_torch::free_completed(free_deferred);
  for (void* b : blocks) CHECK(held(b));
  CHECK(active_not_allocated() == 5);
  refpool_torch::free_all_pending(free_deferred);  // synchronizes
  for (void* b : blocks) CHECK_FALSE(held(b));
  CHECK(active_not_allocated() == 0);
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("a note for memory refpool did not serve is forgotten when refpool serves that address",
          "[torch][record_stream]") {
  std::mt19937 random(3);
  next_queries = 1000;
  void* block = serve(random);
  free_now(block);  // back in refpool: the address is now someone else's memory, say
  refpool_torch::note_stream_use(block, &side);
  block = [&] {  // refpool serves the address again (the malloc hook forgets its note)
    std::lock_guard guard(blocks_mutex);
    served[block] = {true, false, 1000, 0};
    counters.on_alloc(1000);
    return block;
  }();
  refpool_torch::forget_stream_uses(block);
  free_hook(block, &compute);
  CHECK_FALSE(held(block));  // not deferred on the stale note's stream
  CHECK_FALSE(refpool_torch::frees_pending());
}

TEST_CASE("a stream of another device: its event is that device's", "[torch][record_stream]") {
  std::mt19937 random(4);
  next_queries = 1;
  const int made = events_made;
  void* block = record_and_free(random, &other_device);
  CHECK(refpool_torch::frees_pending());  // deferred, not freed at once after a refused record
  CHECK(held(block));
  drain();
  CHECK_FALSE(held(block));
  CHECK(events_made - made <= 2);  // the refused device's event went idle again, not lost
}

TEST_CASE("a failing event keeps its block pending, and the completed ones still go back",
          "[torch][record_stream]") {
  std::mt19937 random(5);
  next_queries = -1;
  failures_on = true;
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) blocks.push_back(record_and_free(random, &side));
  int thrown = 0;
  for (int i = 0; i < 10; ++i) try {
      refpool_torch::free_completed(free_deferred);
    } catch (const std::exception&) {
      ++thrown;
    }
  CHECK(thrown > 0);  // about a fifth of the events fail while they are not ready
  CHECK(active_not_allocated() > 0);  // the failed ones, still pending, still active
  drain();
  for (void* b : blocks) CHECK_FALSE(held(b));
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("frees, records and polls from many threads: every block back exactly once", "[torch][record_stream][threads]") {
  const bool cross = GENERATE(false, true);
  const bool failing = GENERATE(false, true);
  CAPTURE(cross, failing);
  next_queries = -1;
  std::atomic<int> thrown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(100 + t));
      for (int i = 0; i < 3000; ++i) {
        void* block = serve(random, 1 + random() % (std::size_t{2} << 20), static_cast<int>(random() % 2));
        try {
          if (refpool_torch::frees_pending())
            (random() % 50 == 0 ? refpool_torch::free_all_pending : refpool_torch::free_completed)(free_deferred);
        } catch (const std::exception&) {
          ++thrown;
        }
        refpool_torch::forget_stream_uses(block);
        cudaStream_t used = cross && random() % 3 == 0 ? &other_device : random() % 2 != 0 ? &side : nullptr;
        refpool_torch::note_stream_use(block, used);
        try {
          free_hook(block, &compute);
        } catch (const std::exception&) {  // the hook frees the block now (as _torch_hooks.cpp does)
          ++thrown;
          free_now(block);
        }
        if (failing && t == 0 && i % 300 == 0) failures_on = !failures_on;
      }
    });
  for (std::thread& t : threads) t.join();
  drain();
  using c = refpool_torch::device_counters;
  CHECK(counted(c::active) == counted(c::allocation));
  CHECK(counted(c::active_bytes) == counted(c::allocated_bytes));
  CHECK(counted(c::active, c::freed) == counted(c::allocation, c::freed));
  std::lock_guard guard(blocks_mutex);
  for (const auto& [block, b] : served) CHECK_FALSE(b.taken);
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
  if (!failing) CHECK(thrown == 0);
}

// A hostile review of the active counts (each deferred free counted freed once, then inactive once).

// A `counted` that threw once the block was pending had the free hook free the block at once as
// well (a double free, found with a throwing callback): the callbacks cannot throw now.
static_assert(std::is_nothrow_invocable_v<refpool_torch::deferred_fn, void*, int, std::size_t>);

TEST_CASE("an event query that fails, then succeeds: the block stays active, then is counted inactive once",
          "[torch][record_stream][counters]") {
  using c = refpool_torch::device_counters;
  std::mt19937 random(8);
  next_queries = 0;  // complete at once, but the queries fail first
  const std::int64_t active_freed = counted(c::active, c::freed);
  void* block = record_and_free(random, &side);
  failing_queries = 2;
  CHECK_THROWS(refpool_torch::free_completed(free_deferred));
  check_pending(block);
  CHECK_THROWS(refpool_torch::free_all_pending(free_deferred));  // empty_cache: raised, still pending
  check_pending(block);
  refpool_torch::free_completed(free_deferred);
  check_given_back(block);
  CHECK(counted(c::active, c::freed) == active_freed + 1);
  refpool_torch::free_all_pending(free_deferred);  // nothing left to count
  CHECK(counted(c::active, c::freed) == active_freed + 1);
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("empty_cache on one thread, polls on another, frees on a third: each block inactive once",
          "[torch][record_stream][counters][threads]") {
  using c = refpool_torch::device_counters;
  next_queries = -1;
  failures_on = false;
  const std::int64_t active_freed = counted(c::active, c::freed), freed = counted(c::allocation, c::freed);
  std::atomic<bool> freeing{true};
  constexpr int frees = 4000;
  std::thread emptying([&] {
    while (freeing) refpool_torch::free_all_pending(free_deferred);
  });
  std::thread polling([&] {
    while (freeing) refpool_torch::free_completed(free_deferred);
  });
  std::thread freeing_thread([&] {
    std::mt19937 random(9);
    for (int i = 0; i < frees; ++i) record_and_free(random, i % 3 == 0 ? &compute : &side);
    freeing = false;
  });
  freeing_thread.join();
  emptying.join();
  polling.join();
  drain();
  CHECK(counted(c::allocation, c::freed) == freed + frees);
  CHECK(counted(c::active, c::freed) == active_freed + frees);
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("host memory running out while pending frees go back loses no block and frees none twice",
          "[torch][record_stream]") {
  std::mt19937 random(9);
  next_queries = 1;  // each event is not ready at its first query: every poll keeps some, gives back others
  failures_on = false;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(record_and_free(random, &side));
  // The Nth allocation inside a poll fails, for every N until a poll makes fewer.
  for (int n = 0; n < 40; ++n) {
    allocations_until_failure = n;
    try {
      refpool_torch::free_completed(free_deferred);
    } catch (const std::bad_alloc&) {}
    allocations_until_failure = -1;
    blocks.push_back(record_and_free(random, &side));
  }
  drain();
  for (void* b : blocks) CHECK_FALSE(held(b));
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

// ---- a hostile review of host memory running out (allocations_until_failure) --------------------

namespace {

// The free hook's path as _torch_hooks.cpp takes it, with the `n`th allocation of this thread from
// taking the block's streams on failing: an exception there frees the block now, ordered after the
// streams it has in `uses` (refpool's record_stream). Returns whether the free was deferred or has
// the streams to order.
bool free_hook_running_out(void* block, cudaStream_t allocated_on, int n) {
  std::size_t size = 0;
  int device = 0;
  {
    std::lock_guard guard(blocks_mutex);
    size = served[block].size;
    device = served[block].device;
  }
  bool deferred = false;
  std::vector<void*> uses;
  allocations_until_failure = n;
  try {
    uses = refpool_torch::take_stream_uses(block);
    deferred = !uses.empty() && refpool_torch::defer_free(block, device, size, allocated_on, uses, count_deferred);
  } catch (const std::exception&) {}
  allocations_until_failure = -1;
  if (!deferred) free_now(block);
  return deferred || !uses.empty();
}

// A block of `device` recorded on `used_on` and freed, its free deferred (events far from ready).
void* defer_one(std::mt19937& random, int device, cudaStream_t used_on) {
  void* block = serve(random, 1000, device);
  refpool_torch::forget_stream_uses(block);
  refpool_torch::note_stream_use(block, used_on);
  free_hook(block, &compute);
  return block;
}

// How many idle events `device` holds: blocks deferred on `stream` (of that device) until the hooks
// make a new event. Those blocks stay pending, in `blocks`.
int idle_events(std::mt19937& random, int device, cudaStream_t stream, std::vector<void*>& blocks) {
  next_queries = 1000;
  const int made = events_made;
  for (int idle = 0;; ++idle) {
    blocks.push_back(defer_one(random, device, stream));
    if (events_made != made) return idle;
  }
}

// Every event the hooks made and did not destroy is idle again once nothing is pending: none lost.
void check_no_event_lost(std::mt19937& random) {
  drain();
  const int alive[2] = {events_alive_on[0], events_alive_on[1]};
  std::vector<void*> blocks;
  CHECK(idle_events(random, 0, &side, blocks) == alive[0]);
  CHECK(idle_events(random, 1, &other_device, blocks) == alive[1]);
  drain();
  for (void* b : blocks) CHECK_FALSE(held(b));
}

}  // namespace

TEST_CASE("host memory running out where a refused record puts its event back loses no event",
          "[torch][record_stream][events]") {
  // A block of device d recorded on side (device 0's stream): d's record is refused first and its
  // event put back into d's idle list, then device 0's is recorded. Each allocation of the free in
  // turn fails, each time for a device whose idle list has never held an event (putting one back
  // allocates): after that, d's event is idle again (or destroyed), so d's next free makes none.
  std::mt19937 random(12);
  next_queries = 1000;
  failures_on = false;
  for (int n = 0; n < 10; ++n) {
    const int device = 3 + n;  // no other case uses devices above 1
    CAPTURE(n);
    void* block = serve(random, 1000, device);
    refpool_torch::forget_stream_uses(block);
    refpool_torch::note_stream_use(block, &side);
    free_hook_running_out(block, &compute, n);
    drain();
    CHECK_FALSE(held(block));
    block = defer_one(random, device, &side);
    drain();
    CHECK_FALSE(held(block));
    CHECK(events_alive_on[device] <= 1);  // d's one event: never a second while the first is lost
  }
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE("host memory running out on several threads at once while frees defer, poll and wait: no block or event lost",
          "[torch][record_stream][events][threads]") {
  using c = refpool_torch::device_counters;
  next_queries = -1;
  failures_on = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      std::mt19937 random(static_cast<unsigned>(200 + t));
      for (int i = 0; i < 2000; ++i) {
        const int device = static_cast<int>(random() % 2);
        void* block = serve(random, 1 + random() % 4096, device);
        refpool_torch::forget_stream_uses(block);
        refpool_torch::note_stream_use(block, random() % 4 == 0 ? &other_device : &side);
        if (random() % 2 == 0) refpool_torch::note_stream_use(block, device == 0 ? &other_device : &side);
        free_hook_running_out(block, &compute, static_cast<int>(random() % 8));
        allocations_until_failure = static_cast<int>(random() % 6);
        try {
          (random() % 20 == 0 ? refpool_torch::free_all_pending : refpool_torch::free_completed)(free_deferred);
        } catch (const std::exception&) {}
        allocations_until_failure = -1;
      }
    });
  for (std::thread& t : threads) t.join();
  drain();
  CHECK(counted(c::active) == counted(c::allocation));
  CHECK(counted(c::active, c::freed) == counted(c::allocation, c::freed));
  {
    std::lock_guard guard(blocks_mutex);
    for (const auto& [block, b] : served) CHECK_FALSE(b.taken);
  }
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
  std::mt19937 random(13);
  check_no_event_lost(random);
}

TEST_CASE(
    "host memory running out at each allocation of a free recorded on streams of both devices: no block or event lost",
    "[torch][record_stream][events]") {
  // Device 0's block recorded on side and on other_device: other_device's record is refused on
  // device 0 first (its event put back), then made on device 1. Each allocation in turn fails.
  std::mt19937 random(14);
  next_queries = 1000;
  failures_on = false;
  for (int n = 0; n < 16; ++n) {
    CAPTURE(n);
    void* block = serve(random, 1000, 0);
    refpool_torch::forget_stream_uses(block);
    refpool_torch::note_stream_use(block, &other_device);
    refpool_torch::note_stream_use(block, &side);
    free_hook_running_out(block, &compute, n);
    refpool_torch::free_completed(free_deferred);  // not ready: kept
    drain();
    CHECK_FALSE(held(block));
    check_no_event_lost(random);
  }
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}

TEST_CASE(
    "host memory running out while a free takes its recorded streams: the free is deferred or ordered, never neither",
    "[torch][record_stream]") {
  // The free hook frees a block at once where deferring it throws, and then orders the next user
  // after the streams it took (refpool's record_stream). Taking them must not be what runs out:
  // the block would go back with no order after a stream that may still use it.
  std::mt19937 random(15);
  next_queries = 1000;
  failures_on = false;
  for (int n = 0; n < 8; ++n) {
    CAPTURE(n);
    void* block = serve(random, 1000, 0);
    refpool_torch::forget_stream_uses(block);
    refpool_torch::note_stream_use(block, &side);
    CHECK(free_hook_running_out(block, &compute, n));
    drain();
    CHECK_FALSE(held(block));
  }
  CHECK(double_frees == 0);
  CHECK(miscounted == 0);
}
