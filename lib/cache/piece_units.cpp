#include "cache/piece_units.hpp"

#include "segments/segment_options.hpp"

namespace refpool::detail {

key_units piece_units(const backend_state& backend) {
  // Decided once: the unit is part of every cache key of this backend (docs/design.md, "Segments").
  // The cache's heaps use the default options; the heap's constructor asks the same rule.
  const std::size_t unit = choose_piece_unit(backend.alignment(), segment_heap_options{}).unit;
  const bool segmentable = unit != 0;
  const bool device_vm = backend.kind() == memory_kind::device && backend.res().address_space() != nullptr;
  key_units units{};
  units[static_cast<std::size_t>(segment_policy::off)] = 1;
  units[static_cast<std::size_t>(segment_policy::on)] = segmentable ? unit : 1;
  units[static_cast<std::size_t>(segment_policy::automatic)] = segmentable && device_vm ? unit : 1;
  return units;
}

}  // namespace refpool::detail
