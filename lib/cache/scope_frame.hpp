// The calling thread's stack of active scopes and guards: what allocate() consults.
#pragma once

namespace refpool::detail {

class cache_state;
class request_router;
struct slot;

/// One entry of a thread's stack of active scopes and guards.
struct scope_frame {
  scope_frame* previous = nullptr;
  cache_state* cache = nullptr;      ///< null: an uncached guard (allocations go to the backend)
  slot* lease = nullptr;             ///< the slot this frame allocates from; null: uncached
  request_router* router = nullptr;  ///< the planned run this frame allocates through, if any
  bool owns_lease = false;           ///< false when an outer frame on this thread holds the lease
  bool open = false;
};

/// The innermost open frame of this thread. Initial-exec TLS: one pointer of static TLS, read
/// on the hit path without a call (docs/embedding.md says why the library keeps it that small).
extern __thread scope_frame* current_frame __attribute__((tls_model("initial-exec")));

}  // namespace refpool::detail
