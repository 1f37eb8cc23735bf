// segment_heap::layout: the heap's segments and their ranges as a memory map shows them
// (segment_layout.hpp). A plain walk of the range lists; the span records say held or idle.
#include <algorithm>

#include "segments/segment_heap.hpp"

namespace refpool::detail {

std::vector<segment_layout> segment_heap::layout() const {
  // Idle spans by their node: a range's flag says "span", the record says whether it is in use.
  std::vector<const range*> idle_nodes;
  for (const auto& s : spans_.records)
    if (s->now == segment_span::state::idle) idle_nodes.push_back(s->node);
  std::sort(idle_nodes.begin(), idle_nodes.end());
  const auto state_of = [&](const range& r) {
    if (r.free) return range_state::free;
    if (!r.span) return range_state::live;
    return std::binary_search(idle_nodes.begin(), idle_nodes.end(), &r) ? range_state::span_idle
                                                                        : range_state::span_held;
  };
  std::vector<segment_layout> out;
  out.reserve(segments_.size());
  for (const auto& seg : segments_) {
    segment_layout& made = out.emplace_back();
    made.base = seg->base;
    made.reserved = seg->reserved;
    made.committed = seg->committed();
    made.pool = seg->pool;
    made.virtual_memory = seg->virtual_memory();
    for (const range* r = seg->first; r != nullptr; r = r->next)
      made.ranges.push_back(layout_range{r->address, r->bytes, state_of(*r)});
  }
  return out;
}

}  // namespace refpool::detail
