// A region block: a block whose memory is a region of a plan's arena (docs/design.md, "Block
// sources", "Planned scopes"). What only regions need lives here, not in `block`: the owner it
// goes back to on its last release, its request in the owner's plan, and the thread that ends its
// run. The arena source (lib/plan/arena_source.hpp) makes a plan's regions and takes them back.
#pragma once

#include <cstdint>

#include "cache/block.hpp"

namespace refpool::detail {

struct region_block;

/// The owner of region blocks (a plan). Lets the core return regions without knowing plans.
class region_owner {
 public:
  virtual void put_back_region(block* b, bool via_unsafe_free) noexcept = 0;
  /// Bytes of its regions live now (stats; any thread).
  [[nodiscard]] virtual std::size_t live_region_bytes() const noexcept = 0;

 protected:
  ~region_owner() = default;
};

struct region_block : block {
  region_owner* owner = nullptr;   ///< its plan: takes it back on its last release
  std::uint32_t region_index = 0;  ///< its request in the plan
  const void* thread = nullptr;    ///< the only thread that ends its run (scope runs), else null
};

/// `b`, which is known to be a region (its origin is block_origin::region).
inline region_block* as_region(block* b) noexcept { return static_cast<region_block*>(b); }

}  // namespace refpool::detail
