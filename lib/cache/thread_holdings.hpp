// The calling thread's most recent cache-level lease, read on every cache-level request without a
// call (initial-exec). What a thread holds of caches, and when it gives it back: thread_holdings.cpp.
#pragma once

namespace refpool::detail {

class cache_state;
struct slot;

/// The cache of the thread's most recent cache-level lease (compared only), or null.
extern __thread cache_state* ambient_cache __attribute__((tls_model("initial-exec")));
/// That lease: a slot of `ambient_cache` leased to this thread.
extern __thread slot* ambient_lease __attribute__((tls_model("initial-exec")));

}  // namespace refpool::detail
