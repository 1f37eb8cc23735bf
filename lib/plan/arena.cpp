// Arenas: one run at a time, the regions they pin, and the streams released regions leave to wait for.
#include "plan/arena.hpp"

#include <algorithm>
#include <utility>

#include <refpool/resource.hpp>

#include "plan/plan.hpp"

namespace refpool::detail {

namespace {
// The arena whose memory the calling thread is committing: the out-of-memory ladder of that commit
// must not decommit it (decommit_if_unused), nor lock its memory mutex again.
thread_local const arena* committing_on_thread = nullptr;

class committing {
 public:
  explicit committing(const arena* a) noexcept : outer_(std::exchange(committing_on_thread, a)) {}
  ~committing() { committing_on_thread = outer_; }
  committing(const committing&) = delete;
  committing& operator=(const committing&) = delete;

 private:
  const arena* outer_;
};
}  // namespace

arena::arena(arena_source& source, backend_state& backend, stream_ref stream) : source_(source) {
  memory_.backend = &backend;
  memory_.stream = stream;
  backend.retain();
}

arena::~arena() {
  source_.free(memory_);
  memory_.backend->release();
}

void arena::free_memory() noexcept {
  retire();
  std::lock_guard guard(memory_mutex_);
  source_.free(memory_);
  lent_.store(0, std::memory_order_relaxed);
}

bool arena::claim(const void* run, const void* key) noexcept {
  if (retired()) return false;
  const void* none = nullptr;
  if (!claimed_by_.compare_exchange_strong(none, run, std::memory_order_acquire, std::memory_order_relaxed))
    return false;
  if (retired()) {  // retired while we claimed: give it back
    unclaim();
    return false;
  }
  claimed_key_.store(key, std::memory_order_relaxed);
  return true;
}

growth_in_place arena::grow_in_place(std::size_t bytes) {
  std::lock_guard guard(memory_mutex_);
  const committing marked(this);
  return source_.grow_in_place(memory_, bytes);
}

bool arena::recommit() {
  std::lock_guard guard(memory_mutex_);
  const committing marked(this);
  if (!source_.recommit(memory_)) return false;
  lent_.store(0, std::memory_order_relaxed);
  return true;
}

std::size_t arena::decommit_if_unused(const void* claimant) noexcept {
  if (committing_on_thread == this || !claim(claimant, nullptr)) return 0;
  std::size_t freed = 0;
  if (unpinned()) {
    std::unique_lock guard(memory_mutex_, std::try_to_lock);
    if (guard.owns_lock()) {
      freed = memory_.committed.load(std::memory_order_relaxed);
      source_.decommit(memory_);
    }
  }
  unclaim();
  return freed;
}

void arena::drop_released_pins_locked() noexcept {
  std::erase_if(pinned, [](const pinned_region& p) {
    return p.owner->state(p.index).state.load(std::memory_order_acquire) != p.live_state;
  });
}

bool arena::unpinned() noexcept {
  std::lock_guard guard(pinned_mutex);
  drop_released_pins_locked();
  return pinned.empty();
}

void arena::add_waits(const std::vector<stream_ref>& streams) {
  std::lock_guard guard(waits_lock_);
  for (stream_ref s : streams)
    if (s != memory_.stream && std::find(waits_.begin(), waits_.end(), s) == waits_.end()) waits_.push_back(s);
  waits_pending_.store(!waits_.empty(), std::memory_order_release);
}

void arena::wait_for_pending(stream_ref consumer) {
  std::lock_guard guard(waits_lock_);
  for (auto it = waits_.begin(); it != waits_.end(); it = waits_.erase(it))
    if (*it != consumer) memory_.backend->res().order_streams(*it, consumer);
  waits_pending_.store(false, std::memory_order_release);
}

}  // namespace refpool::detail
