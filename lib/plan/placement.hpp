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

/// Runs shorter than this are placed by a walk over every placed request for each new one
/// (about 1 ns a pair: at most 2 ms); longer ones by finding only the placed requests alive
/// together with the new one (O(log n + k) for k of them, and a sort of those).
inline constexpr std::size_t greedy_walk_below = 2048;
/// Placed requests alive together with a new one that greedy by size may visit, on average over a
/// long run's requests: O(n log n) work in all. The traces of bench/traces visit 34-79 (GPT-2
/// serving and training steps); runs where hundreds of requests are alive together go to best fit.
inline constexpr std::size_t greedy_visits_per_request = 128;

/// Offsets for `sizes` with the given lifetimes, greedy by size: largest first (ties by first
/// use), each at the lowest offset that overlaps no placed request alive at the same time. A
/// run of greedy_walk_below requests or more that would visit more than greedy_visits_per_request
/// placed requests alive together per request is placed by best fit in the order of first use
/// instead. Sizes are rounded up to
/// `alignment`. Returns the offsets and the arena size. O(n log n). Throws size_error when a size
/// computation would wrap around.
std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment);

/// Greedy by size as place_greedy_by_size places short runs, whatever the run's length: a walk over
/// every placed request for each new one (quadratic where lifetimes do not overlap). The same
/// offsets where place_greedy_by_size does not fall back to best fit; for comparisons
/// (bench/placement.cpp). Throws size_error when a size computation would wrap around.
std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_walk(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment);

/// The highest sum of `sizes` alive at one position.
std::size_t peak_live_bytes(const std::vector<std::size_t>& sizes, const std::vector<lifetime>& lifetimes);

}  // namespace refpool::detail
