// array<T>: shapes, reshape, reinterpretation, rank-0 and zero-element arrays, size checks.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::what;

TEST_CASE("reshape shares the buffer and keeps the element count", "[array]") {
  const backend be = make_host_backend();
  auto a = empty<float>(be, {16});
  CHECK(a.rank() == 1);
  CHECK(a.size() == 16);
  CHECK(a.bytes() == 64);
  auto b = a.reshape({4, 4});
  CHECK(b.dims() == shape{4, 4});
  CHECK(b.data() == a.data());
  CHECK(a.use_count() == 2);
  auto c = b.reshape({2, 2, 2, 2});
  CHECK(c.rank() == 4);
  CHECK(be.allocation_count() == 1);
}

TEST_CASE("reshape to another element count throws shape_error with both shapes", "[array][errors]") {
  const backend be = make_host_backend();
  auto a = empty<float>(be, {4, 4});
  CHECK_THROWS_MATCHES(a.reshape({3, 5}), shape_error,
                       what(Contains("(4, 4)") && Contains("(3, 5)") && Contains("64 B") && Contains("60 B")));
}

TEST_CASE("reinterpretation needs the same byte size and an aligned start", "[array]") {
  const backend be = make_host_backend();
  auto f = empty<float>(be, {16});
  auto d = f.reinterpret<double>();
  CHECK(d.size() == 8);
  CHECK(static_cast<void*>(d.data()) == static_cast<void*>(f.data()));
  auto m = f.reinterpret<std::int32_t>();
  CHECK(m.dims() == f.dims());
  auto bytes = f.reinterpret<std::uint8_t>(shape{8, 8});
  CHECK(bytes.size() == 64);
  CHECK_THROWS_AS(f.reinterpret<double>(shape{9}), shape_error);
  auto odd = array<float>(f.ref(), shape{2}, 1);  // starts at byte 4
  CHECK_THROWS_AS(odd.reinterpret<double>(shape{1}), shape_error);
}

TEST_CASE("views over a data_ref are checked against its size", "[array]") {
  const backend be = make_host_backend();
  data_ref buffer = allocate(be, 64);
  array<float> view(buffer, {4, 2}, 8);  // elements 8..15 of 16
  CHECK(view.data() == static_cast<float*>(buffer.data()) + 8);
  CHECK(view.offset() == 8);
  CHECK_THROWS_AS(array<float>(buffer, {4, 2}, 9), shape_error);
  CHECK_THROWS_AS(array<float>(buffer, {17}), shape_error);
  CHECK_THROWS_AS(array<float>(buffer, {1}, std::numeric_limits<std::size_t>::max()), shape_error);
}

TEST_CASE("rank-0 arrays are scalars", "[array]") {
  const backend be = make_host_backend();
  auto s = empty<double>(be, {});
  CHECK(s.rank() == 0);
  CHECK(s.size() == 1);
  CHECK(s.bytes() == sizeof(double));
  *s.data() = 2.5;
  auto r = s.reshape({1, 1});
  CHECK(*r.data() == 2.5);
  CHECK(shape{}.to_string() == "()");
}

TEST_CASE("zero-element arrays allocate nothing", "[array]") {
  const backend be = make_host_backend();
  auto z = empty<float>(be, {0, 4});
  CHECK(z.size() == 0);
  CHECK(z.data() == nullptr);
  CHECK(z.use_count() == 0);
  CHECK(be.allocation_count() == 0);
  auto r = z.reshape({4, 0, 7});
  CHECK(r.size() == 0);
  CHECK_THROWS_AS(z.reshape({1}), shape_error);
  z.unsafe_free();  // nothing to free
  CHECK(z.data() == nullptr);
  // A zero dim makes the count 0 even where the other dims would overflow.
  constexpr auto huge = std::numeric_limits<std::size_t>::max();
  CHECK(empty<float>(be, {huge, huge, 0}).size() == 0);
}

TEST_CASE("overflowing dims throw size_error naming the dims", "[array][errors]") {
  const backend be = make_host_backend();
  constexpr auto huge = std::numeric_limits<std::size_t>::max();
  CHECK_THROWS_MATCHES(empty<float>(be, {huge / 2, 3}), size_error,
                       what(Contains("(" + std::to_string(huge / 2) + ", 3)") && Contains("element count")));
  // The count fits, the bytes do not.
  CHECK_THROWS_MATCHES(empty<double>(be, {huge / 4}), size_error,
                       what(Contains("(" + std::to_string(huge / 4) + ",)") && Contains("8-byte elements")));
  CHECK(be.allocation_count() == 0);
}

TEST_CASE("array unsafe_free makes later access throw", "[array][unsafe_free]") {
  const backend be = make_host_backend();
  auto a = empty<float>(be, {8});
  auto b = a;
  a.unsafe_free();
  CHECK(a.is_freed());
  CHECK_THROWS_AS(a.data(), use_after_free);
  CHECK_THROWS_AS(a.reshape({2, 4}), use_after_free);
  CHECK_THROWS_AS(array<float>(a), use_after_free);
  CHECK(b.use_count() == 1);
  CHECK(b.data() != nullptr);
}

TEST_CASE("shapes of high rank spill to the heap", "[array]") {
  const backend be = make_host_backend();
  auto a = empty<std::uint8_t>(be, {2, 2, 2, 2, 2, 2, 2, 2});
  CHECK(a.rank() == 8);
  CHECK(a.size() == 256);
  shape dims = a.dims();
  shape moved = std::move(dims);
  CHECK(moved.rank() == 8);
  CHECK(dims.rank() == 0);  // NOLINT(bugprone-use-after-move): moved-from shapes are rank 0
  CHECK(moved.to_string() == "(2, 2, 2, 2, 2, 2, 2, 2)");
  shape copy = moved;
  CHECK(copy == moved);
}
