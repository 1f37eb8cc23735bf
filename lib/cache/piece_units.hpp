// The unit a cache rounds a backend's keys up to: the piece unit of the backend's segment heap
// where the cache's segment policy gives the backend segments, else 1 (plain blocks), so every
// block of a key has the key's size, pieces included (docs/design.md, "Segments"). Decided once per
// backend, when it is made, and kept in its backend_state (backend_state.hpp, key_units).
#pragma once

#include <cstddef>

#include <refpool/cache_options.hpp>

#include "backend_state.hpp"

namespace refpool::detail {

/// The key units of `backend`, one per segment_policy (off, on, automatic): what backend_state's
/// constructor is given to choose them.
[[nodiscard]] key_units piece_units(const backend_state& backend);

/// What a cache with segment policy `p` rounds `backend`'s keys up to (1: plain blocks).
[[nodiscard]] inline std::size_t piece_unit(const backend_state& backend, segment_policy p) noexcept {
  return backend.units()[static_cast<std::size_t>(p)];
}

static_assert(static_cast<std::size_t>(segment_policy::automatic) + 1 == std::tuple_size_v<key_units>,
              "key_units holds one unit per segment_policy");

}  // namespace refpool::detail
