// serving_lock (serving_lock.hpp): the owner's way in, and the handover.
#include "plan/serving_lock.hpp"

namespace refpool::detail {

// Everything lock() does not: the owner while an intruder is at its record (through the gate), a
// record taken meanwhile, and the handover.
serving_lock::ticket serving_lock::lock_slow() noexcept {
  const void* const me = this_thread_token();
  for (;;) {
    record* const r = current_.load(std::memory_order_acquire);
    if (r == nullptr || r->thread != me) return take_over(me);
    const bool fast = r->lock.owner_enter();
    // A taker publishes its record only while intruding on this one: entered (fast or through the
    // gate) and still current, this thread serves alone; else the record was taken meanwhile.
    if (current_.load(std::memory_order_acquire) == r) [[likely]]
      return {r, fast ? ticket::way::owner_fast : ticket::way::owner_slow};
    r->lock.owner_leave(fast);
  }
}

serving_lock::ticket serving_lock::take_over(const void* me) noexcept {
  handover_.lock();
  record* const old = current_.load(std::memory_order_relaxed);
  if (old == &shared_) return {nullptr, ticket::way::handover};  // handover_ alone excludes everyone now
  if (old != nullptr) old->lock.lock();  // its owner is out, and stays out until unlock
  record* const mine = used_ < max_records ? &records_[static_cast<std::size_t>(used_++)] : &shared_;
  if (mine != &shared_) mine->thread = me;
  current_.store(mine, std::memory_order_release);
  return {old, ticket::way::handover};
}

void serving_lock::unlock_slow(ticket t) noexcept {
  switch (t.how) {
    case ticket::way::owner_fast: t.entered->lock.owner_leave(true); return;
    case ticket::way::owner_slow: t.entered->lock.owner_leave(false); return;
    case ticket::way::handover:
      if (t.entered != nullptr) t.entered->lock.unlock();
      handover_.unlock();
      return;
  }
}

}  // namespace refpool::detail
