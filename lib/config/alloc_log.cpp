// CSV allocation log.
#include "alloc_log.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

alloc_log::alloc_log(const std::string& path) : file_(std::fopen(path.c_str(), "w")) {
  if (file_ == nullptr)
    throw config_error(fmt::format("refpool: REFPOOL_CONF key 'log' names '{}', which cannot be opened: {}", path,
                                   std::strerror(errno)));
  fmt::print(file_, "Thread,Time,Action,Pointer,Size,Stream\n");
}

alloc_log::~alloc_log() { std::fclose(file_); }

void alloc_log::record(bool allocate, const void* ptr, std::size_t bytes, stream_ref stream) noexcept {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const double seconds = std::chrono::duration<double>(now).count();
  const std::size_t thread = std::hash<std::thread::id>{}(std::this_thread::get_id());
  std::lock_guard guard(mutex_);
  fmt::print(file_, "{},{:.6f},{},{},{},{}\n", thread, seconds, allocate ? "allocate" : "free", ptr, bytes,
             stream.handle);
  std::fflush(file_);
}

}  // namespace refpool::detail
