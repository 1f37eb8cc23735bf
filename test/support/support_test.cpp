// The test helpers themselves: a checker that cannot see a second owner, or a matcher that
// matches anything, would make every suite that uses it pass for nothing.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <refpool/refpool.hpp>

#include "support/error_matchers.hpp"
#include "support/host_fixture.hpp"
#include "support/in_child.hpp"
#include "support/stamped.hpp"

using namespace refpool;
using namespace refpool::test;
using Catch::Contains;

TEST_CASE("the stamp pattern: written in pieces at any offset, every foreign byte found", "[support][stamps]") {
  constexpr std::uint64_t stamp = 0x1234'5678'9ABC'DEF0ull;
  std::vector<unsigned char> whole(61), pieces(61);
  write_stamp(whole.data(), whole.size(), stamp);
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK(whole[i] == stamp_byte(stamp, i));
  // As the fuzz harness writes through views: bytes 0..2, 3..29, 30..60, each from its offset.
  write_stamp(pieces.data(), 3, stamp);
  write_stamp(pieces.data() + 3, 27, stamp, 3);
  write_stamp(pieces.data() + 30, 31, stamp, 30);
  CHECK(pieces == whole);
  CHECK_FALSE(first_foreign_byte(whole.data(), whole.size(), stamp));
  CHECK_FALSE(first_foreign_byte(whole.data() + 5, 40, stamp, 5));
  for (std::size_t i = 0; i < whole.size(); ++i) {
    CAPTURE(i);
    std::vector<unsigned char> broken = whole;
    broken[i] ^= 0x01;
    CHECK(first_foreign_byte(broken.data(), broken.size(), stamp) == i);
    if (i >= 7) CHECK(first_foreign_byte(broken.data() + 7, broken.size() - 7, stamp, 7) == i - 7);
  }
  // Another stamp differs in every word, and the words of one stamp differ from each other.
  for (std::size_t w = 0; w < 8; ++w) {
    CHECK(stamp_word(stamp, w) != stamp_word(stamp + 1, w));
    CHECK(stamp_word(stamp, w) != stamp_word(stamp, w + 1));
  }
}

TEST_CASE_METHOD(host_fixture, "stamped sets: a buffer held by two owners shows, and each set stamps its own",
                 "[support][stamps]") {
  stamped_set first, second;
  const stamped_buffer& mine = first.add(empty<std::uint64_t>(be, {16}));
  CHECK(mine.intact());
  CHECK(first.check_all());
  CHECK(first.damage().empty());
  const stamped_buffer& other = second.add(empty<std::uint64_t>(be, {16}));
  CHECK(other.stamp != mine.stamp);
  // What refpool must never do: hand a buffer the first owner still holds to the second.
  second.add(first[0].a);
  CHECK_FALSE(first[0].intact());
  CHECK_FALSE(first.check_all());
  CHECK_THAT(first.damage(), Contains("at byte 0") && Contains("another owner wrote it"));
  CHECK(second.check_all());  // the last writer sees its own stamp
  CHECK_FALSE(first.drop(0));

  // A hand-over keeps the stamp; take keeps the order of the rest; drop(early) gives the buffer back.
  for (int i = 0; i < 3; ++i) first.add(empty<std::uint64_t>(be, {8}));
  const std::uint64_t middle = first[1].stamp;
  const std::uint64_t last = first[2].stamp;
  second.adopt(first.take(1));
  CHECK(first[1].stamp == last);
  CHECK(second[second.size() - 1].stamp == middle);
  CHECK(second.check_all());
  const std::size_t before = be.outstanding_bytes();
  CHECK(first.drop(1, true));  // no scope: a direct allocation, freed by unsafe_free at once
  CHECK(be.outstanding_bytes() == before - 64);
  CHECK(first.size() == 1);
}

TEST_CASE("error matchers match the message and the out_of_memory fields, and nothing else", "[support][errors]") {
  const shape_error shape_failure("refpool: reshape of (4, 4) to (3, 5)");
  CHECK(what(Contains("(4, 4)")).match(shape_failure));
  CHECK_FALSE(what(Contains("(2, 8)")).match(shape_failure));
  CHECK_FALSE((what(Contains("(4, 4)")) && what(Contains("(2, 8)"))).match(shape_failure));
  CHECK_THAT(what(Contains("x")).describe(), Contains("has a message that") && Contains("\"x\""));
  const out_of_memory oom("refpool: out of memory", 2048, -1);
  CHECK(oom_for(2048, -1).match(oom));
  CHECK_FALSE(oom_for(2048, 0).match(oom));
  CHECK_FALSE(oom_for(1024, -1).match(oom));
  CHECK_FALSE(oom_for(2048, -1).match(shape_failure));  // not an out_of_memory at all
  CHECK_THROWS_MATCHES(throw oom, out_of_memory, oom_for(2048, -1) && what(Contains("out of memory")));
}

TEST_CASE_METHOD(host_fixture, "the host fixture: fresh counters and default options", "[support]") {
  CHECK(be.outstanding_bytes() == 0);
  CHECK(be.allocation_count() == 0);
  CHECK(cache.rounding() == rounding_policy::exact());
  CHECK(cache.max_idle_bytes() == cache_options::unlimited);
  CHECK(cache.stats().hits + cache.stats().misses == 0);
}

TEST_CASE("in_child tells an abort with its message from a normal exit", "[support]") {
  const auto [aborted, output] = in_child([] {
    std::fputs("about to abort\n", stderr);
    std::abort();
  });
  CHECK(aborted);
  CHECK(output == "about to abort\n");
  const auto [aborted_normally, quiet] = in_child([] {});
  CHECK_FALSE(aborted_normally);
  CHECK(quiet.empty());
}
