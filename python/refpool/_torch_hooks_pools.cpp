// The requests refpool's private pools (CUDA graph pools, use_mem_pool) served and still hold, by
// pointer: what torch._C._cuda_checkPoolLiveAllocations, CUDA graph trees and snapshots ask of a
// pool, which PyTorch's pluggable interface does not forward to refpool. A request is known to be a
// pool's when refpool's route filter accepted it (the filter notes the pool on the requesting
// thread, _torch_hooks.cpp's call_filter), so only requests made while a route is in force pay
// anything; a free pays one atomic load unless pool allocations are live, and then a lookup.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "_torch_hooks.hpp"

namespace {

struct pool_allocation {
  std::size_t size;
  int device;
  void* stream;
  refpool_torch::pool_name pool;
};

thread_local refpool_torch::pool_name routed;  // the pool the filter accepted this thread's request for

struct pool_table {
  std::mutex mutex;
  std::unordered_map<void*, pool_allocation> live;  // under mutex
};

// Leaked: PyTorch frees tensors from static destructors, after this library's own would have run.
pool_table& table() {
  static auto* made = new pool_table;
  return *made;
}

std::atomic<std::size_t> live_count{0};  // table().live.size(), read without the mutex

}  // namespace

namespace refpool_torch {

void note_routed(pool_name pool) { routed = pool; }

pool_name take_routed() {
  const pool_name pool = routed;
  routed = pool_name{};
  return pool;
}

void track_pool_allocation(void* ptr, std::size_t size, int device, void* stream, pool_name pool) {
  try {
    pool_table& t = table();
    std::lock_guard lock(t.mutex);
    t.live[ptr] = pool_allocation{size, device, stream, pool};
    live_count.store(t.live.size(), std::memory_order_release);
  } catch (const std::exception&) {  // out of host memory: the allocation stands, untracked
  }
}

void untrack_pool_allocation(void* ptr) {
  if (live_count.load(std::memory_order_acquire) == 0) return;
  pool_table& t = table();
  std::lock_guard lock(t.mutex);
  t.live.erase(ptr);
  live_count.store(t.live.size(), std::memory_order_release);
}

}  // namespace refpool_torch

extern "C" {

/// The live allocations of every private pool, six numbers each: address, bytes requested, device,
/// stream, pool id first, pool id second. Writes up to `capacity` allocations into out[0..6 *
/// capacity) and returns how many there are (call again with more room if that is more).
std::int64_t refpool_torch_hooks_pool_allocations(std::uint64_t* out, std::int64_t capacity) {
  pool_table& t = table();
  std::lock_guard lock(t.mutex);
  std::int64_t n = 0;
  for (const auto& [ptr, a] : t.live) {
    if (out != nullptr && n < capacity) {
      std::uint64_t* row = out + 6 * n;
      row[0] = reinterpret_cast<std::uintptr_t>(ptr);
      row[1] = a.size;
      row[2] = static_cast<std::uint64_t>(a.device);
      row[3] = reinterpret_cast<std::uintptr_t>(a.stream);
      row[4] = a.pool.first;
      row[5] = a.pool.second;
    }
    ++n;
  }
  return n;
}

}  // extern "C"
