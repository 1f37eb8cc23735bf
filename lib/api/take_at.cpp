// take_idle_at (take_at.hpp): the cache's take at an address (cache/take_at.cpp) as a data_ref, and
// the message that says why nothing idle lies there.
#include "api/take_at.hpp"

#include <cstdint>

#include <fmt/format.h>

#include <refpool/error.hpp>
#include <refpool/pointer.hpp>

#include "access.hpp"
#include "byte_text.hpp"
#include "cache/hit_path.hpp"
#include "config/alloc_log.hpp"
#include "config/env_config.hpp"

namespace refpool::detail {

namespace {

/// Nothing of `cache` idle at `address` for a request of `bytes` (rounded to `capacity`) from
/// `backend`: says whether a live buffer of the cache starts there, an idle one of another device's
/// backend or of another size, or nothing of it.
[[noreturn]] void throw_not_idle(cache_state& cache, const backend_state& backend, void* address, std::size_t bytes,
                                 std::size_t capacity, std::string_view where) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  const std::string range = fmt::format("[{}, {:#x})", address, at + capacity);
  bool live = false;
  try {
    data_ref held = pointer_ref(address);  // a buffer handed out at `address` and not freed
    const block* b = as_block(access::block(held));
    live = b->origin == block_origin::cached && b->home->owner->cache == &cache;
  } catch (const invalid_argument&) {
    // nothing handed out starts there
  }
  if (live)
    throw invalid_argument(fmt::format("refpool: {}: bytes {} are live: the buffer at {} is in use (free it first)",
                                       where, range, address));
  const cache_state::idle_block_found idle = cache.idle_block_at(at);
  if (idle.capacity != 0 && idle.backend != &backend)  // a pool serves each device from a backend of its own
    throw invalid_argument(fmt::format(
        "refpool: {}: the idle buffer at {} was allocated on another device than this take's: take it on the device "
        "it was allocated on",
        where, address));
  if (const std::size_t other = idle.capacity; other != 0)
    throw invalid_argument(fmt::format(
        "refpool: {}: the idle buffer at {} holds {}, but a request of {} gets {}: take it with the size it was "
        "allocated with",
        where, address, scaled_bytes(other), scaled_bytes(bytes), scaled_bytes(capacity)));
  throw invalid_argument(
      fmt::format("refpool: {}: bytes {} are not the pool's: no idle buffer of it starts there, no live "
                  "one handed out by pointer does, and no free bytes of its segments lie there",
                  where, range));
}

}  // namespace

data_ref take_idle_at(alloc_cache& cache, const backend& be, void* address, std::size_t bytes, stream_ref stream,
                      std::string_view where) {
  backend_state* backend = access::state(be);
  if (backend == nullptr) throw invalid_argument(fmt::format("refpool: {}: the backend is null", where));
  if (address == nullptr) throw invalid_argument(fmt::format("refpool: {}: address is NULL", where));
  if (bytes == 0) throw invalid_argument(fmt::format("refpool: {}: 0 bytes name no buffer", where));
  cache_state& state = access::state(cache);
  const block_key key = state.key_of(*backend, bytes);
  slot* s = state.bypassed() ? nullptr : state.ambient_slot();  // none: nothing is ever idle in it
  block* b = s == nullptr ? nullptr
                          : state.take_at(*s, *backend, key, reinterpret_cast<std::uintptr_t>(address), stream, where);
  if (b == nullptr) throw_not_idle(state, *backend, address, bytes, key.bytes, where);
  b->requested = bytes;
  b->refs.reset(1);
  if (alloc_log* log = active_log()) log->record(true, b->ptr, bytes, stream);
  return access::adopt(b);
}

}  // namespace refpool::detail
