// The part of the pointer table (pointer_table.cpp) that blocks see. A block handed to
// to_pointer gets a node in the table under its address and keeps it for the rest of its life,
// so later hand-overs of the same buffer find it without taking a lock; the block's destructor
// takes the node out.
#pragma once

namespace refpool::detail {

struct block;
struct pointer_node;

/// Takes `b`'s node out of the table (if it still has one). Called by ~block: nobody holds `b`.
void forget_pointer(block& b) noexcept;

}  // namespace refpool::detail
