// Stats and messages for people: byte counts in binary units, the short summary
// (alloc_cache::summary), the full table (one name per figure), and what out-of-memory messages say.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <refpool/refpool.hpp>
#include <refpool/stats_format.hpp>

#include "byte_text.hpp"
#include "cache/oom_text.hpp"
#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"

using namespace refpool;
using Catch::Contains;
using refpool::test::host_fixture;
using refpool::test::what;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// The line of `text` that starts with `label` (after indentation), or "".
std::string line_of(const std::string& text, std::string_view label) {
  for (const std::string& line : lines_of(text)) {
    const auto start = line.find_first_not_of(' ');
    if (start != std::string::npos && line.compare(start, label.size(), label) == 0 &&
        (line.size() == start + label.size() || line[start + label.size()] == ' '))
      return line;
  }
  return {};
}

}  // namespace

TEST_CASE("byte counts in binary units: exact ones whole, others to three significant digits", "[stats][text]") {
  using detail::scaled_bytes;
  CHECK(scaled_bytes(0) == "0 B");
  CHECK(scaled_bytes(1) == "1 B");
  CHECK(scaled_bytes(1023) == "1023 B");
  CHECK(scaled_bytes(1024) == "1 KiB");
  CHECK(scaled_bytes(1536) == "1.50 KiB");
  CHECK(scaled_bytes(3000) == "2.93 KiB");
  CHECK(scaled_bytes(4 * MiB) == "4 MiB");
  CHECK(scaled_bytes(12 * MiB + 100 * KiB) == "12.1 MiB");
  CHECK(scaled_bytes(512 * MiB + 300 * KiB) == "512 MiB");
  CHECK(scaled_bytes(std::size_t{3} << 30) == "3 GiB");
  CHECK(scaled_bytes((std::size_t{5} << 40) + 1) == "5.00 TiB");
  CHECK(scaled_bytes(SIZE_MAX) == "16.0 EiB");
}

TEST_CASE_METHOD(host_fixture, "the summary: requests, memory now and at peak in binary units, plans, calls",
                 "[stats][summary]") {
  {
    scope s(cache);
    auto big = allocate(be, 3 * MiB);
    { auto small = allocate(be, 1536); }
    auto again = allocate(be, 1536);  // a hit on small's block
  }
  const std::string text = cache.summary();
  INFO(text);
  CHECK(text == summary(cache.stats()));
  CHECK(lines_of(text).size() <= 10);  // short: a person reads it at a glance
  CHECK_THAT(line_of(text, "requests"), Contains("3") && Contains("hits 1 (33.3%), misses 2"));
  CHECK_THAT(line_of(text, "memory"), Contains("now") && Contains("peak"));
  // Everything went idle at the scope's end: nothing allocated now; the peak was 3 MiB + 1.5 KiB.
  CHECK_THAT(line_of(text, "allocated"), Contains("0 B") && Contains("3.00 MiB"));
  CHECK_THAT(line_of(text, "reserved"), Contains("3.00 MiB"));
  CHECK_THAT(line_of(text, "idle"), Contains("3.00 MiB") && Contains("2 blocks"));
  CHECK_THAT(line_of(text, "plans"), Contains("hits 0"));
  CHECK_THAT(line_of(text, "backend calls"), Contains("2") && Contains("allocations 2, frees 0"));
  CHECK_THAT(line_of(text, "out of memory"), Contains("0"));
  // No raw byte counts: 3 MiB is never printed as 3145728.
  CHECK(text.find("3145728") == std::string::npos);
}

TEST_CASE_METHOD(host_fixture, "the full table: every counter once, bytes scaled, peaks beside their figure",
                 "[stats][table]") {
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
    const std::string line = line_of(table, name);
    if (name == "held_bytes" || name == "peak_held_bytes") {
      CHECK(line.empty());  // live + idle: both printed
    } else if (name.starts_with("peak_") && name != "peak_held_bytes") {
      CHECK(line.empty());  // in its figure's line
      CHECK_THAT(line_of(table, name.substr(5)), Contains(" peak "));
    } else {
      CHECK_FALSE(line.empty());
    }
  }
  CHECK(stat_value(st, 1) == st.misses);  // the order of refpool/stats_fields.h
  CHECK_THAT(line_of(table, "misses"), Contains("2"));
  CHECK_THAT(line_of(table, "hit_rate"), Contains("0.0%"));
  CHECK_THAT(line_of(table, "idle_bytes"), Contains("2.00 MiB"));
  CHECK_THAT(line_of(table, "live_bytes"), Contains("0 B") && Contains("peak") && Contains("2.00 MiB"));
  CHECK_THAT(line_of(table, "idle_blocks"), Contains("2"));
  CHECK(table.find("2097162") == std::string::npos);  // 2 MiB + 10 B, scaled
}

TEST_CASE("out-of-memory messages: binary units, the host named as such, and what to do", "[oom][text]") {
  auto limited = std::make_shared<limiting_resource>(make_host_resource(), 4 * MiB);
  const backend be(limited);
  alloc_cache cache{cache_options{}};
  scope s(cache);
  auto live = allocate(be, 3 * MiB);
  { auto idle = allocate(be, 512 * KiB); }
  CHECK_THROWS_MATCHES(allocate(be, 2 * MiB), out_of_memory,
                       what(Contains("could not allocate 2 MiB (request 2 MiB) of host memory") &&
                            Contains("reclaiming 512 KiB") && Contains("3 MiB live in 1 blocks") &&
                            Contains("What to do: release buffers no longer needed (3 MiB live in this cache)") &&
                            Contains("max_idle_bytes") && Contains("reclaim()")));
  try {
    (void)allocate(be, 2 * MiB);
  } catch (const out_of_memory& e) {
    CHECK_THAT(e.what(), !Contains("device -1") && !Contains("3145728"));
  }
  CHECK(detail::memory_place(-1) == "of host memory");
  CHECK(detail::memory_place(3) == "on device 3");
}

TEST_CASE("out-of-memory advice names bytes reserved but not handed out", "[oom][text]") {
  cache_stats st;
  st.allocated_bytes = 1 * MiB;
  st.reserved_bytes = 5 * MiB;
  const std::string advice = detail::oom_advice(st);
  CHECK_THAT(advice, Contains("1 MiB live") && Contains("4 MiB is reserved here but not handed out"));
  cache_stats empty;
  CHECK_THAT(detail::oom_advice(empty), !Contains("live in this cache") && !Contains("reserved here") &&
                                            Contains("idle limit"));
}
