// Which operation each input byte runs, and on which thread; what follows every operation (the
// checks, the segment cache's step, the periodic pattern check); and repeats of a few operations.
#include "session.hpp"

namespace refpool::test::fuzz {

// Runs the next few operations again and again, as a training loop repeats its body: later
// rounds meet the blocks earlier rounds released.
void session::op_repeat(int) {
  if (repeating_) return;
  const std::size_t body = 2 + in_.below(7);
  const std::size_t rounds = 2 + in_.below(3);
  trace("repeat the next {} operations {} times", body, rounds);
  const reader start = in_;
  repeating_ = true;
  for (std::size_t round = 0; round < rounds; ++round) {
    in_ = start;
    for (std::size_t k = 0; k < body && !in_.empty() && steps_ < max_operations; ++k) step();
  }
  repeating_ = false;
}

void session::step() {
  static constexpr op table[] = {
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc,
      &session::op_alloc_raw,
      &session::op_alloc_misuse,
      &session::op_drop,
      &session::op_drop,
      &session::op_drop,
      &session::op_copy,
      &session::op_copy,
      &session::op_move,
      &session::op_ref_out,
      &session::op_reshape,
      &session::op_reinterpret,
      &session::op_view,
      &session::op_unsafe_free,
      &session::op_unsafe_free,
      &session::op_access,
      &session::op_write,
      &session::op_record_stream,
      &session::op_scope,
      &session::op_scope,
      &session::op_guard,
      &session::op_close,
      &session::op_close,
      &session::op_close_misuse,
      &session::op_reclaim,
      &session::op_set_limit,
      &session::op_arm,
      &session::op_recreate,
      &session::op_verify,
      &session::op_repeat,
      &session::op_repeat,
      &session::op_in_flight,
      &session::op_step,
      &session::op_cache_alloc,
      &session::op_cache_alloc,
      &session::op_planned_loop,
      &session::op_planned_loop,
      &session::op_plan_sweep,
      &session::op_to_pointer,
      &session::op_free_pointer,
      &session::op_racing_frees,
      &session::op_failing_configure,
  };
  const std::uint8_t code = in_.byte();
  const int t = code >> 6 == 3 ? 1 : 0;  // a quarter of the operations run on the helper
  const std::size_t which = (code & 0x3f) % std::size(table);
  run_op(table[which], t, which);
}

void session::run_op(op f, int t, std::size_t code) {
  const std::size_t n = steps_++;
  op_index = n;
  op_code = code;
  (this->*f)(t);
  all.operations += 1;
  check_all();
  shadow_->step(code, t, n);
  if (n % 16 == 15) verify_all("periodic check");
  if (n % 64 == 63) log_.compact();
}

}  // namespace refpool::test::fuzz
