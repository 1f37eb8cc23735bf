// A reference model of refpool's caching rules, written from docs/design.md and the stats
// definitions rather than from lib/: which idle block a request gets (own slot, oldest, same
// stream first; then another slot's), where a released block goes, what reclaim, eviction and
// out-of-memory free (least recently released first), escapes, and what a destroyed cache
// does. It also predicts every backend call, and checks each against the tracking_resource's
// log as it goes, learning the addresses of new allocations from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <refpool/stats.hpp>

#include "tracking_resource.hpp"

namespace refpool_fuzz {

/// Reports a mismatch between refpool and the model, with context, and aborts.
[[noreturn]] void fail(const std::string& what);

/// What an operation gave: success or the type of exception it threw.
enum class outcome : std::uint8_t {
  ok, size_error, shape_error, use_after_free, out_of_memory, backend_error, scope_error,
  config_error, invalid_argument, error, other,
};
const char* to_string(outcome o) noexcept;

constexpr std::size_t unlimited = std::numeric_limits<std::size_t>::max();
constexpr int threads = 2;   // 0: the main thread, 1: the helper
constexpr int backends = 2;

/// Rounding as documented in include/refpool/rounding.hpp.
struct model_rounding {
  enum class mode { exact, step, pow2 } how = mode::exact;
  std::size_t parameter = 1;
  /// False when rounding overflows (size_error).
  bool round(std::size_t bytes, std::size_t& out) const noexcept;
};

struct model_block {
  std::uint64_t gid = 0;  ///< the model's own number, unique over the input
  void* ptr = nullptr;
  std::size_t capacity = 0;
  std::size_t requested = 0;
  int backend = 0;
  int cache = -1;  ///< model cache index, -1: uncached (freed at its last release)
  int slot = -1;   ///< home slot in that cache
  std::uint64_t id = 0;  ///< creation number in its cache
  bool idle = false;
  std::uint64_t idle_since = 0, idle_seq = 0, epoch = 0;
  void* last_stream = nullptr;
  std::vector<void*> extra_streams;
  int refs = 0;
  std::uint64_t stamp = 0;  ///< the owner's pattern written into the buffer
};

struct model_slot {
  bool erased = false, leased = false, orphaned = false;
  int last_thread = -1;
  std::uint64_t epoch = 1, live_in_epoch = 0, releases = 0;
  std::uint64_t hits = 0, misses = 0, steals = 0, unsafe_frees = 0, escapes = 0, cross_stream = 0;
  std::size_t live_blocks = 0, idle_blocks = 0, live_bytes = 0, idle_bytes = 0;
  /// Idle blocks by (backend, rounded bytes), highest id first: back() is the oldest.
  std::map<std::pair<int, std::size_t>, std::vector<std::uint64_t>> idle;
};

struct model_cache {
  model_rounding rounding;
  std::size_t max_idle = unlimited;
  bool closed = false;
  std::vector<model_slot> slots;  ///< in creation order, as the cache iterates them
  std::vector<int> free_slots;
  std::uint64_t next_id = 1, clock = 1;
  std::uint64_t backend_allocations = 0, backend_frees = 0, evictions = 0, reclaimed = 0,
                oom_retries = 0, scope_entries = 0, uncached_entries = 0;
  std::size_t held = 0, peak = 0;
};

/// One entry of a thread's scope stack.
struct model_frame {
  bool guard = false;
  int cache = -1;  ///< model cache index (scopes)
  int lease = -1;  ///< slot index, -1: uncached
  bool owns = false;
};

/// Fault injection of one backend, as failing_resource documents it, and its byte limit.
struct model_backend {
  std::size_t capacity = 0;  ///< limiting_resource's limit
  std::size_t outstanding = 0;
  std::uint64_t calls = 0, first = 0, count = 0;
  bool inject_backend_error = false;
  std::uint64_t injected = 0, limit_failures = 0;
};

class model {
 public:
  explicit model(event_log& log) : log_(log) {}

  model_backend be[backends];
  std::vector<model_cache> caches;
  std::vector<model_frame> frames[threads];
  std::map<std::uint64_t, model_block> blocks;

  int new_cache(model_rounding rounding, std::size_t max_idle);
  /// The alloc_cache is destroyed: its idle blocks are freed, slots in use are orphaned.
  void close_cache(int c);

  void enter_scope(int thread, int c, std::size_t warmup);
  void enter_guard(int thread);
  /// `closer` closes frame `index` of `owner`'s stack: scope_error unless it is the innermost
  /// of the closer's own stack.
  outcome close_frame(int closer, int owner, std::size_t index);

  /// A request of `bytes` (> 0) on `thread`: through the innermost frame's lease, else direct.
  /// On success `gid` names the block (refs 1). On out_of_memory `oom_bytes` is the rounded size.
  outcome allocate(int thread, int backend, std::size_t bytes, void* stream, std::uint64_t& gid,
                   std::size_t& oom_bytes);
  void add_ref(std::uint64_t gid);
  void drop_ref(std::uint64_t gid, bool via_unsafe_free);
  void record_stream(std::uint64_t gid, void* stream);

  std::size_t reclaim(int c, std::size_t keep);
  void set_max_idle(int c, std::size_t bytes);

  [[nodiscard]] refpool::cache_stats stats(int c) const;
  /// Bytes of blocks of `backend` that the model thinks are allocated.
  [[nodiscard]] std::size_t allocated_bytes(int backend) const;

  /// Every backend call the model expected happened, and no other.
  void expect_no_more_events(const char* where);

  std::uint64_t next_gid = 1;

 private:
  enum class backend_result { ok, out_of_memory, error };
  backend_result backend_allocate(int backend, std::size_t bytes, void*& ptr);
  void backend_free(const model_block& b);
  const backend_event& next_event(const char* expected);

  std::uint64_t take(model_slot& s, std::pair<int, std::size_t> key, void* stream);
  void mark_live(model_slot& s, model_block& b, bool hit);
  void add_idle(model_cache& c, model_slot& s, model_block& b);
  void remove_idle(model_slot& s, model_block& b);
  std::size_t idle_total(const model_cache& c) const;
  /// Frees least recently released idle blocks (of `backend`, or all when -1) while more than
  /// `keep` idle bytes match. Ties in release order are resolved by reading the log.
  std::size_t free_idle(int c, std::size_t keep, int backend, std::uint64_t& counter);
  void enforce_limit(int c);
  void free_block(model_cache& c, std::uint64_t gid);  // to the backend, counted as a cache free
  int lease(model_cache& c, int thread);
  void give_back(model_cache& c, int slot);
  void wait_for_streams(model_block& b, void* stream);

  event_log& log_;
};

}  // namespace refpool_fuzz
