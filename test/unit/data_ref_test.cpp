// data_ref: reference counting, moves, unsafe_free and use-after-free detection.
#include <catch2/catch.hpp>

#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::host_fixture;
using refpool::test::what;

TEST_CASE("a direct allocation is freed to the backend by its last reference", "[data_ref]") {
  const backend be = make_host_backend();
  {
    data_ref a = allocate(be, 100);
    CHECK(a.use_count() == 1);
    CHECK(a.bytes() == 100);
    CHECK(a.data() != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % host_alignment == 0);
    CHECK(be.outstanding_bytes() == 100);
    data_ref b = a;
    CHECK(a.use_count() == 2);
    CHECK(b.data() == a.data());
    a.reset();
    CHECK(b.use_count() == 1);
    CHECK(be.outstanding_bytes() == 100);
  }
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == 1);
  CHECK(be.deallocation_count() == 1);
}

TEST_CASE("moves leave the source null and keep the count", "[data_ref]") {
  const backend be = make_host_backend();
  data_ref a = allocate(be, 64);
  void* p = a.data();
  data_ref b = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): the rule under test
  CHECK(a.data() == nullptr);
  CHECK(b.use_count() == 1);
  CHECK(b.data() == p);
  data_ref c;
  c = std::move(b);
  CHECK(c.use_count() == 1);
  CHECK_FALSE(b);
  c = c;  // self-assignment keeps the buffer
  CHECK(c.use_count() == 1);
}

TEST_CASE("unsafe_free releases the reference at once and is idempotent", "[data_ref][unsafe_free]") {
  const backend be = make_host_backend();
  data_ref a = allocate(be, 32);
  data_ref keep = a;
  a.unsafe_free();
  CHECK(a.is_freed());
  CHECK(a.use_count() == 0);
  CHECK(keep.use_count() == 1);  // the other handle still owns the buffer
  a.unsafe_free();               // twice: no double free
  CHECK(keep.use_count() == 1);
  CHECK(be.outstanding_bytes() == 32);
  keep.unsafe_free();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.deallocation_count() == 1);
}

TEST_CASE("access after unsafe_free throws use_after_free naming the buffer", "[data_ref][unsafe_free]") {
  const backend be = make_host_backend();
  data_ref a = allocate(be, 48);
  const std::string address = fmt::format("{}", a.data());
  a.unsafe_free();
  REQUIRE_THROWS_AS(a.data(), use_after_free);
  REQUIRE_THROWS_AS(a.bytes(), use_after_free);
  REQUIRE_THROWS_AS(data_ref(a), use_after_free);
  REQUIRE_THROWS_AS(a.record_stream({}), use_after_free);
  data_ref target = allocate(be, 8);
  REQUIRE_THROWS_AS(target = a, use_after_free);
  CHECK(target.bytes() == 8);  // a failed assignment leaves the target unchanged
  CHECK_THROWS_MATCHES(a.data(), use_after_free, what(Contains(address) && Contains("48 B") && Contains("data()")));
  // A moved freed handle stays freed; reset makes it a plain null handle again.
  data_ref moved = std::move(a);
  CHECK(moved.is_freed());
  moved.reset();
  CHECK_FALSE(moved.is_freed());
  CHECK(moved.data() == nullptr);
}

TEST_CASE("handles report their source and stream", "[data_ref]") {
  const backend be = make_host_backend();
  data_ref a = allocate(be, 16, stream_ref{reinterpret_cast<void*>(0x10)});
  CHECK(a.source() == be);
  CHECK(a.stream().handle == reinterpret_cast<void*>(0x10));
  CHECK(a.capacity() == 16);
  CHECK(data_ref{}.use_count() == 0);
}

TEST_CASE_METHOD(host_fixture, "zero bytes give a null handle and allocate nothing; null backends are rejected",
                 "[data_ref][errors]") {
  for (const bool in_scope : {false, true}) {
    std::optional<scope> s;
    if (in_scope) s.emplace(cache);
    data_ref zero = allocate(be, 0);
    CHECK_FALSE(zero);
    CHECK(zero.data() == nullptr);
    CHECK(zero.bytes() == 0);
    CHECK(zero.use_count() == 0);
    CHECK_FALSE(zero.source());
    zero.unsafe_free();  // nothing to free: stays a plain null handle
    CHECK_FALSE(zero.is_freed());
    CHECK(cache.allocate(be, 0).data() == nullptr);
  }
  CHECK(be.allocation_count() == 0);
  CHECK(cache.stats().hits + cache.stats().misses == 0);
  CHECK_THROWS_AS(allocate(backend{}, 8), invalid_argument);
  CHECK_THROWS_AS(allocate(backend{}, 0), invalid_argument);  // the backend is checked first
  CHECK_THROWS_AS(cache.allocate(backend{}, 8), invalid_argument);
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE("concurrent copies and drops of one buffer free it exactly once", "[data_ref][threads]") {
  const backend be = make_host_backend();
  data_ref shared = allocate(be, 256);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([copy = shared] {
      for (int i = 0; i < 20000; ++i) {
        data_ref local = copy;
        data_ref other = local;
        other.unsafe_free();
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(shared.use_count() == 1);
  shared.reset();
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.deallocation_count() == 1);
}

// A count found ownerless must order the finder after the last owner: a plan run that finds a
// pinned region's plan dying skips the region and reuses its bytes, which the region's last holder
// read just before it went (plan-hostile under ThreadSanitizer, about once in 300 runs). The race
// on `payload` shows under ThreadSanitizer, as CI runs this test; elsewhere it cannot show.
TEST_CASE("a count found ownerless orders the finder after its last owner", "[data_ref][threads]") {
  for (int round = 0; round < 200; ++round) {
    detail::ref_count count(1);
    int payload = 0;  // plain memory the owner uses and the finder then reuses
    std::thread owner([&] {
      payload = round;
      (void)count.decrement();
    });
    // Owned still: give the finder's owner back (the last one, maybe) and look again.
    while (count.increment_if_owned())
      if (count.decrement()) break;
    payload += 1;  // ownerless: the finder's now
    owner.join();
    CHECK(payload == round + 1);
  }
}
