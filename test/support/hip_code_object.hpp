// What a HIP code object has code for, read before loading it where the runtime cannot be trusted
// to say so: HIP before 5.4 abort()s the process on a code object without code for the device,
// where later releases return hipErrorNoBinaryForGpu. Test tooling (the GPU tests' modules).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace refpool::test::hip_code_object {

/// The targets ("gfx90a:xnack-") a code object has code for: each amdgcn entry of a clang offload
/// bundle (what `hipcc --genco` writes), or the machine and features in a bare AMDGPU ELF's
/// header. nullopt when `image` is neither (or is cut short).
std::optional<std::vector<std::string>> code_object_targets(std::string_view image);

/// Whether code for `target` ("gfx90a:xnack-") runs on a device whose gcnArchName is `device`
/// ("gfx90a:sramecc+:xnack-"): the same processor, and each feature the code sets set alike.
bool runs_on(std::string_view target, std::string_view device);

}  // namespace refpool::test::hip_code_object
