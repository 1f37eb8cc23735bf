// Byte counts for people: "512 B", "1.50 KiB", "12.0 MiB", "4 GiB" (binary units), in the stats
// summary and in out-of-memory messages.
#pragma once

#include <cstddef>
#include <string>

namespace refpool::detail {

/// `bytes` in the largest binary unit (B, KiB, MiB, GiB, TiB, PiB, EiB) that keeps the number at
/// least 1: a whole number when exact ("4 GiB"), else three significant digits ("1.50 KiB",
/// "12.0 MiB", "512 MiB" when 512.3 MiB).
[[nodiscard]] std::string scaled_bytes(std::size_t bytes);

}  // namespace refpool::detail
