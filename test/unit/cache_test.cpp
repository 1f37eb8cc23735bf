// alloc_cache and scopes: reshape reuse, reuse by refcount, escapes, nesting, destruction,
// reclaim, limits, rounding, stable addresses; the stats as text (summary, full table).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>
#include <refpool/stats_format.hpp>

#include "support/host_fixture.hpp"

using namespace refpool;
using refpool::test::host_fixture;

TEST_CASE_METHOD(host_fixture, "the seed case: same byte size, other shapes, served by one buffer", "[cache][seed]") {
  void* first = nullptr;
  for (int iteration = 0; iteration < 3; ++iteration) {
    scope s(cache);
    auto a = empty<float>(be, {16});
    if (first == nullptr) first = a.data();
    CHECK(a.dims() == shape{16});
    CHECK(a.data() == first);
    a = {};
    auto b = empty<float>(be, {4, 4});
    CHECK(b.dims() == shape{4, 4});  // the shape asked for, not the cached one
    CHECK(b.data() == first);
    b = {};
    auto c = empty<float>(be, {2, 8});
    CHECK(c.dims() == shape{2, 8});
    CHECK(c.data() == first);
    c = {};
    auto d = empty<double>(be, {8});  // another element type of 64 bytes
    CHECK(d.size() == 8);
    CHECK(static_cast<void*>(d.data()) == first);
  }
  const auto st = cache.stats();
  CHECK(st.backend_allocations == 1);
  CHECK(st.misses == 1);
  CHECK(st.hits == 11);
  CHECK(be.allocation_count() == 1);
}

TEST_CASE_METHOD(host_fixture, "from the second iteration on a loop makes no backend allocation", "[cache]") {
  std::uint64_t after_first = 0;
  for (int iteration = 0; iteration < 20; ++iteration) {
    scope s(cache);
    auto w = empty<float>(be, {128, 64});
    auto x = empty<float>(be, {64, 128});  // same bytes as w, both live: two blocks
    auto y = empty<std::int32_t>(be, {8192});
    auto z = empty<std::uint8_t>(be, {3, 5, 7});
    x = {};
    auto t = empty<float>(be, {8192});  // reuses x's block at once
    if (iteration == 0) after_first = be.allocation_count();
  }
  CHECK(after_first == 4);
  CHECK(be.allocation_count() == 4);
  const auto st = cache.stats();
  CHECK(st.misses == 4);
  CHECK(st.hits == 20 * 5 - 4);
  CHECK(st.live_blocks == 0);
  CHECK(st.idle_blocks == 4);
  CHECK(st.held_bytes == be.outstanding_bytes());
}

TEST_CASE_METHOD(host_fixture, "a buffer released inside the scope is reusable at once; a live one never", "[cache]") {
  scope s(cache);
  auto a = empty<float>(be, {256});
  auto b = empty<float>(be, {256});
  CHECK(a.data() != b.data());  // a is live: never handed out twice
  void* pa = a.data();
  a = {};
  auto c = empty<float>(be, {16, 16});
  CHECK(c.data() == pa);
  CHECK(cache.stats().live_blocks == 2);
  CHECK(be.allocation_count() == 2);
}

TEST_CASE_METHOD(host_fixture, "unsafe_free inside a scope returns the buffer and is counted", "[cache][unsafe_free]") {
  scope s(cache);
  auto a = empty<float>(be, {64});
  void* pa = a.data();
  a.unsafe_free();
  auto b = empty<float>(be, {8, 8});
  CHECK(b.data() == pa);
  CHECK_THROWS_AS(a.data(), use_after_free);  // the old handle cannot reach b's buffer
  CHECK(cache.stats().unsafe_frees == 1);
  auto view = b;
  b.unsafe_free();  // another handle still holds it: not returned
  CHECK(cache.stats().unsafe_frees == 1);
  auto other = empty<float>(be, {64});
  CHECK(other.data() != pa);
}

TEST_CASE_METHOD(host_fixture, "arrays that escape a scope are not handed out again while held", "[cache][escape]") {
  array<float> escaped;
  {
    scope s(cache);
    escaped = empty<float>(be, {32});
    escaped.data()[0] = 42.0f;
    auto temporary = empty<float>(be, {32});
  }
  CHECK(cache.stats().escapes == 1);
  {
    scope s(cache);
    auto next = empty<float>(be, {32});  // gets the temporary's block, not the escaped one
    CHECK(next.data() != escaped.data());
    next.data()[0] = -1.0f;
    auto another = empty<float>(be, {32});
    CHECK(another.data() != escaped.data());
  }
  CHECK(escaped.data()[0] == 42.0f);
  CHECK(cache.stats().escapes == 1);
  void* pe = escaped.data();
  escaped = {};  // now it goes idle
  CHECK(cache.stats().idle_blocks == 3);
  scope s(cache);
  std::set<void*> seen;
  std::vector<array<float>> all;
  for (int i = 0; i < 3; ++i) all.push_back(empty<float>(be, {32}));
  for (auto& a : all) seen.insert(a.data());
  CHECK(seen.count(pe) == 1);
  CHECK(be.allocation_count() == 3);
}

TEST_CASE_METHOD(host_fixture, "nested scopes: innermost wins, same-cache nesting shares state", "[cache][scope]") {
  alloc_cache& outer_cache = cache;
  alloc_cache inner_cache{cache_options{}};
  scope outer(outer_cache);
  auto a = empty<float>(be, {10});
  {
    scope inner(inner_cache);
    auto b = empty<float>(be, {10});
    CHECK(inner_cache.stats().misses == 1);
    {
      scope again(outer_cache);  // back to the outer cache, sharing its lease
      auto c = empty<float>(be, {10});
      CHECK(outer_cache.stats().misses == 2);
    }
    CHECK(outer_cache.stats().escapes == 0);  // escapes count at the outermost scope
  }
  CHECK(outer_cache.stats().idle_blocks == 1);
  CHECK(inner_cache.stats().idle_blocks == 1);
  CHECK(outer_cache.stats().scope_entries == 1);
  auto d = empty<float>(be, {10});
  CHECK(outer_cache.stats().hits == 1);
}

TEST_CASE_METHOD(host_fixture, "cached() returns the function's result", "[cache][scope]") {
  auto result = cached(cache, [&] {
    auto t = empty<float>(be, {4});
    return empty<float>(be, {2, 2});
  });
  CHECK(result.dims() == shape{2, 2});
  CHECK(cache.stats().escapes == 1);
  CHECK(cached(cache, [] { return 7; }) == 7);
}

TEST_CASE_METHOD(host_fixture, "without a scope, allocations go straight to the backend", "[cache]") {
  { auto a = empty<float>(be, {8}); }
  CHECK(be.outstanding_bytes() == 0);
  CHECK(cache.stats().misses == 0);
  CHECK_FALSE(caching_active());
}

TEST_CASE("a cache destroyed before its arrays: they stay valid and are freed last", "[cache][lifetime]") {
  const backend be = make_host_backend();
  array<float> survivor;
  data_ref other;
  {
    alloc_cache cache{cache_options{}};
    scope s(cache);
    survivor = empty<float>(be, {100});
    other = allocate(be, 12);
    auto idle = empty<float>(be, {7});
    s.close();
  }
  CHECK(be.outstanding_bytes() == 400 + 12);  // the idle block was freed with the cache
  survivor.data()[99] = 1.0f;
  survivor = {};
  CHECK(be.outstanding_bytes() == 12);
  other.unsafe_free();
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE("a scope outliving its cache runs on, uncached, and frees everything", "[cache][lifetime]") {
  const backend be = make_host_backend();
  auto cache = std::make_unique<alloc_cache>(cache_options{});
  {
    scope s(*cache);
    auto a = empty<float>(be, {16});
    cache.reset();  // destroyed while the scope is active
    auto b = empty<float>(be, {16});
    b = {};
    a = {};
    CHECK(be.outstanding_bytes() == 0);
    auto c = empty<float>(be, {16});
    CHECK(be.outstanding_bytes() == 64);
  }
  CHECK(be.outstanding_bytes() == 0);
}

TEST_CASE_METHOD(host_fixture, "reclaim frees idle blocks, oldest first, down to a budget", "[cache][reclaim]") {
  for (std::size_t bytes : {1000, 2000, 3000}) {
    scope s(cache);  // one scope each: released in that order
    auto a = allocate(be, bytes);
  }
  CHECK(cache.stats().idle_bytes == 6000);
  CHECK(cache.reclaim(5000) == 1000);  // the oldest goes first
  CHECK(cache.stats().idle_bytes == 5000);
  {
    scope s(cache);
    auto live = allocate(be, 2000);
    CHECK(cache.reclaim(0) == 3000);  // live blocks are never touched
  }
  CHECK(cache.reclaim() == 2000);
  CHECK(be.outstanding_bytes() == 0);
  const auto st = cache.stats();
  CHECK(st.reclaimed_blocks == 3);
  CHECK(st.backend_frees == 3);
  CHECK(st.held_bytes == 0);
  CHECK(st.peak_held_bytes == 6000);
}

TEST_CASE("max_idle_bytes evicts least recently released blocks", "[cache][limits]") {
  const backend be = make_host_backend();
  cache_options options;
  options.max_idle_bytes = 2500;
  alloc_cache cache{options};
  data_ref first;
  {
    scope s(cache);
    first = allocate(be, 1000);
  }
  {
    scope s(cache);
    auto second = allocate(be, 1000);
  }
  first = {};  // released after second: second is the least recently used
  CHECK(cache.stats().evictions == 0);
  void* released_last = nullptr;
  {
    scope s(cache);
    auto third = allocate(be, 1000);  // the two idle blocks
    auto fourth = allocate(be, 1000);
    auto fifth = allocate(be, 1000);  // a new one
    released_last = third.data();     // locals go in reverse: fifth, fourth, then third
  }
  // Three 1000 B blocks went idle: over the limit by one, and one evicted.
  const auto st = cache.stats();
  CHECK(st.evictions == 1);
  CHECK(st.idle_bytes == 2000);
  cache.set_max_idle_bytes(1000);
  CHECK(cache.stats().idle_bytes == 1000);
  CHECK(cache.stats().evictions == 2);
  cache.set_max_idle_bytes(cache_options::unlimited);
  CHECK(cache.max_idle_bytes() == cache_options::unlimited);
  CHECK(be.outstanding_bytes() == 1000);
  // The one kept is the most recently released.
  scope s(cache);
  CHECK(allocate(be, 1000).data() == released_last);
  CHECK(be.allocation_count() == 3);
}

TEST_CASE("rounding policies widen keys; exact keys never mix sizes", "[cache][rounding]") {
  const backend be = make_host_backend();
  SECTION("exact") {
    alloc_cache cache{cache_options{}};
    scope s(cache);
    { auto a = allocate(be, 1000); }
    auto b = allocate(be, 1001);
    CHECK(cache.stats().misses == 2);
    CHECK(b.capacity() == 1001);
  }
  SECTION("step") {
    cache_options options;
    options.rounding = rounding_policy::step(512);
    alloc_cache cache{options};
    scope s(cache);
    { auto a = allocate(be, 1000); }
    auto b = allocate(be, 600);
    CHECK(cache.stats().hits == 1);
    CHECK(b.bytes() == 600);
    CHECK(b.capacity() == 1024);
  }
  SECTION("pow2") {
    CHECK(rounding_policy::pow2(1).round(1000) == 1024);
    CHECK(rounding_policy::pow2(4).round(1100) == 1280);
    CHECK(rounding_policy::pow2(4).round(1024) == 1024);
    CHECK(rounding_policy::step(512).round(0) == 0);
    CHECK_THROWS_AS(rounding_policy::pow2(1).round(std::numeric_limits<std::size_t>::max() - 5), size_error);
    CHECK_THROWS_AS(rounding_policy::pow2(3), config_error);
    CHECK_THROWS_AS(rounding_policy::step(0), config_error);
    CHECK(rounding_policy::pow2(4).to_string() == "pow2:4");
  }
}

TEST_CASE_METHOD(host_fixture, "blocks of different backends never serve each other", "[cache][keys]") {
  const backend two = make_host_backend();
  scope s(cache);
  { auto a = allocate(be, 128); }
  auto b = allocate(two, 128);
  CHECK(cache.stats().misses == 2);
  CHECK(b.source() == two);
  CHECK(be.outstanding_bytes() == 128);  // be's block stays idle, for be alone
  CHECK(two.outstanding_bytes() == 128);
}

TEST_CASE_METHOD(host_fixture, "stable addresses: iteration n gets the same buffers in the same order",
                 "[cache][stable]") {
  std::vector<std::vector<void*>> pointers;
  for (int iteration = 0; iteration < 10; ++iteration) {
    scope s(cache);
    std::vector<void*> seen;
    // Interleaved lifetimes and a free order unlike the allocation order (LIFO would reverse).
    auto a = empty<float>(be, {256});
    auto b = empty<float>(be, {256});
    auto c = empty<float>(be, {16, 16});
    seen = {a.data(), b.data(), c.data()};
    b = {};
    auto d = empty<float>(be, {128, 2});
    seen.push_back(d.data());
    a = {};
    c = {};
    auto e = empty<float>(be, {256});
    auto f = empty<float>(be, {256});
    seen.push_back(e.data());
    seen.push_back(f.data());
    pointers.push_back(seen);
  }
  for (int iteration = 2; iteration < 10; ++iteration) CHECK(pointers[iteration] == pointers[1]);
  CHECK(be.allocation_count() == 3);
}

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// The line of `text` whose first word (after indentation) is `label` (words may hold spaces:
/// "backend calls"), or "".
std::string line_of(const std::string& text, std::string_view label) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto start = line.find_first_not_of(' ');
    if (start != std::string::npos && line.compare(start, label.size(), label) == 0 &&
        (line.size() == start + label.size() || line[start + label.size()] == ' '))
      return line;
  }
  return {};
}

}  // namespace

TEST_CASE_METHOD(host_fixture, "the summary: requests, memory now and at peak in binary units, plans, calls",
                 "[cache][stats][summary]") {
  {
    scope s(cache);
    auto big = allocate(be, 3 * MiB);
    { auto small = allocate(be, 1536); }
    auto again = allocate(be, 1536);  // a hit on small's block
  }
  const std::string text = cache.summary();
  INFO(text);
  CHECK(text == summary(cache.stats()));
  CHECK(std::count(text.begin(), text.end(), '\n') <= 10);  // short: read at a glance
  CHECK_THAT(line_of(text, "requests"), Catch::Contains("3") && Catch::Contains("hits 1 (33.3%), misses 2"));
  CHECK_THAT(line_of(text, "memory"), Catch::Contains("now") && Catch::Contains("peak"));
  // All idle at the scope's end: nothing allocated now; the peak was 3 MiB + 1.5 KiB.
  CHECK_THAT(line_of(text, "allocated"), Catch::Contains(" 0 B") && Catch::Contains("3.00 MiB"));
  CHECK_THAT(line_of(text, "reserved"), Catch::Contains("3.00 MiB"));
  CHECK_THAT(line_of(text, "idle"), Catch::Contains("3.00 MiB") && Catch::Contains("2 blocks"));
  CHECK_THAT(line_of(text, "plans"), Catch::Contains("hits 0"));
  CHECK_THAT(line_of(text, "backend calls"), Catch::Contains("allocations 2, frees 0"));
  CHECK_THAT(line_of(text, "out of memory"), Catch::Contains("failed requests"));
  CHECK(text.find("3145728") == std::string::npos);  // never raw bytes
}

TEST_CASE("stats print bytes in binary units: exact ones whole, others to three significant digits",
          "[cache][stats][summary]") {
  const std::vector<std::pair<std::size_t, std::string>> cases{
      {0, "0 B"},
      {1023, "1023 B"},
      {1024, "1 KiB"},
      {1536, "1.50 KiB"},
      {3000, "2.93 KiB"},
      {4 * MiB, "4 MiB"},
      {12 * MiB + 100 * KiB, "12.1 MiB"},
      {512 * MiB + 300 * KiB, "512 MiB"},
      {std::size_t{3} << 30, "3 GiB"},
      {(std::size_t{5} << 40) + 1, "5.00 TiB"},
      {SIZE_MAX, "16.0 EiB"},
  };
  for (const auto& [bytes, text] : cases) {
    cache_stats st;
    st.idle_bytes = bytes;
    INFO(bytes);
    CHECK_THAT(line_of(summary(st), "idle"), Catch::Contains(" " + text + "  "));
    CHECK_THAT(line_of(to_string(st), "idle_bytes"), Catch::EndsWith(" " + text));
  }
}

TEST_CASE_METHOD(host_fixture, "the full table: every counter once, bytes scaled, peaks beside their figure",
                 "[cache][stats]") {
  {
    scope s(cache);
    auto a = allocate(be, 10);
    auto b = allocate(be, 2 * MiB);
  }
  const cache_stats st = cache.stats();
  const std::string table = fmt::format("{}", st);  // refpool/stats_format.hpp: to_string
  INFO(table);
  CHECK(table == to_string(st));
  REQUIRE(stat_count() > 25);
  for (std::size_t i = 0; i < stat_count(); ++i) {
    const std::string name(stat_at(i).name);
    CHECK_FALSE(stat_at(i).description.empty());
    INFO(name);
    if (name == "held_bytes" || name == "peak_held_bytes") {
      CHECK(line_of(table, name).empty());  // live + idle, both printed: one name per figure
    } else if (name.starts_with("peak_")) {
      CHECK(line_of(table, name).empty());  // in its figure's line
      CHECK_THAT(line_of(table, name.substr(5)), Catch::Contains(" peak "));
    } else {
      CHECK_FALSE(line_of(table, name).empty());
    }
  }
  CHECK(stat_value(st, 1) == st.misses);  // the order of refpool/stats_fields.h
  CHECK_THAT(line_of(table, "misses"), Catch::EndsWith(" 2"));
  CHECK_THAT(line_of(table, "hit_rate"), Catch::EndsWith(" 0.0%"));
  CHECK_THAT(line_of(table, "idle_bytes"), Catch::EndsWith(" 2.00 MiB"));
  CHECK_THAT(line_of(table, "live_bytes"), Catch::Contains(" 0 B") && Catch::EndsWith("peak   2.00 MiB"));
  CHECK(table.find("2097162") == std::string::npos);  // 2 MiB + 10 B, scaled
}
