// Out-of-memory messages: place and advice (oom_text.hpp).
#include "cache/oom_text.hpp"

#include <fmt/format.h>

#include "byte_text.hpp"

namespace refpool::detail {

std::string memory_place(int device) {
  return device < 0 ? std::string("of host memory") : fmt::format("on device {}", device);
}

std::string oom_advice(const cache_stats& now) {
  std::string advice = "What to do: ";
  if (now.allocated_bytes != 0)
    advice += fmt::format("release buffers no longer needed ({} live in this cache); ", scaled_bytes(now.allocated_bytes));
  const std::size_t unused = now.reserved_bytes > now.allocated_bytes ? now.reserved_bytes - now.allocated_bytes : 0;
  if (unused != 0)
    advice += fmt::format(
        "{} is reserved here but not handed out (idle blocks of other backends, free ranges of segments, plan "
        "arenas): reclaim() or end the steps that keep it; ",
        scaled_bytes(unused));
  advice +=
      "if other caches or processes use the same memory, call reclaim() on those caches (refpool_cache_reclaim; "
      "the framework allocator's empty_cache) or give them an idle limit (REFPOOL_CONF=max_idle_bytes:<bytes>, "
      "set_max_idle_bytes) so they keep less idle memory.";
  return advice;
}

}  // namespace refpool::detail
