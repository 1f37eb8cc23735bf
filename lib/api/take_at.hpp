// Taking idle bytes of a cache back at their address, for the framework allocator's private pools
// (refpool_allocator_pool_take: a pool restored to a checkpoint). Internal: no public C++ API needs it.
#pragma once

#include <cstddef>
#include <string_view>

#include <refpool/alloc_cache.hpp>
#include <refpool/backend.hpp>
#include <refpool/data_ref.hpp>

namespace refpool::detail {

/// Hands out again from `cache`, for `stream`, exactly the `bytes` at `address` that `cache` handed
/// out from `be` before and that are idle in it now: an idle buffer starting there whose capacity is
/// what a request of `bytes` gets, or, where the cache carves `be`'s blocks from segments, bytes of
/// its segments that are free or in idle buffers (those go back to the segments first). The buffer
/// starts at `address`, is counted as an allocation of the cache (a hit, or a miss where it was
/// carved), and is released as any other (its data_ref); `stream` is ordered after the streams that
/// used those bytes, as at a reuse. Thread-safe. Throws invalid_argument (null backend or address,
/// 0 bytes, bytes that are live or not the cache's: the message, opened by `where`, says which;
/// nothing changed then), out_of_memory where trimmed bytes cannot be committed again, and what
/// ordering streams throws.
data_ref take_idle_at(alloc_cache& cache, const backend& be, void* address, std::size_t bytes, stream_ref stream,
                      std::string_view where);

}  // namespace refpool::detail
