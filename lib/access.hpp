// The one door from refpool's own code into the private parts of its public classes (each of
// them names detail::access a friend), so no internal accessor is public API.
#pragma once

#include <refpool/alloc_cache.hpp>
#include <refpool/backend.hpp>
#include <refpool/data_ref.hpp>

namespace refpool::detail {

class backend_state;
class cache_state;

struct access {
  static backend_state* state(const backend& be) noexcept { return be.state_; }
  /// A handle that takes over one counted reference to `state`.
  static backend adopt(backend_state* state) noexcept {
    backend out;
    out.state_ = state;
    return out;
  }
  static cache_state& state(const alloc_cache& cache) noexcept { return *cache.state_; }
  static block_header* block(const data_ref& ref) noexcept { return ref.block_; }
  /// A handle that takes over the one reference a fresh block was handed out with.
  static data_ref adopt(block_header* b) noexcept { return data_ref(b); }
  /// Empties `ref` without dropping its reference (its new keeper holds it).
  static void release_into_table(data_ref& ref) noexcept {
    ref.block_ = nullptr;
    ref.freed_ptr_ = nullptr;
    ref.freed_bytes_ = 0;
  }
};

}  // namespace refpool::detail
