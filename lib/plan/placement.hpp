// Placement: where each request of a recorded run goes in its plan's arena. Lifetimes are in
// request positions: request i is allocated at position i and released at the position that
// counts the requests allocated before its release, so two requests are alive together exactly
// when each was allocated before the other's release.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace refpool::detail {

/// [allocated at, released at) in request positions; `released at` is past the run's last
/// position for a request still live at its end.
using lifetime = std::pair<std::uint64_t, std::uint64_t>;

/// Offsets for `sizes` with the given lifetimes, greedy by size: largest first (ties by first
/// use), each at the lowest offset that overlaps no placed request alive at the same time.
/// Sizes are rounded up to `alignment`. Returns the offsets and the arena size. Throws
/// size_error when a size computation would wrap around.
std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment);

/// The highest sum of `sizes` alive at one position.
std::size_t peak_live_bytes(const std::vector<std::size_t>& sizes, const std::vector<lifetime>& lifetimes);

}  // namespace refpool::detail
