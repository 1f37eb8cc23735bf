// Misuse and what it gives (docs/design.md, "Misuse and what it gives"): the cases no other test
// file covers, and regression tests for what the fuzzer found in array<T>.
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <thread>

#include <refpool/refpool.hpp>

#include "config/alloc_log.hpp"
#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"
#include "support/in_child.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::host_fixture;
using refpool::test::oom_for;
using refpool::test::what;

// Found by the fuzzer: the implicit move kept size() and offset(), so a moved-from array said it
// had 64 elements while data() was null, and reshape({64}) of it "succeeded".
TEST_CASE("a moved-from array is empty: no buffer and no elements", "[misuse][array]") {
  const backend be = make_host_backend();
  auto a = empty<float>(be, {4, 16});
  const float* p = a.data();
  auto b = std::move(a);
  CHECK(b.data() == p);
  CHECK(b.size() == 64);
  CHECK(a.size() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  CHECK(a.offset() == 0);
  CHECK(a.bytes() == 0);
  CHECK(a.data() == nullptr);
  CHECK(a.use_count() == 0);
  CHECK_THROWS_AS(a.reshape({64}), shape_error);
  array<float> c;
  c = std::move(b);
  CHECK(c.size() == 64);
  CHECK(b.size() == 0);
  CHECK(b.data() == nullptr);
}

// Found by the fuzzer: array<U>(ref, {0, 4}) kept a reference to the buffer and data() returned
// base + offset, though zero-element arrays own no buffer and data() is documented null for
// them (with offset SIZE_MAX, the pointer arithmetic overflowed).
TEST_CASE("a zero-element view over a buffer owns no reference and has a null data()", "[misuse][array]") {
  const backend be = make_host_backend();
  data_ref buffer = allocate(be, 64);
  const array<std::uint16_t> view(buffer, {0, 4}, 3);
  CHECK(view.size() == 0);
  CHECK(view.data() == nullptr);
  CHECK(view.use_count() == 0);
  CHECK(buffer.use_count() == 1);
  const array<float> far(buffer, {0}, std::numeric_limits<std::size_t>::max());
  CHECK(far.data() == nullptr);
  buffer = {};
  CHECK(be.outstanding_bytes() == 0);  // the views did not keep it
}

// Found by the fuzzer: a freed data_ref moved (not copied) into a view gave shape_error ("does not
// fit a buffer of 0 B"), or, for zero elements, an array holding the freed handle.
TEST_CASE("a freed data_ref moved into a view throws use_after_free", "[misuse][array][unsafe_free]") {
  const backend be = make_host_backend();
  data_ref a = allocate(be, 64);
  a.unsafe_free();
  CHECK_THROWS_AS(array<float>(std::move(a), {4}), use_after_free);
  data_ref b = allocate(be, 64);
  b.unsafe_free();
  CHECK_THROWS_AS(array<float>(std::move(b), {0}), use_after_free);
  data_ref c = allocate(be, 64);
  c.unsafe_free();
  CHECK_THROWS_AS(array<float>(c, {4}), use_after_free);  // by copy, as before
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE_METHOD(host_fixture, "unsafe_free of one handle of a shared buffer leaves it to the other handles",
                 "[misuse][unsafe_free]") {
  scope s(cache);
  auto a = empty<float>(be, {16});
  auto view = a.reshape({4, 4});
  const float* p = a.data();
  a.unsafe_free();
  CHECK_THROWS_AS(a.data(), use_after_free);
  CHECK(view.data() == p);  // still owned through the view
  auto other = empty<float>(be, {16});
  CHECK(other.data() != p);  // so never handed out again
  CHECK(cache.stats().live_blocks == 2);
  view = {};
  CHECK(cache.stats().unsafe_frees == 0);  // its last handle went normally
  auto again = empty<float>(be, {16});
  CHECK(again.data() == p);
}

TEST_CASE_METHOD(host_fixture, "closing an uncached_guard out of order throws scope_error and keeps it open",
                 "[misuse][scope]") {
  scope outer(cache);
  uncached_guard guard;
  auto inner = std::make_unique<scope>(cache);
  CHECK(caching_active());
  CHECK_THROWS_MATCHES(guard.close(), scope_error,
                       what(Contains("uncached_guard was closed out of order") &&
                            Contains("opened after it on this thread is still open")));
  inner.reset();
  CHECK_FALSE(caching_active());  // the guard is still the innermost frame
  guard.close();
  CHECK(caching_active());
  outer.close();
  CHECK_FALSE(caching_active());
}

TEST_CASE_METHOD(host_fixture, "destroying a scope on another thread terminates with a clear message",
                 "[misuse][scope][threads]") {
  const auto [aborted, output] = refpool::test::in_child([&] {
    auto s = std::make_unique<scope>(cache);
    std::thread([&] { s.reset(); }).join();  // the destructor cannot throw: it must terminate
  });
  CHECK(aborted);
  CHECK_THAT(output, Contains("on the thread that opened"));
}

TEST_CASE("an uncached request that runs out of memory throws at once: no cache to reclaim", "[misuse][oom]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 1024);
  const backend be(limited);
  alloc_cache cache{cache_options{}};
  scope s(cache);
  { auto idle = allocate(be, 800); }  // idle in the cache, which an uncached request cannot use
  uncached_guard g;
  CHECK_THROWS_MATCHES(allocate(be, 512), out_of_memory, oom_for(512, -1) && what(Contains("uncached allocation")));
  CHECK(cache.stats().oom_retries == 0);
  CHECK(cache.stats().idle_bytes == 800);
}

TEST_CASE("an allocation log that cannot be opened throws config_error naming the path", "[misuse][config]") {
  CHECK_THROWS_MATCHES(detail::alloc_log("/nonexistent-refpool-folder/alloc.csv"), config_error,
                       what(Contains("'log'") && Contains("/nonexistent-refpool-folder/alloc.csv")));
}
