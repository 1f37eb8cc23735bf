// What every C API file shares: the objects behind handles and their tables, and the checks of
// arguments that several functions make. Errors: last_error.hpp; tables: handle_table.hpp.
#pragma once

#include <refpool/refpool.h>


#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <refpool/config.hpp>
#include <refpool/refpool.hpp>

#include "c_api/handle_table.hpp"
#include "c_api/last_error.hpp"

namespace refpool::c_api {

// The objects behind the handles. Each has its own lock: a handle may be used from any thread.
struct backend_object {
  refpool::backend backend;
  int runtime = -1;  ///< refpool_runtime of a GPU backend, -1 for host backends
};

struct cache_object {
  explicit cache_object(std::shared_ptr<refpool::alloc_cache> shared) : owner(std::move(shared)), cache(*owner) {}
  std::shared_ptr<refpool::alloc_cache> owner;  // the handle's, or shared with the framework allocator
  refpool::alloc_cache& cache;                  // thread-safe itself
};

struct step_object {
  step_object(refpool::alloc_cache& cache, const refpool::scope_options& options,
              std::shared_ptr<refpool::alloc_cache> keep)
      : keep_cache(std::move(keep)), step(cache, options) {}
  std::shared_ptr<refpool::alloc_cache> keep_cache;  // outlives the step
  refpool::step step;
};

struct scope_object {
  scope_object(refpool::alloc_cache& cache, const refpool::scope_options& options) : scope(cache, options) {}
  std::mutex mutex;
  refpool::scope scope;
};

struct buffer_object {
  std::mutex mutex;
  refpool::data_ref ref;
  refpool::shape dims;
  std::size_t element_size = 0;
  std::size_t element_count = 0;
};

// Leaked on purpose: handles may be used (and objects destroyed) by atexit handlers and by
// threads that outlive static destruction; a scope still open at exit must not be destroyed.
template <class T>
handle_table<T>& table_of();
template <>
inline handle_table<backend_object>& table_of() {
  static auto* table = new handle_table<backend_object>(kind::backend, "released");
  return *table;
}
template <>
inline handle_table<cache_object>& table_of() {
  static auto* table = new handle_table<cache_object>(kind::cache, "destroyed");
  return *table;
}
template <>
inline handle_table<scope_object>& table_of() {
  static auto* table = new handle_table<scope_object>(kind::scope, "exited");
  return *table;
}
template <>
inline handle_table<buffer_object>& table_of() {
  static auto* table = new handle_table<buffer_object>(kind::buffer, "released");
  return *table;
}

template <>
inline handle_table<step_object>& table_of() {
  static auto* table = new handle_table<step_object>(kind::step, "ended");
  return *table;
}

template <class T, class Handle>
std::shared_ptr<T> lookup(Handle handle, const char* function) {
  return table_of<T>().get(handle.id, function);
}

template <class Handle, class T>
Handle make_handle(std::shared_ptr<T> object) {
  return Handle{table_of<T>().add(std::move(object))};
}

inline refpool::shape dims_from(const std::size_t* dims, std::size_t rank, const char* function) {
  if (dims == nullptr && rank != 0)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: dims is NULL but rank is {}", function, rank));
  return rank == 0 ? refpool::shape{} : refpool::shape(std::span<const std::size_t>(dims, rank));
}

/// A new buffer handle viewing `ref` with `dims` (already checked against it).
inline refpool_buffer new_buffer(refpool::data_ref ref, refpool::shape dims, std::size_t element_size,
                                 std::size_t element_count) {
  auto object = std::make_shared<buffer_object>();
  object->ref = std::move(ref);
  object->dims = std::move(dims);
  object->element_size = element_size;
  object->element_count = element_count;
  return make_handle<refpool_buffer>(std::move(object));
}

/// Stores a new handle to the backend `make()` returns in *out.
template <class Make>
refpool_status backend_handle(Make make, refpool_backend* out, const char* function, int runtime = -1) {
  return guarded([&] {
    refpool_backend& result = required(out, function, "out");
    result = make_handle<refpool_backend>(std::make_shared<backend_object>(backend_object{make(), runtime}));
  });
}

/// The C++ options of `options` (NULL: the defaults), a caller's struct of `size` bytes. The plan
/// text is copied by the scope or step.
refpool::scope_options scope_options_from(const refpool_scope_options* options, std::size_t size,
                                          const char* function);

/// A new buffer handle of `dims` x `element_size` bytes from `backend` for `stream`.
/// refpool_alloc_options::alignment: 0, or a power of two no larger than what every buffer of the
/// backend has (a larger one would need blocks keyed by alignment, which the cache does not have).
inline void check_alignment(std::size_t alignment, const refpool::backend& be) {
  if (alignment == 0) return;
  if ((alignment & (alignment - 1)) != 0)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: refpool_alloc: alignment {} is not a power of two", alignment));
  if (alignment > be.alignment())
    fail(REFPOOL_ERROR_INVALID_ARGUMENT,
         fmt::format("refpool: refpool_alloc: alignment {} is above backend {}'s alignment ({} B), the most a "
                     "buffer is guaranteed",
                     alignment, be.name(), be.alignment()));
}

inline refpool_status enter_scope(refpool_cache cache, const refpool_scope_options* options, std::size_t size,
                                  refpool_scope* out, const char* function) {
  return guarded([&] {
    refpool_scope& result = required(out, function, "out");
    const auto object = lookup<cache_object>(cache, function);
    const refpool::scope_options chosen = scope_options_from(options, size, function);
    // Made on the heap and never moved: the thread's scope stack points at it. If making the
    // handle fails, destroying `entered` ends the scope again (it is innermost).
    auto entered = std::make_shared<scope_object>(object->cache, chosen);
    result = make_handle<refpool_scope>(std::move(entered));
  });
}

}  // namespace refpool::c_api
