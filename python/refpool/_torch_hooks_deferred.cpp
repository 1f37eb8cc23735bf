// Frees that Tensor.record_stream defers, as PyTorch's own allocator does (part of refpool's hooks
// library, built against the PyTorch in use: _torch_hooks.py). A tensor recorded on another stream
// goes back to refpool only when an event recorded on that stream at its free has completed, so
// no request gets its bytes while the other stream may still use them, and the stream that takes
// them next gets no wait on work it never depended on.
//
// Why here and not in librefpool: refpool's own record_stream orders the next user's stream after
// the recorded ones (an event and a wait on the device), hands the same address out at once, and
// needs no polling. PyTorch's tests and users expect PyTorch's behaviour under install(): the
// address is not reused before the other stream's work is done.
//
// Threads: every function may be called from any thread (frees come from tensors' deleters);
// one mutex guards the recorded uses and the pending frees. Requests pay one relaxed atomic load
// when nothing is pending, frees one when nothing is recorded.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "_torch_hooks.hpp"

namespace refpool_torch {
namespace {

struct pending_free {
  void* ptr;
  int device;
  std::vector<cudaEvent_t> events;  // one for each other stream that used the bytes
};

struct deferred_frees {
  std::mutex mutex;
  std::unordered_map<void*, std::vector<cudaStream_t>> uses;  // record_stream's streams, by block
  std::vector<pending_free> pending;
  std::unordered_map<int, std::vector<cudaEvent_t>> idle_events;  // by device: events to record again
  std::atomic<std::size_t> use_count{0};
  std::atomic<std::size_t> pending_count{0};
};

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

// Frees the pending blocks whose events have all completed (`wait`: waits for every one first),
// after the mutex is let go: refpool's free may take its own locks.
void free_pending(bool wait, void (*free_now)(void*)) {
  deferred_frees& s = state();
  std::vector<void*> done;
  {
    std::lock_guard guard(s.mutex);
    auto completed = [&](const pending_free& p) {
      for (const cudaEvent_t e : p.events) {
        const cudaError_t status = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (status == cudaErrorNotReady) {
          (void)cudaGetLastError();  // a query's "not ready" is not an error to keep
          return false;
        }
        C10_CUDA_CHECK(status);
      }
      for (const cudaEvent_t e : p.events) s.idle_events[p.device].push_back(e);
      done.push_back(p.ptr);
      return true;
    };
    s.pending.erase(std::remove_if(s.pending.begin(), s.pending.end(), completed), s.pending.end());
    s.pending_count.store(s.pending.size(), std::memory_order_relaxed);
  }
  for (void* ptr : done) free_now(ptr);
}

}  // namespace

void note_stream_use(void* ptr, void* used_on) {
  const auto stream = static_cast<cudaStream_t>(used_on);
  deferred_frees& s = state();
  std::lock_guard guard(s.mutex);
  std::vector<cudaStream_t>& streams = s.uses[ptr];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) streams.push_back(stream);
  s.use_count.store(s.uses.size(), std::memory_order_relaxed);
}

std::vector<void*> take_stream_uses(void* ptr) {
  deferred_frees& s = state();
  if (s.use_count.load(std::memory_order_relaxed) == 0) return {};
  std::lock_guard guard(s.mutex);
  const auto it = s.uses.find(ptr);
  if (it == s.uses.end()) return {};
  std::vector<void*> streams(it->second.begin(), it->second.end());
  s.uses.erase(it);
  s.use_count.store(s.uses.size(), std::memory_order_relaxed);
  return streams;
}

bool defer_free(void* ptr, int device, void* allocated_on, std::vector<void*>& uses) {
  // PyTorch ignores a record on the allocation's own stream.
  uses.erase(std::remove(uses.begin(), uses.end(), allocated_on), uses.end());
  if (uses.empty()) return false;
  // Under a graph capture events cannot be polled: refpool orders the streams itself.
  if (capturing(allocated_on) || std::any_of(uses.begin(), uses.end(), capturing)) return false;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  deferred_frees& s = state();
  std::lock_guard lock(s.mutex);
  pending_free p{ptr, device, {}};
  for (void* stream : uses) {
    p.events.push_back(take_event(s, device));
    C10_CUDA_CHECK(cudaEventRecord(p.events.back(), static_cast<cudaStream_t>(stream)));
  }
  s.pending.push_back(std::move(p));
  s.pending_count.store(s.pending.size(), std::memory_order_relaxed);
  return true;
}

bool frees_pending() { return state().pending_count.load(std::memory_order_relaxed) != 0; }

void free_completed(void (*free_now)(void*)) { free_pending(false, free_now); }

void free_all_pending(void (*free_now)(void*)) { free_pending(true, free_now); }

}  // namespace refpool_torch
