// The parts every out-of-memory message shares: where the memory was asked for ("on device 0", "of
// host memory") and what the caller can do about it, from the cache's stats after its reclaim and
// retry. Bytes are in binary units (byte_text.hpp).
#pragma once

#include <string>

#include <refpool/stats.hpp>

namespace refpool::detail {

/// "on device 3", or "of host memory" for the host backends (device -1).
[[nodiscard]] std::string memory_place(int device);

/// The last sentence of a cache's out-of-memory message: what to free or limit, given what the
/// cache still holds after reclaiming its idle blocks of the failing backend (`now`).
[[nodiscard]] std::string oom_advice(const cache_stats& now);

}  // namespace refpool::detail
