// Which table serves which runtime, and what every call through a table starts or ends with:
// the runtime usable, the device present and current, errors turned into backend_error.
#include <fmt/format.h>

#include <refpool/error.hpp>

#include "loaded_runtime.hpp"
#include "runtime_api.hpp"

namespace refpool::detail::gpu {

void throw_unavailable(std::string_view runtime, std::string_view why) {
  throw backend_unavailable(fmt::format("refpool: {} is unavailable: {}", runtime, why));
}

const runtime_api& table(runtime_id id) { return id == runtime_id::cuda ? cuda::table() : hip::table(); }

const runtime_api& usable(runtime_id id) {
  const runtime_api& api = table(id);
  if (const std::string& why = api.failure(); !why.empty()) throw_unavailable(api.name, why);
  return api;
}

void check_device(const runtime_api& api, int ordinal) {
  const int count = api.device_count();
  if (ordinal < 0 || ordinal >= count)
    throw backend_unavailable(
        fmt::format("refpool: {} device {} does not exist ({} device(s) present)", api.name, ordinal, count));
}

void throw_error(const runtime_api& api, status code, std::string_view call, std::string_view details) {
  const char* name = api.error_name != nullptr ? api.error_name(code) : nullptr;
  const char* text = api.error_string != nullptr ? api.error_string(code) : nullptr;
  throw backend_error(fmt::format("refpool: {} error {} ({}): {}, in {}{}{}", api.name, name ? name : "unknown", code,
                                  text ? text : "no description", call, details.empty() ? "" : " ",
                                  details.empty() ? std::string{} : fmt::format("({})", details)),
                      code);
}

device_guard::device_guard(const runtime_api& api, int device) : api_(api) {
  check_device(api_, device);
  check(api_, api_.activate(device, &saved_), api_.activate.name, fmt::format("device {}", device));
}

device_guard::~device_guard() { (void)api_.restore(saved_); }

relaxed_capture_mode::relaxed_capture_mode(const runtime_api& api) noexcept : api_(api) {
  exchanged_ = api_.exchange_capture_mode(&saved_) == api_.success;
}

relaxed_capture_mode::~relaxed_capture_mode() {
  if (exchanged_) (void)api_.exchange_capture_mode(&saved_);
}

}  // namespace refpool::detail::gpu
