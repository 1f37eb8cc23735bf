// What a planned run records of its blocks that are not regions (recorder.hpp).
#include "plan/recorder.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

namespace refpool::detail {

void run_recorder::reserve() {
  std::lock_guard guard(lock_);
  // Geometric: reserving size + 1 reallocated (and copied) every request, quadratic in the run's
  // length (42% of the time of a 7,453-request recording run).
  if (tracked_.size() == tracked_.capacity()) tracked_.reserve(std::max<std::size_t>(64, 2 * tracked_.capacity()));
}

void run_recorder::track(block* b, const planned_request& request, std::uint64_t at,
                         release_observer* observer) noexcept {
  const bool cached = b->origin == block_origin::cached;
  std::lock_guard guard(lock_);
  b->observer = observer;
  b->observer_index = static_cast<std::uint32_t>(tracked_.size());
  tracked_.push_back({request, at, 0, true, cached});  // room was reserved
  if (!cached) ++uncached_live_;
  if (first_backend_ == nullptr) {
    first_backend_ = b->backend;
    first_backend_->retain();
  }
}

void run_recorder::released(std::uint32_t index, const replay_cursor& cursor) noexcept {
  std::lock_guard guard(lock_);
  tracked& t = tracked_[index];
  if (!finished_) {  // after the end the recording sees it alive to the end, as it was
    t.released_at = cursor.position();
    t.live = false;
  }
  if (!t.cached) --uncached_live_;
}

std::size_t run_recorder::finish() noexcept {
  std::lock_guard guard(lock_);
  finished_ = true;  // lifetimes are final: later releases only mark their block released
  return uncached_live_;
}

void run_recorder::fill_recording(std::uint64_t end, std::vector<planned_request>& sequence,
                                  std::vector<lifetime>& lifetimes, std::vector<bool>& known) const {
  std::lock_guard guard(lock_);
  for (const tracked& t : tracked_) {
    if (t.position >= end) continue;
    sequence[t.position] = t.request;
    lifetimes[t.position] = {t.position, t.live ? end + 1 : t.released_at};
    known[t.position] = true;
  }
}

void run_recorder::release_backend() noexcept {
  if (first_backend_ != nullptr) std::exchange(first_backend_, nullptr)->release();
}

}  // namespace refpool::detail
