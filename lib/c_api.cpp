// The C API (include/refpool/refpool.h): handle tables with generation numbers, and one wrapper
// that turns every exception into a status and this thread's last-error message.
#include <refpool/refpool.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <refpool/config.hpp>
#include <refpool/refpool.hpp>

namespace {

// ---- errors -------------------------------------------------------------------------------

// The last error of this thread. TLS stays small on purpose: the core's initial-exec TLS makes
// this library's whole TLS block static, and a library loaded with dlopen (Python ctypes) gets
// only glibc's small surplus of static TLS. `last_text` points at `last_message` or at a
// string literal, so reporting std::bad_alloc never needs memory.
thread_local std::string last_message;
thread_local const char* last_text = "";

void set_static_error(const char* literal) noexcept { last_text = literal; }

void set_error(const char* message) noexcept {
  try {
    last_message.assign(message);
    last_text = last_message.c_str();
  } catch (...) {
    set_static_error("refpool: an error occurred, and there was no memory left to record its message");
  }
}

/// Thrown inside this file for failures the C API itself detects (bad arguments and handles).
struct api_error {
  refpool_status status;
  std::string message;
};

[[noreturn]] void fail(refpool_status status, std::string message) { throw api_error{status, std::move(message)}; }

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
enum class kind : std::uint64_t { backend = 1, cache = 2, scope = 3, buffer = 4 };
constexpr unsigned index_bits = 28;
constexpr unsigned generation_bits = 28;
constexpr std::uint64_t index_mask = (std::uint64_t{1} << index_bits) - 1;
constexpr std::uint64_t generation_mask = (std::uint64_t{1} << generation_bits) - 1;
/// A slot whose generation reaches this is retired, so an old id never matches a newer object.
constexpr std::uint64_t last_generation = generation_mask;

const char* kind_name(std::uint64_t tag) noexcept {
  switch (static_cast<kind>(tag)) {
    case kind::backend: return "backend";
    case kind::cache: return "cache";
    case kind::scope: return "scope";
    case kind::buffer: return "buffer";
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
      fail(REFPOOL_ERROR_INVALID_HANDLE, fmt::format("refpool: {}: handle {:#x} is not a {} handle ({})", function,
                                                     id, name, id_tag <= static_cast<std::uint64_t>(kind::buffer) ? kind_name(id_tag) : "corrupt"));
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
};

struct cache_object {
  explicit cache_object(const refpool::cache_options& options) : cache(options) {}
  refpool::alloc_cache cache;  // thread-safe itself
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
handle_table<backend_object>& table_of() {
  static auto* table = new handle_table<backend_object>(kind::backend, "released");
  return *table;
}
template <>
handle_table<cache_object>& table_of() {
  static auto* table = new handle_table<cache_object>(kind::cache, "destroyed");
  return *table;
}
template <>
handle_table<scope_object>& table_of() {
  static auto* table = new handle_table<scope_object>(kind::scope, "exited");
  return *table;
}
template <>
handle_table<buffer_object>& table_of() {
  static auto* table = new handle_table<buffer_object>(kind::buffer, "released");
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

refpool::shape dims_from(const std::size_t* dims, std::size_t rank, const char* function) {
  if (dims == nullptr && rank != 0)
    fail(REFPOOL_ERROR_INVALID_ARGUMENT, fmt::format("refpool: {}: dims is NULL but rank is {}", function, rank));
  return rank == 0 ? refpool::shape{} : refpool::shape(std::span<const std::size_t>(dims, rank));
}

/// A new buffer handle viewing `ref` with `dims` (already checked against it).
refpool_buffer new_buffer(refpool::data_ref ref, refpool::shape dims, std::size_t element_size,
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
refpool_status backend_handle(Make make, refpool_backend* out, const char* function) {
  return guarded([&] {
    refpool_backend& result = required(out, function, "out");
    result = make_handle<refpool_backend>(std::make_shared<backend_object>(backend_object{make()}));
  });
}

refpool_status enter_scope(refpool_cache cache, const refpool_scope_options* options, refpool_scope* out,
                           const char* function) {
  return guarded([&] {
    refpool_scope& result = required(out, function, "out");
    const auto object = lookup<cache_object>(cache, function);
    refpool::scope_options chosen;
    if (options != nullptr) {
      chosen.uncached_warmup_entries = options->uncached_warmup_entries;
      if (options->plan != nullptr) chosen.plan = options->plan;  // the scope copies the text
    }
    // Made on the heap and never moved: the thread's scope stack points at it. If making the
    // handle fails, destroying `entered` ends the scope again (it is innermost).
    auto entered = std::make_shared<scope_object>(object->cache, chosen);
    result = make_handle<refpool_scope>(std::move(entered));
  });
}

refpool_cache_options to_c(const refpool::cache_options& options) {
  refpool_cache_options out{};
  switch (options.rounding.policy_mode()) {
    case refpool::rounding_policy::mode::exact: out.rounding = REFPOOL_ROUNDING_EXACT; break;
    case refpool::rounding_policy::mode::step: out.rounding = REFPOOL_ROUNDING_STEP; break;
    case refpool::rounding_policy::mode::pow2_divisions: out.rounding = REFPOOL_ROUNDING_POW2; break;
  }
  out.rounding_parameter = options.rounding.parameter();
  out.max_idle_bytes = options.max_idle_bytes;
  return out;
}

refpool::cache_options from_c(const refpool_cache_options& options) {
  refpool::cache_options out;
  switch (options.rounding) {
    case REFPOOL_ROUNDING_EXACT: out.rounding = refpool::rounding_policy::exact(); break;
    case REFPOOL_ROUNDING_STEP: out.rounding = refpool::rounding_policy::step(options.rounding_parameter); break;
    case REFPOOL_ROUNDING_POW2:
      if (options.rounding_parameter > std::numeric_limits<unsigned>::max())
        throw refpool::config_error(fmt::format(
            "refpool: pow2 rounding divisions must be a power of two from 1 to 64, not {}", options.rounding_parameter));
      out.rounding = refpool::rounding_policy::pow2(static_cast<unsigned>(options.rounding_parameter));
      break;
    default:
      throw refpool::config_error(fmt::format(
          "refpool: refpool_cache_options.rounding is {}; allowed: REFPOOL_ROUNDING_EXACT (0), "
          "REFPOOL_ROUNDING_STEP (1), REFPOOL_ROUNDING_POW2 (2)",
          static_cast<int>(options.rounding)));
  }
  out.max_idle_bytes = options.max_idle_bytes;
  return out;
}

}  // namespace

extern "C" {

// ---- errors and version -------------------------------------------------------------------

const char* refpool_last_error(void) { return last_text; }

const char* refpool_status_name(refpool_status status) {
  switch (status) {
    case REFPOOL_OK: return "REFPOOL_OK";
    case REFPOOL_ERROR_USE_AFTER_FREE: return "REFPOOL_ERROR_USE_AFTER_FREE";
    case REFPOOL_ERROR_SHAPE: return "REFPOOL_ERROR_SHAPE";
    case REFPOOL_ERROR_SIZE: return "REFPOOL_ERROR_SIZE";
    case REFPOOL_ERROR_OUT_OF_MEMORY: return "REFPOOL_ERROR_OUT_OF_MEMORY";
    case REFPOOL_ERROR_BACKEND: return "REFPOOL_ERROR_BACKEND";
    case REFPOOL_ERROR_SCOPE: return "REFPOOL_ERROR_SCOPE";
    case REFPOOL_ERROR_CONFIG: return "REFPOOL_ERROR_CONFIG";
    case REFPOOL_ERROR_INVALID_ARGUMENT: return "REFPOOL_ERROR_INVALID_ARGUMENT";
    case REFPOOL_ERROR_INVALID_HANDLE: return "REFPOOL_ERROR_INVALID_HANDLE";
    case REFPOOL_ERROR_BACKEND_UNAVAILABLE: return "REFPOOL_ERROR_BACKEND_UNAVAILABLE";
    case REFPOOL_ERROR_INTERNAL: return "REFPOOL_ERROR_INTERNAL";
  }
  return "REFPOOL_UNKNOWN_STATUS";
}

const char* refpool_version(void) { return REFPOOL_VERSION; }

// ---- backends -----------------------------------------------------------------------------

refpool_status refpool_backend_host(refpool_backend* out) {
  return backend_handle(&refpool::host_backend, out, "refpool_backend_host");
}

refpool_status refpool_backend_new_host(refpool_backend* out) {
  return backend_handle(&refpool::make_host_backend, out, "refpool_backend_new_host");
}

refpool_status refpool_backend_new_host_limited(size_t capacity_bytes, refpool_backend* out) {
  return backend_handle(
      [&] {
        return refpool::backend(std::make_shared<refpool::limiting_resource>(refpool::make_host_resource(), capacity_bytes));
      },
      out, "refpool_backend_new_host_limited");
}

refpool_status refpool_backend_release(refpool_backend backend) {
  return guarded([&] { table_of<backend_object>().remove(backend.id, "refpool_backend_release"); });
}

refpool_status refpool_backend_get_stats(refpool_backend backend, refpool_backend_stats* out) {
  return guarded([&] {
    refpool_backend_stats& result = required(out, "refpool_backend_get_stats", "out");
    const auto object = lookup<backend_object>(backend, "refpool_backend_get_stats");
    result.outstanding_bytes = object->backend.outstanding_bytes();
    result.allocation_count = object->backend.allocation_count();
    result.deallocation_count = object->backend.deallocation_count();
  });
}

// ---- caches -------------------------------------------------------------------------------

refpool_status refpool_cache_options_init(refpool_cache_options* options) {
  return guarded([&] { required(options, "refpool_cache_options_init", "options") = to_c(refpool::cache_options{}); });
}

refpool_status refpool_cache_options_from_environment(refpool_cache_options* options) {
  return guarded([&] {
    refpool_cache_options& result = required(options, "refpool_cache_options_from_environment", "options");
    result = to_c(refpool::cache_options::from_environment());
  });
}

refpool_status refpool_cache_create(const refpool_cache_options* options, refpool_cache* out) {
  return guarded([&] {
    refpool_cache& result = required(out, "refpool_cache_create", "out");
    const refpool::cache_options chosen =
        options == nullptr ? refpool::cache_options::from_environment() : from_c(*options);
    result = make_handle<refpool_cache>(std::make_shared<cache_object>(chosen));
  });
}

refpool_status refpool_cache_destroy(refpool_cache cache) {
  return guarded([&] { table_of<cache_object>().remove(cache.id, "refpool_cache_destroy"); });
}

refpool_status refpool_cache_get_stats(refpool_cache cache, refpool_cache_stats* out) {
  return guarded([&] {
    refpool_cache_stats& result = required(out, "refpool_cache_get_stats", "out");
    const refpool::cache_stats s = lookup<cache_object>(cache, "refpool_cache_get_stats")->cache.stats();
#define REFPOOL_STATS_FIELD(type, name, description) result.name = s.name;
    REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD
  });
}

refpool_status refpool_cache_reclaim(refpool_cache cache, size_t keep_bytes, size_t* freed_bytes) {
  return guarded([&] {
    const std::size_t freed = lookup<cache_object>(cache, "refpool_cache_reclaim")->cache.reclaim(keep_bytes);
    if (freed_bytes != nullptr) *freed_bytes = freed;
  });
}

refpool_status refpool_cache_set_max_idle_bytes(refpool_cache cache, size_t max_idle_bytes) {
  return guarded([&] {
    lookup<cache_object>(cache, "refpool_cache_set_max_idle_bytes")->cache.set_max_idle_bytes(max_idle_bytes);
  });
}

// ---- scopes -------------------------------------------------------------------------------

refpool_status refpool_scope_enter(refpool_cache cache, refpool_scope* out) {
  return enter_scope(cache, nullptr, out, "refpool_scope_enter");
}

refpool_status refpool_scope_enter_with_options(refpool_cache cache, const refpool_scope_options* options,
                                                refpool_scope* out) {
  return enter_scope(cache, options, out, "refpool_scope_enter_with_options");
}

refpool_status refpool_scope_exit(refpool_scope scope) {
  return guarded([&] {
    auto& table = table_of<scope_object>();
    const auto object = table.get(scope.id, "refpool_scope_exit");
    std::lock_guard guard(object->mutex);
    object->scope.close();  // throws scope_error (handle kept) when out of order or on another thread
    table.remove(scope.id, "refpool_scope_exit");  // throws if a racing exit removed it first
  });
}

// ---- buffers ------------------------------------------------------------------------------

refpool_status refpool_alloc(refpool_backend backend, const size_t* dims, size_t rank, size_t element_size,
                             refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_alloc", "out");
    if (element_size == 0) fail(REFPOOL_ERROR_INVALID_ARGUMENT, "refpool: refpool_alloc: element_size is 0");
    const auto be = lookup<backend_object>(backend, "refpool_alloc");
    refpool::shape shape = dims_from(dims, rank, "refpool_alloc");
    const std::size_t bytes = refpool::detail::checked_bytes(shape, element_size);
    refpool::data_ref ref = bytes == 0 ? refpool::data_ref{} : refpool::allocate(be->backend, bytes);
    result = new_buffer(std::move(ref), std::move(shape), element_size, bytes / element_size);
  });
}

refpool_status refpool_reshape(refpool_buffer buffer, const size_t* dims, size_t rank, refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_reshape", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_reshape");
    refpool::shape shape = dims_from(dims, rank, "refpool_reshape");
    std::lock_guard guard(object->mutex);
    if (shape.element_count() != object->element_count)
      refpool::detail::throw_reshape_error(object->dims, object->element_size, shape, object->element_size);
    result = new_buffer(object->ref, std::move(shape), object->element_size, object->element_count);
  });
}

refpool_status refpool_retain(refpool_buffer buffer, refpool_buffer* out) {
  return guarded([&] {
    refpool_buffer& result = required(out, "refpool_retain", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_retain");
    std::lock_guard guard(object->mutex);
    result = new_buffer(object->ref, object->dims, object->element_size, object->element_count);
  });
}

refpool_status refpool_release(refpool_buffer buffer) {
  return guarded([&] { table_of<buffer_object>().remove(buffer.id, "refpool_release"); });
}

refpool_status refpool_unsafe_free(refpool_buffer buffer) {
  return guarded([&] {
    const auto object = lookup<buffer_object>(buffer, "refpool_unsafe_free");
    std::lock_guard guard(object->mutex);
    object->ref.unsafe_free();
  });
}

refpool_status refpool_use_count(refpool_buffer buffer, long* out) {
  return guarded([&] {
    long& result = required(out, "refpool_use_count", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_use_count");
    std::lock_guard guard(object->mutex);
    result = object->ref.use_count();
  });
}

refpool_status refpool_data(refpool_buffer buffer, void** out) {
  return guarded([&] {
    void*& result = required(out, "refpool_data", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_data");
    std::lock_guard guard(object->mutex);
    result = object->ref.data();
  });
}

refpool_status refpool_dims(refpool_buffer buffer, size_t* dims, size_t capacity, size_t* rank) {
  return guarded([&] {
    std::size_t& rank_out = required(rank, "refpool_dims", "rank");
    const auto object = lookup<buffer_object>(buffer, "refpool_dims");
    std::lock_guard guard(object->mutex);
    const refpool::shape& shape = object->dims;
    rank_out = shape.rank();
    if (dims == nullptr) return;
    if (capacity < shape.rank())
      fail(REFPOOL_ERROR_INVALID_ARGUMENT,
           fmt::format("refpool: refpool_dims: the buffer has rank {} but dims has room for {}", shape.rank(), capacity));
    std::copy(shape.begin(), shape.end(), dims);
  });
}

refpool_status refpool_buffer_get_info(refpool_buffer buffer, refpool_buffer_info* out) {
  return guarded([&] {
    refpool_buffer_info& result = required(out, "refpool_buffer_get_info", "out");
    const auto object = lookup<buffer_object>(buffer, "refpool_buffer_get_info");
    std::lock_guard guard(object->mutex);
    result = refpool_buffer_info{object->dims.rank(), object->element_count, object->element_size,
                                 object->element_count * object->element_size, object->ref.is_freed() ? 1 : 0};
  });
}

}  // extern "C"
