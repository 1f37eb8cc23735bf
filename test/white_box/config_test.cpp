// REFPOOL_CONF and REFPOOL_NO_CACHING parsing: values, one spelling of on/off for every switch, and
// errors that name key and values.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "config/env_config.hpp"
#include "config/option_kinds.hpp"
#include "support/error_matchers.hpp"

using namespace refpool;
using Catch::Contains;
using detail::parse_conf;
using refpool::test::what;

TEST_CASE("REFPOOL_CONF keys are parsed", "[config]") {
  const auto c = parse_conf("rounding:pow2:4,max_idle_bytes:512M,log:/tmp/x.csv,stats_at_exit:1");
  CHECK(c.cache.rounding == rounding_policy::pow2(4));
  CHECK(c.cache.max_idle_bytes == std::size_t{512} << 20);
  CHECK(c.cache.segments == segment_policy::automatic);  // not given: the default
  CHECK(c.log_path == "/tmp/x.csv");
  CHECK(c.stats_at_exit == detail::exit_stats::summary);
  CHECK(parse_conf("rounding:step:512").cache.rounding == rounding_policy::step(512));
  CHECK(parse_conf("rounding:exact").cache.rounding == rounding_policy::exact());
  CHECK(parse_conf("rounding:pow2").cache.rounding == rounding_policy::pow2(1));
  CHECK(parse_conf("max_idle_bytes:1024").cache.max_idle_bytes == 1024);
  CHECK(parse_conf("max_idle_bytes:64K,max_idle_bytes:unlimited").cache.max_idle_bytes == cache_options::unlimited);
  CHECK(parse_conf("").cache == cache_options{});
  CHECK(parse_conf("").stats_at_exit == detail::exit_stats::off);
}

TEST_CASE("REFPOOL_CONF's cache options are exactly what a conf string sets", "[config]") {
  const char* conf = "rounding:step:4096,max_idle_bytes:3G,segments:on";
  CHECK(parse_conf(conf).cache == cache_options::from_string(conf));
  CHECK_THAT(parse_conf(std::string(conf) + ",stats_at_exit:0").cache.to_string(),
             Catch::StartsWith("rounding:step:4096,max_idle_bytes:3G,segments:on"));
}

TEST_CASE("bad REFPOOL_CONF values name the key and the allowed values", "[config][errors]") {
  CHECK_THROWS_MATCHES(parse_conf("rounding:pow2:3"), config_error,
                       what(Contains("REFPOOL_CONF key 'rounding'") && Contains("pow2:<divisions")));
  CHECK_THROWS_MATCHES(parse_conf("rounding:fast"), config_error, what(Contains("'fast'") && Contains("exact")));
  CHECK_THROWS_MATCHES(parse_conf("max_idle_bytes:lots"), config_error,
                       what(Contains("'max_idle_bytes'") && Contains("512M") && Contains("unlimited")));
  CHECK_THROWS_MATCHES(parse_conf("max_idle_bytes:99999999999999999999G"), config_error,
                       what(Contains("'max_idle_bytes'")));
  CHECK_THROWS_MATCHES(parse_conf("max_idle_bytes:16777216T"), config_error, what(Contains("'max_idle_bytes'")));
  CHECK_THROWS_MATCHES(parse_conf("stats_at_exit:maybe"), config_error,
                       what(Contains("'stats_at_exit' has value 'maybe'") &&
                            Contains("allowed: on (a summary), full (every counter), off")));
  CHECK_THROWS_MATCHES(parse_conf("auto_plans:enabled"), config_error,
                       what(Contains("'auto_plans' has value 'enabled'") && Contains("allowed: on, off")));
  CHECK_THROWS_MATCHES(parse_conf("log:"), config_error, what(Contains("'log'") && Contains("file path")));
  CHECK_THROWS_MATCHES(parse_conf("colour:blue"), config_error,
                       what(Contains("unknown key 'colour'") && Contains("rounding, max_idle_bytes, segments") &&
                            Contains(", log, stats_at_exit")));
  CHECK_THROWS_MATCHES(parse_conf("rounding"), config_error, what(Contains("not key:value")));
  CHECK_THROWS_MATCHES(detail::parse_no_caching("maybe"), config_error,
                       what(Contains("REFPOOL_NO_CACHING") && Contains("'maybe'") && Contains("allowed: on, off")));
  CHECK(detail::parse_no_caching("1"));
  CHECK_FALSE(detail::parse_no_caching("0"));
  CHECK_FALSE(detail::parse_no_caching(""));
}

TEST_CASE("REFPOOL_CONF segments: off, on, auto; anything else names the allowed values", "[config][segments]") {
  CHECK(parse_conf("segments:off").cache.segments == segment_policy::off);
  CHECK(parse_conf("segments:on").cache.segments == segment_policy::on);
  CHECK(parse_conf("segments:on,segments:auto").cache.segments == segment_policy::automatic);
  CHECK(parse_conf("segments:ON").cache.segments == segment_policy::on);  // a switch's spellings (below)
  CHECK(parse_conf("segments:no").cache.segments == segment_policy::off);
  CHECK(parse_conf("segments:Auto").cache.segments == segment_policy::automatic);
  for (const char* bad : {"segments:", "segments:automatic", "segments:2", "segments:o n"}) {
    try {
      parse_conf(bad);
      FAIL("no error for " << bad);
    } catch (const config_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("'segments'") && Catch::Contains("off, on, auto"));
    }
  }
}

TEST_CASE("every switch takes on/off, true/false, yes/no and 1/0 in any case", "[config][switch]") {
  for (const char* on : {"on", "ON", "On", "true", "True", "TRUE", "yes", "Yes", "YES", "1"}) {
    INFO(on);
    CHECK(detail::parse_switch(on) == true);
    CHECK(parse_conf(fmt::format("auto_plans:{}", on)).cache.auto_plans);
    CHECK(parse_conf(fmt::format("stats_at_exit:{}", on)).stats_at_exit == detail::exit_stats::summary);
    CHECK(detail::parse_no_caching(on));
    CHECK(cache_options::from_string(fmt::format("segments:{}", on)).segments == segment_policy::on);
  }
  for (const char* off : {"off", "OFF", "Off", "false", "False", "FALSE", "no", "No", "NO", "0"}) {
    INFO(off);
    CHECK(detail::parse_switch(off) == false);
    CHECK_FALSE(parse_conf(fmt::format("auto_plans:{}", off)).cache.auto_plans);
    CHECK(parse_conf(fmt::format("stats_at_exit:{}", off)).stats_at_exit == detail::exit_stats::off);
    CHECK_FALSE(detail::parse_no_caching(off));
    CHECK(cache_options::from_string(fmt::format("segments:{}", off)).segments == segment_policy::off);
  }
  CHECK(parse_conf("stats_at_exit:full").stats_at_exit == detail::exit_stats::full);
  CHECK(parse_conf("stats_at_exit:FULL").stats_at_exit == detail::exit_stats::full);
  for (const char* neither : {"", "o", "onn", "2", "-1", "y", "enable", "on ", " off", "tru"}) {
    INFO("'" << neither << "'");
    CHECK_FALSE(detail::parse_switch(neither).has_value());
  }
  // Printed back in the one documented spelling.
  CHECK(cache_options::from_string("auto_plans:FALSE").to_string().find("auto_plans:off") != std::string::npos);
}
