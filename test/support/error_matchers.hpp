// Catch2 matchers for refpool's exceptions, for CHECK_THROWS_MATCHES (which checks the type first,
// then the matcher, and prints the message when either fails):
//
//   CHECK_THROWS_MATCHES(a.reshape({3, 5}), shape_error, what(Contains("(4, 4)") && Contains("(3, 5)")));
//   CHECK_THROWS_MATCHES(allocate(be, 2048), out_of_memory, oom_for(2048, -1) && what(Contains("2.93 KiB live")));
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::test {

/// Matches a refpool::error whose what() satisfies a Catch2 string matcher (Contains, EndsWith,
/// StartsWith, Equals, Matches, and their && and || combinations).
template <class StringMatcher>
class what_matcher final : public Catch::MatcherBase<refpool::error> {
 public:
  explicit what_matcher(StringMatcher message) : message_(std::move(message)) {}
  bool match(const refpool::error& e) const override { return message_.match(e.what()); }
  std::string describe() const override { return "has a message that " + message_.describe(); }

 private:
  StringMatcher message_;
};

/// A refpool::error whose message satisfies `message`.
template <class StringMatcher>
[[nodiscard]] what_matcher<StringMatcher> what(StringMatcher message) {
  return what_matcher<StringMatcher>(std::move(message));
}

/// Matches an out_of_memory for a request of `requested_bytes` on `device` (-1: host).
class oom_matcher final : public Catch::MatcherBase<refpool::error> {
 public:
  oom_matcher(std::size_t requested_bytes, int device) : requested_bytes_(requested_bytes), device_(device) {}
  bool match(const refpool::error& e) const override {
    const auto* oom = dynamic_cast<const refpool::out_of_memory*>(&e);
    return oom != nullptr && oom->requested_bytes() == requested_bytes_ && oom->device() == device_;
  }
  std::string describe() const override {
    return fmt::format("is an out_of_memory for {} B on device {}", requested_bytes_, device_);
  }

 private:
  std::size_t requested_bytes_;
  int device_;
};

/// An out_of_memory for a request of `requested_bytes` on `device` (-1: host).
[[nodiscard]] inline oom_matcher oom_for(std::size_t requested_bytes, int device) { return {requested_bytes, device}; }

}  // namespace refpool::test
