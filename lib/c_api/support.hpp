// What every C API file shares: the last-error slot, the one wrapper that turns exceptions into
// statuses, the handle tables with generation numbers, and the objects behind handles.
#pragma once

#include <refpool/refpool.h>

#include <pthread.h>

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

namespace refpool::c_api {

// ---- errors -------------------------------------------------------------------------------

// The last error of this thread. TLS stays small on purpose: the core's initial-exec TLS makes
// this library's whole TLS block static, and a library loaded with dlopen (Python ctypes) gets
// only glibc's small surplus of static TLS. `last_text` points at the thread's message or at a
// string literal, so reporting std::bad_alloc never needs memory. The message lives on the heap
// until the thread ends, when a pthread key's destructor frees it: key destructors run after the
// thread's thread_local destructors (a message set there is kept) and again for a message another
// key's destructor set (a thread_local made there would never be destroyed, and leak its text).
// After that errors report a fixed text; the status still says which error it was. The main
// thread's message lives until the process ends (exit() runs no key destructor).
inline thread_local const char* last_text = "";
inline thread_local std::string* last_message = nullptr;  // no destructor: readable to the thread's end
inline thread_local bool last_message_gone = false;

inline void set_static_error(const char* literal) noexcept { last_text = literal; }

constexpr const char* message_after_thread_end =
    "refpool: an error occurred after this thread's thread_local storage was destroyed; its message "
    "cannot be kept (the status code names the error)";

/// The thread ends: its message goes (a pthread key's destructor).
inline void drop_last_message(void*) noexcept {
  last_message_gone = true;
  std::string* const message = std::exchange(last_message, nullptr);
  if (message == nullptr) return;
  if (last_text == message->c_str()) last_text = message_after_thread_end;
  delete message;
}

/// The key whose destructor frees a thread's message; null if none could be made.
inline pthread_key_t* last_message_key() noexcept {
  static pthread_key_t key;
  static const bool made = pthread_key_create(&key, drop_last_message) == 0;
  return made ? &key : nullptr;
}

inline void set_error(const char* message) noexcept {
  if (last_message_gone) {
    set_static_error(message_after_thread_end);
    return;
  }
  try {
    if (last_message == nullptr) {
      auto made = std::make_unique<std::string>();
      pthread_key_t* key = last_message_key();
      if (key == nullptr || pthread_setspecific(*key, made.get()) != 0) throw std::bad_alloc();
      last_message = made.release();
    }
    last_message->assign(message);
    last_text = last_message->c_str();
  } catch (...) {
    set_static_error("refpool: an error occurred, and there was no memory left to record its message");
  }
}

/// Thrown inside this file for failures the C API itself detects (bad arguments and handles).
struct api_error {
  refpool_status status;
  std::string message;
};

[[noreturn]] inline void fail(refpool_status status, std::string message) {
  throw api_error{status, std::move(message)};
}

/// Runs `body` (which returns nothing and reports failures by throwing) and maps what it throws
/// to a status. The only place exceptions stop: every API function's body runs inside it.
template <class F>
refpool_status guarded(F&& body) noexcept {
  try {
    body();
    return REFPOOL_OK;
  } catch (const api_error& e) {
    set_error(e.message.c_str());
    return e.status;
  } catch (const refpool::use_after_free& e) {
    set_error(e.what());
    return REFPOOL_ERROR_USE_AFTER_FREE;
  } catch (const refpool::shape_error& e) {
    set_error(e.what());
    return REFPOOL_ERROR_SHAPE;
  } catch (const refpool::size_error& e) {
    set_error(e.what());
    return REFPOOL_ERROR_SIZE;
  } catch (const refpool::out_of_memory& e) {
    set_error(e.what());
    return REFPOOL_ERROR_OUT_OF_MEMORY;
  } catch (const refpool::backend_error& e) {
    set_error(e.what());
    return REFPOOL_ERROR_BACKEND;
  } catch (const refpool::backend_unavailable& e) {
    set_error(e.what());
    return REFPOOL_ERROR_BACKEND_UNAVAILABLE;
  } catch (const refpool::scope_error& e) {
    set_error(e.what());
    return REFPOOL_ERROR_SCOPE;
  } catch (const refpool::config_error& e) {
    set_error(e.what());
    return REFPOOL_ERROR_CONFIG;
  } catch (const refpool::invalid_argument& e) {
    set_error(e.what());
    return REFPOOL_ERROR_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    set_static_error("refpool: out of host memory for refpool's own bookkeeping (std::bad_alloc)");
    return REFPOOL_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_error(e.what());
    return REFPOOL_ERROR_INTERNAL;
  } catch (...) {
    set_static_error("refpool: unknown exception inside the C API");
    return REFPOOL_ERROR_INTERNAL;
  }
}

template <class T>
T& required(T* out, const char* function, const char* what) {
  if (out == nullptr) fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: {} is NULL", function, what));
  return *out;
}

// ---- handle tables ------------------------------------------------------------------------

// A handle id: kind tag (8 bits) | generation (28 bits) | slot index (28 bits). The tag is never
// 0, so a zero id is the null handle of every kind; generations start at 1.
enum class kind : std::uint64_t { backend = 1, cache = 2, scope = 3, buffer = 4, step = 5 };
constexpr unsigned index_bits = 28;
constexpr unsigned generation_bits = 28;
constexpr std::uint64_t index_mask = (std::uint64_t{1} << index_bits) - 1;
constexpr std::uint64_t generation_mask = (std::uint64_t{1} << generation_bits) - 1;
/// A slot whose generation reaches this is retired, so an old id never matches a newer object.
constexpr std::uint64_t last_generation = generation_mask;

inline const char* kind_name(std::uint64_t tag) noexcept {
  switch (static_cast<kind>(tag)) {
    case kind::backend: return "backend";
    case kind::cache: return "cache";
    case kind::scope: return "scope";
    case kind::buffer: return "buffer";
    case kind::step: return "step";
  }
  return "unknown";
}

/// The objects behind handles of one kind. An id names a slot and the slot's generation when the
/// handle was made; removing the object bumps the generation, so stale ids are told apart from
/// live ones exactly. Objects are held by shared_ptr: a call that looked one up keeps it alive
/// even if another thread removes the handle meanwhile. Never destroyed (see `table_of`).
template <class T>
class handle_table {
 public:
  handle_table(kind k, const char* removed_verb) : kind_(k), removed_verb_(removed_verb) {}

  std::uint64_t add(std::shared_ptr<T> object) {
    std::lock_guard guard(mutex_);
    std::uint64_t index = 0;
    if (free_.empty()) {
      if (slots_.size() > index_mask)
        fail(REFPOOL_ERROR_OUT_OF_MEMORY, fmt::format("refpool: too many live {} handles", kind_name(tag())));
      index = slots_.size();
      slots_.push_back({});  // may throw bad_alloc: nothing changed yet
    } else {
      index = free_.back();
      free_.pop_back();
    }
    slot& s = slots_[index];
    s.object = std::move(object);
    return (tag() << (index_bits + generation_bits)) | (s.generation << index_bits) | index;
  }

  /// The object of a live id; throws api_error naming what is wrong with any other id.
  std::shared_ptr<T> get(std::uint64_t id, const char* function) {
    std::lock_guard guard(mutex_);
    return slots_[checked_index(id, function)].object;
  }

  /// Removes a live id's object (handing it back, to be destroyed outside the lock).
  std::shared_ptr<T> remove(std::uint64_t id, const char* function) {
    std::lock_guard guard(mutex_);
    const std::uint64_t index = checked_index(id, function);
    slot& s = slots_[index];
    std::shared_ptr<T> object = std::move(s.object);
    s.object.reset();
    if (++s.generation < last_generation) free_.push_back(static_cast<std::uint32_t>(index));
    return object;
  }

 private:
  struct slot {
    std::shared_ptr<T> object;
    std::uint64_t generation = 1;
  };

  [[nodiscard]] std::uint64_t tag() const noexcept { return static_cast<std::uint64_t>(kind_); }

  std::uint64_t checked_index(std::uint64_t id, const char* function) const {
    const char* name = kind_name(tag());
    if (id == 0) fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: null {} handle", function, name));
    const std::uint64_t id_tag = id >> (index_bits + generation_bits);
    const std::uint64_t generation = (id >> index_bits) & generation_mask;
    const std::uint64_t index = id & index_mask;
    if (id_tag != tag())
      fail(REFPOOL_ERROR_INVALID_HANDLE,
           fmt::format("refpool: {}: handle {:#x} is not a {} handle ({})", function, id, name,
                       id_tag <= static_cast<std::uint64_t>(kind::step) ? kind_name(id_tag) : "corrupt"));
    if (index >= slots_.size() || generation == 0 || generation > slots_[index].generation)
      fail(REFPOOL_ERROR_INVALID_HANDLE, fmt::format("refpool: {}: {} handle {:#x} was never handed out (an "
                                                     "uninitialised or corrupted handle)",
                                                     function, name, id));
    if (generation < slots_[index].generation)
      fail(REFPOOL_ERROR_INVALID_HANDLE,
           fmt::format("refpool: {}: {} handle {:#x} was already {}", function, name, id, removed_verb_));
    return index;
  }

  const kind kind_;
  const char* const removed_verb_;
  mutable std::mutex mutex_;
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_;
};

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
