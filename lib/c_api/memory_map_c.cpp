// refpool_cache_memory_map: a cache's memory map (cache/memory_map.hpp) into the caller's arrays of
// refpool_memory_segment and refpool_memory_range, each element of the caller's struct size.
#include <cstring>
#include <limits>
#include <vector>

#include "access.hpp"
#include "c_api/sized_struct.hpp"
#include "c_api/support.hpp"
#include "cache/cache_state.hpp"

using namespace refpool::c_api;

namespace {

constexpr const char* function = "refpool_cache_memory_map";

refpool_range_state c_state(refpool::detail::range_state state) noexcept {
  using refpool::detail::range_state;
  switch (state) {
    case range_state::live: return REFPOOL_RANGE_LIVE;
    case range_state::idle: return REFPOOL_RANGE_IDLE;
    case range_state::free: return REFPOOL_RANGE_FREE;
    case range_state::span_held: return REFPOOL_RANGE_SPAN_HELD;
    case range_state::span_idle: return REFPOOL_RANGE_SPAN_IDLE;
  }
  return REFPOOL_RANGE_FREE;
}

refpool_segment_pool c_pool(refpool::detail::map_pool pool) noexcept {
  using refpool::detail::map_pool;
  switch (pool) {
    case map_pool::small: return REFPOOL_SEGMENT_SMALL;
    case map_pool::large: return REFPOOL_SEGMENT_LARGE;
    case map_pool::whole_block: return REFPOOL_SEGMENT_BLOCK;
  }
  return REFPOOL_SEGMENT_BLOCK;
}

/// Checks one output array: its count pointer, the array against its capacity, its element size.
template <class T>
void check_array(const T* array, std::size_t capacity, std::size_t size, const std::size_t* count, const char* name,
                 const char* type) {
  if (count == nullptr)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: {}_count is NULL", function, name));
  if (array == nullptr && capacity > 0)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: {}s is NULL but {}_capacity is {}", function, name, name, capacity));
  check_struct_size<T>(size, function, type);
  if (capacity > std::numeric_limits<std::size_t>::max() / size)  // no array is that large: a wrong capacity
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: {}: {}_capacity {} times {}_size {} overflows size_t", function, name, capacity, name,
                     size));
  if (array != nullptr) check_struct_alignment<T>(array, function, type);
}

/// Element `index` of the caller's array of `size`-byte structs.
template <class T>
void* element(T* array, std::size_t index, std::size_t size) noexcept {
  return reinterpret_cast<unsigned char*>(array) + index * size;
}

}  // namespace

extern "C" refpool_status refpool_cache_memory_map(refpool_cache cache, refpool_memory_segment* segments,
                                                   size_t segment_capacity, size_t segment_size, size_t* segment_count,
                                                   refpool_memory_range* ranges, size_t range_capacity,
                                                   size_t range_size, size_t* range_count) {
  return guarded([&] {
    check_array(segments, segment_capacity, segment_size, segment_count, "segment", "refpool_memory_segment");
    check_array(ranges, range_capacity, range_size, range_count, "range", "refpool_memory_range");
    const auto object = lookup<cache_object>(cache, function);
    const refpool::detail::memory_map map = refpool::detail::access::state(object->cache).map_memory();
    std::size_t range_index = 0;
    for (std::size_t i = 0; i < map.size(); ++i) {
      const refpool::detail::map_segment& seg = map[i];
      if (i < segment_capacity) {
        refpool_memory_segment out{};
        out.address = seg.address;
        out.reserved_bytes = seg.reserved;
        out.committed_bytes = seg.committed;
        out.first_range = range_index;
        out.range_count = seg.ranges.size();
        out.device = seg.device;
        out.memory_kind = static_cast<int32_t>(seg.kind);
        out.pool = c_pool(seg.pool);
        out.expandable = seg.expandable ? 1 : 0;
        write_sized(out, element(segments, i, segment_size), segment_size, function, "refpool_memory_segment");
      }
      for (const refpool::detail::layout_range& r : seg.ranges) {
        if (range_index < range_capacity) {
          const refpool_memory_range out{r.address, r.bytes, i, c_state(r.state), 0};
          write_sized(out, element(ranges, range_index, range_size), range_size, function, "refpool_memory_range");
        }
        ++range_index;
      }
    }
    *segment_count = map.size();
    *range_count = range_index;
  });
}
