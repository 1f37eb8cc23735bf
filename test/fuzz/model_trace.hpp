// The model's lines of the REFPOOL_FUZZ_TRACE trace, indented under the operation they belong to.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace refpool::test::fuzz {

inline const bool model_tracing = std::getenv("REFPOOL_FUZZ_TRACE") != nullptr;

template <class... Args>
void model_trace(fmt::format_string<Args...> format, Args&&... args) {
  if (model_tracing) fmt::print(stderr, "    model: {}\n", fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace refpool::test::fuzz
