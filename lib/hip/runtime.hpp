// The HIP runtime (libamdhip64), loaded at run time: one X-macro list of the entry points refpool
// uses, expanded into a table of pointers filled once, thread-safely, through dlsym. Only files in
// lib/hip/ include this (and hip/hip_runtime_api.h).
#pragma once

// Without the header's C++ convenience overloads (hipMalloc(T**), ...), decltype(&name) is the C
// entry point's type; the few overloads the macro leaves (hipMallocAsync) are TYPED below.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <string>
#include <utility>

namespace refpool::detail::hip {

// The C entry points of names the header also overloads in C++ (hipMallocAsync with a pool).
using hip_malloc_async_t = hipError_t (*)(void**, size_t, hipStream_t);

// X(name) takes the type of the header's declaration; TYPED(name, type) names the type of an
// overloaded name's C entry point.
#define REFPOOL_HIP_RUNTIME_SYMBOLS(X, TYPED)                                                                     \
  X(hipRuntimeGetVersion)                                                                                         \
  X(hipDriverGetVersion)                                                                                          \
  X(hipGetDeviceCount)                                                                                            \
  X(hipGetDevice) X(hipSetDevice) X(hipDeviceGet) X(hipDeviceGetName) X(hipMemGetInfo) X(hipMalloc) X(hipFree)    \
      TYPED(hipMallocAsync, hip_malloc_async_t) X(hipFreeAsync) X(hipHostMalloc) X(hipHostFree)                   \
          X(hipDeviceGetDefaultMemPool) X(hipMemPoolSetAttribute) X(hipStreamCreateWithFlags) X(hipStreamDestroy) \
              X(hipStreamSynchronize) X(hipStreamGetCaptureInfo) X(hipThreadExchangeStreamCaptureMode)            \
                  X(hipDeviceSynchronize) X(hipEventCreateWithFlags) X(hipEventDestroy) X(hipEventRecord)         \
                      X(hipStreamWaitEvent) X(hipMemcpyAsync) X(hipMemsetAsync) X(hipMemcpyPeerAsync)             \
                          X(hipGetErrorName) X(hipGetErrorString) X(hipGetLastError)

// The hipMemAllocationProp of HIP 5.3 and later (HIP 5.2's header, which refpool may compile
// against, has another order of the same fields), which is what refpool passes: virtual memory is
// used only from HIP 5.3 on.
struct allocation_prop_53 {
  hipMemAllocationType type;
  hipMemAllocationHandleType requested_handle_type;
  hipMemLocation location;
  void* win32_metadata;
  unsigned char compression_type;
  unsigned char rdma_capable;
  unsigned short usage;
};
static_assert(sizeof(allocation_prop_53) == 32);
using mem_create_53_t = hipError_t (*)(hipMemGenericAllocationHandle_t*, size_t, const allocation_prop_53*,
                                       unsigned long long);
using mem_granularity_53_t = hipError_t (*)(size_t*, const allocation_prop_53*, hipMemAllocationGranularity_flags);

/// The first runtime whose virtual memory refpool uses: it has the attribute that says whether a
/// device supports it (hipDeviceAttributeVirtualMemoryManagementSupported, 89) and the layout above.
inline constexpr int minimum_vm_version = 50'300'000;
inline constexpr int attribute_virtual_memory = 89;  // hipDeviceAttribute_t from HIP 5.3 (5.2's header lacks it)

// Entry points refpool uses only on some releases or where present; null where absent.
// Virtual memory.
#define REFPOOL_HIP_OPTIONAL_SYMBOLS(X, TYPED)                                                                    \
  X(hipDeviceGetAttribute)                                                                                        \
  TYPED(hipMemGetAllocationGranularity, mem_granularity_53_t)                                                     \
  X(hipMemAddressReserve) X(hipMemAddressFree) TYPED(hipMemCreate, mem_create_53_t) X(hipMemRelease) X(hipMemMap) \
      X(hipMemUnmap) X(hipMemSetAccess)

struct runtime_api {
#define REFPOOL_HIP_DECLARE(name) decltype(&::name) name = nullptr;
#define REFPOOL_HIP_DECLARE_TYPED(name, type) type name = nullptr;  // static_cast below checks the type
  REFPOOL_HIP_RUNTIME_SYMBOLS(REFPOOL_HIP_DECLARE, REFPOOL_HIP_DECLARE_TYPED)
  REFPOOL_HIP_OPTIONAL_SYMBOLS(REFPOOL_HIP_DECLARE, REFPOOL_HIP_DECLARE_TYPED)
#undef REFPOOL_HIP_DECLARE
#undef REFPOOL_HIP_DECLARE_TYPED
  std::string library;          ///< the name that loaded ("libamdhip64.so.5")
  bool already_loaded = false;  ///< the process had loaded it before refpool
  int version = 0;              ///< hipRuntimeGetVersion: major * 10'000'000 + minor * 100'000 + patch
  int device_count = 0;         ///< at least 1 once loaded
};

// A TYPED entry must name the type of one of the header's declarations (else the cast fails).
#define REFPOOL_HIP_CHECK_TYPED(name, type) static_assert(sizeof(static_cast<type>(&::name)) != 0);
#define REFPOOL_HIP_IGNORE(name)
REFPOOL_HIP_RUNTIME_SYMBOLS(REFPOOL_HIP_IGNORE, REFPOOL_HIP_CHECK_TYPED)
#undef REFPOOL_HIP_CHECK_TYPED
#undef REFPOOL_HIP_IGNORE

/// A name the runtime is loaded by, and the HIP major its SONAME stands for (0: unversioned).
struct library_name {
  const char* name;
  int major;
};

/// The names tried, newest first: first whichever of them this process has already loaded (a
/// second runtime would know nothing of the application's streams and pointers), then each in
/// turn. The unversioned name (a development link) comes last.
inline constexpr library_name library_names[] = {
    {"libamdhip64.so.7", 7}, {"libamdhip64.so.6", 6}, {"libamdhip64.so.5", 5}, {"libamdhip64.so", 0}};

/// The HIP majors refpool has been reviewed against (docs/hip.md); others are refused.
inline constexpr int reviewed_majors[] = {5, 6, 7};

/// Oldest runtime refpool accepts (HIP 5.2: stream-ordered allocation).
inline constexpr int minimum_runtime_version = 50'200'000;

/// Oldest runtime whose stream-ordered allocation refpool offers (`memory_kind::device_async`):
/// HIP 5.2's hipMallocAsync and hipFreeAsync dereference the stream before their null-stream
/// branch, so on the default stream they crash (fixed in 5.3).
inline constexpr int minimum_async_version = 50'300'000;

/// The loaded runtime. Throws `backend_unavailable` saying why it cannot be used.
const runtime_api& runtime();
/// Empty when the runtime is usable, else the reason. Never throws.
const std::string& failure() noexcept;
/// The runtime's device count and version (hipRuntimeGetVersion); valid once failure() is empty.
int device_count();
int version();
/// "5.2.21153" for 50'221'153.
std::string version_text(int version);
/// True once the process has begun to exit after refpool loaded the runtime. HIP tears itself down
/// in a static destructor registered when its library loads, so the destructors of statics made
/// before that (a global cache, a global optional stream) run after it and would call into freed
/// runtime state. refpool's own exit handler, registered right after loading, runs just before
/// the runtime's teardown and sets this; from then on refpool makes no HIP call (device memory
/// still held goes with the process).
bool process_exiting() noexcept;

/// Calls a runtime entry point; when it fails, clears the runtime's last error. refpool handles
/// every failure itself (retries after out-of-memory, an exception otherwise), and HIP 7 keeps the
/// last error until hipGetLastError: the application's next check would see refpool's. Once the
/// process is exiting (process_exiting()) nothing is called and the result is
/// hipErrorDeinitialized. Every HIP call refpool makes goes through here.
template <class... Parameters, class... Arguments>
hipError_t call(hipError_t (*entry)(Parameters...), Arguments&&... arguments) {
  if (process_exiting()) return hipErrorDeinitialized;
  const hipError_t result = entry(std::forward<Arguments>(arguments)...);
  if (result != hipSuccess) (void)runtime().hipGetLastError();
  return result;
}

}  // namespace refpool::detail::hip
