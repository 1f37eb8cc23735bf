// Stand-in for PyTorch's c10 header (see cuda/CUDAException.h here), for the compile check of
// python/refpool/_torch_hooks.cpp: c10's errors and the TORCH_CHECK macros, with PyTorch's shapes.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace c10 {
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
  const char* what_without_backtrace() const noexcept { return what(); }
};
struct OutOfMemoryError : Error {
  using Error::Error;
};
template <class... Parts>
std::string stub_message(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace c10

#define TORCH_CHECK_WITH(error_t, cond, ...) \
  if (!(cond)) throw ::c10::error_t(::c10::stub_message(__VA_ARGS__))
#define TORCH_CHECK(cond, ...) TORCH_CHECK_WITH(Error, cond, __VA_ARGS__)
