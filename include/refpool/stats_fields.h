/* refpool/stats_fields.h: every counter of a cache, defined once. C and C++.
 *
 * REFPOOL_CACHE_STATS(X) expands X(type, name, description) for each counter, in a fixed order:
 * the field order of refpool::cache_stats and of the C struct refpool_cache_stats (ABI 1), the
 * order of refpool_stat_name(i), and the rows of the printed table. New counters are appended.
 * `type` is uint64_t for event counts and size_t for byte and block counts. */
#ifndef REFPOOL_STATS_FIELDS_H
#define REFPOOL_STATS_FIELDS_H

#define REFPOOL_CACHE_STATS(X)                                                                               \
  X(uint64_t, hits, "requests served by an idle block")                                                      \
  X(uint64_t, misses, "requests no idle block served: a backend allocation, or a piece carved")              \
  X(uint64_t, steals, "hits taken from another scope's idle blocks (part of hits)")                          \
  X(uint64_t, backend_allocations, "successful backend allocations of blocks (driver calls)")                \
  X(uint64_t, backend_frees, "blocks this cache gave back to a backend")                                     \
  X(uint64_t, unsafe_frees, "buffers that came back through unsafe_free")                                    \
  X(uint64_t, escapes, "buffers still referenced when their scope or step ended")                            \
  X(uint64_t, evictions, "idle blocks freed to stay under max_idle_bytes")                                   \
  X(uint64_t, reclaimed_blocks, "idle blocks freed by reclaim or on out-of-memory")                          \
  X(uint64_t, oom_retries, "backend out-of-memory answered by reclaim and retry")                            \
  X(uint64_t, cross_stream_reuses, "hits on a block, or pieces carved, last used on another stream")         \
  X(uint64_t, scope_entries, "scopes entered on this cache (outermost per thread)")                          \
  X(uint64_t, uncached_entries, "of those, entries that ran uncached (warm-up)")                             \
  X(size_t, live_blocks, "cached blocks held by handles")                                                    \
  X(size_t, idle_blocks, "cached blocks ready for reuse")                                                    \
  X(size_t, live_bytes, "bytes of cached blocks held by handles")                                            \
  X(size_t, idle_bytes, "bytes of cached blocks ready for reuse")                                            \
  X(size_t, held_bytes, "live + idle: bytes of cached blocks (pieces of segments included)")                 \
  X(size_t, peak_held_bytes, "highest held_bytes since creation or the last reset_peaks")                    \
  X(uint64_t, plan_hits, "planned requests served by a plan's region")                                       \
  X(uint64_t, plan_misses, "divergences, shorter runs and live-region conflicts")                            \
  X(uint64_t, plan_recordings, "plans made (first runs, diverged or stale runs)")                            \
  X(size_t, plans, "plans kept now")                                                                         \
  X(size_t, arena_bytes, "bytes of arenas (a replaced one a live region still pins too)")                    \
  X(size_t, planned_peak_live_bytes, "peak live bytes of the runs they were made from")                      \
  X(uint64_t, ooms, "requests that failed with out_of_memory after reclaim and retry")                       \
  X(size_t, peak_live_bytes, "highest live_bytes since creation or the last reset_peaks")                    \
  X(uint64_t, steps, "steps begun on this cache")                                                            \
  X(uint64_t, uncached_allocations, "backend allocations made for this cache's scopes uncached")             \
  X(size_t, uncached_live_bytes, "bytes of those still held by handles")                                     \
  X(size_t, plan_live_bytes, "bytes of plan regions held by handles")                                        \
  X(size_t, allocated_bytes, "everything handed out and still held: live + plan_live + uncached_live")       \
  X(size_t, reserved_bytes, "everything held from backends: held + segment_free + arena + uncached_live")    \
  X(size_t, peak_allocated_bytes, "peak_live + peak_plan_live + peak uncached, at most peak_reserved_bytes") \
  X(size_t, peak_reserved_bytes, "highest reserved_bytes (exact) since creation or the last reset_peaks")    \
  X(uint64_t, plan_evictions, "plans dropped: replaced by a re-recording, beyond 16 per key, or memoryless") \
  X(uint64_t, plan_pauses, "times a key re-recorded so often that its recording was paused")                 \
  X(uint64_t, plan_unrecorded_runs, "planned runs served by the plain cache while their key was paused")     \
  X(uint64_t, plan_busy_runs, "planned runs served by the plain cache: another run held their arena")        \
  X(uint64_t, arena_growths, "arenas grown in place (virtual memory: nothing moved or held twice)")          \
  X(uint64_t, arena_replacements, "arenas grown by allocating a larger one and moving their plans")          \
  X(size_t, segments, "segments of this cache's segment heaps (docs/design.md, Segments)")                   \
  X(size_t, segment_bytes, "bytes committed to them: held from backends = this + plain blocks")              \
  X(size_t, segment_free_bytes, "of those, bytes in no piece (held from backends: held + this)")             \
  X(uint64_t, segment_grows, "driver calls that grew segments: segments made, commits at their end")         \
  X(uint64_t, splits, "free remainders split off when pieces were carved")                                   \
  X(uint64_t, merges, "free neighbours joined when pieces came back to their segment")                     \
  X(size_t, peak_plan_live_bytes, "per key, most region bytes live at once in a run since the last reset_peaks") \
  X(uint64_t, arena_lendings, "always 0: arenas are spans, yielded, never lent (kept: the C layout)")            \
  X(uint64_t, segment_trims, "driver calls of segment trims: decommits, and frees of segments without VM")   \
  X(uint64_t, segment_trimmed_bytes, "bytes those trims gave back, in total")                                  \
  X(size_t, segment_free_ranges, "ranges of segment bytes in no piece (PyTorch's inactive split blocks)")    \
  X(uint64_t, reserved_allocated_bytes, "bytes taken from backends in total: reserved_bytes' increases")    \
  X(uint64_t, reserved_freed_bytes, "bytes given back to backends in total: reserved_bytes' decreases")        \
  X(uint64_t, plan_pass_runs, "planned runs of keys in pass (sequences that do not repeat): no router")      \
  X(uint64_t, plan_probe_runs, "planned runs of keys in pass that probed whether their sequences repeat")    \
  X(uint64_t, plan_pass_entries, "times a key's sequences did not repeat and it entered pass")

#endif
