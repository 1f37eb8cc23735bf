// The HIP backend's virtual memory when each runtime call fails (docs/design.md, "Virtual memory
// failure rules"), on the fake HIP runtime (test/gpu/fake_amdhip64.cpp), which fails the calls it
// is told to: hipMemAddressReserve, hipMemCreate, hipMemMap, hipMemSetAccess, hipMemUnmap,
// hipMemRelease, hipMemAddressFree. Each failure must fall back or give the right error, and
// leave no device memory behind. The same code serves CUDA (lib/gpu/virtual_memory.cpp).
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <string>

#include <refpool/refpool.hpp>

#include "fake_hip/app.hpp"

using namespace refpool;
using fake_hip::fake;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

const char* const vm_calls[] = {"hipMemAddressReserve", "hipMemCreate",  "hipMemMap",        "hipMemSetAccess",
                                "hipMemUnmap",          "hipMemRelease", "hipMemAddressFree"};

// Loads the runtime (refpool loads the fake at first use), and ends every injected failure when
// the test leaves (also when it fails).
struct faults_cleared {
  faults_cleared() {
    REQUIRE(hip::available());
    clear();
  }
  ~faults_cleared() { clear(); }
  static void clear() {
    for (const char* call : vm_calls) fake().fail_calls(call, hipSuccess, 0);
  }
};

virtual_memory& device_vm() {
  virtual_memory* vm = hip::device(0).underlying().address_space();
  REQUIRE(vm != nullptr);
  return *vm;
}

// The virtual memory cases' set-up: faults cleared, device 0's address space, its granularity,
// and the device memory in use before the case.
struct device_vm_case {
  faults_cleared guard;
  virtual_memory& vm = device_vm();
  const std::size_t g = vm.granularity();
  const std::size_t before = fake().device_bytes_in_use(0);
};

cache_options with_segments() {
  cache_options o;
  o.segments = segment_policy::on;
  return o;
}

// A stream of its own that captures a graph (relaxed mode) from construction until end() or
// destruction. The fake records the failed device wait a capture breaks as a violation.
struct capturing_stream {
  hipStream_t stream = nullptr;
  capturing_stream() {
    REQUIRE(fake_hip::symbol<decltype(::hipStreamCreateWithFlags)>("hipStreamCreateWithFlags")(
                &stream, hipStreamNonBlocking) == hipSuccess);
    REQUIRE(fake_hip::symbol<decltype(::hipStreamBeginCapture)>("hipStreamBeginCapture")(
                stream, hipStreamCaptureModeRelaxed) == hipSuccess);
  }
  hipError_t end() {
    hipGraph_t graph = nullptr;
    return fake_hip::symbol<decltype(::hipStreamEndCapture)>("hipStreamEndCapture")(stream, &graph);
  }
  ~capturing_stream() { (void)fake_hip::symbol<decltype(::hipStreamDestroy)>("hipStreamDestroy")(stream); }
  capturing_stream(const capturing_stream&) = delete;
  capturing_stream& operator=(const capturing_stream&) = delete;
};

}  // namespace

TEST_CASE_METHOD(device_vm_case,
                 "hipMemAddressReserve: out of memory is no address space, another error a backend_error", "[hip-7]") {
  fake().fail_calls("hipMemAddressReserve", hipErrorOutOfMemory, 1);
  CHECK(vm.reserve(4 * g) == nullptr);
  fake().fail_calls("hipMemAddressReserve", hipErrorInvalidValue, 1);
  CHECK_THROWS_AS(vm.reserve(4 * g), backend_error);
  void* base = vm.reserve(4 * g);  // the next one works
  REQUIRE(base != nullptr);
  vm.release(base, 4 * g);
  CHECK(fake().violations().empty());
}

TEST_CASE_METHOD(device_vm_case, "hipMemCreate, hipMemMap, hipMemSetAccess: a failed commit holds nothing", "[hip-7]") {
  for (const char* call : {"hipMemCreate", "hipMemMap", "hipMemSetAccess"}) {
    for (const hipError_t error : {hipErrorOutOfMemory, hipErrorInvalidValue}) {
      CAPTURE(call, error);
      const std::size_t before = fake().device_bytes_in_use(0);
      void* base = vm.reserve(4 * g);
      REQUIRE(base != nullptr);
      fake().fail_calls(call, error, 1);
      if (error == hipErrorOutOfMemory)
        CHECK_FALSE(vm.commit(base, 2 * g));  // out of memory from any step: the cache reclaims and retries
      else
        CHECK_THROWS_AS(vm.commit(base, 2 * g), backend_error);
      CHECK(fake().device_bytes_in_use(0) == before);  // the physical allocation went back
      REQUIRE(vm.commit(base, 2 * g));                 // and nothing is left mapped in the range
      vm.decommit(base, 2 * g);
      vm.release(base, 4 * g);
      CHECK(fake().device_bytes_in_use(0) == before);
    }
  }
  CHECK(fake().violations().empty());
}

TEST_CASE_METHOD(
    device_vm_case,
    "hipMemUnmap or hipMemRelease refused at decommit: kept, retried by the next commit there and by release",
    "[hip-7]") {
  void* base = vm.reserve(4 * g);
  REQUIRE(base != nullptr);

  SECTION("a commit over the range gives the stale allocation back first") {
    REQUIRE(vm.commit(base, 2 * g));
    fake().fail_calls("hipMemUnmap", hipErrorInvalidValue, 1);
    vm.decommit(base, 2 * g);  // reported on stderr; the allocation is still mapped
    CHECK(fake().device_bytes_in_use(0) == before + 2 * g);
    REQUIRE(vm.commit(base, g));
    CHECK(fake().device_bytes_in_use(0) == before + g);
    vm.decommit(base, g);
  }
  SECTION("a release of the reservation gives it back") {
    REQUIRE(vm.commit(base, 2 * g));
    fake().fail_calls("hipMemRelease", hipErrorInvalidValue, 1);
    vm.decommit(base, 2 * g);  // unmapped, but the physical allocation is not released
    CHECK(fake().device_bytes_in_use(0) == before + 2 * g);
  }
  SECTION("a driver that keeps refusing: the commit there is a backend_error") {
    REQUIRE(vm.commit(base, 2 * g));
    fake().fail_calls("hipMemUnmap", hipErrorInvalidValue, 2);
    vm.decommit(base, 2 * g);
    CHECK_THROWS_AS(vm.commit(base, 2 * g), backend_error);
  }
  vm.release(base, 4 * g);
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(fake().violations().empty());
}

TEST_CASE_METHOD(device_vm_case, "hipMemAddressFree refused at release: reported, and the process goes on", "[hip-7]") {
  void* base = vm.reserve(4 * g);
  REQUIRE(base != nullptr);
  REQUIRE(vm.commit(base, g));
  fake().fail_calls("hipMemAddressFree", hipErrorInvalidValue, 1);
  vm.release(base, 4 * g);  // the memory went back first; only address space is lost
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(fake().violations().empty());
}

TEST_CASE("a cache with segments when every reservation is refused: segments are hipMalloc allocations", "[hip-7]") {
  faults_cleared guard;
  const backend be = hip::device(0);
  const std::size_t before = fake().device_bytes_in_use(0);
  fake().fail_calls("hipMemAddressReserve", hipErrorOutOfMemory, 1000);
  fake().clear_calls();
  {
    alloc_cache cache{with_segments()};
    {
      const data_ref small = cache.allocate(be, 64 * 1024);
      const data_ref large = cache.allocate(be, 40 * MiB);
      CHECK(cache.stats().segments == 2);
    }
    CHECK(fake_hip::count_calls(fake().calls(), "hipMemCreate") == 0);
    CHECK(fake_hip::count_calls(fake().calls(), "hipMalloc") == 2);
    cache.reclaim();
  }
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(fake().violations().empty());
}

TEST_CASE("a cache with segments when a commit fails with an error: backend_error, and nothing is held", "[hip-7]") {
  faults_cleared guard;
  const backend be = hip::device(0);
  const std::size_t before = fake().device_bytes_in_use(0);
  {
    alloc_cache cache{with_segments()};
    for (const char* call : {"hipMemCreate", "hipMemMap", "hipMemSetAccess"}) {
      CAPTURE(call);
      fake().fail_calls(call, hipErrorInvalidValue, 1);
      CHECK_THROWS_AS(cache.allocate(be, 3 * MiB), backend_error);
      CHECK(fake().device_bytes_in_use(0) == before);
    }
    const data_ref works = cache.allocate(be, 3 * MiB);
    CHECK(works.bytes() == 3 * MiB);
  }
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(fake().violations().empty());
}

TEST_CASE_METHOD(device_vm_case,
                 "a decommit during a graph capture keeps the memory mapped until a wait for the device succeeds",
                 "[hip-7]") {
  // Unmapping waits for the device first; during a capture that wait fails (and breaks the
  // capture: the runtime does not say beforehand that a stream captures). Nothing is unmapped
  // under work that may still be in flight: the pieces stay, and the next decommit after the
  // capture gives them back.
  void* base = vm.reserve(4 * g);
  REQUIRE(base != nullptr);
  REQUIRE(vm.commit(base, g));
  REQUIRE(vm.commit(static_cast<char*>(base) + g, g));
  capturing_stream captured;
  fake().clear_calls();
  vm.decommit(base, g);
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemUnmap") == 0);
  CHECK(fake().device_bytes_in_use(0) == before + 2 * g);
  CHECK(captured.end() == hipErrorStreamCaptureInvalidated);
  fake().clear_violations();                     // the failed wait broke the capture: recorded by the fake
  vm.decommit(static_cast<char*>(base) + g, g);  // after the capture: both go
  CHECK(fake().device_bytes_in_use(0) == before);
  REQUIRE(vm.commit(base, 2 * g));  // the range is free to commit again
  vm.decommit(base, 2 * g);
  vm.release(base, 4 * g);
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(fake().violations().empty());
}

TEST_CASE_METHOD(device_vm_case,
                 "a reservation released during a graph capture goes with its last piece, after a wait succeeds",
                 "[hip-7]") {
  // The driver refuses to free a range that still has mappings (the H100 said
  // CUDA_ERROR_INVALID_VALUE in cuMemAddressFree when a trim during a capture released a segment
  // whose pieces the failed wait had kept): the release waits for the pieces.
  void* released = vm.reserve(2 * g);
  void* other = vm.reserve(g);
  REQUIRE(released != nullptr);
  REQUIRE(other != nullptr);
  REQUIRE(vm.commit(released, g));
  REQUIRE(vm.commit(other, g));
  capturing_stream captured;
  fake().clear_calls();
  vm.decommit(released, g);
  vm.release(released, 2 * g);
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemUnmap") == 0);
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemAddressFree") == 0);  // not refused: not asked
  CHECK(captured.end() == hipErrorStreamCaptureInvalidated);
  fake().clear_violations();  // the failed wait broke the capture: recorded by the fake
  fake().clear_calls();
  vm.decommit(other, g);  // a wait that succeeds: the kept piece goes, then its reservation
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemUnmap") == 2);
  CHECK(fake_hip::count_calls(fake().calls(), "hipMemAddressFree") == 1);
  CHECK(fake().device_bytes_in_use(0) == before);
  vm.release(other, g);
  CHECK(fake().violations().empty());
}
