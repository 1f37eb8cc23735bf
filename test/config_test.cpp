// REFPOOL_CONF and REFPOOL_NO_CACHING parsing: values, and errors that name key and values.
#include <catch2/catch.hpp>

#include <refpool/error.hpp>

#include "config/env_config.hpp"

using namespace refpool;
using detail::parse_conf;

TEST_CASE("REFPOOL_CONF keys are parsed", "[config]") {
  const auto c = parse_conf("rounding:pow2:4,max_idle_bytes:512M,log:/tmp/x.csv,stats_at_exit:1");
  REQUIRE(c.rounding);
  CHECK(*c.rounding == rounding_policy::pow2(4));
  CHECK(c.max_idle_bytes == std::size_t{512} << 20);
  CHECK(c.log_path == "/tmp/x.csv");
  CHECK(c.stats_at_exit);
  CHECK(*parse_conf("rounding:step:512").rounding == rounding_policy::step(512));
  CHECK(*parse_conf("rounding:exact").rounding == rounding_policy::exact());
  CHECK(*parse_conf("rounding:pow2").rounding == rounding_policy::pow2(1));
  CHECK(parse_conf("max_idle_bytes:1024").max_idle_bytes == 1024);
  CHECK(parse_conf("").max_idle_bytes == std::nullopt);
}

TEST_CASE("bad REFPOOL_CONF values name the key and the allowed values", "[config][errors]") {
  const auto message = [](const char* conf) {
    try {
      parse_conf(conf);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message("rounding:pow2:3"), Catch::Contains("'rounding'") && Catch::Contains("pow2:<divisions"));
  CHECK_THAT(message("rounding:fast"), Catch::Contains("'fast'") && Catch::Contains("exact"));
  CHECK_THAT(message("max_idle_bytes:lots"), Catch::Contains("'max_idle_bytes'") && Catch::Contains("512M"));
  CHECK_THAT(message("max_idle_bytes:99999999999999999999G"), Catch::Contains("'max_idle_bytes'"));
  CHECK_THAT(message("stats_at_exit:yes"), Catch::Contains("0, 1"));
  CHECK_THAT(message("colour:blue"), Catch::Contains("unknown key 'colour'") && Catch::Contains("rounding"));
  CHECK_THAT(message("rounding"), Catch::Contains("not key:value"));
  CHECK_THROWS_AS(detail::parse_no_caching("yes"), config_error);
  CHECK(detail::parse_no_caching("1"));
  CHECK_FALSE(detail::parse_no_caching("0"));
  CHECK_FALSE(detail::parse_no_caching(""));
}

TEST_CASE("REFPOOL_CONF segments: off, on, auto; anything else names the allowed values", "[config][segments]") {
  CHECK(parse_conf("segments:off").segments == segment_policy::off);
  CHECK(parse_conf("segments:on").segments == segment_policy::on);
  CHECK(parse_conf("rounding:exact,segments:auto").segments == segment_policy::automatic);
  CHECK(parse_conf("rounding:exact").segments == std::nullopt);
  CHECK(cache_options{}.segments == segment_policy::automatic);
  for (const char* bad : {"segments:yes", "segments:", "segments:automatic", "segments:ON"}) {
    try {
      parse_conf(bad);
      FAIL("no error for " << bad);
    } catch (const config_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("'segments'") && Catch::Contains("off, on, auto"));
    }
  }
  try {
    parse_conf("colour:blue");
  } catch (const config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("segments"));  // the list of keys names it
  }
}
