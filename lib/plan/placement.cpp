// Greedy-by-size placement (TFLite's and XLA's heap simulators do the same), its bounded search
// for the requests alive together, best fit as the fallback, and the peak of live bytes of a
// recorded run.
#include "plan/placement.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

#include "plan/checked_size.hpp"

namespace refpool::detail {

namespace {

// The placed requests alive together with a new one, found without visiting the others: those
// alive at its start (a segment tree over positions holds each placed request in the O(log n)
// nodes that tile its lifetime: one of them is on the path to any position inside it), and those
// that start during it (a bitset over the requests in the order of their starts). O(log n + k)
// for k of them. The quadratic walk it replaces read every placed request for each new one: on 2
// cores under ASan, 6,366- and 8,045-request plans of key-less steps took seconds each (issue 35).
class placed_requests {
 public:
  explicit placed_requests(const std::vector<lifetime>& lifetimes) : lifetimes_(lifetimes) {
    const std::size_t n = lifetimes.size();
    for (const lifetime& l : lifetimes) {
      positions_.push_back(l.first);
      positions_.push_back(l.second);
    }
    std::sort(positions_.begin(), positions_.end());
    positions_.erase(std::unique(positions_.begin(), positions_.end()), positions_.end());
    while (leaves_ < positions_.size()) leaves_ *= 2;
    covering_.resize(2 * leaves_);
    by_start_.resize(n);
    std::iota(by_start_.begin(), by_start_.end(), std::size_t{0});
    std::sort(by_start_.begin(), by_start_.end(), [&](std::size_t a, std::size_t b) {
      return lifetimes[a].first != lifetimes[b].first ? lifetimes[a].first < lifetimes[b].first : a < b;
    });
    rank_.resize(n);
    for (std::size_t k = 0; k < n; ++k) rank_[by_start_[k]] = k;
    placed_.assign((n + 63) / 64, 0);
  }

  void place(std::size_t i) {
    placed_[rank_[i] / 64] |= std::uint64_t{1} << (rank_[i] % 64);
    // The nodes that tile [start, end) in position indices (bottom-up, as an iterative segment tree).
    std::size_t from = leaves_ + position(lifetimes_[i].first), to = leaves_ + position(lifetimes_[i].second);
    for (; from < to; from /= 2, to /= 2) {
      if (from % 2 == 1) covering_[from++].push_back(static_cast<std::uint32_t>(i));
      if (to % 2 == 1) covering_[--to].push_back(static_cast<std::uint32_t>(i));
    }
  }

  /// Appends the placed requests alive together with `life` to `out`. False (and `out` partial)
  /// when more than `budget` would be visited; the budget is what is left after.
  bool alive_during(const lifetime& life, std::size_t& budget, std::vector<std::size_t>& out) const {
    if (life.first >= life.second) return alive_during_empty(life, budget, out);
    // Alive at its start: on the path from the root to that position.
    for (std::size_t node = leaves_ + position(life.first); node != 0; node /= 2) {
      if (covering_[node].size() > budget) return false;
      budget -= covering_[node].size();
      out.insert(out.end(), covering_[node].begin(), covering_[node].end());
    }
    // Started after its start and before its end.
    const std::size_t from = first_rank_at_or_after(life.first + 1), to = first_rank_at_or_after(life.second);
    for (std::size_t word = from / 64; word * 64 < to; ++word) {
      std::uint64_t bits = placed_[word];
      if (word == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
      if (word == to / 64) bits &= (std::uint64_t{1} << (to % 64)) - 1;
      for (; bits != 0; bits &= bits - 1) {
        if (budget == 0) return false;
        budget -= 1;
        out.push_back(by_start_[word * 64 + static_cast<std::size_t>(__builtin_ctzll(bits))]);
      }
    }
    return true;
  }

 private:
  std::size_t position(std::uint64_t at) const {
    return static_cast<std::size_t>(std::lower_bound(positions_.begin(), positions_.end(), at) - positions_.begin());
  }
  std::size_t first_rank_at_or_after(std::uint64_t at) const {
    return static_cast<std::size_t>(
        std::lower_bound(by_start_.begin(), by_start_.end(), at,
                         [&](std::size_t j, std::uint64_t a) { return lifetimes_[j].first < a; }) -
        by_start_.begin());
  }
  // An empty lifetime [s, s) (none in a recording) meets what starts before s and ends after it.
  bool alive_during_empty(const lifetime& life, std::size_t& budget, std::vector<std::size_t>& out) const {
    for (std::size_t node = leaves_ + position(life.first); node != 0; node /= 2)
      for (const std::uint32_t j : covering_[node]) {
        if (lifetimes_[j].first >= life.first) continue;
        if (budget == 0) return false;
        budget -= 1;
        out.push_back(j);
      }
    return true;
  }

  const std::vector<lifetime>& lifetimes_;
  std::vector<std::uint64_t> positions_;  // every start and end, sorted, once each
  std::size_t leaves_ = 1;
  std::vector<std::vector<std::uint32_t>> covering_;  // per node: placed requests whose lifetime tiles it
  std::vector<std::size_t> by_start_;                 // requests by start (ties by index)
  std::vector<std::size_t> rank_;                     // request -> its place in by_start_
  std::vector<std::uint64_t> placed_;                 // bit per place in by_start_
};

// Best fit in the order of first use, as an allocator that knows every release would: each request
// takes the smallest free range that holds it (ties: the lowest), else the top of the arena grows.
// O(n log n) whatever the lifetimes. 0.1-5.8% more bytes than greedy by size on the steps of
// bench/traces: used only where that one would visit too much.
std::size_t place_best_fit(const std::vector<std::size_t>& rounded, const std::vector<lifetime>& lifetimes,
                           std::vector<std::size_t>& offsets) {
  const std::size_t n = rounded.size();
  std::vector<std::size_t> by_start(n), by_end(n);
  std::iota(by_start.begin(), by_start.end(), std::size_t{0});
  std::iota(by_end.begin(), by_end.end(), std::size_t{0});
  std::sort(by_start.begin(), by_start.end(), [&](std::size_t a, std::size_t b) {
    return lifetimes[a].first != lifetimes[b].first ? lifetimes[a].first < lifetimes[b].first : a < b;
  });
  std::sort(by_end.begin(), by_end.end(),
            [&](std::size_t a, std::size_t b) { return lifetimes[a].second < lifetimes[b].second; });
  std::map<std::size_t, std::size_t> free_at;             // offset -> bytes, below the top
  std::set<std::pair<std::size_t, std::size_t>> by_size;  // (bytes, offset) of the same ranges
  std::vector<bool> placed(n, false);
  std::size_t top = 0, arena = 0, released = 0;
  const auto give_back = [&](std::size_t at, std::size_t bytes) {
    auto next = free_at.lower_bound(at);
    if (next != free_at.end() && next->first == at + bytes) {
      bytes += next->second;
      by_size.erase({next->second, next->first});
      next = free_at.erase(next);
    }
    if (next != free_at.begin()) {
      const auto before = std::prev(next);
      if (before->first + before->second == at) {
        at = before->first;
        bytes += before->second;
        by_size.erase({before->second, before->first});
        free_at.erase(before);
      }
    }
    if (at + bytes == top) {
      top = at;  // the top of the arena comes down
      return;
    }
    free_at.emplace(at, bytes);
    by_size.emplace(bytes, at);
  };
  for (const std::size_t i : by_start) {
    // Releases at a position come before the allocation at it (not alive together).
    for (; released < n && lifetimes[by_end[released]].second <= lifetimes[i].first; ++released)
      if (placed[by_end[released]]) give_back(offsets[by_end[released]], rounded[by_end[released]]);
    const std::size_t bytes = rounded[i];
    const auto fit = by_size.lower_bound({bytes, 0});
    if (fit != by_size.end()) {
      const auto [range, at] = *fit;
      by_size.erase(fit);
      free_at.erase(at);
      if (range > bytes) {
        free_at.emplace(at + bytes, range - bytes);
        by_size.emplace(range - bytes, at + bytes);
      }
      offsets[i] = at;
    } else {
      offsets[i] = top;
      top = checked_add(top, bytes, "an arena");
      arena = std::max(arena, top);
    }
    placed[i] = true;
  }
  return arena;
}

// Greedy by size over a short run: for each request, a walk over every placed one in address order
// (placed requests by offset, so that the walk needs no sort). Quadratic, at about a nanosecond a
// pair: cheaper than finding the few alive together where the run is short.
std::size_t place_by_walk(const std::vector<std::size_t>& rounded, const std::vector<lifetime>& lifetimes,
                          const std::vector<std::size_t>& order, std::vector<std::size_t>& offsets) {
  std::vector<std::size_t> by_offset;
  by_offset.reserve(order.size());
  std::size_t arena = 0;
  for (const std::size_t i : order) {
    const std::size_t bytes = rounded[i];
    std::size_t at = 0;
    for (const std::size_t j : by_offset) {
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
  return arena;
}

// Greedy by size over a long run: for each request, only the placed ones alive together with it
// (placed_requests), sorted by offset. Best fit instead when they are too many (the budget).
std::size_t place_by_lifetimes(const std::vector<std::size_t>& rounded, const std::vector<lifetime>& lifetimes,
                               const std::vector<std::size_t>& order, std::vector<std::size_t>& offsets) {
  placed_requests placed(lifetimes);
  std::size_t budget = greedy_visits_per_request * order.size();
  std::vector<std::size_t> together;
  std::vector<std::pair<std::size_t, std::size_t>> spans;  // [offset, end) of those, in address order
  std::size_t arena = 0;
  for (const std::size_t i : order) {
    together.clear();
    if (!placed.alive_during(lifetimes[i], budget, together)) {
      std::fill(offsets.begin(), offsets.end(), 0);
      return place_best_fit(rounded, lifetimes, offsets);
    }
    spans.clear();
    for (const std::size_t j : together)
      spans.emplace_back(offsets[j], offsets[j] + rounded[j]);  // checked when placed
    std::sort(spans.begin(), spans.end());
    // The lowest gap between them that holds this one, as place_by_walk finds it.
    const std::size_t bytes = rounded[i];
    std::size_t at = 0;
    for (const auto& [from, to] : spans) {
      if (from >= checked_add(at, bytes, "a placement")) break;
      at = std::max(at, to);
    }
    offsets[i] = at;
    arena = std::max(arena, checked_add(at, bytes, "an arena"));
    placed.place(i);
  }
  return arena;
}

// Greedy by size, placed by `place` (place_by_walk or place_by_lifetimes): sizes rounded up to
// `alignment`, largest first, ties by first use (so that the result does not depend on sort
// stability).
template <class Place>
std::pair<std::vector<std::size_t>, std::size_t> place_largest_first(const std::vector<std::size_t>& sizes,
                                                                     const std::vector<lifetime>& lifetimes,
                                                                     std::size_t alignment, Place&& place) {
  const std::size_t n = sizes.size();
  std::vector<std::size_t> rounded(n);
  for (std::size_t i = 0; i < n; ++i) rounded[i] = checked_round_up(sizes[i], alignment, "a planned request");
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return rounded[a] != rounded[b] ? rounded[a] > rounded[b] : lifetimes[a].first < lifetimes[b].first;
  });
  std::vector<std::size_t> offsets(n, 0);
  const std::size_t arena = place(rounded, lifetimes, order, offsets);
  return {offsets, arena};
}

}  // namespace

std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_size(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment) {
  return place_largest_first(sizes, lifetimes, alignment,
                             sizes.size() < greedy_walk_below ? place_by_walk : place_by_lifetimes);
}

std::pair<std::vector<std::size_t>, std::size_t> place_greedy_by_walk(const std::vector<std::size_t>& sizes,
                                                                      const std::vector<lifetime>& lifetimes,
                                                                      std::size_t alignment) {
  return place_largest_first(sizes, lifetimes, alignment, place_by_walk);
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
