// What a planned run (run.hpp) records of the requests it serves with blocks that are not regions
// (recorded or fallen back to the plain cache): each one's request and lifetime, for the plan the
// store may make of the run at its end; and the fingerprint of a probe's sizes.
//
// Threads. The serving thread reserves and tracks; a tracked block's release may come from any
// thread at any time, also after the run ended: lock_ guards what releases write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend_state.hpp"
#include "cache/block.hpp"
#include "cache/spinlock.hpp"
#include "plan/key_policy.hpp"
#include "plan/plan.hpp"
#include "plan/replay_cursor.hpp"

namespace refpool::detail {

class run_recorder {
 public:
  /// Room for one more tracked block (before the request is served: track cannot fail).
  void reserve();
  /// `b` served the request at `at`: `observer` (its run, which holds a reference for it until
  /// the release) sees its release first. Room was reserved.
  void track(block* b, const planned_request& request, std::uint64_t at, release_observer* observer) noexcept;
  /// The tracked block `index` lost its last handle, with the run where `cursor` stands (read
  /// under the lock, after what the serving thread wrote before its last tracking).
  void released(std::uint32_t index, const replay_cursor& cursor) noexcept;
  /// The run ended: lifetimes are final (later releases only count). Returns the uncached blocks
  /// still live: escapes.
  std::size_t finish() noexcept;
  /// The tracked requests below `end`, and their lifetimes (alive at the end: end + 1).
  void fill_recording(std::uint64_t end, std::vector<planned_request>& sequence, std::vector<lifetime>& lifetimes,
                      std::vector<bool>& known) const;
  /// Gives back the backend the first tracked block came from (kept until then: a recording's
  /// backend outlives its blocks).
  void release_backend() noexcept;

  /// A probe's sizes, asked for (served or not).
  void probed(std::size_t bytes) noexcept { probed_.add(bytes); }
  [[nodiscard]] std::uint64_t probe_fingerprint() const noexcept { return probed_.value(); }

 private:
  /// A block that is not a region: its request and lifetime, for the recording.
  struct tracked {
    planned_request request;
    std::uint64_t position;
    std::uint64_t released_at;
    bool live;
    bool cached;  ///< a cached block: the cache counts its escape
  };

  mutable spinlock lock_;  // guards what releases write: tracked_, uncached_live_, finished_
  std::vector<tracked> tracked_;
  std::size_t uncached_live_ = 0;
  bool finished_ = false;
  backend_state* first_backend_ = nullptr;  ///< retained until the end (release_backend)
  fingerprint probed_;                      ///< probe: the sizes asked for so far
};

}  // namespace refpool::detail
