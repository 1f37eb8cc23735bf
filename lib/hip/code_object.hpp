// What a HIP code object has code for, read before loading it where the runtime cannot be trusted
// to say so: HIP before 5.4 abort()s the process on a code object without code for the device,
// where later releases return hipErrorNoBinaryForGpu.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime.hpp"

namespace refpool::detail::hip {

/// The targets ("gfx90a:xnack-") a code object has code for: each amdgcn entry of a clang offload
/// bundle (what `hipcc --genco` writes), or the machine and features in a bare AMDGPU ELF's
/// header. nullopt when `image` is neither (or is cut short).
std::optional<std::vector<std::string>> code_object_targets(std::string_view image);

/// Whether code for `target` ("gfx90a:xnack-") runs on a device whose gcnArchName is `device`
/// ("gfx90a:sramecc+:xnack-"): the same processor, and each feature the code sets set alike.
bool runs_on(std::string_view target, std::string_view device);

/// Oldest runtime that reports a code object without code for the device as an error.
inline constexpr int minimum_checked_load_version = 50'400'000;

/// hipSuccess if `image` has code that runs on device `ordinal`; else hipErrorNoBinaryForGpu or
/// hipErrorInvalidImage (neither format) with `*why` saying what the image and device have.
/// Before HIP 5.4 the module loader calls this first.
hipError_t check_code_object(int ordinal, std::string_view image, std::string* why);

}  // namespace refpool::detail::hip
