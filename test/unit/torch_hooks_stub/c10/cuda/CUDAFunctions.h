// Stand-in for PyTorch's c10 header (see CUDAException.h here).
#pragma once
#include <c10/cuda/CUDAGuard.h>

namespace c10::cuda {
bool hasPrimaryContext(DeviceIndex device_index);
}
