// The allocation log: one CSV line per allocation and free that users see, in the format RMM's
// replay benchmark reads (Thread,Time,Action,Pointer,Size,Stream).
#pragma once

#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

#include <refpool/types.hpp>

namespace refpool::detail {

class alloc_log {
 public:
  /// Opens (truncates) `path`; throws `config_error` if it cannot.
  explicit alloc_log(const std::string& path);
  ~alloc_log();
  alloc_log(const alloc_log&) = delete;
  alloc_log& operator=(const alloc_log&) = delete;

  void record(bool allocate, const void* ptr, std::size_t bytes, stream_ref stream) noexcept;

 private:
  std::mutex mutex_;
  std::FILE* file_;
};

}  // namespace refpool::detail
