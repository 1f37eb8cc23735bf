// cache_options (refpool/cache_options.hpp): the defaults of refpool/cache_option_fields.h, the
// text form shared with REFPOOL_CONF, and errors that name the option and its allowed values.
#include <catch2/catch.hpp>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"

using namespace refpool;
using Catch::Contains;
using Catch::StartsWith;
using refpool::test::what;

TEST_CASE("the defaults are the ones the option table spells", "[options]") {
  const cache_options defaults;
  CHECK(defaults.rounding == rounding_policy::exact());
  CHECK(defaults.max_idle_bytes == cache_options::unlimited);
  CHECK(defaults.segments == segment_policy::automatic);
  // Options added later follow these three.
  CHECK_THAT(defaults.to_string(), StartsWith("rounding:exact,max_idle_bytes:unlimited,segments:auto"));
}

TEST_CASE("a conf string sets the options it names, in REFPOOL_CONF's spelling", "[options]") {
  const auto o = cache_options::from_string("rounding:pow2:4,max_idle_bytes:512M,segments:off");
  CHECK(o.rounding == rounding_policy::pow2(4));
  CHECK(o.max_idle_bytes == std::size_t{512} << 20);
  CHECK(o.segments == segment_policy::off);
  CHECK(cache_options::from_string("rounding:step:100").rounding == rounding_policy::step(100));
  CHECK(cache_options::from_string("max_idle_bytes:1000").max_idle_bytes == 1000);
  CHECK(cache_options::from_string(",,segments:on,").segments == segment_policy::on);  // empty entries: skipped
  CHECK(cache_options::from_string("") == cache_options{});

  cache_options applied = o;
  applied.apply("segments:on");
  CHECK(applied.segments == segment_policy::on);
  CHECK(applied.rounding == o.rounding);  // the others keep their values
  applied.set("max_idle_bytes", "2K");
  CHECK(applied.max_idle_bytes == 2048);
}

TEST_CASE("to_string spells every option so that from_string reads it back", "[options]") {
  cache_options o;
  o.rounding = rounding_policy::step(3000);
  o.max_idle_bytes = (std::size_t{3} << 30) + 1;  // no exact binary multiple: plain bytes
  o.segments = segment_policy::on;
  CHECK_THAT(o.to_string(), StartsWith("rounding:step:3000,max_idle_bytes:3221225473,segments:on"));
  CHECK(cache_options::from_string(o.to_string()) == o);
  o.max_idle_bytes = std::size_t{5} << 40;
  o.rounding = rounding_policy::pow2(8);
  CHECK_THAT(o.to_string(), StartsWith("rounding:pow2:8,max_idle_bytes:5T,segments:on"));
  CHECK(cache_options::from_string(o.to_string()) == o);
  o.max_idle_bytes = 0;
  CHECK(cache_options::from_string(o.to_string()) == o);
}

TEST_CASE("a bad conf names the option and its allowed values, and changes nothing", "[options][errors]") {
  cache_options o = cache_options::from_string("rounding:step:64");
  const cache_options before = o;
  CHECK_THROWS_MATCHES(o.apply("segments:on,rounding:pow2:3"), config_error,
                       what(Contains("cache option 'rounding' has value 'pow2:3'") && Contains("pow2:<divisions")));
  CHECK(o == before);  // segments:on came first, and was not kept
  CHECK_THROWS_MATCHES(o.set("segments", "sometimes"), config_error,
                       what(Contains("'segments'") && Contains("'sometimes'") && Contains("off, on, auto")));
  CHECK_THROWS_MATCHES(o.set("max_idle_bytes", "-1"), config_error, what(Contains("512M")));
  CHECK_THROWS_MATCHES(o.set("rounding", "step:0"), config_error, what(Contains("step:<bytes>")));
  CHECK_THROWS_MATCHES(o.apply("colour:blue"), config_error,
                       what(Contains("'colour'") && Contains("rounding, max_idle_bytes, segments")));
  CHECK_THROWS_MATCHES(o.apply("log:/tmp/a.csv"), config_error,
                       what(Contains("'log' is process-wide") && Contains("REFPOOL_CONF")));
  CHECK_THROWS_MATCHES(o.apply("stats_at_exit:1"), config_error, what(Contains("process-wide")));
  CHECK_THROWS_MATCHES(o.apply("segments"), config_error, what(Contains("not key:value")));
  CHECK(o == before);
}

TEST_CASE("a cache made from a conf string uses its options", "[options]") {
  const backend be = make_host_backend();
  alloc_cache cache{cache_options::from_string("rounding:step:256,max_idle_bytes:1K")};
  CHECK(cache.rounding() == rounding_policy::step(256));
  CHECK(cache.max_idle_bytes() == 1024);
  {
    scope s(cache);
    auto a = allocate(be, 100);
    CHECK(a.capacity() == 256);
  }
}
