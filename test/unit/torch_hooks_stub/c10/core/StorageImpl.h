// Stand-in for PyTorch's c10 header (see cuda/CUDAException.h here): a storage's data pointer.
#pragma once
#include <c10/cuda/CUDAGuard.h>

namespace c10 {
using DeleterFnPtr = void (*)(void*);
enum class DeviceType : signed char { CPU = 0, CUDA = 1 };
struct Device {
  Device(DeviceType type, DeviceIndex index) : type(type), index(index) {}
  DeviceType type;
  DeviceIndex index;
};
class DataPtr {
 public:
  DataPtr(void* data, void* context, DeleterFnPtr deleter, Device device)
      : data_(data), context_(context), deleter_(deleter), device_(device) {}
  void* get() const { return data_; }
  void* get_context() const { return context_; }

 private:
  void* data_;
  void* context_;
  DeleterFnPtr deleter_;
  Device device_;
};
struct StorageImpl {
  DataPtr& data_ptr() { return data_ptr_; }
  void set_data_ptr_noswap(DataPtr&& data_ptr) { data_ptr_ = data_ptr; }
  DataPtr data_ptr_{nullptr, nullptr, nullptr, Device(DeviceType::CUDA, 0)};
};
}  // namespace c10
