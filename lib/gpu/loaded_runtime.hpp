// What loading a runtime's library gave: its entry points, or why it cannot be used. Each runtime
// (lib/cuda/driver.cpp, lib/hip/runtime.cpp) keeps one in a function-local static, so it loads
// once per process, thread-safely, and reaches it through the two functions below.
#pragma once

#include <string>
#include <string_view>

namespace refpool::detail::gpu {

template <class Entries>
struct loaded_runtime {
  Entries api;
  std::string failure;  ///< why the runtime cannot be used; empty on success
};

/// Throws `backend_unavailable`: "refpool: RUNTIME is unavailable: WHY".
[[noreturn]] void throw_unavailable(std::string_view runtime, std::string_view why);

/// The entry points, or `backend_unavailable` saying why the runtime cannot be used.
template <class Entries>
const Entries& usable_entries(const loaded_runtime<Entries>& loaded, std::string_view runtime) {
  if (!loaded.failure.empty()) throw_unavailable(runtime, loaded.failure);
  return loaded.api;
}

/// The failure of the runtime that `state()` loads; never throws (a load that throws is `fallback`).
template <class State>
const std::string& load_failure(State& (*state)(), const char* fallback) noexcept {
  try {
    return state().failure;
  } catch (...) {
    static const std::string& why = *new std::string(fallback);  // never destroyed
    return why;
  }
}

}  // namespace refpool::detail::gpu
