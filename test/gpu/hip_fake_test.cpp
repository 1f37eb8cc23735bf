// refpool's HIP backend against the fake HIP runtime (test/gpu/fake_amdhip64.cpp), which stands
// in for libamdhip64 in CI and records every call, the device current at each, and what the real
// runtime would crash or abort on. Meson runs this program once per runtime it pretends to be
// (the tags): "[hip-7]" as HIP 7 (sticky last error), "[hip-5.2]" as Debian 12's HIP 5.2; both with
// two devices.
#define __HIP_DISABLE_CPP_FUNCTIONS__
#include <hip/hip_runtime_api.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <refpool/refpool.hpp>

#include "fake_hip/app.hpp"
#include "fake_hip/app_stream.hpp"
#include "fake_hip/code_object.hpp"
#include "runtime_under_test.hpp"
#include "support/gpu_modules.hpp"

using namespace refpool;
using fake_hip::count_calls;
using fake_hip::fake;
using fake_hip::symbol;
using refpool::test::download;

namespace {

bool all_equal(const std::vector<std::uint8_t>& bytes, std::uint8_t value) {
  return std::all_of(bytes.begin(), bytes.end(), [&](std::uint8_t v) { return v == value; });
}

// The application's own HIP calls, straight into the loaded runtime.
#define APP_HIP(name) symbol<decltype(::name)>(#name)

// A code object for the fake's device (gfx90a) with the fake's host kernel fill_u8.
const std::string fill_module =
    fake_hip::make_bundle({{"hipv4-amdgcn-amd-amdhsa--gfx90a", fake_hip::kernels({"fill_u8"})}});

// These tests count runtime calls per block: one hipMalloc per miss, as with segments off (with
// segments, misses carve pieces out of hipMemCreate commits; see "virtual memory" below).
cache_options one_allocation_per_block() {
  cache_options options;
  options.segments = segment_policy::off;
  return options;
}

}  // namespace

TEST_CASE("the cache runs on the fake runtime: allocation, streams, events, copies, reclaim", "[hip-7][hip-5.2]") {
  REQUIRE(hip::available());
  fake().clear_calls();
  const backend be = hip::device(0);
  hip::stream a;
  hip::stream b;
  alloc_cache cache{one_allocation_per_block()};
  {
    scope sc(cache);
    auto first = empty<std::uint8_t>(be, {1 << 20}, a);
    const void* address = first.data();
    hip::fill(first.data(), 7, first.bytes(), a);
    first = {};
    auto reused = empty<std::uint8_t>(be, {1 << 19, 2}, b);  // the same block, on stream b
    CHECK(reused.data() == address);
    CHECK(all_equal(download(reused.data(), reused.bytes(), b), 7));
  }
  const auto calls = fake().calls();
  CHECK(count_calls(calls, "hipMalloc") == 1);
  CHECK(count_calls(calls, "hipEventRecord") == 1);  // b waits for a
  CHECK(count_calls(calls, "hipStreamWaitEvent") == 1);
  CHECK(cache.stats().cross_stream_reuses == 1);
  CHECK(fake().device_bytes_in_use(0) == std::size_t{1} << 20);
  cache.reclaim();
  CHECK(fake().device_bytes_in_use(0) == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("out of memory on the fake runtime: the cache reclaims and retries", "[hip-7][hip-5.2]") {
  const backend be = hip::device(0);
  const std::size_t total = hip::memory_info(0).second;
  alloc_cache cache{one_allocation_per_block()};
  scope sc(cache);
  { auto idle = empty<std::uint8_t>(be, {total / 2 + total / 4}); }
  auto fits_after_reclaim = empty<std::uint8_t>(be, {total / 2});  // the idle block must go first
  CHECK(cache.stats().oom_retries == 1);
  CHECK_THROWS_AS(empty<std::uint8_t>(be, {total / 2 + total / 4}), out_of_memory);
  CHECK(fake().violations().empty());
}

TEST_CASE("HIP 5.2: stream-ordered memory is refused, saying why", "[hip-5.2]") {
  REQUIRE(hip::runtime_version() < 50'300'000);
  try {
    const backend be = hip::device(0, memory_kind::device_async);
    auto block = allocate(be, 4096);  // on the default stream, where HIP 5.2's hipMallocAsync crashes
    FAIL("device_async was offered on HIP " << hip::runtime_version());
  } catch (const backend_unavailable& e) {
    CHECK_THAT(e.what(), Catch::Contains("device_async") && Catch::Contains("HIP 5.3.0 or newer") &&
                             Catch::Contains("HIP 5.2.21153") && Catch::Contains("memory_kind::device"));
  }
  CHECK_NOTHROW(allocate(hip::device(0, memory_kind::device), 4096));
  CHECK(fake().violations().empty());
}

TEST_CASE("HIP 5.3 and newer: stream-ordered memory on the default stream", "[hip-7]") {
  const backend be = hip::device(0, memory_kind::device_async);
  { auto block = allocate(be, 4096); }
  CHECK(be.allocation_count() == 1);
  CHECK(be.outstanding_bytes() == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("module calls run with the module's device current, whatever device the thread has", "[hip-7][hip-5.2]") {
  const auto buffer = allocate(hip::device(0), 4096);
  REQUIRE(APP_HIP(hipSetDevice)(1) == hipSuccess);  // the application works on device 1
  fake().clear_calls();
  {
    const refpool::test::gpu_modules::hip_module m(0, fill_module);
    const refpool::test::gpu_modules::hip_kernel k = m.function("fill_u8");
    refpool::test::gpu_modules::launch_with(k, {1}, {64}, {}, buffer.data(), std::uint32_t{4096}, std::uint32_t{9});
  }
  std::size_t module_calls = 0;
  for (const auto& c : fake().calls())
    if (c.name.rfind("hipModule", 0) == 0) {
      ++module_calls;
      INFO(c.name << " made with device " << c.device << " current");
      CHECK(c.device == 0);
    }
  CHECK(module_calls == 4);  // load, get function, launch, unload
  int current = -1;
  CHECK(APP_HIP(hipGetDevice)(&current) == hipSuccess);
  CHECK(current == 1);  // as the application left it
  REQUIRE(APP_HIP(hipSetDevice)(0) == hipSuccess);
  CHECK(all_equal(download(buffer.data(), 4096, {}), 9));
  CHECK(fake().violations().empty());
}

TEST_CASE("HIP 5.2 and 5.3: a code object without code for the device is refused before loading", "[hip-5.2]") {
  REQUIRE(hip::runtime_version() < 50'400'000);
  fake().clear_violations();
  using fake_hip::make_bundle;
  using fake_hip::make_elf;
  const std::string kernel = fake_hip::kernels({"fill_u8"});
  const auto refused = [](const std::string& image, const char* why) {
    try {
      refpool::test::gpu_modules::hip_module m(0, image);
      FAIL("loaded a code object that HIP " << hip::runtime_version() << " aborts on");
    } catch (const backend_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("device 0 (gfx90a:sramecc+:xnack-)") && Catch::Contains(why));
    }
  };
  SECTION("another processor") {
    refused(make_bundle({{"hipv4-amdgcn-amd-amdhsa--gfx1030", kernel}}), "it has code for gfx1030");
    refused(make_elf(fake_hip::elf_mach_gfx1030, kernel), "it has code for gfx1030");
  }
  SECTION("the processor, with another feature setting") {
    refused(make_bundle({{"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+", kernel}}), "it has code for gfx90a:xnack+");
    refused(make_elf(fake_hip::elf_mach_gfx90a | 0x300, kernel), "it has code for gfx90a:xnack+");
  }
  SECTION("neither a bundle nor an AMDGPU ELF") { refused("this is not a code object", "neither"); }
  SECTION("code for the device loads") {
    const std::string images[] = {
        make_bundle({{"hip-amdgcn-amd-amdhsa-gfx906", kernel}, {"hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-", kernel}}),
        make_elf(fake_hip::elf_mach_gfx90a | fake_hip::elf_xnack_off_v4 | fake_hip::elf_sramecc_on_v4, kernel),
        make_elf(fake_hip::elf_mach_gfx90a, kernel, 1),  // code object v3: no feature settings
    };
    for (const auto& image : images)
      CHECK(refpool::test::gpu_modules::hip_module(0, image).function("fill_u8").function != nullptr);
  }
  CHECK(fake().violations().empty());
}

TEST_CASE("HIP 5.4 and newer: the runtime itself says a code object has no code for the device", "[hip-7]") {
  try {
    refpool::test::gpu_modules::hip_module m(
        0, fake_hip::make_bundle({{"hipv4-amdgcn-amd-amdhsa--gfx1030", fake_hip::kernels({"fill_u8"})}}));
    FAIL("no error");
  } catch (const backend_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("hipErrorNoBinaryForGpu") && Catch::Contains("hipModuleLoadData"));
  }
  CHECK(fake().violations().empty());
}

TEST_CASE("HIP 7: after an error refpool handles, the application's next check sees none", "[hip-7]") {
  const auto get_last_error = APP_HIP(hipGetLastError);
  // Control: the fake keeps an error until it is read, even across later successful calls, as HIP 7.
  REQUIRE(APP_HIP(hipSetDevice)(99) == hipErrorInvalidDevice);
  REQUIRE(APP_HIP(hipSetDevice)(0) == hipSuccess);
  REQUIRE(get_last_error() == hipErrorInvalidDevice);
  REQUIRE(get_last_error() == hipSuccess);
  const backend be = hip::device(0);
  const std::size_t total = hip::memory_info(0).second;
  alloc_cache cache{one_allocation_per_block()};
  SECTION("an out-of-memory the cache recovers from") {
    scope sc(cache);
    { auto idle = empty<std::uint8_t>(be, {total / 2 + total / 4}); }
    auto fits_after_reclaim = empty<std::uint8_t>(be, {total / 2});
    REQUIRE(cache.stats().oom_retries == 1);
    CHECK(get_last_error() == hipSuccess);
  }
  SECTION("an out-of-memory reported as out_of_memory") {
    CHECK_THROWS_AS(allocate(be, total + 1), out_of_memory);
    CHECK(get_last_error() == hipSuccess);
  }
  SECTION("an error reported as backend_error") {
    CHECK_THROWS_AS(refpool::test::gpu_modules::hip_module(0, "this is not a code object"), backend_error);
    CHECK(get_last_error() == hipSuccess);
  }
}

namespace {

// Blocks of 4 and 8 KiB left idle in `cache`, last used on a stream the application made; then the
// application retires (or not) and destroys that stream, and the cache reuses the 4 KiB block on
// another stream and frees the 8 KiB one.
void reuse_after_the_stream_is_destroyed(memory_kind kind, bool retire) {
  const backend be = hip::device(0, kind);
  alloc_cache cache{cache_options{}};
  hipStream_t user = nullptr;
  REQUIRE(APP_HIP(hipStreamCreateWithFlags)(&user, 0) == hipSuccess);
  {
    scope sc(cache);
    auto a = empty<std::uint8_t>(be, {4096}, {user});
    auto b = empty<std::uint8_t>(be, {8192}, {user});
  }
  if (retire) hip::retire_stream({user});
  REQUIRE(APP_HIP(hipStreamDestroy)(user) == hipSuccess);
  hip::stream other;
  {
    scope sc(cache);
    auto reused = empty<std::uint8_t>(be, {4096}, other);
    CHECK(cache.stats().cross_stream_reuses == 1);
  }
  cache.reclaim();
  CHECK(be.outstanding_bytes() == 0);
}

}  // namespace

TEST_CASE("a stream destroyed without hip::retire_stream is still used by the cache (control)", "[hip-7]") {
  fake().clear_violations();
  CHECK_THROWS_AS(reuse_after_the_stream_is_destroyed(memory_kind::device, false), backend_error);
  REQUIRE(fake().violations().size() == 1);
  // The first call on it is the capture query before the event is recorded on it.
  CHECK_THAT(fake().violations()[0], Catch::Contains("hipStreamGetCaptureInfo on a destroyed stream"));
  fake().clear_violations();
}

TEST_CASE("hip::retire_stream: the cache never uses a retired stream again", "[hip-7]") {
  fake().clear_violations();
  for (memory_kind kind : {memory_kind::device, memory_kind::device_async}) {
    CAPTURE(to_string(kind));
    reuse_after_the_stream_is_destroyed(kind, true);
  }
  CHECK(fake().violations().empty());
}

TEST_CASE("record_stream: stream-ordered memory is freed after the recorded stream, also once its own is retired",
          "[hip-7]") {
  // A whole block (device_async memory has no virtual memory) freed by reclaim goes back with
  // hipFreeAsync on its last stream, which waits for that stream only: the recorded stream's work
  // is ordered before it. Its last stream retired meanwhile, the free and the wait go to the
  // default stream, never to the destroyed one.
  const backend be = hip::device(0, memory_kind::device_async);
  alloc_cache cache{cache_options{}};
  hip::stream side;
  for (const bool retired : {false, true}) {
    CAPTURE(retired);
    hipStream_t user = nullptr;
    REQUIRE(APP_HIP(hipStreamCreateWithFlags)(&user, 0) == hipSuccess);
    {
      data_ref x = cache.allocate(be, 4096, {user});
      x.record_stream(side);
    }
    if (retired) {
      hip::retire_stream({user});
      REQUIRE(APP_HIP(hipStreamDestroy)(user) == hipSuccess);
    }
    fake().clear_calls();
    fake().clear_violations();
    cache.reclaim();
    CHECK(fake().violations().empty());
    const auto calls = fake().calls();
    const hipStream_t freed_on = retired ? nullptr : user;
    const auto at = [&](std::string_view name, const void* object) {
      return std::find_if(calls.begin(), calls.end(),
                          [&](const auto& c) { return c.name == name && c.object == object; });
    };
    const auto recorded = at("hipEventRecord", side.ref().handle);
    const auto waited = at("hipStreamWaitEvent", freed_on);
    const auto freed = std::find_if(calls.begin(), calls.end(), [](const auto& c) { return c.name == "hipFreeAsync"; });
    REQUIRE(freed != calls.end());
    CHECK(recorded < waited);
    CHECK(waited < freed);
    CHECK(be.outstanding_bytes() == 0);
    if (!retired) REQUIRE(APP_HIP(hipStreamDestroy)(user) == hipSuccess);
  }
}

TEST_CASE("virtual memory on HIP 5.3 and newer: one hipMemCreate per commit, released on decommit", "[hip-7]") {
  fake().clear_violations();
  virtual_memory* vm = hip::device(0).underlying().address_space();
  REQUIRE(vm != nullptr);
  const std::size_t g = vm->granularity();
  const std::size_t before = fake().device_bytes_in_use(0);
  void* base = vm->reserve(4 * g);
  REQUIRE(base != nullptr);
  fake().clear_calls();
  REQUIRE(vm->commit(base, 2 * g));
  REQUIRE(vm->commit(static_cast<char*>(base) + 2 * g, g));
  CHECK(count_calls(fake().calls(), "hipMemCreate") == 2);
  CHECK(count_calls(fake().calls(), "hipMemMap") == 2);
  CHECK(fake().device_bytes_in_use(0) == before + 3 * g);
  vm->decommit(static_cast<char*>(base) + 2 * g, g);
  CHECK(fake().device_bytes_in_use(0) == before + 2 * g);
  CHECK(count_calls(fake().calls(), "hipMemUnmap") == 1);
  {  // unmapping does not wait for work in flight: the device is synchronised first
    const auto calls = fake().calls();
    const auto unmap = std::find_if(calls.begin(), calls.end(), [](const auto& c) { return c.name == "hipMemUnmap"; });
    CHECK(std::any_of(calls.begin(), unmap, [](const auto& c) { return c.name == "hipDeviceSynchronize"; }));
  }
  CHECK(count_calls(fake().calls(), "hipMemRelease") == 1);
  vm->release(base, 4 * g);  // with [0, 2g) still committed: decommitted first
  CHECK(fake().device_bytes_in_use(0) == before);
  CHECK(count_calls(fake().calls(), "hipMemAddressFree") == 1);
  for (const auto& c : fake().calls()) CHECK(c.result == hipSuccess);
  CHECK(fake().violations().empty());
}

// Large pieces, each last used on a stream of its own, given back and coalesced into one free range
// that a request on another stream carves whole. Returns the runtime calls the carving made.
static std::vector<fake_hip::call> carve_after_streams(int stream_count) {
  const backend be = hip::device(0);
  cache_options options;
  options.segments = segment_policy::on;
  alloc_cache cache{options};
  std::vector<std::unique_ptr<hip::stream>> streams;
  constexpr std::size_t piece = std::size_t{2} << 20;  // the large pool
  {
    scope sc(cache);
    std::vector<array<std::uint8_t>> pieces;
    for (int i = 0; i < stream_count; ++i) {
      streams.push_back(std::make_unique<hip::stream>());
      pieces.push_back(empty<std::uint8_t>(be, {piece}, *streams.back()));
    }
  }
  hip::stream consumer;
  fake().clear_calls();
  {
    scope sc(cache);
    auto whole = empty<std::uint8_t>(be, {piece * stream_count}, consumer);  // every piece's bytes
  }
  auto calls = fake().calls();
  cache.reclaim();
  return calls;
}

TEST_CASE("segments: bytes last used on more than eight streams wait for the whole device", "[hip-7]") {
  fake().clear_violations();
  SECTION("eight streams: eight waits on events") {
    const auto calls = carve_after_streams(8);
    CHECK(count_calls(calls, "hipStreamWaitEvent") == 8);
    CHECK(count_calls(calls, "hipDeviceSynchronize") == 0);
  }
  SECTION("nine streams: their names are no longer kept, the device is synchronised") {
    const auto calls = carve_after_streams(9);
    CHECK(count_calls(calls, "hipDeviceSynchronize") == 1);
  }
  CHECK(fake().violations().empty());
}

TEST_CASE("virtual memory on HIP 7: out of memory in a commit is false, and the application sees no error", "[hip-7]") {
  virtual_memory* vm = hip::device(0).underlying().address_space();
  REQUIRE(vm != nullptr);
  const std::size_t g = vm->granularity();
  const std::size_t bytes = (hip::memory_info(0).second / g + 1) * g;
  void* range = vm->reserve(bytes);
  REQUIRE(range != nullptr);
  CHECK_FALSE(vm->commit(range, bytes));
  CHECK(APP_HIP(hipGetLastError)() == hipSuccess);
  vm->release(range, bytes);
}

TEST_CASE("HIP 5.2: no virtual memory (no attribute says whether a device has it, and another layout)", "[hip-5.2]") {
  CHECK(hip::device(0).underlying().address_space() == nullptr);
  CHECK(fake().violations().empty());
}

// ---- graph capture: refpool never orders streams across a capture's boundary ---------------------
// The fake enforces the runtimes' rules (fake_amdhip64.cpp): a stream outside a capture that
// waits for an event recorded in it joins the capture, which then cannot end (unjoined); a
// capturing stream waiting for an event from outside invalidates it. A cache that reused memory
// across such streams broke the application's graph (PyTorch's test_cuda_graph_error_options).

using fake_hip::app_stream;

TEST_CASE("graph capture: the fake runtime breaks a capture that an event wait crosses (control)", "[hip-7]") {
  app_stream captured;
  app_stream other;
  hipEvent_t event = nullptr;
  REQUIRE(APP_HIP(hipEventCreateWithFlags)(&event, hipEventDisableTiming) == hipSuccess);
  fake().clear_violations();
  captured.begin_capture();  // an event of the capture, waited for outside it: `other` joins, never rejoins
  REQUIRE(APP_HIP(hipEventRecord)(event, captured.handle) == hipSuccess);
  REQUIRE(APP_HIP(hipStreamWaitEvent)(other.handle, event, 0) == hipSuccess);
  CHECK(captured.end_capture() == hipErrorStreamCaptureUnjoined);
  captured.begin_capture();  // an event from outside, waited for in the capture: invalidated
  REQUIRE(APP_HIP(hipEventRecord)(event, other.handle) == hipSuccess);
  CHECK(APP_HIP(hipStreamWaitEvent)(captured.handle, event, 0) == hipErrorStreamCaptureIsolation);
  CHECK(captured.end_capture() == hipErrorStreamCaptureInvalidated);
  captured.begin_capture();  // a device-wide wait during a capture: invalidated
  CHECK(APP_HIP(hipDeviceSynchronize)() == hipErrorStreamCaptureUnsupported);
  CHECK(captured.end_capture() == hipErrorStreamCaptureInvalidated);
  CHECK(fake().violations().size() == 2);
  fake().clear_violations();
  (void)APP_HIP(hipGetLastError)();
  REQUIRE(APP_HIP(hipEventDestroy)(event) == hipSuccess);
}

TEST_CASE("graph capture: an idle block is not handed across the boundary of a capture", "[hip-7][hip-5.2]") {
  const backend be = hip::device(0);
  alloc_cache cache{one_allocation_per_block()};
  app_stream captured;
  app_stream other;
  fake().clear_violations();
  const bool consumer_captures = GENERATE(false, true);
  CAPTURE(consumer_captures);
  // The block is last used on the producer; the consumer asks for its size while the capture runs
  // (in PyTorch's test, another thread allocates on a fresh stream during a relaxed capture).
  const app_stream& producer = consumer_captures ? other : captured;
  const app_stream& consumer = consumer_captures ? captured : other;
  const void* idle = nullptr;
  {
    data_ref x = cache.allocate(be, 4096, producer.ref());
    idle = x.data();
  }
  captured.begin_capture();
  const void* during = nullptr;
  {
    data_ref y = cache.allocate(be, 4096, consumer.ref());
    during = y.data();
  }
  CHECK(during != idle);  // a miss: memory of its own
  CHECK(captured.end_capture() == hipSuccess);
  CHECK(fake().violations().empty());
  // After the capture, cross-stream reuse is back: two blocks on the consumer take both.
  {
    data_ref a = cache.allocate(be, 4096, consumer.ref());
    data_ref b = cache.allocate(be, 4096, consumer.ref());
    CHECK(((a.data() == idle && b.data() == during) || (a.data() == during && b.data() == idle)));
  }
  CHECK(cache.stats().cross_stream_reuses >= 1);
  cache.reclaim();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("graph capture: a miss during a capture in global mode allocates in relaxed mode", "[hip-7][hip-5.2]") {
  // A capture in global mode (CUDA's and PyTorch's default) forbids allocating, mapping and freeing
  // on every thread not in relaxed mode; refpool's driver calls that do so switch the thread to
  // relaxed mode for the call (PyTorch's test_graph_capture_reset_recapture failed with 900).
  const bool segments = GENERATE(false, true);
  CAPTURE(segments);
  const backend be = hip::device(0);
  alloc_cache cache{segments ? cache_options{} : one_allocation_per_block()};
  app_stream captured;
  app_stream other;
  fake().clear_violations();
  captured.begin_capture(hipStreamCaptureModeGlobal);
  fake().clear_calls();
  {  // misses: the backend allocates (with segments, a reservation mapped where HIP has virtual memory)
    data_ref small = cache.allocate(be, 8000, other.ref());
    data_ref large = cache.allocate(be, std::size_t{4} << 20, other.ref());
    CHECK((small.data() != nullptr && large.data() != nullptr));
  }
  CHECK(count_calls(fake().calls(), "hipMalloc") + count_calls(fake().calls(), "hipMemMap") >= 2);
  if (!segments) cache.reclaim();  // hipFree during the capture (segments' give_back waits: not during it)
  CHECK(captured.end_capture() == hipSuccess);
  CHECK(fake().violations().empty());
  hipStreamCaptureMode mode = hipStreamCaptureModeRelaxed;  // the thread's mode was restored
  REQUIRE(APP_HIP(hipThreadExchangeStreamCaptureMode)(&mode) == hipSuccess);
  CHECK(mode == hipStreamCaptureModeGlobal);
  REQUIRE(APP_HIP(hipThreadExchangeStreamCaptureMode)(&mode) == hipSuccess);
  cache.reclaim();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("graph capture: a piece is not carved from bytes last used across a capture's boundary", "[hip-7]") {
  // Segments (virtual memory on the fake HIP 7): a large idle piece goes back to its heap before a
  // miss of another size carves from the free range it left, whose last stream is the capture's.
  const backend be = hip::device(0);
  alloc_cache cache{cache_options{}};
  app_stream captured;
  app_stream other;
  fake().clear_violations();
  { data_ref x = cache.allocate(be, std::size_t{8} << 20, captured.ref()); }
  captured.begin_capture();
  fake().clear_calls();
  {
    data_ref y = cache.allocate(be, std::size_t{4} << 20, other.ref());
    CHECK(y.data() != nullptr);
  }
  CHECK(captured.end_capture() == hipSuccess);
  CHECK(count_calls(fake().calls(), "hipStreamWaitEvent") == 0);
  CHECK(fake().violations().empty());
  cache.reclaim();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(fake().violations().empty());
}

TEST_CASE("graph capture: a free that needs a capturing stream's order waits for a reclaim after it", "[hip-7]") {
  // record_stream on a stream that then captures: the block's free must be ordered after it, which
  // cannot be done during the capture (and a device-wide wait would break it): kept, not lost.
  for (const memory_kind kind : {memory_kind::device, memory_kind::device_async}) {
    CAPTURE(to_string(kind));
    const backend be = hip::device(0, kind);
    alloc_cache cache{one_allocation_per_block()};
    app_stream captured;
    app_stream other;
    fake().clear_violations();
    {
      data_ref x = cache.allocate(be, 4096, other.ref());
      x.record_stream(captured.ref());
    }
    captured.begin_capture();
    cache.reclaim();
    CHECK(be.outstanding_bytes() == 4096);  // kept
    CHECK(captured.end_capture() == hipSuccess);
    CHECK(fake().violations().empty());
    cache.reclaim();  // after the capture: freed
    CHECK(be.outstanding_bytes() == 0);
    CHECK(fake().violations().empty());
  }
}

TEST_CASE("graph capture: a stream-ordered free on a capturing stream waits until the capture ends", "[hip-7]") {
  const backend be = hip::device(0, memory_kind::device_async);
  alloc_cache cache{one_allocation_per_block()};
  app_stream captured;
  fake().clear_violations();
  { data_ref x = cache.allocate(be, 4096, captured.ref()); }
  captured.begin_capture();
  fake().clear_calls();
  cache.reclaim();  // hipFreeAsync on the capturing stream would put the free into the graph
  CHECK(count_calls(fake().calls(), "hipFreeAsync") == 0);
  CHECK(captured.end_capture() == hipSuccess);
  { data_ref y = cache.allocate(be, std::size_t{1} << 20, captured.ref()); }  // a miss: the kept free goes first
  CHECK(count_calls(fake().calls(), "hipFreeAsync") == 1);
  cache.reclaim();
  CHECK(fake().device_bytes_in_use(0) == 0);
  CHECK(fake().violations().empty());
}
