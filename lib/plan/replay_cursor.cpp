// A planned run's place in the plans it replays, out of line: the start in an arena, plan switches,
// the overlap checks a blocked region needs, and the end (replay_cursor.hpp).
#include "plan/replay_cursor.hpp"

#include <algorithm>
#include <mutex>

namespace refpool::detail {

namespace {
bool overlap(std::size_t a, std::size_t an, std::size_t b, std::size_t bn) noexcept { return a < b + bn && b < a + an; }
}  // namespace

void replay_cursor::start(plan& first, arena& a) {
  arena_ = &a;
  current_ = &first;
  generation_ = ++a.generation;
  try {
    // Regions of finished runs still live pin their bytes: this run must not hand those out.
    std::lock_guard guard(a.pinned_mutex);
    a.drop_released_pins_locked();
    foreign_.reserve(a.pinned.size());
    for (const pinned_region& p : a.pinned) {
      // Released since it was read live, by the plan's last region: the plan is being
      // destroyed, and its entries go as soon as this lock is free (pinned_region).
      if (!p.owner->retain_if_owned()) continue;
      foreign_.push_back({p.owner, p.index, p.live_state});
    }
  } catch (...) {
    a.unclaim();
    arena_ = nullptr;
    current_ = nullptr;
    throw;
  }
}

bool replay_cursor::blocked(std::uint64_t at) {
  const plan& p = *current_;
  const std::size_t from = p.offset(at);
  const std::size_t span = p.span(at);
  std::erase_if(overdue_, [&](std::uint32_t j) {
    return p.state(j).state.load(std::memory_order_acquire) != region_state::live_in(generation_);
  });
  for (std::uint32_t j : overdue_) {
    if (overlap(from, span, p.offset(j), p.span(j))) {
      stale_ = true;  // a release later than recorded: the plan's lifetimes no longer hold
      return true;
    }
  }
  bool hit = false;
  std::erase_if(foreign_, [&](const foreign_region& f) {
    if (f.owner->state(f.index).state.load(std::memory_order_acquire) != f.live_state) {
      f.owner->release();
      return true;
    }
    hit = hit || overlap(from, span, f.owner->offset(f.index), f.owner->span(f.index));
    return false;
  });
  return hit;
}

bool replay_cursor::switch_to(const std::vector<plan*>& candidates, const planned_request& request, std::uint64_t at) {
  for (plan* c : candidates) {
    if (c == current_ || c->size() <= at || &c->memory() != arena_ || !(c->request(at) == request)) continue;
    if (!std::equal(c->requests().begin(), c->requests().begin() + static_cast<std::ptrdiff_t>(at),
                    current_->requests().begin()))
      continue;
    // The regions this run holds of the plan it leaves may share bytes with the new plan's.
    const std::uint64_t held = region_state::live_in(generation_);
    std::size_t live = 0;
    for (std::uint64_t p = segment_from_; p < at; ++p)
      live += current_->state(p).state.load(std::memory_order_acquire) == held;
    foreign_.reserve(foreign_.size() + live);
    segments_.reserve(segments_.size() + 1);
    for (std::uint64_t p = segment_from_; p < at; ++p) {
      if (current_->state(p).state.load(std::memory_order_acquire) != held) continue;
      current_->retain();
      foreign_.push_back({current_, static_cast<std::uint32_t>(p), held});
    }
    segments_.push_back({current_, segment_from_, at});
    current_ = c;
    segment_from_ = at;
    overdue_.clear();
    due_processed_ = at;
    return true;
  }
  return false;
}

std::size_t replay_cursor::settle(std::uint64_t end, std::vector<lifetime>* lifetimes) noexcept {
  if (arena_ == nullptr) return 0;
  segments_.push_back({current_, segment_from_, std::min(end, replayed_to_)});
  std::vector<pinned_region> pins;
  const std::uint64_t held = region_state::live_in(generation_);
  for (const segment& s : segments_) {
    for (std::uint64_t p = s.from; p < s.to; ++p) {
      region_state& st = s.owner->state(p);
      std::uint64_t seen = st.state.load(std::memory_order_acquire);
      if (region_state::generation_of(seen) != generation_) continue;  // never handed out by this run
      if (seen == held) {
        s.owner->retain();  // the region's: it keeps its plan alive until released
        if (st.state.compare_exchange_strong(seen, held | region_state::holds_plan, std::memory_order_acq_rel)) {
          pins.push_back({s.owner, static_cast<std::uint32_t>(p), held | region_state::holds_plan});
          if (lifetimes != nullptr) (*lifetimes)[p] = {p, end + 1};  // escaped: alive to the end
          continue;
        }
        s.owner->release();  // released meanwhile
      }
      // Released, and the arena is still ours: its release position is this run's.
      if (lifetimes != nullptr) (*lifetimes)[p] = {p, st.released_at.load(std::memory_order_relaxed)};
    }
  }
  for (const foreign_region& f : foreign_) f.owner->release();
  foreign_.clear();
  {
    std::lock_guard guard(arena_->pinned_mutex);
    arena_->drop_released_pins_locked();
    arena_->pinned.insert(arena_->pinned.end(), pins.begin(), pins.end());
    idle_at_end_ = arena_->pinned.empty();
  }
  return pins.size();
}

void replay_cursor::leave_arena() noexcept {
  if (arena_ == nullptr) return;
  // No region live: the heap may yield its bytes until the next claim. Pinned: it stays held, and
  // a later run's end idles it once its regions went. After the serving section (idling takes the
  // cache's and the heap's locks, which a request waiting to be served need not wait for), and
  // before the claim goes (an idle span must not be one another run holds again already).
  if (idle_at_end_) arena_->idle();
  arena_->unclaim();
  // Pinned at the end: the last pinned region's release idles the span, unless it came while this
  // run still held the claim (idle_if_unpinned found the arena claimed). Checked once more now.
  if (!idle_at_end_) arena_->idle_if_unpinned();
}

std::size_t replay_cursor::replayed_peak() const noexcept {
  std::size_t peak = 0;  // counted whole when any region was handed out: an upper bound
  for (const segment& s : segments_)
    if (s.to > s.from) peak = std::max(peak, s.owner->peak_live_bytes());
  return peak;
}

void replay_cursor::fill_recording(std::vector<planned_request>& sequence, const std::vector<lifetime>& lifetimes,
                                   std::vector<bool>& known) const {
  for (const segment& s : segments_) {
    for (std::uint64_t p = s.from; p < s.to; ++p) {
      if (lifetimes[p].second == 0) continue;
      sequence[p] = s.owner->request(p);
      known[p] = true;
    }
  }
}

}  // namespace refpool::detail
