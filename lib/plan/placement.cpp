// Greedy-by-size placement (TFLite's and XLA's heap simulators do the same) and the peak of live
// bytes of a recorded run.
#include "plan/placement.hpp"

#include <algorithm>
#include <numeric>

#include "plan/checked_size.hpp"

namespace refpool::detail {

std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment) {
  const std::size_t n = sizes.size();
  std::vector<std::size_t> rounded(n);
  for (std::size_t i = 0; i < n; ++i) rounded[i] = checked_round_up(sizes[i], alignment, "a planned request");
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // Largest first; ties by first use, so the result does not depend on sort stability.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return rounded[a] != rounded[b] ? rounded[a] > rounded[b] : lifetimes[a].first < lifetimes[b].first;
  });
  std::vector<std::size_t> offsets(n, 0);
  // Placed requests by offset, so that each new one walks them in address order without sorting
  // (sorting the overlapping ones per request took 15 ms of a 1,200-request recording on the
  // host: a step that learned a new sequence of GPT-2 training paid it on the GPU's critical path).
  std::vector<std::size_t> by_offset;
  by_offset.reserve(n);
  std::size_t arena = 0;
  for (std::size_t i : order) {
    const std::size_t bytes = rounded[i];
    std::size_t at = 0;
    for (std::size_t j : by_offset) {
      if (lifetimes[j].first >= lifetimes[i].second || lifetimes[i].first >= lifetimes[j].second) continue;
      if (offsets[j] >= checked_add(at, bytes, "a placement")) break;  // the gap before this one fits
      at = std::max(at, offsets[j] + rounded[j]);                      // ends were checked when j was placed
    }
    offsets[i] = at;
    arena = std::max(arena, checked_add(at, bytes, "an arena"));
    const auto later = std::upper_bound(by_offset.begin(), by_offset.end(), at,
                                        [&](std::size_t offset, std::size_t j) { return offset < offsets[j]; });
    by_offset.insert(later, i);
  }
  return {offsets, arena};
}

std::size_t peak_live_bytes(const std::vector<std::size_t>& sizes, const std::vector<lifetime>& lifetimes) {
  // Releases at a position come before the allocation at it (they happened before it).
  std::vector<std::pair<std::uint64_t, std::size_t>> allocs, releases;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    allocs.emplace_back(lifetimes[i].first, sizes[i]);
    releases.emplace_back(lifetimes[i].second, sizes[i]);
  }
  std::sort(allocs.begin(), allocs.end());
  std::sort(releases.begin(), releases.end());
  std::size_t live = 0, peak = 0, r = 0;
  for (const auto& [at, bytes] : allocs) {
    for (; r < releases.size() && releases[r].first <= at; ++r) live -= releases[r].second;
    live = checked_add(live, bytes, "the live bytes of a run");
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace refpool::detail
