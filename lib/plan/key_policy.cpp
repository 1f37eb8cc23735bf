// The policy of a plan key at its runs' boundaries: a run begins (learning, probing or passing),
// ends (counted, its plan marked used, its recording adopted, pauses), and whether the key's
// sequences repeat (repeat_detector), which moves it between learning and passing.
#include "plan/key_policy.hpp"

#include <algorithm>
#include <bit>
#include <utility>

#include "plan/run.hpp"
#include "plan/store.hpp"

namespace refpool::detail {

// ---- the detector ---------------------------------------------------------------------------

repeat_detector::change repeat_detector::observe(std::uint64_t runs, std::uint64_t fp, bool replayed,
                                                 std::size_t longest_run) noexcept {
  // The budget holds for what the key keeps from now on, not only when it grew: a key whose runs
  // became longer since keeps fewer plans (never fewer than first_capacity). Computed again only
  // when the longest run changed (a division).
  if (longest_run != budget_run_) [[unlikely]] {
    budget_run_ = longest_run;
    budget_ = std::clamp<std::size_t>(planned_requests_per_key / std::max<std::size_t>(longest_run, 1),
                                      first_capacity, ring);
    capacity_ = std::min(capacity_, budget_);
  }
  bool repeated = replayed;
  std::size_t far = 0;
  for (std::size_t back = 1; back <= ring && !repeated && far == 0 && fp != fingerprint::unknown; ++back) {
    if (fingerprints_[(next_ + ring - back) % ring] != fp) continue;
    repeated = back <= capacity_;
    far = repeated ? 0 : back;
  }
  fingerprints_[next_] = fp;
  far_[next_] = static_cast<std::uint8_t>(far);
  next_ = (next_ + 1) % ring;
  repeats_ = repeats_ << 1 | (repeated ? 1u : 0u);
  far_repeats_ = far_repeats_ << 1 | (far != 0 ? 1u : 0u);
  runs_in_mode_ += 1;
  const bool few = static_cast<unsigned>(std::popcount(repeats_)) < min_repeats;
  if (!passing_) {
    if (runs_in_mode_ < window) return change::none;
    // Far repeats grow the capacity whether or not near ones are many: a loop that partly
    // repeats nearby (24 shapes in random order) replays what it keeps and could keep more.
    if (const std::size_t grown = capacity_for_far_repeats(); grown != 0) {
      capacity_ = grown;
      runs_in_mode_ = 0;
      return change::grow;
    }
    if (!few) return change::none;
    passing_ = true;
    runs_in_mode_ = 0;
    pass_until_ = runs + next_pass_;
    return change::enter_pass;
  }
  if (runs < pass_until_ + window) return change::none;  // passing, or probing
  // The probe window ended: the last `window` runs were its probes.
  const std::size_t grown = capacity_for_far_repeats();
  if (few && grown == 0) {
    next_pass_ = std::min(2 * next_pass_, longest_pass);
    pass_until_ = runs + next_pass_;
    return change::none;
  }
  capacity_ = std::max(capacity_, grown);
  passing_ = false;
  runs_in_mode_ = 0;
  next_pass_ = first_pass;
  return change::learn_again;
}

std::size_t repeat_detector::capacity_for_far_repeats() const noexcept {
  if (static_cast<unsigned>(std::popcount(far_repeats_)) < min_repeats) return 0;  // most runs end here
  std::size_t farthest = 0;
  for (std::size_t back = 1; back <= window; ++back) farthest = std::max<std::size_t>(farthest, far_[(next_ + ring - back) % ring]);
  // A power of two (fewer growths) that reaches the farthest, or as far as the budget allows,
  // where it makes `min_repeats` of them near.
  const std::size_t grown = std::min(std::bit_ceil(farthest), budget_);
  if (grown <= capacity_) return 0;
  unsigned reached = 0;
  for (std::size_t back = 1; back <= window; ++back) {
    const std::size_t d = far_[(next_ + ring - back) % ring];
    reached += d != 0 && d <= grown ? 1 : 0;
  }
  return reached >= min_repeats ? grown : 0;
}

// ---- runs -----------------------------------------------------------------------------------

plan_run* plan_store::begin_run(std::string_view key, bool shared, pass_ticket& passing) {
  std::lock_guard guard(mutex_);
  auto found = std::find_if(keys_.begin(), keys_.end(), [&](const auto& k) { return k->name == key; });
  if (found == keys_.end()) {
    auto made = std::make_unique<key_state>();
    made->name = key;
    made->next_pause = first_pause;
    keys_.push_back(std::move(made));
    found = keys_.end() - 1;
  }
  key_state& k = **found;
  const run_kind kind = k.repeats.kind_at(k.runs);
  if (kind == run_kind::pass) {
    passing.begin(*this, &k);
    return nullptr;
  }
  // A key that probes has no plans (entering pass dropped them) and records nothing.
  std::vector<std::pair<std::uint64_t, plan*>> order;
  order.reserve(k.plans.size());
  for (std::size_t i = 0; i < k.plans.size(); ++i) order.emplace_back(k.last_used[i], k.plans[i]);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<plan*> candidates;
  candidates.reserve(order.size());
  for (const auto& [used, p] : order) candidates.push_back(p);
  active_.reserve(active_.size() + 1);
  const bool may_record = !closed_ && k.runs >= k.paused_until && kind == run_kind::learn;
  auto* run = new plan_run(cache_, *this, &k, kind, std::move(candidates), may_record, shared);  // retains them
  active_.push_back(run);  // room was reserved
  return run;
}

void pass_ticket::end() noexcept {
  if (key_ != nullptr) std::exchange(store_, nullptr)->end_pass(std::exchange(key_, nullptr));
}

void plan_store::end_pass(key_state* key) noexcept {
  std::lock_guard guard(mutex_);
  key->runs += 1;
  pass_runs_ += 1;
  (void)key->repeats.observe(key->runs, fingerprint::unknown, false, key->longest_run);
}

void plan_store::end_run(plan_run* run, key_state* key, run_outcome outcome) noexcept {
  bool reclaim = false;
  bool passing = false;
  {
    std::lock_guard guard(mutex_);
    hits_ += outcome.hits;
    misses_ += outcome.misses;
    busy_runs_ += outcome.busy ? 1 : 0;
    unrecorded_runs_ += outcome.unrecorded ? 1 : 0;
    probe_runs_ += outcome.probed ? 1 : 0;
    std::erase(active_, run);
    key->runs += 1;
    key->peak_plan_live = std::max(key->peak_plan_live, outcome.replayed_peak);
    key->longest_run = std::max(key->longest_run, outcome.requests);
    // The first replay after a plan joined: what the recording runs left in the plain path (their
    // escapes, released during this run) has no use beside the arena. Only then: a paused key
    // whose runs alternate between replays and the plain cache would otherwise empty it each time.
    reclaim = outcome.used != nullptr && key->reclaim_at_replay;
    if (outcome.used != nullptr) {
      key->reclaim_at_replay = false;
      auto it = std::find(key->plans.begin(), key->plans.end(), outcome.used);
      if (it != key->plans.end()) key->last_used[static_cast<std::size_t>(it - key->plans.begin())] = ++clock_;
    }
    const auto change =
        key->repeats.observe(key->runs, outcome.fingerprint, outcome.used != nullptr, key->longest_run);
    passing = change == repeat_detector::change::enter_pass;
    pass_entries_ += passing ? 1 : 0;
    if (change == repeat_detector::change::learn_again || change == repeat_detector::change::grow) {
      // Its traffic changed since it passed, or its loop is longer than it kept: a pause from
      // before (against re-recording the sequences it could not keep) would keep it from
      // recording, and so from repeating, and it would pass again.
      key->paused_until = key->runs;
      key->next_pause = first_pause;
      key->rerecordings = 0;
    }
  }
  if (reclaim) reclaim_plain_memory(*outcome.used->request(0).key.backend);
  if (passing) {
    delete outcome.made;  // a sequence of a key that does not repeat: no plan
    enter_pass(*key);
    return;
  }
  unsigned rerecorded = 0;  // plans (or pending recordings) this run's recording replaced or dropped
  if (outcome.made != nullptr || outcome.busy_other_key) {
    // One end at a time decides, places (O(n log n) a plan) and adds, so that two ends of a key
    // agree on its pending sequences; only other ends that add plans wait here, no request.
    const std::lock_guard growing(growth_mutex_);
    std::vector<plan*> made;
    if (outcome.made != nullptr) rerecorded = adopt(*key, outcome.made, made) ? 1 : 0;
    for (plan* p : made) rerecorded += add_plan(*key, p) ? 1 : 0;
    if (outcome.busy_other_key) move_to_own_arena(*key);
  }
  std::lock_guard guard(mutex_);
  // One bit a run, or one a re-recording: a run whose sequence came again turns every pending
  // recording into a plan, and each may drop one (24 shapes in random order drop a few every
  // few runs, each time an arena growth and the plain path's memory given back).
  const unsigned n = std::min(rerecorded, thrash_window);
  key->rerecordings = (key->rerecordings << std::max(n, 1u) | ((1u << n) - 1)) & ((1u << thrash_window) - 1);
  if (static_cast<unsigned>(std::popcount(key->rerecordings)) >= thrash_rerecordings) {
    // It keeps recording: every recording is a run of uncached driver allocations. Stop for a
    // while (its plans still replay; other runs use the plain cache), longer each time.
    key->paused_until = key->runs + key->next_pause;
    key->next_pause = std::min(key->next_pause * 2, longest_pause);
    key->rerecordings = 0;
    pauses_ += 1;
  }
}

void plan_store::abandon_run(plan_run* run) noexcept {
  std::lock_guard guard(mutex_);
  std::erase(active_, run);
}

// Nothing of the key is worth keeping: its plans replay no run and its pending sequences do not
// come again. What they held goes now (a key in pass holds no arena while the plain path serves it).
void plan_store::enter_pass(key_state& key) noexcept {
  std::vector<plan*> dropped;
  std::vector<recording*> pending;
  std::vector<arena*> freed;
  {
    const std::lock_guard growing(growth_mutex_);  // no plan is being added meanwhile
    std::lock_guard guard(mutex_);
    pending = std::move(key.pending);
    key.pending.clear();
    for (std::size_t i = key.plans.size(); i-- > 0;) drop(key, i, dropped);
    key.rerecordings = 0;
    // A group whose arena no plan of any key is bound to any more lets it go.
    for (std::size_t g = groups_.size(); g-- > 0;) {
      bool bound = false;
      for (const auto& k : keys_)
        for (const plan* p : k->plans) bound = bound || &p->memory() == groups_[g].memory;
      if (bound) continue;
      freed.push_back(groups_[g].memory);
      groups_[g] = groups_.back();
      groups_.pop_back();
    }
  }
  for (recording* r : pending) delete r;
  for (plan* p : dropped) p->release();
  for (arena* a : freed) a->release();  // its memory goes with its last plan, run and pinned region
}

}  // namespace refpool::detail
