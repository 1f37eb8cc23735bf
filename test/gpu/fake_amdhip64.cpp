// A stand-in libamdhip64 (the HIP runtime) for CI, where no AMD GPU exists: refpool's real HIP
// code paths run against it. It is built once per SONAME (test/gpu/fake_hip/*/meson.build:
// libamdhip64.so.5, .so.6, .so.7, an unversioned libamdhip64.so, and one lacking an entry point).
//
// It behaves as the runtime does where refpool depends on it, including the faults of particular
// releases (docs/hip.md), and records what the real runtime would have crashed or aborted on as
// a "violation" instead (printed, and abort() under REFPOOL_FAKE_HIP_FATAL=1):
// - hipMallocAsync/hipFreeAsync on the null stream before HIP 5.3 (a null dereference there);
// - hipModuleGetFunction with another device current than the module's (guarantee() aborts);
// - a code object without code for the device's target before HIP 5.4 (aborts);
// - any use of a destroyed stream (ROCm 7 segfaults; older releases return an error, as here);
// - any call after the runtime's teardown at exit (its static destructor, as ROCclr's).
// Stream capture is emulated as the runtimes enforce it (CUDA and HIP alike): a stream outside any
// capture that waits for an event recorded in one joins it (a fork), and the capture's end fails
// with hipErrorStreamCaptureUnjoined unless the capture waited for that stream again; a capturing
// stream waiting for an event of another capture or of none, or a device-wide or capturing
// stream's synchronisation during a capture, fails (hipErrorStreamCaptureIsolation,
// hipErrorStreamCaptureUnsupported) and invalidates the capture (its end then fails with
// hipErrorStreamCaptureInvalidated), recorded as a violation too. While a capture in global mode
// runs, a thread whose own mode (hipThreadExchangeStreamCaptureMode) is not relaxed may not
// allocate, map, unmap or free memory: the call fails (hipErrorStreamCaptureUnsupported) and
// invalidates the capture, as CUDA does.
// Memory is host memory, work runs at once on the calling thread, kernels are named in the code
// object's payload (fake_hip/code_object.hpp) and run on the host. The last error is sticky
// (kept until hipGetLastError) from HIP 7 on, as in HIP 7, else set by every call.
//
// Environment: REFPOOL_FAKE_HIP_VERSION (default by SONAME: 5.7, 6.4, 7.0), REFPOOL_FAKE_HIP_DEVICES
// (0: hipErrorNoDevice), REFPOOL_FAKE_HIP_MEMORY (bytes per device, 1 GiB), REFPOOL_FAKE_HIP_ARCH
// (gcnArchName, "gfx90a:sramecc+:xnack-"), REFPOOL_FAKE_HIP_STICKY (0/1), REFPOOL_FAKE_HIP_VMM (0
// hides virtual memory support), REFPOOL_FAKE_HIP_FATAL (1: violations abort). A test makes the
// virtual-memory calls (hipMemAddressReserve, hipMemCreate, hipMemMap, hipMemSetAccess,
// hipMemUnmap, hipMemRelease, hipMemAddressFree) and hipEventRecord (the ordering of two streams)
// fail on command: control::fail_calls.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fake_hip/code_object.hpp"
#include "fake_hip/control.hpp"

#ifndef REFPOOL_FAKE_HIP_MAJOR
#error "build with -DREFPOOL_FAKE_HIP_MAJOR=<the SONAME's major>"
#endif

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

int env_int(const char* name, long long fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? static_cast<int>(std::atoll(text)) : static_cast<int>(fallback);
}

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0' ? static_cast<std::size_t>(std::atoll(text)) : fallback;
}

int default_version() {
  switch (REFPOOL_FAKE_HIP_MAJOR) {
    case 5: return 50'731'921;
    case 6: return 60'443'482;
    default: return REFPOOL_FAKE_HIP_MAJOR * 10'000'000 + 51'831;
  }
}

// Stream capture: a stream between hipStreamBeginCapture and hipStreamEndCapture captures into
// capture `capture` (0: none); an event remembers the capture it was last recorded in.
struct stream_object {
  int device;
  bool destroyed = false;
  unsigned long long capture = 0;
  hipStreamCaptureMode mode = hipStreamCaptureModeGlobal;  // of its capture
  bool invalidated = false;  // its capture was broken: hipStreamEndCapture fails
  bool forked = false;       // joined a capture by waiting for one of its events...
  bool rejoined = false;     // ...and was waited for by the capture again since its last record
};
struct event_object {
  int device;
  unsigned long long capture = 0;
  stream_object* recorded_on = nullptr;
};
struct module_object {
  int device;
  std::string kernels;  // "fill_u8,add_u8,"
};
struct function_object {
  module_object* module;
  std::string name;
};
struct physical_object {
  std::size_t bytes;
  int device;
  bool released = false;
  int mappings = 0;
};
// A range of memory refpool may touch: an allocation, or a mapped piece of a reservation.
struct region {
  std::size_t bytes;
  int device;  // -1 for host memory
  physical_object* physical = nullptr;
  bool accessible = true;
};

// The 5.3+ layout of hipMemAllocationProp (the 5.2 header this file compiles against has the
// older one, which HIP 5.2 itself reads).
struct allocation_prop_53 {
  hipMemAllocationType type;
  hipMemAllocationHandleType requested_handle_type;
  hipMemLocation location;
  void* win32_metadata;
  unsigned char compression_type, rdma_capable;
  unsigned short usage;
};

constexpr std::size_t vmm_granularity = std::size_t{2} << 20;
constexpr int attribute_memory_pools = 88, attribute_vmm = 89;  // hipDeviceAttribute_t, 5.3+

struct runtime_state {
  std::mutex mutex;
  const int version = env_int("REFPOOL_FAKE_HIP_VERSION", default_version());
  const int devices = env_int("REFPOOL_FAKE_HIP_DEVICES", 0);
  const std::size_t memory = env_size("REFPOOL_FAKE_HIP_MEMORY", std::size_t{1} << 30);
  const bool sticky = env_int("REFPOOL_FAKE_HIP_STICKY", version >= 70'000'000) != 0;
  const bool vmm = env_int("REFPOOL_FAKE_HIP_VMM", 1) != 0 && version >= 50'300'000;
  const bool fatal = env_int("REFPOOL_FAKE_HIP_FATAL", 0) != 0;
  const std::string arch =
      std::getenv("REFPOOL_FAKE_HIP_ARCH") ? std::getenv("REFPOOL_FAKE_HIP_ARCH") : "gfx90a:sramecc+:xnack-";
  std::atomic<bool> torn_down{false};
  std::vector<std::size_t> used = std::vector<std::size_t>(static_cast<std::size_t>(std::max(devices, 0)));
  std::map<std::uintptr_t, region> regions;            // allocations and mapped pieces
  std::map<std::uintptr_t, std::size_t> reservations;  // virtual address ranges
  std::set<const void*> streams, events, modules, functions, physicals;
  unsigned long long captures = 0;                           // the last capture id handed out
  std::map<std::string, std::pair<hipError_t, int>> faults;  // entry point -> (error, calls left)
  std::vector<fake_hip::call> calls;
  std::vector<std::string> violations;
};

// Leaked: refpool may call in from static destructors, after this library's own would run.
runtime_state& state() {
  static auto* s = new runtime_state;
  return *s;
}

thread_local int current_device = 0;
thread_local hipError_t last_error = hipSuccess;
thread_local hipStreamCaptureMode thread_capture_mode = hipStreamCaptureModeGlobal;

// The runtime's teardown at exit: a static object's destructor, registered when the library is
// loaded (ROCclr's RuntimeTearDown does the same), so it runs before the destructors of statics
// that were constructed before the library was loaded.
struct teardown {
  ~teardown() { state().torn_down = true; }
} runtime_teardown;

void violation(runtime_state& s, std::string text) {
  std::fprintf(stderr, "fake HIP: violation: %s\n", text.c_str());
  s.violations.push_back(std::move(text));
  if (s.fatal) std::abort();
}

stream_object* as_stream(hipStream_t stream) { return reinterpret_cast<stream_object*>(stream); }

// control::before_calls: a hook run at the start of one entry point's calls, outside the lock.
struct call_hook {
  std::mutex mutex;
  std::string name;
  void (*hook)() = nullptr;
};
call_hook& before_calls() {
  static auto* hook = new call_hook;
  return *hook;
}
runtime_state& state_after_hook(const char* name) {
  void (*hook)() = nullptr;
  {
    std::lock_guard lock(before_calls().mutex);
    if (before_calls().name == name) hook = before_calls().hook;
  }
  if (hook != nullptr) hook();
  return state();
}

// One entry point's call: holds the lock, and records the call and its result on the way out.
class entry {
 public:
  explicit entry(const char* name) : s(state_after_hook(name)), lock_(s.mutex), name_(name) {
    if (s.torn_down) violation(s, std::string(name_) + " called after the runtime was torn down at exit");
  }
  // Records the call; sets the last error as the runtime does (sticky from HIP 7: only failures).
  hipError_t done(hipError_t result, const void* object = nullptr) {
    (void)record(result, object);
    if (!s.sticky || result != hipSuccess) last_error = result;
    return result;
  }
  hipError_t record(hipError_t result, const void* object = nullptr) {
    if (s.calls.size() < 1'000'000) s.calls.push_back({name_, current_device, object, result});
    return result;
  }
  bool device_ok(int device) const { return device >= 0 && device < s.devices; }
  // The error a test asked this entry point to fail with (control::fail_calls), or hipSuccess.
  hipError_t injected() {
    const auto it = s.faults.find(name_);
    if (it == s.faults.end() || it->second.second == 0) return hipSuccess;
    --it->second.second;
    return it->second.first;
  }
  // A stream argument: null (the device's null stream) or a live stream.
  bool stream_ok(hipStream_t stream) {
    if (stream == nullptr) return true;
    if (s.streams.count(stream) == 0) return false;
    if (reinterpret_cast<stream_object*>(stream)->destroyed) {
      violation(s, std::string(name_) + " on a destroyed stream (ROCm 7 segfaults)");
      return false;
    }
    return true;
  }
  // The error of work enqueued on a stream whose capture was invalidated, else hipSuccess.
  hipError_t capture_broken(hipStream_t stream) const {
    return stream != nullptr && as_stream(stream)->capture != 0 && as_stream(stream)->invalidated
               ? hipErrorStreamCaptureInvalidated
               : hipSuccess;
  }
  // Whether p lies in a reserved address range (mapped or not).
  bool reserved(const void* p) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto r = s.reservations.upper_bound(at);
    return r != s.reservations.begin() && at < std::prev(r)->first + std::prev(r)->second;
  }
  // Whether [p, p + bytes) is covered by known, accessible regions laid end to end (mapped pieces
  // of a reservation are contiguous, as on a GPU).
  bool covered(const void* p, std::size_t bytes) const {
    auto at = reinterpret_cast<std::uintptr_t>(p);
    const auto end = at + bytes;
    auto it = s.regions.upper_bound(at);
    if (it == s.regions.begin()) return false;
    --it;
    while (it != s.regions.end() && it->first <= at && at < it->first + it->second.bytes && it->second.accessible) {
      at = it->first + it->second.bytes;
      if (at >= end) return true;
      ++it;
    }
    return false;
  }
  // Whether p lies in any known range: an allocation, a mapped piece or a reservation.
  bool known(const void* p) const {
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    auto it = s.regions.upper_bound(at);
    return reserved(p) || (it != s.regions.begin() && at < std::prev(it)->first + std::prev(it)->second.bytes);
  }
  // Host pointers refpool does not know (a user's vector) are fine; known ranges must be covered.
  bool data_ok(const void* p, std::size_t bytes) const { return !known(p) || covered(p, bytes); }

  runtime_state& s;

 private:
  std::unique_lock<std::mutex> lock_;
  const char* name_;
};

// Breaks capture `capture`: every stream in it is invalidated (its end fails), as the runtimes do.
void invalidate_capture(entry& e, unsigned long long capture, const char* why) {
  for (const void* object : e.s.streams) {
    auto* st = static_cast<stream_object*>(const_cast<void*>(object));
    if (st->capture == capture) st->invalidated = true;
  }
  violation(e.s, std::string(why) + ": the capture is invalidated");
}

// A "potentially unsafe" call (allocating, mapping, freeing) while a capture in global mode runs,
// from a thread not in relaxed mode: refused, and every such capture is invalidated.
hipError_t unsafe_during_capture(entry& e, const char* call) {
  if (thread_capture_mode == hipStreamCaptureModeRelaxed) return hipSuccess;
  std::set<unsigned long long> global;
  for (const void* object : e.s.streams) {
    const auto* st = static_cast<const stream_object*>(object);
    if (!st->destroyed && st->capture != 0 && st->mode == hipStreamCaptureModeGlobal) global.insert(st->capture);
  }
  for (const unsigned long long capture : global)
    invalidate_capture(e, capture, (std::string(call) + " during a capture in global mode").c_str());
  return global.empty() ? hipSuccess : hipErrorStreamCaptureUnsupported;
}

hipError_t allocate(entry& e, void** ptr, std::size_t bytes, int device) {
  *ptr = nullptr;
  if (bytes == 0) return hipSuccess;
  if (device >= 0) {
    if (e.s.used[static_cast<std::size_t>(device)] + bytes > e.s.memory) return hipErrorOutOfMemory;
    e.s.used[static_cast<std::size_t>(device)] += bytes;
  }
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  e.s.regions[reinterpret_cast<std::uintptr_t>(*ptr)] = {bytes, device};
  return hipSuccess;
}

hipError_t deallocate(entry& e, void* ptr, bool device) {
  if (ptr == nullptr) return hipSuccess;
  const auto it = e.s.regions.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == e.s.regions.end() || it->second.physical != nullptr || (it->second.device >= 0) != device)
    return hipErrorInvalidValue;
  if (device) e.s.used[static_cast<std::size_t>(it->second.device)] -= it->second.bytes;
  std::free(ptr);
  e.s.regions.erase(it);
  return hipSuccess;
}

// "gfx90a:sramecc+:xnack-" runs code for "gfx90a", "gfx90a:xnack-", ... but not "gfx90a:xnack+".
bool compatible(const std::string& device_arch, const std::string& code_target) {
  const auto processor = [](const std::string& t) { return t.substr(0, t.find(':')); };
  if (processor(device_arch) != processor(code_target)) return false;
  for (std::size_t at = code_target.find(':'); at != std::string::npos; at = code_target.find(':', at + 1)) {
    const std::string feature = code_target.substr(at + 1, code_target.find(':', at + 1) - at - 1);
    if (device_arch.find(":" + feature) == std::string::npos) return false;
  }
  return true;
}

// The target of a bare ELF code object's e_flags (only those the tests use).
std::string elf_target(unsigned flags) {
  std::string name;
  switch (flags & 0xff) {
    case fake_hip::elf_mach_gfx906: name = "gfx906"; break;
    case fake_hip::elf_mach_gfx90a: name = "gfx90a"; break;
    case fake_hip::elf_mach_gfx1030: name = "gfx1030"; break;
    default: name = "unknown"; break;
  }
  if ((flags & 0xc00) == 0xc00) name += ":sramecc+";
  if ((flags & 0xc00) == 0x800) name += ":sramecc-";
  if ((flags & 0x300) == 0x300) name += ":xnack+";
  if ((flags & 0x300) == 0x200) name += ":xnack-";
  return name;
}

}  // namespace

// The test's view (fake_hip/control.hpp).
FAKE_API const fake_hip::control* refpool_fake_hip_control() {
  static const fake_hip::control instance{
      [] {
        std::lock_guard lock(state().mutex);
        return state().calls;
      },
      [] {
        std::lock_guard lock(state().mutex);
        state().calls.clear();
      },
      [] {
        std::lock_guard lock(state().mutex);
        return state().violations;
      },
      [] {
        std::lock_guard lock(state().mutex);
        state().violations.clear();
      },
      [](int device) {
        std::lock_guard lock(state().mutex);
        return state().used.at(static_cast<std::size_t>(device));
      },
      [](const char* name, int error, int count) {
        std::lock_guard lock(state().mutex);
        state().faults[name] = {static_cast<hipError_t>(error), count};
      },
      [](const char* name, void (*hook)()) {
        std::lock_guard lock(before_calls().mutex);
        before_calls().name = hook != nullptr ? name : "";
        before_calls().hook = hook;
      },
  };
  return &instance;
}

// ---- versions, devices, errors

FAKE_API hipError_t hipRuntimeGetVersion(int* version) {
  entry e("hipRuntimeGetVersion");
  *version = e.s.version;
  return e.done(hipSuccess);
}

#ifndef REFPOOL_FAKE_HIP_INCOMPLETE  // the build that lacks an entry point refpool needs
FAKE_API hipError_t hipDriverGetVersion(int* version) {
  entry e("hipDriverGetVersion");
  *version = e.s.version;
  return e.done(hipSuccess);
}
#endif

FAKE_API hipError_t hipGetDeviceCount(int* count) {
  entry e("hipGetDeviceCount");
  *count = e.s.devices;
  return e.done(e.s.devices > 0 ? hipSuccess : hipErrorNoDevice);
}

FAKE_API hipError_t hipGetDevice(int* device) {
  entry e("hipGetDevice");
  *device = current_device;
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipSetDevice(int device) {
  entry e("hipSetDevice");
  if (!e.device_ok(device)) return e.done(hipErrorInvalidDevice);
  current_device = device;
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipDeviceGet(hipDevice_t* device, int ordinal) {
  entry e("hipDeviceGet");
  if (!e.device_ok(ordinal)) return e.done(hipErrorInvalidDevice);
  *device = ordinal;
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipDeviceGetName(char* name, int length, hipDevice_t device) {
  entry e("hipDeviceGetName");
  if (!e.device_ok(device)) return e.done(hipErrorInvalidDevice);
  std::snprintf(name, static_cast<std::size_t>(length), "Fake AMD GPU %d (%s)", device, e.s.arch.c_str());
  return e.done(hipSuccess);
}

// The hipDeviceProp_t of HIP 5.x (gcnArchName at 396 of 792 bytes), whatever the header compiled
// against says (ROCm 6 headers name another layout so): refpool reads it only from HIP 5.2 and 5.3.
struct device_properties_5 {
  alignas(8) char name[256];
  std::size_t total_global_mem;
  char between[396 - 256 - 8];
  char gcn_arch_name[256];
  char after[140];
};
static_assert(sizeof(device_properties_5) == 792);
FAKE_API hipError_t get_device_properties_5(device_properties_5* prop, int device) __asm__("hipGetDeviceProperties");
FAKE_API hipError_t get_device_properties_5(device_properties_5* prop, int device) {
  entry e("hipGetDeviceProperties");
  if (!e.device_ok(device)) return e.done(hipErrorInvalidDevice);
  *prop = device_properties_5{};
  std::snprintf(prop->name, sizeof prop->name, "Fake AMD GPU %d", device);
  std::snprintf(prop->gcn_arch_name, sizeof prop->gcn_arch_name, "%s", e.s.arch.c_str());
  prop->total_global_mem = e.s.memory;
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device) {
  entry e("hipDeviceGetAttribute");
  if (!e.device_ok(device)) return e.done(hipErrorInvalidDevice);
  if (attribute == attribute_memory_pools)
    *value = 1;
  else if (attribute == attribute_vmm && e.s.version >= 50'300'000)
    *value = e.s.vmm ? 1 : 0;
  else
    return e.done(hipErrorInvalidValue);  // 5.2 has no attribute 89
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipMemGetInfo(size_t* free, size_t* total) {
  entry e("hipMemGetInfo");
  if (!e.device_ok(current_device)) return e.done(hipErrorNoDevice);
  *total = e.s.memory;
  *free = e.s.memory - e.s.used[static_cast<std::size_t>(current_device)];
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipGetLastError() {
  entry e("hipGetLastError");
  return e.record(std::exchange(last_error, hipSuccess));
}

FAKE_API hipError_t hipPeekAtLastError() {
  entry e("hipPeekAtLastError");
  return e.record(last_error);
}

FAKE_API const char* hipGetErrorName(hipError_t code) {
  switch (code) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorDeinitialized: return "hipErrorDeinitialized";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorNoBinaryForGpu: return "hipErrorNoBinaryForGpu";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorStreamCaptureUnsupported: return "hipErrorStreamCaptureUnsupported";
    case hipErrorStreamCaptureInvalidated: return "hipErrorStreamCaptureInvalidated";
    case hipErrorStreamCaptureUnjoined: return "hipErrorStreamCaptureUnjoined";
    case hipErrorStreamCaptureIsolation: return "hipErrorStreamCaptureIsolation";
    case hipErrorIllegalState: return "hipErrorIllegalState";
    default: return "hipErrorUnknown";
  }
}

FAKE_API const char* hipGetErrorString(hipError_t code) {
  return code == hipSuccess ? "no error" : "an error of the fake HIP runtime";
}

// ---- memory

FAKE_API hipError_t hipMalloc(void** ptr, size_t bytes) {
  entry e("hipMalloc");
  if (const hipError_t r = unsafe_during_capture(e, "hipMalloc"); r != hipSuccess) return e.done(r);
  if (!e.device_ok(current_device)) return e.done(hipErrorNoDevice);
  const hipError_t r = allocate(e, ptr, bytes, current_device);
  return e.done(r, *ptr);
}

FAKE_API hipError_t hipFree(void* ptr) {
  entry e("hipFree");
  if (const hipError_t r = unsafe_during_capture(e, "hipFree"); r != hipSuccess) return e.done(r);
  return e.done(deallocate(e, ptr, true), ptr);
}

FAKE_API hipError_t hipMallocAsync(void** ptr, size_t bytes, hipStream_t stream) {
  entry e("hipMallocAsync");
  if (stream == nullptr && e.s.version < 50'300'000)
    violation(e.s, "hipMallocAsync on the null stream: HIP 5.2 dereferences the stream before its null check");
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  const int device = stream != nullptr ? reinterpret_cast<stream_object*>(stream)->device : current_device;
  const hipError_t r = allocate(e, ptr, bytes, device);
  return e.done(r, *ptr);
}

FAKE_API hipError_t hipFreeAsync(void* ptr, hipStream_t stream) {
  entry e("hipFreeAsync");
  if (stream == nullptr && e.s.version < 50'300'000)
    violation(e.s, "hipFreeAsync on the null stream: HIP 5.2 dereferences the stream before its null check");
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  return e.done(deallocate(e, ptr, true), ptr);
}

FAKE_API hipError_t hipHostMalloc(void** ptr, size_t bytes, unsigned int) {
  entry e("hipHostMalloc");
  if (const hipError_t r = unsafe_during_capture(e, "hipHostMalloc"); r != hipSuccess) return e.done(r);
  const hipError_t r = allocate(e, ptr, bytes, -1);
  return e.done(r, *ptr);
}

FAKE_API hipError_t hipHostFree(void* ptr) {
  entry e("hipHostFree");
  if (const hipError_t r = unsafe_during_capture(e, "hipHostFree"); r != hipSuccess) return e.done(r);
  return e.done(deallocate(e, ptr, false), ptr);
}

FAKE_API hipError_t hipDeviceGetDefaultMemPool(hipMemPool_t* pool, int device) {
  entry e("hipDeviceGetDefaultMemPool");
  if (!e.device_ok(device)) return e.done(hipErrorInvalidDevice);
  static char pools[64];
  *pool = reinterpret_cast<hipMemPool_t>(&pools[device % 64]);
  return e.done(hipSuccess, *pool);
}

FAKE_API hipError_t hipMemPoolSetAttribute(hipMemPool_t pool, hipMemPoolAttr, void* value) {
  entry e("hipMemPoolSetAttribute");
  return e.done(pool != nullptr && value != nullptr ? hipSuccess : hipErrorInvalidValue, pool);
}

// ---- streams and events

FAKE_API hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int) {
  entry e("hipStreamCreateWithFlags");
  if (!e.device_ok(current_device)) return e.done(hipErrorNoDevice);
  // Never freed, so a destroyed stream's address is never handed out again: uses are caught.
  auto* object = new stream_object{current_device};
  e.s.streams.insert(object);
  *stream = reinterpret_cast<hipStream_t>(object);
  return e.done(hipSuccess, object);
}

FAKE_API hipError_t hipStreamDestroy(hipStream_t stream) {
  entry e("hipStreamDestroy");
  if (stream == nullptr || !e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  reinterpret_cast<stream_object*>(stream)->destroyed = true;
  return e.done(hipSuccess, stream);
}

FAKE_API hipError_t hipStreamSynchronize(hipStream_t stream) {
  entry e("hipStreamSynchronize");
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (stream != nullptr && as_stream(stream)->capture != 0) {
    invalidate_capture(e, as_stream(stream)->capture, "hipStreamSynchronize of a capturing stream");
    return e.done(hipErrorStreamCaptureUnsupported, stream);
  }
  return e.done(hipSuccess, stream);
}

FAKE_API hipError_t hipDeviceSynchronize() {
  entry e("hipDeviceSynchronize");
  if (!e.device_ok(current_device)) return e.done(hipErrorInvalidDevice);
  bool capturing = false;
  for (const void* object : e.s.streams) {
    const auto* st = static_cast<const stream_object*>(object);
    capturing |= !st->destroyed && st->capture != 0 && st->device == current_device;
  }
  if (capturing) {
    for (const void* object : e.s.streams) {
      const auto* st = static_cast<const stream_object*>(object);
      if (!st->destroyed && st->capture != 0 && st->device == current_device)
        invalidate_capture(e, st->capture, "hipDeviceSynchronize while a stream of the device captures");
    }
    return e.done(hipErrorStreamCaptureUnsupported);
  }
  return e.done(hipSuccess);
}

// ---- stream capture

FAKE_API hipError_t hipStreamBeginCapture(hipStream_t stream, hipStreamCaptureMode mode) {
  entry e("hipStreamBeginCapture");
  if (stream == nullptr || !e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  stream_object* st = as_stream(stream);
  if (st->capture != 0) return e.done(hipErrorIllegalState, stream);
  st->capture = ++e.s.captures;
  st->mode = mode;
  st->invalidated = false;
  return e.done(hipSuccess, stream);
}

// Ends the capture on `stream` and every stream that joined it. The graph is not emulated: null.
FAKE_API hipError_t hipStreamEndCapture(hipStream_t stream, hipGraph_t* graph) {
  entry e("hipStreamEndCapture");
  if (stream == nullptr || !e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  const unsigned long long capture = as_stream(stream)->capture;
  if (capture == 0) return e.done(hipErrorIllegalState, stream);
  const bool invalidated = as_stream(stream)->invalidated;
  bool unjoined = false;
  for (const void* object : e.s.streams) {
    auto* st = static_cast<stream_object*>(const_cast<void*>(object));
    if (st->capture != capture) continue;
    unjoined |= st->forked && !st->rejoined;
    *st = stream_object{st->device, st->destroyed};
  }
  if (graph != nullptr) *graph = nullptr;
  return e.done(invalidated ? hipErrorStreamCaptureInvalidated
                : unjoined  ? hipErrorStreamCaptureUnjoined
                            : hipSuccess,
                stream);
}

FAKE_API hipError_t hipGraphDestroy(hipGraph_t graph) {
  entry e("hipGraphDestroy");
  return e.done(graph == nullptr ? hipErrorInvalidValue : hipSuccess);  // the fake's captures make no graph
}

// This thread's capture mode (thread-local, as in the runtimes).
FAKE_API hipError_t hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode) {
  entry e("hipThreadExchangeStreamCaptureMode");
  if (mode == nullptr) return e.done(hipErrorInvalidValue);
  std::swap(*mode, thread_capture_mode);
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipStreamGetCaptureInfo(hipStream_t stream, hipStreamCaptureStatus* status,
                                            unsigned long long* id) {
  entry e("hipStreamGetCaptureInfo");
  if (!e.stream_ok(stream) || status == nullptr) return e.done(hipErrorInvalidValue, stream);
  const stream_object* st = stream == nullptr ? nullptr : as_stream(stream);
  const unsigned long long capture = st == nullptr ? 0 : st->capture;
  *status = capture == 0      ? hipStreamCaptureStatusNone
            : st->invalidated ? hipStreamCaptureStatusInvalidated
                              : hipStreamCaptureStatusActive;
  if (id != nullptr) *id = capture;
  return e.done(hipSuccess, stream);
}

FAKE_API hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned int) {
  entry e("hipEventCreateWithFlags");
  auto* object = new event_object{current_device};
  e.s.events.insert(object);
  *event = reinterpret_cast<hipEvent_t>(object);
  return e.done(hipSuccess, object);
}

FAKE_API hipError_t hipEventDestroy(hipEvent_t event) {
  entry e("hipEventDestroy");
  if (e.s.events.erase(event) == 0) return e.done(hipErrorInvalidHandle, event);
  delete reinterpret_cast<event_object*>(event);
  return e.done(hipSuccess, event);
}

FAKE_API hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
  entry e("hipEventRecord");
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault, stream);
  if (e.s.events.count(event) == 0 || !e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (const hipError_t broken = e.capture_broken(stream); broken != hipSuccess) return e.done(broken, stream);
  auto* ev = reinterpret_cast<event_object*>(event);
  ev->capture = stream == nullptr ? 0 : as_stream(stream)->capture;
  ev->recorded_on = stream == nullptr ? nullptr : as_stream(stream);
  if (ev->recorded_on != nullptr) ev->recorded_on->rejoined = false;
  return e.done(hipSuccess, stream);
}

// A wait across a capture's boundary (an event of one capture waited for by a stream outside it,
// or a capturing stream waiting for an event recorded outside its capture) is illegal.
FAKE_API hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int) {
  entry e("hipStreamWaitEvent");
  if (e.s.events.count(event) == 0 || !e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (const hipError_t broken = e.capture_broken(stream); broken != hipSuccess) return e.done(broken, stream);
  const auto* ev = reinterpret_cast<event_object*>(event);
  const unsigned long long recorded_in = ev->capture;
  const unsigned long long waiting_in = stream == nullptr ? 0 : as_stream(stream)->capture;
  if (recorded_in != 0 && waiting_in == 0 && stream != nullptr) {  // a fork: the stream joins the capture
    as_stream(stream)->capture = recorded_in;
    as_stream(stream)->forked = true;
    as_stream(stream)->rejoined = false;
    return e.done(hipSuccess, stream);
  }
  if (recorded_in != waiting_in) {
    const char* what = "hipStreamWaitEvent across a stream capture's boundary";
    if (recorded_in != 0) invalidate_capture(e, recorded_in, what);
    if (waiting_in != 0) invalidate_capture(e, waiting_in, what);
    return e.done(hipErrorStreamCaptureIsolation, stream);
  }
  if (recorded_in != 0 && ev->recorded_on != nullptr && ev->recorded_on != as_stream(stream))
    ev->recorded_on->rejoined = true;  // the capture waits for the forked stream again: a join
  return e.done(hipSuccess, stream);
}

// ---- copies

FAKE_API hipError_t hipMemcpyAsync(void* dst, const void* src, size_t bytes, hipMemcpyKind, hipStream_t stream) {
  entry e("hipMemcpyAsync");
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (!e.data_ok(dst, bytes) || !e.data_ok(src, bytes)) return e.done(hipErrorInvalidValue, dst);
  std::memmove(dst, src, bytes);
  return e.done(hipSuccess, dst);
}

FAKE_API hipError_t hipMemsetAsync(void* dst, int value, size_t bytes, hipStream_t stream) {
  entry e("hipMemsetAsync");
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (!e.covered(dst, bytes)) return e.done(hipErrorInvalidValue, dst);
  std::memset(dst, value, bytes);
  return e.done(hipSuccess, dst);
}

FAKE_API hipError_t hipMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                                       hipStream_t stream) {
  entry e("hipMemcpyPeerAsync");
  if (!e.device_ok(dst_device) || !e.device_ok(src_device)) return e.done(hipErrorInvalidDevice);
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (!e.covered(dst, bytes) || !e.covered(src, bytes)) return e.done(hipErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return e.done(hipSuccess, dst);
}

// ---- modules and kernels

FAKE_API hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
  entry e("hipModuleLoadData");
  if (!e.device_ok(current_device)) return e.done(hipErrorNoDevice);
  const char* bytes = static_cast<const char*>(image);
  std::vector<std::string> targets;  // each target the image has code for
  std::string payload;
  bool found = false;
  if (std::memcmp(bytes,
                  "\x7f"
                  "ELF",
                  4) == 0) {
    unsigned flags = 0;
    for (int i = 3; i >= 0; --i) flags = (flags << 8) | static_cast<unsigned char>(bytes[48 + i]);
    targets.push_back(elf_target(flags));
    found = compatible(e.s.arch, targets.back());
    payload = bytes + fake_hip::elf_header_bytes;
  } else {
    const auto entries = fake_hip::read_bundle(bytes);
    if (entries.empty()) return e.done(hipErrorInvalidImage);
    for (const auto& item : entries) {
      const auto at = item.id.find("amdgcn-amd-amdhsa-");
      if (at == std::string::npos) continue;
      std::string target = item.id.substr(at + 18);
      target.erase(0, target.find_first_not_of('-'));
      targets.push_back(target);
      if (!found && compatible(e.s.arch, target)) {
        found = true;
        payload = item.payload;
      }
    }
  }
  if (!found) {
    if (e.s.version < 50'400'000)
      violation(e.s, "hipModuleLoadData of a code object without code for " + e.s.arch +
                         ": HIP before 5.4 aborts instead of returning hipErrorNoBinaryForGpu");
    return e.done(hipErrorNoBinaryForGpu);
  }
  if (payload.rfind(fake_hip::kernels_prefix, 0) != 0) return e.done(hipErrorInvalidImage);
  auto* object = new module_object{current_device, payload.substr(fake_hip::kernels_prefix.size())};
  e.s.modules.insert(object);
  *module = reinterpret_cast<hipModule_t>(object);
  return e.done(hipSuccess, object);
}

FAKE_API hipError_t hipModuleUnload(hipModule_t module) {
  entry e("hipModuleUnload");
  if (e.s.modules.erase(module) == 0) return e.done(hipErrorInvalidHandle, module);
  delete reinterpret_cast<module_object*>(module);
  return e.done(hipSuccess, module);
}

FAKE_API hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* name) {
  entry e("hipModuleGetFunction");
  if (e.s.modules.count(module) == 0) return e.done(hipErrorInvalidHandle, module);
  auto* m = reinterpret_cast<module_object*>(module);
  if (m->device != current_device)
    violation(e.s, "hipModuleGetFunction with device " + std::to_string(current_device) +
                       " current for a module of device " + std::to_string(m->device) + ": HIP aborts (guarantee)");
  if (m->kernels.find(std::string(name) + ",") == std::string::npos) return e.done(hipErrorNotFound, module);
  auto* object = new function_object{m, name};
  e.s.functions.insert(object);
  *function = reinterpret_cast<hipFunction_t>(object);
  return e.done(hipSuccess, module);
}

// Kernels: fill_u8(void* p, uint32 n, uint32 value) sets n bytes at p to value.
FAKE_API hipError_t hipModuleLaunchKernel(hipFunction_t function, unsigned, unsigned, unsigned, unsigned, unsigned,
                                          unsigned, unsigned, hipStream_t stream, void** args, void**) {
  entry e("hipModuleLaunchKernel");
  if (e.s.functions.count(function) == 0) return e.done(hipErrorInvalidHandle, function);
  const auto* f = reinterpret_cast<function_object*>(function);
  if (e.s.modules.count(f->module) == 0) return e.done(hipErrorInvalidHandle, f->module);
  if (!e.stream_ok(stream)) return e.done(hipErrorInvalidHandle, stream);
  if (f->name == "fill_u8") {
    void* p = *static_cast<void**>(args[0]);
    const auto n = *static_cast<std::uint32_t*>(args[1]);
    const auto value = *static_cast<std::uint32_t*>(args[2]);
    if (!e.covered(p, n)) return e.done(hipErrorInvalidValue, f->module);
    std::memset(p, static_cast<int>(value & 0xff), n);
  }
  return e.done(hipSuccess, f->module);
}

// ---- virtual memory (HIP 5.3+ layout of hipMemAllocationProp)

namespace {
hipError_t check_prop(entry& e, const hipMemAllocationProp* p) {
  const auto* prop = reinterpret_cast<const allocation_prop_53*>(p);
  if (!e.s.vmm) return hipErrorNotSupported;
  if (prop->type != hipMemAllocationTypePinned || prop->location.type != hipMemLocationTypeDevice ||
      !e.device_ok(prop->location.id))
    return hipErrorInvalidValue;
  return hipSuccess;
}
}  // namespace

FAKE_API hipError_t hipMemGetAllocationGranularity(size_t* granularity, const hipMemAllocationProp* prop,
                                                   hipMemAllocationGranularity_flags) {
  entry e("hipMemGetAllocationGranularity");
  if (const hipError_t r = check_prop(e, prop); r != hipSuccess) return e.done(r);
  *granularity = vmm_granularity;
  return e.done(hipSuccess);
}

FAKE_API hipError_t hipMemAddressReserve(void** ptr, size_t bytes, size_t alignment, void*, unsigned long long) {
  entry e("hipMemAddressReserve");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemAddressReserve"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  if (!e.s.vmm) return e.done(hipErrorNotSupported);
  alignment = std::max(alignment, vmm_granularity);
  if (bytes == 0 || bytes % vmm_granularity != 0) return e.done(hipErrorInvalidValue);
  void* raw = mmap(nullptr, bytes + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return e.done(hipErrorOutOfMemory);
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const auto aligned = (start + alignment - 1) / alignment * alignment;
  if (aligned > start) munmap(raw, aligned - start);
  if (const auto end = start + bytes + alignment; end > aligned + bytes)
    munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  e.s.reservations[aligned] = bytes;
  *ptr = reinterpret_cast<void*>(aligned);
  return e.done(hipSuccess, *ptr);
}

FAKE_API hipError_t hipMemAddressFree(void* ptr, size_t bytes) {
  entry e("hipMemAddressFree");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemAddressFree"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  const auto it = e.s.reservations.find(at);
  if (it == e.s.reservations.end() || it->second != bytes) return e.done(hipErrorInvalidValue, ptr);
  const auto mapped = e.s.regions.lower_bound(at);
  if (mapped != e.s.regions.end() && mapped->first < at + bytes)
    return e.done(hipErrorInvalidValue, ptr);  // pieces are still mapped
  munmap(ptr, bytes);
  e.s.reservations.erase(it);
  return e.done(hipSuccess, ptr);
}

FAKE_API hipError_t hipMemCreate(hipMemGenericAllocationHandle_t* handle, size_t bytes,
                                 const hipMemAllocationProp* prop, unsigned long long) {
  entry e("hipMemCreate");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemCreate"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  if (const hipError_t r = check_prop(e, prop); r != hipSuccess) return e.done(r);
  if (bytes == 0 || bytes % vmm_granularity != 0) return e.done(hipErrorInvalidValue);
  const int device = reinterpret_cast<const allocation_prop_53*>(prop)->location.id;
  std::size_t& used = e.s.used[static_cast<std::size_t>(device)];
  if (used + bytes > e.s.memory) return e.done(hipErrorOutOfMemory);
  used += bytes;
  auto* object = new physical_object{bytes, device};
  e.s.physicals.insert(object);
  *handle = reinterpret_cast<hipMemGenericAllocationHandle_t>(object);
  return e.done(hipSuccess, object);
}

namespace {
void free_physical_if_unused(entry& e, physical_object* p) {
  if (!p->released || p->mappings > 0) return;
  e.s.used[static_cast<std::size_t>(p->device)] -= p->bytes;
  e.s.physicals.erase(p);
  delete p;
}
}  // namespace

FAKE_API hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
  entry e("hipMemRelease");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemRelease"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  auto* p = reinterpret_cast<physical_object*>(handle);
  if (e.s.physicals.count(p) == 0 || p->released) return e.done(hipErrorInvalidValue, handle);
  p->released = true;  // the memory stays while mapped
  free_physical_if_unused(e, p);
  return e.done(hipSuccess, handle);
}

FAKE_API hipError_t hipMemMap(void* ptr, size_t bytes, size_t offset, hipMemGenericAllocationHandle_t handle,
                              unsigned long long) {
  entry e("hipMemMap");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemMap"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  auto* p = reinterpret_cast<physical_object*>(handle);
  if (e.s.physicals.count(p) == 0 || p->released || offset != 0 || bytes != p->bytes)
    return e.done(hipErrorInvalidValue, ptr);
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  const bool inside = e.reserved(ptr);
  auto next = e.s.regions.lower_bound(at);
  const bool overlaps = (next != e.s.regions.end() && next->first < at + bytes) ||
                        (next != e.s.regions.begin() && std::prev(next)->first + std::prev(next)->second.bytes > at);
  auto r = e.s.reservations.upper_bound(at);
  const bool in_range = r != e.s.reservations.begin() && at + bytes <= std::prev(r)->first + std::prev(r)->second;
  if (!inside || !in_range || overlaps) return e.done(hipErrorInvalidValue, ptr);
  // Fresh zero pages, inaccessible until hipMemSetAccess.
  mmap(ptr, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  e.s.regions[at] = {bytes, p->device, p, false};
  ++p->mappings;
  return e.done(hipSuccess, ptr);
}

FAKE_API hipError_t hipMemSetAccess(void* ptr, size_t bytes, const hipMemAccessDesc* desc, size_t count) {
  entry e("hipMemSetAccess");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemSetAccess"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  const auto at = reinterpret_cast<std::uintptr_t>(ptr);
  if (count != 1 || desc->location.type != hipMemLocationTypeDevice || !e.device_ok(desc->location.id))
    return e.done(hipErrorInvalidValue, ptr);
  // Every mapped piece in [ptr, ptr + bytes), which they must cover exactly.
  std::uintptr_t next = at;
  for (auto it = e.s.regions.find(at); it != e.s.regions.end() && it->first == next && next < at + bytes; ++it)
    next += it->second.bytes;
  if (next != at + bytes) return e.done(hipErrorInvalidValue, ptr);
  const bool rw = desc->flags == hipMemAccessFlagsProtReadWrite;
  mprotect(ptr, bytes, rw ? PROT_READ | PROT_WRITE : PROT_NONE);
  for (auto it = e.s.regions.find(at); it != e.s.regions.end() && it->first < at + bytes; ++it)
    it->second.accessible = rw;
  return e.done(hipSuccess, ptr);
}

FAKE_API hipError_t hipMemUnmap(void* ptr, size_t bytes) {
  entry e("hipMemUnmap");
  if (const hipError_t r = unsafe_during_capture(e, "hipMemUnmap"); r != hipSuccess) return e.done(r);
  if (const hipError_t fault = e.injected(); fault != hipSuccess) return e.done(fault);
  const auto it = e.s.regions.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == e.s.regions.end() || it->second.physical == nullptr || it->second.bytes != bytes)
    return e.done(hipErrorInvalidValue, ptr);  // a whole mapping only, as CUDA's cuMemUnmap
  physical_object* p = it->second.physical;
  e.s.regions.erase(it);
  mmap(ptr, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  --p->mappings;
  free_physical_if_unused(e, p);
  return e.done(hipSuccess, ptr);
}
