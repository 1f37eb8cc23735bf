// The reference model's view of planned scopes and steps, written from docs/design.md ("Planned
// scopes"): keys and their plans, arenas, runs and the policy. The rules themselves are in
// model_plans.cpp and model_plan_store.cpp; model.hpp holds the rest of the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace refpool::test::fuzz {

/// A request as plans compare them: backend, exact bytes, stream.
struct model_request {
  int backend = 0;
  std::size_t bytes = 0;
  void* stream = nullptr;
  friend bool operator==(const model_request&, const model_request&) = default;
};

struct model_region {
  bool live = false;
  bool pinned = false;            ///< live past its run's end: keeps its plan alive
  std::uint64_t generation = 0;   ///< the arena run that handed it out last (0: never)
  std::uint64_t released_at = 0;  ///< the arena's position at its last release
  std::uint64_t gid = 0;          ///< the live block
};

struct model_plan {
  int cache = -1;
  int arena = -1;
  std::vector<model_request> requests;
  std::vector<std::size_t> offsets;
  std::vector<std::size_t> spans;          ///< bytes rounded up to 256
  std::vector<std::uint64_t> released_at;  ///< the recording's release position of each request
  std::size_t bytes_needed = 0;
  std::size_t peak = 0;
  std::vector<model_region> regions;
  bool in_store = false;
};

/// A range of a segment of a heap of spans alone (lib/cache/segment_source_spans.cpp: no
/// virtual memory, each new segment one backend allocation of the span's size rounded to 512).
struct model_heap_range {
  std::size_t offset = 0, bytes = 0;
  int arena = -1;              ///< the span placed here, or -1: free
  std::vector<void*> streams;  ///< free: the streams its last users ran on
};

struct model_heap_segment {
  void* base = nullptr;
  std::size_t bytes = 0;
  bool small = false;  ///< the small pool (512 B) or the large one
  std::uint64_t last_use = 0;
  std::vector<model_heap_range> ranges;  ///< in address order, tiling the segment
};

/// The heap of spans alone of one (cache, backend): where arenas' spans live.
struct model_span_heap {
  int cache = -1;
  int backend = 0;
  std::uint64_t tick = 0;
  std::uint64_t spans_made = 0;
  std::vector<model_heap_segment> segments;  ///< in creation order
  /// Arenas of it were given back where the model does not follow the library call by call
  /// (settle_arenas): its free segments go in the order the log shows.
  bool settling = false;
};

struct model_arena {
  enum class span_state { none, held, idle, yielded, gone };
  int cache = -1;
  int backend = 0;
  void* stream = nullptr;
  void* base = nullptr;
  std::size_t bytes = 0;   ///< its span's bytes (512 B pieces)
  std::size_t needed = 0;  ///< what its plans need: its span's size at the next claim
  span_state span = span_state::none;
  void* home = nullptr;  ///< where its span was last placed
  std::uint64_t idle_since = 0;
  std::uint64_t span_record = 0;  ///< its span's place in its heap's list of spans (made at a carve)
  std::vector<void*> used_on;     ///< idle: the streams its bytes may still be used on
  bool memory = false;            ///< its span is placed (held or idle) in its heap
  bool retired = false;   ///< replaced: no run claims it any more
  bool reclaim_before_take = false;  ///< a plan joined: its next claim gives the plain path's idle memory back first
  bool in_group = false;  ///< a store's arena for its (backend, stream, key) now
  int claimed_by = -1;    ///< the run that holds it
  int claimed_key = -1;   ///< that run's key (the last claimer's)
  std::uint64_t generation = 0;
  std::uint64_t position = 0;
  std::vector<void*> waits;  ///< streams recorded on released regions: the next hand-out waits
  std::vector<int> plans;    ///< the plans placed in it
};

struct model_key {
  std::string name;
  std::vector<int> plans;
  std::vector<std::uint64_t> last_used;
  std::vector<int> pending;  ///< recordings of sequences seen once, oldest first (no arena)
  bool own_arena = false;
  std::uint64_t runs = 0;
  std::uint32_t rerecordings = 0;
  std::uint64_t paused_until = 0;
  std::uint64_t next_pause = 64;
  bool reclaim_at_replay = false;  ///< a plan joined since its last complete replay
  // Whether its sequences repeat (docs/design.md, "A key that does not repeat").
  std::vector<std::uint64_t> fingerprints;  ///< of its runs, oldest first (0: not hashed)
  std::vector<bool> repeated;               ///< of its runs, oldest first
  std::vector<std::size_t> far;  ///< of its runs: how far back the fingerprint came, where beyond the capacity (else 0)
  std::size_t capacity = 16;     ///< plans and pending recordings kept: 16, grown to follow a longer loop (to 64)
  std::size_t longest_run = 0;   ///< the most requests a run of it served (the capacity's budget)
  std::uint64_t runs_in_mode = 0;
  bool passing = false;
  std::uint64_t pass_until = 0;  ///< passing: runs below pass; the next 32 probe
  std::uint64_t next_pass = 64;
};

struct model_group {
  int backend = 0;
  void* stream = nullptr;
  int owner = -1;  ///< a key with an arena of its own, or -1: shared
  int arena = -1;
};

/// The plan store of one cache.
struct model_plan_store {
  bool closed = false;
  std::uint64_t clock = 0;
  std::vector<model_key> keys;
  std::vector<model_group> groups;
  std::uint64_t hits = 0, misses = 0, recordings = 0, evictions = 0, pauses = 0, unrecorded = 0, busy = 0, growths = 0,
                replacements = 0, pass_runs = 0, probe_runs = 0, pass_entries = 0;
};

/// A block of a run that is not a region (a recording's, or a fallback).
struct model_tracked {
  model_request request;
  std::uint64_t position = 0;
  std::uint64_t released_at = 0;
  bool live = true;
  bool cached = false;
};

struct model_segment {
  int plan;
  std::uint64_t from, to;
};

struct model_run {
  enum class mode { start, replay, record, plain, finished, pass, probe };
  int cache = -1;
  int key = -1;
  bool shared = false;
  mode how = mode::start;
  bool may_record = true, stale = false, busy = false, busy_other_key = false;
  std::vector<int> candidates;     ///< the key's plans at its start, most recently used first
  std::vector<int> foreign_plans;  ///< plans whose regions it may still reference (until its end)
  int current = -1;
  int arena = -1;
  std::uint64_t generation = 0;
  std::vector<model_segment> segments;
  std::uint64_t segment_from = 0, replayed_to = 0, position = 0;
  std::vector<model_tracked> tracked;
  std::vector<std::size_t> probed;  ///< probe or plain: the sizes asked for (served or not)
  bool asked = false;               ///< a request came (served or not)
  std::size_t uncached_live = 0;
  std::uint64_t hits = 0, misses = 0;
};

/// Totals over all inputs, for the fuzzer's summary line.
struct model_plan_totals {
  std::uint64_t runs = 0, region_hits = 0, conflicts = 0, divergences = 0, recordings = 0, escapes = 0, busy = 0,
                pauses = 0, arenas = 0, arena_frees = 0, stale = 0, evictions = 0, pass_entries = 0, pass_runs = 0,
                learned_again = 0, passing_recordings = 0, failed_probes = 0, pauses_lifted = 0,
                capacity_growths = 0;
  // Arenas' spans (model_span_heap.cpp): yielded, held again elsewhere, extended, made again larger.
  std::uint64_t span_yields = 0, span_moves = 0, span_extensions = 0, span_remakes = 0;
};

}  // namespace refpool::test::fuzz
