// A GPU backend on a real device, built once per runtime (test 'cuda' and test 'hip'): loading,
// memory kinds, reshape reuse with no runtime allocation after the first iteration, reuse across
// streams, errors, a device budget, and out-of-memory by really exhausting the device. Skipped (77,
// by gpu_skip.cpp) where no device of the runtime is usable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <refpool/refpool.hpp>

#include "runtime_under_test.hpp"
#include "support/gpu_modules.hpp"

using namespace refpool;
namespace rt = refpool::test::rt;
using refpool::test::download;

namespace {

// The memory kinds this runtime serves here.
std::vector<memory_kind> gpu_kinds() {
  std::vector<memory_kind> kinds{memory_kind::device, memory_kind::pinned_host};
  if (refpool::test::async_supported()) kinds.push_back(memory_kind::device_async);
  return kinds;
}

std::string backend_name(const char* kind) { return std::string(refpool::test::backend_prefix) + ":0 " + kind; }

}  // namespace

TEST_CASE("the runtime loads and backends are process-wide per device and kind", "[gpu]") {
  CHECK(rt::device_count() >= 1);
  CHECK(refpool::test::version_supported());
  CHECK_FALSE(rt::device_name(0).empty());
  CHECK(rt::memory_info(0).second > 0);
  const backend a = rt::device(0);
  CHECK(a == rt::device(0));
  CHECK(a.device() == 0);
  CHECK(a.kind() == memory_kind::device);
  CHECK(a.name() == backend_name("device"));
  CHECK(rt::device(0, memory_kind::pinned_host) != a);
  if (refpool::test::async_supported())
    CHECK(rt::device(0, memory_kind::device_async).kind() == memory_kind::device_async);
  CHECK_THROWS_AS(rt::device(rt::device_count()), backend_unavailable);
  CHECK_THROWS_AS(rt::device(0, memory_kind::host), backend_unavailable);
}

TEST_CASE("every memory kind round-trips data", "[gpu]") {
  rt::stream s;
  for (memory_kind kind : gpu_kinds()) {
    CAPTURE(to_string(kind));
    const backend be = rt::device(0, kind);
    const std::size_t before = be.outstanding_bytes();
    {
      auto a = empty<std::uint32_t>(be, {1024}, s);
      CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 256 == 0);
      std::vector<std::uint32_t> in(1024);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint32_t>(i * 2654435761u);
      rt::copy(a.data(), in.data(), in.size() * 4, s);
      std::vector<std::uint32_t> out(1024);
      rt::copy(out.data(), a.data(), out.size() * 4, s);
      s.synchronize();
      CHECK(out == in);
      if (kind == memory_kind::pinned_host) CHECK(std::memcmp(a.data(), in.data(), 4096) == 0);
    }
    CHECK(be.outstanding_bytes() == before);  // uncached: freed on release
  }
}

TEST_CASE("a reshape-reuse loop makes no runtime allocation after iteration 1", "[gpu][cache]") {
  const backend be = rt::device(0);
  rt::stream s;
  alloc_cache cache{cache_options{}};
  std::uint64_t allocations_after_first = 0;
  for (int iteration = 0; iteration < 50; ++iteration) {
    scope sc(cache);
    auto a = empty<float>(be, {1024, 1024}, s);
    auto b = empty<float>(be, {1048576}, s);
    auto c = empty<float>(be, {512, 2048}, s);
    rt::fill(a.data(), 0, a.bytes(), s);
    a = {};
    auto d = empty<double>(be, {512, 1024}, s);  // a's 4 MiB, another element type
    rt::fill(d.data(), 1, d.bytes(), s);
    if (iteration == 0) allocations_after_first = be.allocation_count();
  }
  s.synchronize();
  CHECK(be.allocation_count() == allocations_after_first);
  const auto st = cache.stats();
  CHECK(st.misses == 3);
  CHECK(st.hits == 50 * 4 - 3);
  CHECK(st.cross_stream_reuses == 0);
  CHECK(cache.reclaim() == 3 * (4u << 20));
}

TEST_CASE("a buffer reused on another stream sees the old stream's writes", "[gpu][streams]") {
  constexpr std::size_t bytes = std::size_t{256} << 20;  // a fill long enough to still run at reuse
  for (memory_kind kind : gpu_kinds()) {
    if (kind == memory_kind::pinned_host) continue;
    CAPTURE(to_string(kind));
    const backend be = rt::device(0, kind);
    rt::stream a;
    rt::stream b;
    alloc_cache cache{cache_options{}};
    scope sc(cache);
    auto first = empty<std::uint8_t>(be, {bytes}, a);
    const void* address = first.data();
    rt::fill(first.data(), 1, bytes, a);
    first = {};                                                // released while a may still write
    auto reused = empty<std::uint8_t>(be, {bytes / 2, 2}, b);  // same block, other shape, stream b
    CHECK(reused.data() == address);
    CHECK(cache.stats().cross_stream_reuses == 1);
    const auto got = download(reused.data(), bytes, b);  // b waits for a's fill: all ones
    CHECK(std::all_of(got.begin(), got.end(), [](std::uint8_t v) { return v == 1; }));
    a.synchronize();
  }
}

TEST_CASE("runtime errors are backend_error with the runtime's error name and the call", "[gpu][errors]") {
  try {
    refpool::test::gpu_modules::module<rt::this_runtime> m(0, "this is not a code object");
    FAIL("no exception");
  } catch (const backend_error& e) {
    CHECK_THAT(e.what(), Catch::Contains(std::string(refpool::test::error_prefix)) &&
                             Catch::Contains(std::string(refpool::test::module_load_call)));
    CHECK(e.native_code() != 0);
  }
#ifndef REFPOOL_TEST_HIP  // HIP would read from an address it does not know as host memory
  const backend be = rt::device(0);
  auto a = empty<std::uint8_t>(be, {64});
  try {
    rt::copy(a.data(), reinterpret_cast<void*>(0x10), 1u << 30, {});  // not an address the driver knows
    rt::synchronize({});
    FAIL("no exception");
  } catch (const backend_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("CUDA error CUDA_ERROR_") && Catch::Contains("cuMemcpyAsync"));
  }
#endif
  CHECK_THROWS_AS(rt::stream(rt::device_count()), backend_unavailable);
}

namespace {

cache_options with_segments(segment_policy policy) {
  cache_options options;
  options.segments = policy;
  return options;
}

}  // namespace

TEST_CASE("a device budget makes the cache reclaim and retry, then report", "[gpu][oom]") {
  auto budget = std::make_shared<limiting_resource>(
      std::shared_ptr<resource>(&rt::device(0).underlying(), [](resource*) {}), 64u << 20);
  const backend be(budget);
  SECTION("one allocation per block: the idle 48 MiB block goes back, the 32 MiB request is retried") {
    alloc_cache cache{with_segments(segment_policy::off)};
    scope sc(cache);
    { auto idle = empty<std::uint8_t>(be, {48u << 20}); }
    auto fits_after_reclaim = empty<std::uint8_t>(be, {32u << 20});
    CHECK(cache.stats().oom_retries == 1);
    CHECK_THROWS_AS(empty<std::uint8_t>(be, {40u << 20}), out_of_memory);
    CHECK(budget->used() == 32u << 20);
  }
  SECTION("segments: the idle 48 MiB piece goes back to its segment and holds the 32 MiB request") {
    alloc_cache cache{with_segments(segment_policy::on)};
    {
      scope sc(cache);
      { auto idle = empty<std::uint8_t>(be, {48u << 20}); }
      auto carved = empty<std::uint8_t>(be, {32u << 20});
      CHECK(budget->used() == 48u << 20);  // no new memory: carved from the free range
      // 32 MiB out of 48 committed: 40 more would need 24 MiB beyond the 64 MiB budget.
      CHECK_THROWS_AS(empty<std::uint8_t>(be, {40u << 20}), out_of_memory);
      CHECK(cache.stats().ooms == 1);
      CHECK(budget->used() <= 64u << 20);
    }
    cache.reclaim();
    CHECK(budget->used() == 0);
  }
}

TEST_CASE("exhausting the real device: out_of_memory, then reclaim-and-retry succeeds", "[gpu][oom]") {
  const backend be = rt::device(0);
  const auto [free_before, total] = rt::memory_info(0);
  const std::size_t chunk = std::max(total / 16, std::size_t{1} << 20);  // 8.8 GiB on an H200
  const std::size_t slack = std::min(std::size_t{1} << 30, chunk);       // what others may hold meanwhile
  for (const segment_policy policy : {segment_policy::off, segment_policy::on}) {
    CAPTURE(policy == segment_policy::on ? "segments" : "one allocation per block");
    alloc_cache cache{with_segments(policy)};
    {
      scope sc(cache);
      std::vector<array<std::uint8_t>> hold;
      try {
        for (;;) hold.push_back(empty<std::uint8_t>(be, {chunk}));
      } catch (const out_of_memory& e) {
        CHECK(e.requested_bytes() == chunk);
        CHECK_THAT(e.what(), Catch::Contains(backend_name("device")) && Catch::Contains("live"));
      }
      INFO("held " << hold.size() << " blocks of " << (chunk >> 20) << " MiB of " << (total >> 20) << " MiB");
      REQUIRE(hold.size() >= 2);
      CHECK(cache.stats().oom_retries == 1);
    }  // all blocks go idle: the cache now holds nearly the whole device
    CHECK(rt::memory_info(0).first < chunk);
    {
      scope sc(cache);
      // No idle block of this size. Per block: the idle blocks are freed and the request retried.
      // With segments the idle pieces go back to their segment first, where they coalesce and
      // hold the request with no retry: every chunk, even an H200's 8.8 GiB, is carved from the
      // growable segment (segment_heap_options::own_segment_min is off by default).
      auto bigger = empty<std::uint8_t>(be, {chunk + chunk / 2});
      if (policy == segment_policy::off) {
        CHECK(cache.stats().oom_retries == 2);
        CHECK(cache.stats().reclaimed_blocks >= 2);
      } else {
        CHECK(cache.stats().oom_retries == 1);
      }
    }
    cache.reclaim();
    CHECK(cache.stats().held_bytes == 0);
    CHECK(cache.stats().reserved_bytes == 0);
    CHECK(rt::memory_info(0).first + slack > free_before);  // all given back
  }
}

namespace {

std::vector<std::uint8_t> pattern(std::size_t bytes, unsigned seed) {
  std::vector<std::uint8_t> out(bytes);
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::uint8_t>((i * 2654435761u + seed) >> 13);
  return out;
}

// Whether the first `bytes` of `got` and `want` are equal (a bool, so a failure prints no megabytes).
bool same_start(const std::vector<std::uint8_t>& got, const std::vector<std::uint8_t>& want, std::size_t bytes) {
  return got.size() >= bytes && want.size() >= bytes &&
         std::equal(got.begin(), got.begin() + std::ptrdiff_t(bytes), want.begin());
}

}  // namespace

TEST_CASE("virtual memory of device memory: reserve, commit, use, decommit, recommit, release", "[gpu][vmm]") {
  CHECK(rt::device(0, memory_kind::pinned_host).underlying().address_space() == nullptr);  // device memory only
  virtual_memory* vm = rt::device(0).underlying().address_space();
  if (vm == nullptr) {
    // CUDA 12 devices and the fake runtime have it; an AMD device may not (or HIP 5.2).
    REQUIRE(std::getenv("REFPOOL_TEST_EXPECT_VMM") == nullptr);
    WARN(refpool::test::runtime_name << " device 0 has no virtual memory management: skipped");
    return;
  }
  CHECK(vm == rt::device(0).underlying().address_space());  // one per resource
  const std::size_t g = vm->granularity();
  REQUIRE(g > 0);
  CHECK((g & (g - 1)) == 0);
  auto* base = static_cast<std::uint8_t*>(vm->reserve(8 * g));
  REQUIRE(base != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(base) % g == 0);
  REQUIRE(vm->commit(base, 2 * g));  // two physical allocations, contiguous in addresses
  REQUIRE(vm->commit(base + 2 * g, g));
  rt::stream s;
  const auto written = pattern(3 * g, 1);
  rt::copy(base, written.data(), written.size(), s);
  CHECK(same_start(download(base, 3 * g, s), written, 3 * g));  // one copy across both
  rt::fill(base + g, 7, 2 * g, s);                              // one fill across both
  const auto filled = download(base + g, 2 * g, s);
  CHECK(std::all_of(filled.begin(), filled.end(), [](std::uint8_t v) { return v == 7; }));

  // Misuse is refused, and changes nothing.
  CHECK_THROWS_AS(vm->commit(base + g, 2 * g), invalid_argument);          // already committed
  CHECK_THROWS_AS(vm->commit(base + 7 * g, 2 * g), invalid_argument);      // past the reservation
  CHECK_THROWS_AS(vm->commit(base + 4 * g, g / 2 + 1), invalid_argument);  // not a multiple of g
  vm->decommit(base + g, 2 * g);  // cuts the first commit: refused with a message
  CHECK(same_start(download(base, g, s), written, g));

  vm->decommit(base + 2 * g, g);  // the second commit: given back, the range stays reserved
  REQUIRE(vm->commit(base + 2 * g, g));
  const auto again = pattern(g, 2);
  rt::copy(base + 2 * g, again.data(), g, s);
  CHECK(same_start(download(base + 2 * g, g, s), again, g));
  CHECK(same_start(download(base, g, s), written, g));
  s.synchronize();
  vm->decommit(base, 3 * g);
  vm->release(base, 8 * g);
}

TEST_CASE("virtual memory: a commit larger than the device is answered false", "[gpu][vmm][oom]") {
  virtual_memory* vm = rt::device(0).underlying().address_space();
  if (vm == nullptr) return;  // said by the test above
  const std::size_t g = vm->granularity();
  const std::size_t bytes = (rt::memory_info(0).second / g + 1) * g;
  void* range = vm->reserve(bytes);
  REQUIRE(range != nullptr);
  CHECK_FALSE(vm->commit(range, bytes));
  REQUIRE(vm->commit(range, g));  // the device still serves what it has
  vm->decommit(range, g);
  vm->release(range, bytes);
}

// A block or a piece last used on one side of a graph capture's boundary is not handed to a stream
// on the other side while it runs (an event wait across it would join the other stream to the
// capture, or invalidate it: docs/design.md, "Stream safety"), and the capture holds. On a real
// device, and on the fake HIP runtime, which breaks captures as the runtimes do.
TEST_CASE("graph capture: the cache never orders streams across a capture, and the capture holds", "[gpu][capture]") {
  using capture = refpool::test::gpu_modules::capture<rt::this_runtime>;
  for (memory_kind kind : gpu_kinds()) {
    if (kind == memory_kind::pinned_host) continue;
    for (const bool segments : {false, true}) {
      CAPTURE(to_string(kind), segments);
      const backend be = rt::device(0, kind);
      rt::stream captured;
      rt::stream other;
      cache_options options;
      if (!segments) options.segments = segment_policy::off;
      alloc_cache cache{options};
      const void* idle = nullptr;
      {
        data_ref x = cache.allocate(be, std::size_t{8} << 20, captured);  // idle, last used on `captured`
        idle = x.data();
      }
      {
        capture graph(captured, 0);
        {  // another stream's request while the capture runs (another thread's, in PyTorch's test)
          data_ref a = cache.allocate(be, std::size_t{8} << 20, other);
          CHECK(a.data() != idle);
          data_ref b = cache.allocate(be, std::size_t{4} << 20, other);
        }
        CHECK(graph.end() == 0);
      }
      other.synchronize();
      cache.reclaim();
      CHECK(be.outstanding_bytes() == 0);
    }
  }
}

TEST_CASE("graph capture: a free ordered after a capturing stream waits for a reclaim after the capture",
          "[gpu][capture]") {
  using capture = refpool::test::gpu_modules::capture<rt::this_runtime>;
  const backend be = rt::device(0);
  rt::stream captured;
  rt::stream other;
  cache_options options;
  options.segments = segment_policy::off;
  alloc_cache cache{options};
  {
    data_ref y = cache.allocate(be, std::size_t{4} << 20, other);
    y.record_stream(captured);  // its free must follow `captured`'s work
  }
  {
    capture graph(captured, 0);
    cache.reclaim();  // kept: the order cannot be had during the capture, and a device-wide wait would break it
    CHECK(be.outstanding_bytes() == std::size_t{4} << 20);
    CHECK(graph.end() == 0);
  }
  cache.reclaim();
  CHECK(be.outstanding_bytes() == 0);
}
