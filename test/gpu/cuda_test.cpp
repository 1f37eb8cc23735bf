// The CUDA backend on a real GPU: loading, memory kinds, reshape reuse with no driver calls,
// errors, and out-of-memory by really exhausting the device.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include <refpool/refpool.hpp>

using namespace refpool;

TEST_CASE("the driver loads and backends are process-wide per device and kind", "[cuda]") {
  CHECK(cuda::device_count() >= 1);
  CHECK(cuda::driver_version() >= 12000);
  CHECK_FALSE(cuda::device_name(0).empty());
  const backend a = cuda::device(0);
  CHECK(a == cuda::device(0));
  CHECK(a.device() == 0);
  CHECK(a.kind() == memory_kind::device);
  CHECK(cuda::device(0, memory_kind::pinned_host) != a);
  CHECK(cuda::device(0, memory_kind::device_async).kind() == memory_kind::device_async);
  CHECK_THROWS_AS(cuda::device(cuda::device_count()), backend_unavailable);
  CHECK_THROWS_AS(cuda::device(0, memory_kind::host), backend_unavailable);
}

TEST_CASE("every memory kind round-trips data", "[cuda]") {
  cuda::stream s;
  for (memory_kind kind : {memory_kind::device, memory_kind::device_async, memory_kind::pinned_host}) {
    CAPTURE(to_string(kind));
    const backend be = cuda::device(0, kind);
    const std::size_t before = be.outstanding_bytes();
    {
      auto a = empty<std::uint32_t>(be, {1024}, s);
      CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 256 == 0);
      std::vector<std::uint32_t> in(1024);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<std::uint32_t>(i * 2654435761u);
      cuda::copy(a.data(), in.data(), in.size() * 4, s);
      std::vector<std::uint32_t> out(1024);
      cuda::copy(out.data(), a.data(), out.size() * 4, s);
      s.synchronize();
      CHECK(out == in);
      if (kind == memory_kind::pinned_host) CHECK(std::memcmp(a.data(), in.data(), 4096) == 0);
    }
    CHECK(be.outstanding_bytes() == before);  // uncached: freed on release
  }
}

TEST_CASE("a reshape-reuse loop on the GPU makes no driver allocation after iteration 1", "[cuda][cache]") {
  const backend be = cuda::device(0);
  cuda::stream s;
  alloc_cache cache{cache_options{}};
  std::uint64_t allocations_after_first = 0;
  for (int iteration = 0; iteration < 50; ++iteration) {
    scope sc(cache);
    auto a = empty<float>(be, {1024, 1024}, s);
    auto b = empty<float>(be, {1048576}, s);
    auto c = empty<float>(be, {512, 2048}, s);
    cuda::fill(a.data(), 0, a.bytes(), s);
    a = {};
    auto d = empty<double>(be, {512, 1024}, s);  // a's 4 MiB, another element type
    cuda::fill(d.data(), 1, d.bytes(), s);
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

TEST_CASE("driver errors are backend_error with the CUDA name and the call", "[cuda][errors]") {
  const backend be = cuda::device(0);
  auto a = empty<std::uint8_t>(be, {64});
  try {
    cuda::copy(a.data(), reinterpret_cast<void*>(0x10), 1u << 30, {});  // not an address the driver knows
    cuda::synchronize({});
    FAIL("no exception");
  } catch (const backend_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("CUDA error CUDA_ERROR_") && Catch::Contains("cuMemcpyAsync"));
    CHECK(e.native_code() != 0);
  }
  CHECK_THROWS_AS(cuda::module(0, "this is not PTX"), backend_error);
}

TEST_CASE("a device budget makes the cache reclaim and retry, then report", "[cuda][oom]") {
  auto budget = std::make_shared<limiting_resource>(
      std::shared_ptr<resource>(&cuda::device(0).underlying(), [](resource*) {}), 64u << 20);
  const backend be(budget);
  alloc_cache cache{cache_options{}};
  scope sc(cache);
  { auto idle = empty<std::uint8_t>(be, {48u << 20}); }
  auto fits_after_reclaim = empty<std::uint8_t>(be, {32u << 20});
  CHECK(cache.stats().oom_retries == 1);
  CHECK_THROWS_AS(empty<std::uint8_t>(be, {40u << 20}), out_of_memory);
  CHECK(budget->used() == 32u << 20);
}

TEST_CASE("exhausting the real device: out_of_memory, then reclaim-and-retry succeeds", "[cuda][oom]") {
  const backend be = cuda::device(0);
  const auto [free_before, total] = cuda::memory_info(0);
  const std::size_t chunk = std::size_t{8} << 30;  // 8 GiB blocks until the device is full
  alloc_cache cache{cache_options{}};
  {
    scope sc(cache);
    std::vector<array<std::uint8_t>> hold;
    try {
      for (;;) hold.push_back(empty<std::uint8_t>(be, {chunk}));
    } catch (const out_of_memory& e) {
      CHECK(e.requested_bytes() == chunk);
      CHECK_THAT(e.what(), Catch::Contains("cuda:0 device") && Catch::Contains("live"));
    }
    INFO("held " << hold.size() << " blocks of 8 GiB of " << (total >> 30) << " GiB");
    REQUIRE(hold.size() >= 2);
    CHECK(cache.stats().oom_retries == 1);
  }  // all blocks go idle: the cache now holds nearly the whole device
  CHECK(cuda::memory_info(0).first < chunk);
  {
    scope sc(cache);
    auto bigger = empty<std::uint8_t>(be, {chunk + chunk / 2});  // no idle block of this size
    CHECK(cache.stats().oom_retries == 2);
    CHECK(cache.stats().reclaimed_blocks >= 2);
  }
  cache.reclaim();
  CHECK(cache.stats().held_bytes == 0);
  CHECK(cuda::memory_info(0).first + (std::size_t{1} << 30) > free_before);  // all given back
}
