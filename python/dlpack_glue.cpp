// The Python package's DLPack capsule destructor and tensor deleter (python/refpool/_interfaces.py),
// built into the package's own librefpool only. A consumer that refuses a tensor (NumPy: too many
// dims, a dtype it lacks) drops the capsule in its error path, with its exception set; Python code
// run there by ctypes cannot make a call without failing on that exception, and ctypes clears it
// afterwards, so the buffer was never released and the consumer failed with SystemError. Here the
// pending exception is set aside around the package's release (a ctypes callback) and restored.
// No Python headers: the package hands over the few C API functions it needs (ctypes.pythonapi).
#include <cstddef>

/// Filled by refpool_python_dlpack_setup; the field order is _interfaces.py's _PythonApi.
struct python_api {
  int (*is_initialized)();
  int (*capsule_is_valid)(void* capsule, const char* name);
  void* (*capsule_pointer)(void* capsule, const char* name);
  int (*gil_ensure)();  // PyGILState_STATE is an enum
  void (*gil_release)(int state);
  void (*error_fetch)(void** type, void** value, void** traceback);
  void (*error_restore)(void* type, void* value, void* traceback);
  void (*release_export)(void* managed);  // the package's: drops the export of this DLManagedTensor
};

namespace {

python_api api{};

void release_with_error_set_aside(void* managed) noexcept {
  // Past Python's finalization (a framework's static object deleting a tensor), nothing can run: the
  // buffer stays held until the process ends.
  if (api.is_initialized() == 0) return;
  const int gil = api.gil_ensure();  // a consumer may delete the tensor on any thread
  void* type = nullptr;
  void* value = nullptr;
  void* traceback = nullptr;
  api.error_fetch(&type, &value, &traceback);
  api.release_export(managed);
  api.error_restore(type, value, traceback);
  api.gil_release(gil);
}

}  // namespace

extern "C" {

/// Returns 0, or -1 (nothing set up) when `size` is not this library's sizeof(python_api): a
/// package and a library built from different sources (REFPOOL_LIBRARY).
__attribute__((visibility("default"))) int refpool_python_dlpack_setup(const python_api* given,
                                                                       std::size_t size) noexcept {
  if (size != sizeof(python_api)) return -1;
  api = *given;
  return 0;
}

/// DLManagedTensor::deleter of every export.
__attribute__((visibility("default"))) void refpool_python_dlpack_deleter(void* managed) noexcept {
  release_with_error_set_aside(managed);
}

/// The capsule's destructor (the GIL is held). A capsule still named "dltensor" was never
/// consumed, so its tensor is deleted here; a consumer renames it and calls the deleter itself.
__attribute__((visibility("default"))) void refpool_python_capsule_destructor(void* capsule) noexcept {
  if (api.capsule_is_valid(capsule, "dltensor") == 0) return;
  release_with_error_set_aside(api.capsule_pointer(capsule, "dltensor"));
}

}  // extern "C"
