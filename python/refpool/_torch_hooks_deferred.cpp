// Frees that Tensor.record_stream defers, as PyTorch's own allocator does (part of refpool's hooks
// library, built against the PyTorch in use: _torch_hooks.py). A tensor recorded on another stream
// goes back to refpool only when an event recorded on that stream at its free has completed, so
// no request gets its bytes while the other stream may still use them, and the stream that takes
// them next gets no wait on work it never depended on. Meanwhile the block is freed but still active
// in PyTorch's statistics: its pending record keeps its device and size, for free_now to count it
// inactive once it goes back.
//
// Why here and not in librefpool: refpool's own record_stream orders the next user's stream after
// the recorded ones (an event and a wait on the device), hands the same address out at once, and
// needs no polling. PyTorch's tests and users expect PyTorch's behaviour under install(): the
// address is not reused before the other stream's work is done.
//
// Threads: every function may be called from any thread (frees come from tensors' deleters);
// one mutex guards the recorded uses and the pending frees, and is never held while waiting for the
// GPU. Requests pay one relaxed atomic load when nothing is pending, and requests and frees one
// when no recorded block's address hashes where theirs does.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "_torch_hooks.hpp"

namespace refpool_torch {
namespace {

// An event recorded on a stream that used a block; `device` is the stream's (and the event's).
struct recorded_event {
  cudaEvent_t event;
  int device;
};

struct pending_free {
  void* ptr;
  int device;  // the block's, and its size as requested: what free_now counts inactive
  std::size_t size;
  std::vector<recorded_event> events;  // one for each other stream that used the bytes
};

struct deferred_frees {
  std::mutex mutex;  // guards uses, pending and idle_events
  // Held by the one thread that takes pending frees and gives them to refpool: a caller that waits
  // for all of them (empty_cache, out of memory) then also waits for those another thread holds.
  std::mutex releasing;
  // record_stream's streams, by block: as the free hook takes them, moved out without allocating
  // (out of host memory, a free that cannot defer still has its streams to order).
  std::unordered_map<void*, std::vector<void*>> uses;
  // A list: free_pending moves its entries out and back by splicing, which never allocates, so
  // running out of host memory there loses no block.
  std::list<pending_free> pending;
  std::unordered_map<int, std::vector<cudaEvent_t>> idle_events;  // by device: events to record again
  // How many recorded blocks hash to each slot (note_slot): a request or free whose slot holds none
  // takes no lock, however many others are noted (a long-lived tensor recorded once, say).
  std::array<std::atomic<std::uint32_t>, 4096> noted{};
  std::atomic<std::size_t> pending_count{0};  // pending, or taken and not yet given to refpool
};

std::size_t note_slot(const void* ptr) {  // Fibonacci hashing: blocks' low bits are mostly zero
  return static_cast<std::size_t>((static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(ptr)) *
                                   0x9E3779B97F4A7C15ull) >> 52);
}

deferred_frees& state() {
  static auto* s = new deferred_frees;  // never destroyed: deleters may run during process exit
  return *s;
}

// An event of `device` (current now), from the idle ones or new; with the mutex held.
cudaEvent_t take_event(deferred_frees& s, int device) {
  std::vector<cudaEvent_t>& idle = s.idle_events[device];
  if (!idle.empty()) {
    const cudaEvent_t e = idle.back();
    idle.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// An event no record keeps (its block went back, or CUDA refused it), idle again for the next
// record; destroyed where host memory runs out for the list. With the mutex held.
void recycle_event(deferred_frees& s, const recorded_event& e) noexcept {
  try {
    s.idle_events[e.device].push_back(e.event);
  } catch (...) {
    (void)cudaEventDestroy(e.event);
  }
}

// Records an event of `device` on `stream`; false (the event idle again) where CUDA refuses, as it
// does for a stream of another device. With the mutex held.
bool record_on(deferred_frees& s, cudaStream_t stream, int device, recorded_event& out, cudaError_t& refused) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaEvent_t e = take_event(s, device);
  refused = cudaEventRecord(e, stream);
  if (refused == cudaSuccess) {
    out = {e, device};
    return true;
  }
  (void)cudaGetLastError();
  recycle_event(s, {e, device});  // the list may grow: out of host memory, destroyed, never lost
  return false;
}

// An event on `stream` at its work so far. CUDA records an event only on a stream of its own device,
// and the pluggable interface gives no stream's device: the block's first (nearly always the one),
// then the others that have a context, as a stream needs one (PyTorch's allocator records on the
// stream's device; record_stream allows any). The default streams (0, legacy, per-thread) are the
// current device's: the block's device's here.
recorded_event record_use(deferred_frees& s, cudaStream_t stream, int device) {
  recorded_event recorded{};
  cudaError_t refused = cudaSuccess;
  if (record_on(s, stream, device, recorded, refused)) return recorded;
  const cudaError_t first_refusal = refused;
  int devices = 0;
  const bool named = stream != nullptr && stream != cudaStreamLegacy && stream != cudaStreamPerThread;
  if (named && cudaGetDeviceCount(&devices) == cudaSuccess)
    for (int d = 0; d < devices; ++d)
      if (d != device && c10::cuda::hasPrimaryContext(static_cast<c10::DeviceIndex>(d)) &&
          record_on(s, stream, d, recorded, refused))
        return recorded;
  C10_CUDA_CHECK(first_refusal);  // throws: no device's event records on this stream
  return recorded;
}

// Gives refpool the pending frees whose events have completed (`wait`: waits for each first). Events
// are checked outside the mutex, so that frees and record_stream on other threads go on meanwhile.
// A CUDA error keeps its block pending (its streams' use of it is unknown) and is thrown after the
// others went to refpool. Entries move between lists by splicing and nothing else allocates, so no
// block is lost or freed twice, whatever fails.
void free_pending(bool wait, deferred_fn free_now) {
  deferred_frees& s = state();
  std::unique_lock releasing(s.releasing, std::defer_lock);
  if (wait)
    releasing.lock();
  else if (!releasing.try_lock())
    return;  // another thread is checking them now
  std::list<pending_free> kept;
  {
    std::lock_guard guard(s.mutex);
    kept.splice(kept.end(), s.pending);
  }
  cudaError_t failure = cudaSuccess;
  auto in_use = [&](const pending_free& p) noexcept {
    for (const recorded_event& e : p.events) {
      const cudaError_t status = wait ? cudaEventSynchronize(e.event) : cudaEventQuery(e.event);
      if (status == cudaSuccess) continue;
      (void)cudaGetLastError();  // a query's "not ready" is no error to keep; a failure is thrown below
      if (status != cudaErrorNotReady && failure == cudaSuccess) failure = status;
      return true;
    }
    return false;
  };
  std::list<pending_free> done;
  for (auto p = kept.begin(); p != kept.end();) {
    const auto next = std::next(p);
    if (!in_use(*p)) done.splice(done.end(), kept, p);
    p = next;
  }
  {
    std::lock_guard guard(s.mutex);
    s.pending.splice(s.pending.end(), kept);
    for (const pending_free& p : done)
      for (const recorded_event& e : p.events) recycle_event(s, e);
  }
  for (const pending_free& p : done) free_now(p.ptr, p.device, p.size);
  s.pending_count.fetch_sub(done.size(), std::memory_order_relaxed);
  releasing.unlock();
  C10_CUDA_CHECK(failure);
}

}  // namespace

void note_stream_use(void* ptr, void* stream) {
  deferred_frees& s = state();
  std::lock_guard guard(s.mutex);
  const auto [it, first] = s.uses.try_emplace(ptr);
  if (first) s.noted[note_slot(ptr)].fetch_add(1, std::memory_order_relaxed);
  std::vector<void*>& streams = it->second;
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
}

std::vector<void*> take_stream_uses(void* ptr) {
  deferred_frees& s = state();
  std::atomic<std::uint32_t>& noted = s.noted[note_slot(ptr)];
  if (noted.load(std::memory_order_relaxed) == 0) return {};
  std::lock_guard guard(s.mutex);
  const auto it = s.uses.find(ptr);
  if (it == s.uses.end()) return {};
  std::vector<void*> streams = std::move(it->second);
  s.uses.erase(it);
  noted.fetch_sub(1, std::memory_order_relaxed);
  return streams;
}

void forget_stream_uses(void* ptr) {
  deferred_frees& s = state();
  std::atomic<std::uint32_t>& noted = s.noted[note_slot(ptr)];
  if (noted.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard guard(s.mutex);
  if (s.uses.erase(ptr) != 0) noted.fetch_sub(1, std::memory_order_relaxed);
}

bool defer_free(void* ptr, int device, std::size_t size, void* allocated_on, std::vector<void*>& uses,
                deferred_fn counted) {
  // PyTorch ignores a record on the allocation's own stream.
  uses.erase(std::remove(uses.begin(), uses.end(), allocated_on), uses.end());
  if (uses.empty()) return false;
  // Under a graph capture events cannot be polled: refpool orders the streams itself.
  if (capturing(allocated_on) || std::any_of(uses.begin(), uses.end(), capturing)) return false;
  deferred_frees& s = state();
  std::lock_guard lock(s.mutex);
  pending_free p{ptr, device, size, {}};
  try {
    p.events.reserve(uses.size());
    for (void* stream : uses) p.events.push_back(record_use(s, static_cast<cudaStream_t>(stream), device));
    s.pending.push_back(std::move(p));  // strong guarantee: p is whole if this throws
  } catch (...) {  // the caller frees the block now: the events recorded so far are idle again
    for (const recorded_event& e : p.events) recycle_event(s, e);
    throw;
  }
  s.pending_count.fetch_add(1, std::memory_order_relaxed);
  // Under the mutex, so no thread takes the block back (counting it inactive) before its free is counted.
  counted(ptr, device, size);
  return true;
}

bool frees_pending() { return state().pending_count.load(std::memory_order_relaxed) != 0; }

void free_completed(deferred_fn free_now) { free_pending(false, free_now); }

void free_all_pending(deferred_fn free_now) { free_pending(true, free_now); }

}  // namespace refpool_torch
