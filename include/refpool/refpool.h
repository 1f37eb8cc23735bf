/* refpool.h: the C API of refpool, for C programs and foreign-function interfaces (Python ctypes,
 * Julia ccall, Rust bindgen). Plain C11; the same header compiles as C++.
 *
 * What the C API is: the C++ API's objects behind handles. A buffer handle is one `data_ref` plus
 * dims and an element size, i.e. an array view; backends, caches and scopes are the C++ objects
 * of the same name. Semantics (reuse by reference count, scopes, escapes, unsafe_free) are exactly
 * those of the C++ API: see docs/design.md; docs/embedding.md and docs/api.md describe this header.
 *
 * Handles. Every handle is a small struct holding a 64-bit id, passed by value; zero-initialise
 * one (`refpool_buffer b = {0};`) for a null handle. An id names a slot of a process-wide table
 * of its kind together with the slot's generation: destroying or releasing a handle frees the
 * slot and bumps its generation, so every later use of the old id, including a second release,
 * is detected and answered with REFPOOL_ERROR_INVALID_HANDLE ("already released"); it can never
 * reach an object that took the slot since. An id of another kind, or one never handed out, is
 * detected too. Nothing is left allocated for a dead handle. A slot is retired, never reused,
 * once its generation reaches 2^28 - 1, so detection stays exact for the life of the process.
 *
 * Errors. Every function returns a refpool_status; REFPOOL_OK is 0. On failure the function sets
 * this thread's last-error message (refpool_last_error) and leaves its out-parameters untouched.
 * No C++ exception crosses this API: every one, std::bad_alloc included, becomes a status.
 *
 * Structs that grow. Options, stats and infos (every struct here but the handles, refpool_pool_id
 * and refpool_rounding_policy) may gain fields at their end in a later refpool with the same
 * soname. So every function that takes one by address takes its size too: pass `sizeof` of your
 * struct, as the refpool.h you compiled against declares it. The library reads or writes only
 * that many bytes:
 *   - a struct from an older header (smaller): on output the library writes the fields it has
 *     and leaves the rest of its own alone; on input the fields it lacks take their defaults;
 *   - a struct from a newer header (larger) than this library knows: on output the bytes past
 *     this library's struct are zeroed; on input they must be zero (fields left unset), else
 *     INVALID_ARGUMENT names the first byte set.
 * A size no refpool.h ever declared is INVALID_ARGUMENT, before a byte is read or written: 0, not
 * a multiple of the struct's alignment, ending inside its first field, or over 64 KiB. So is a
 * pointer not aligned as the struct is. A NULL options pointer means the defaults; its size is
 * ignored.
 * An incompatible change (a field changed, moved or removed, a signature changed) changes the
 * soname; CI compares the library's ABI against the last release's (abi/).
 *
 * Thread safety. Every function may be called from any thread, on any handle, concurrently:
 * handle lookups are locked and each object has its own lock, so even a release racing with a
 * use of the same handle is safe (the use either completes first or gets INVALID_HANDLE).
 * Scopes are the exception by nature: a scope is active on the thread that entered it, and must
 * be exited on that thread, innermost first (like refpool::scope).
 */
#ifndef REFPOOL_REFPOOL_H
#define REFPOOL_REFPOOL_H

#include <stddef.h>
#include <stdint.h>

#include <refpool/cache_option_fields.h>
#include <refpool/stats_fields.h>

/* What librefpool exports (it is built with hidden visibility). */
#if defined(__GNUC__)
#define REFPOOL_C_API __attribute__((visibility("default")))
#else
#define REFPOOL_C_API
#endif

#ifdef __cplusplus
extern "C" {
/* In C++ the enums get int as their underlying type, so any value a C caller passes is valid
 * there too (an unscoped C++ enum without one only holds the range of its enumerators). */
#define REFPOOL_ENUM_BASE : int
#else
#define REFPOOL_ENUM_BASE
#endif

/// What a refpool C function reports. Values are stable (part of the ABI).
typedef enum refpool_status REFPOOL_ENUM_BASE {
  REFPOOL_OK = 0,
  /// A buffer was used after refpool_unsafe_free released it (data, retain, reshape).
  REFPOOL_ERROR_USE_AFTER_FREE = 1,
  /// A reshape that changes the element count. The message names both shapes.
  REFPOOL_ERROR_SHAPE = 2,
  /// A size that overflows size_t (dims product, times the element size, rounding).
  REFPOOL_ERROR_SIZE = 3,
  /// The backend is out of memory even after the cache reclaimed its idle blocks and retried,
  /// or host memory for refpool's own bookkeeping ran out (std::bad_alloc).
  REFPOOL_ERROR_OUT_OF_MEMORY = 4,
  /// A backend call failed for a reason other than out-of-memory.
  REFPOOL_ERROR_BACKEND = 5,
  /// A scope exited out of order (not the innermost on its thread) or on another thread.
  REFPOOL_ERROR_SCOPE = 6,
  /// A bad value in REFPOOL_CONF or in refpool_cache_options.
  REFPOOL_ERROR_CONFIG = 7,
  /// A null handle, a null pointer where one is needed, an element size of 0, dims NULL with a
  /// rank above 0, an output array too small.
  REFPOOL_ERROR_INVALID_ARGUMENT = 8,
  /// A handle that was already released or destroyed (a second release, a use after release),
  /// one of another kind, or an id never handed out. The message says which.
  REFPOOL_ERROR_INVALID_HANDLE = 9,
  /// A backend cannot be used here (library missing, no device, built without it).
  REFPOOL_ERROR_BACKEND_UNAVAILABLE = 10,
  /// Any other failure inside refpool (a bug: please report it with the message).
  REFPOOL_ERROR_INTERNAL = 11
} refpool_status;

/// A backend: where buffers come from (host memory for now). Release with
/// refpool_backend_release; buffers allocated from it keep it alive on their own.
typedef struct refpool_backend {
  uint64_t id;
} refpool_backend;

/// A cache of idle buffers (refpool::alloc_cache). Destroy with refpool_cache_destroy.
typedef struct refpool_cache {
  uint64_t id;
} refpool_cache;

/// An active scope on a cache (refpool::scope). End with refpool_scope_exit.
typedef struct refpool_scope {
  uint64_t id;
} refpool_scope;

/// An open step on a cache (refpool::step). End with refpool_step_end.
typedef struct refpool_step {
  uint64_t id;
} refpool_step;

/// A buffer view: one reference to a buffer, plus dims and an element size. Release with
/// refpool_release; the buffer goes back to its cache when the last handle to it is released.
typedef struct refpool_buffer {
  uint64_t id;
} refpool_buffer;

/// How a cache rounds request sizes into block sizes (refpool::rounding_policy::mode).
typedef enum refpool_rounding REFPOOL_ENUM_BASE {
  /// Blocks have exactly the requested size ("exact").
  REFPOOL_ROUNDING_EXACT = 0,
  /// Round up to a multiple of `parameter` bytes (> 0) ("step:<bytes>").
  REFPOOL_ROUNDING_STEP = 1,
  /// Split each [2^k, 2^(k+1)) into `parameter` steps (a power of two, 1..64) ("pow2:<divisions>").
  REFPOOL_ROUNDING_POW2 = 2
} refpool_rounding;

/// What kind of memory a backend hands out (refpool::memory_kind).
typedef enum refpool_memory_kind REFPOOL_ENUM_BASE {
  REFPOOL_MEMORY_HOST = 0,          ///< pageable host memory
  REFPOOL_MEMORY_DEVICE = 1,        ///< device memory (cuMemAlloc / hipMalloc)
  REFPOOL_MEMORY_DEVICE_ASYNC = 2,  ///< stream-ordered device memory (cuMemAllocAsync / hipMallocAsync)
  REFPOOL_MEMORY_PINNED_HOST = 3    ///< page-locked host memory (cuMemHostAlloc / hipHostMalloc)
} refpool_memory_kind;

/// A GPU runtime.
typedef enum refpool_runtime REFPOOL_ENUM_BASE {
  REFPOOL_RUNTIME_CUDA = 0,  ///< the CUDA driver API (libcuda.so.1)
  REFPOOL_RUNTIME_HIP = 1,   ///< the HIP runtime (libamdhip64)
  REFPOOL_RUNTIME_HOST = 2   ///< the host backend (any device number; for CPU frameworks and tests)
} refpool_runtime;

/* ---- cache options: their C types, by kind (refpool/cache_option_fields.h) ----------------- */

/// A rounding policy (kind rounding_policy; refpool::rounding_policy).
typedef struct refpool_rounding_policy {
  refpool_rounding mode;
  size_t parameter;  ///< step bytes, or pow2 divisions; ignored for REFPOOL_ROUNDING_EXACT
} refpool_rounding_policy;

/// A byte count where REFPOOL_UNLIMITED means no limit (kind byte_limit).
typedef size_t refpool_byte_limit;

/// Whether a cache carves misses out of segments (kind segment_policy; refpool::segment_policy,
/// docs/design.md, "Segments").
typedef enum refpool_segment_policy REFPOOL_ENUM_BASE {
  /// "auto": on for device memory whose backend has virtual memory (GPUs), off for the rest.
  REFPOOL_SEGMENTS_AUTO = 0,
  /// "off": one backend allocation per block (needed for buffers exported for IPC or registered
  /// with NCCL or RDMA as allocations of their own).
  REFPOOL_SEGMENTS_OFF = 1,
  /// "on": segments for every backend.
  REFPOOL_SEGMENTS_ON = 2
} refpool_segment_policy;

/// A switch (kind on_off; bool in C++).
typedef enum refpool_on_off REFPOOL_ENUM_BASE {
  REFPOOL_OFF = 0,  ///< "off"
  REFPOOL_ON = 1    ///< "on"
} refpool_on_off;

/// refpool_byte_limit value for "no limit" (spelled `unlimited`).
#define REFPOOL_UNLIMITED SIZE_MAX

/// Tunables of a cache (refpool::cache_options): one field per option of
/// refpool/cache_option_fields.h (rounding, max_idle_bytes, segments, auto_plans), of its kind's C type. Fill
/// with refpool_cache_options_init or refpool_cache_options_from_environment, then change fields
/// or apply a conf string with refpool_cache_options_parse. A struct that grows: functions take
/// its size, and options your struct lacks take REFPOOL_CONF's value (else their default).
typedef struct refpool_cache_options {
#define REFPOOL_OPTION_FIELD(kind, name, default_text, description) refpool_##kind name;
  REFPOOL_CACHE_OPTIONS(REFPOOL_OPTION_FIELD)
#undef REFPOOL_OPTION_FIELD
} refpool_cache_options;

/// One cache option, as bindings need it to lay out refpool_cache_options and to name and check
/// its keywords (refpool_cache_option_info). Every string is static and NUL-terminated.
typedef struct refpool_option_info {
  const char* name;          ///< "rounding": the field, the REFPOOL_CONF key, the Python keyword
  const char* kind;          ///< "rounding_policy", "byte_limit", "segment_policy" or "on_off"
  size_t offset;             ///< offsetof(refpool_cache_options, <name>)
  size_t size;               ///< sizeof that field
  const char* default_text;  ///< the default, spelled as in REFPOOL_CONF ("exact")
  const char* allowed;       ///< the values the kind accepts, spelled so ("off, on, auto")
  const char* description;   ///< one line saying what the option does
} refpool_option_info;

/// A snapshot of a cache's counters: the fields of refpool::cache_stats, in its order, with its
/// meaning, all defined once in refpool/stats_fields.h. New counters are appended: a struct that
/// grows (refpool_cache_get_stats takes its size). Exact when no other thread uses the cache.
/// hit rate = hits / (hits + misses).
typedef struct refpool_cache_stats {
#define REFPOOL_STATS_FIELD(type, name, description) type name;
  REFPOOL_CACHE_STATS(REFPOOL_STATS_FIELD)
#undef REFPOOL_STATS_FIELD
} refpool_cache_stats;

/// How a scope runs (refpool::scope_options). Zero-initialise for a plain scope.
typedef struct refpool_scope_options {
  /// Run the first N entries of scopes on this cache (over all threads) uncached, so one-off
  /// warm-up allocations are never kept.
  size_t uncached_warmup_entries;
  /// NULL or "": a plain scope. Otherwise a planned scope under this key (docs/design.md,
  /// "Planned scopes"): a run with no plan for its sequence is served by the plain cache and
  /// records its requests; when a recorded sequence repeats, its plan (one arena) is made, and
  /// later runs with that sequence get regions of the arena. The text is copied.
  const char* plan;
} refpool_scope_options;

/// The framework allocator: one process-wide cache over the GPU backends of every device, used
/// by the framework entry points (refpool_torch_malloc, refpool_cupy_malloc) and by
/// refpool_allocator_alloc. Fill with refpool_allocator_options_init, change fields, then pass to
/// refpool_allocator_configure, with the cache's options, before the allocator's first allocation.
typedef struct refpool_allocator_options {
  refpool_runtime runtime;   ///< default REFPOOL_RUNTIME_CUDA
  refpool_memory_kind kind;  ///< REFPOOL_MEMORY_DEVICE (default) or _DEVICE_ASYNC; ignored for HOST
} refpool_allocator_options;

/// How refpool_alloc serves a request. Zero-initialise for the defaults (or pass NULL).
typedef struct refpool_alloc_options {
  /// The stream the buffer is used on (a CUstream or hipStream_t); NULL: the default stream.
  /// Host backends ignore it.
  void* stream;
  /// 0: the backend's alignment. Otherwise a power of two the address must be a multiple of: every
  /// buffer has its backend's alignment (256 B for refpool's host and GPU backends), and a request
  /// for more is refused (INVALID_ARGUMENT naming both), never served misaligned.
  size_t alignment;
  /// {0}: the calling thread's innermost active scope, else the backend itself. A cache: a
  /// request through that cache from any thread, with no scope; it belongs to the cache's open step.
  refpool_cache cache;
} refpool_alloc_options;

/// A backend's own accounting (refpool::backend's counters).
typedef struct refpool_backend_stats {
  size_t outstanding_bytes;     ///< allocated from the backend and not given back (cached or live)
  uint64_t allocation_count;    ///< successful backend allocations so far
  uint64_t deallocation_count;  ///< backend deallocations so far
} refpool_backend_stats;

/// What a buffer handle views, besides its dims (see refpool_dims).
typedef struct refpool_buffer_info {
  size_t rank;           ///< number of dims; 0 for a scalar
  size_t element_count;  ///< product of the dims (1 for rank 0)
  size_t element_size;   ///< bytes per element, as given to refpool_alloc
  size_t bytes;          ///< element_count * element_size
  int is_freed;          ///< 1 after refpool_unsafe_free on this handle, else 0
} refpool_buffer_info;

/* ---- errors and version ------------------------------------------------------------------ */

/// The message of the last failing refpool call on this thread: a complete sentence naming what
/// failed; "" if none failed yet. Successful calls leave it unchanged. The string is owned by
/// refpool and valid until the next failing call on this thread. Never returns NULL.
REFPOOL_C_API const char* refpool_last_error(void);

/// The name of a status ("REFPOOL_ERROR_SHAPE"); "REFPOOL_UNKNOWN_STATUS" for other values.
/// Static storage. Thread-safe.
REFPOOL_C_API const char* refpool_status_name(refpool_status status);

/// The library's version (the project version in meson.build). Static storage. Thread-safe.
REFPOOL_C_API const char* refpool_version(void);

/* ---- backends ---------------------------------------------------------------------------- */

/// A new handle to the process-wide host backend (pageable memory, 256-byte aligned).
/// All handles from this function name the same backend, so their buffers share cache keys.
/// The caller owns *out and releases it with refpool_backend_release.
/// Errors: INVALID_ARGUMENT (out NULL), OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_backend_host(refpool_backend* out);

/// A new host backend with its own counters (outstanding bytes start at 0); it is another
/// backend than refpool_backend_host's, so caches never exchange their blocks. Owned by the
/// caller. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_backend_new_host(refpool_backend* out);

/// A new host backend that fails (out of memory) any allocation that would take its
/// outstanding bytes past `capacity_bytes` (refpool::limiting_resource). For tests and for
/// capping memory. Owned by the caller. Errors: INVALID_ARGUMENT, OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_backend_new_host_limited(size_t capacity_bytes, refpool_backend* out);

/// Releases a backend handle. Buffers allocated from it, and caches holding its idle blocks,
/// keep the backend alive as long as they need it. Errors: INVALID_ARGUMENT (null handle),
/// INVALID_HANDLE (already released).
REFPOOL_C_API refpool_status refpool_backend_release(refpool_backend backend);

/// The backend's counters, into *out of `out_size` bytes (sizeof(refpool_backend_stats)).
/// Errors: INVALID_ARGUMENT (also a bad size), INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_backend_get_stats(refpool_backend backend, refpool_backend_stats* out,
                                                       size_t out_size);

/* ---- caches ------------------------------------------------------------------------------ */

/// Every function below that takes a refpool_cache_options takes `options_size` too:
/// sizeof(refpool_cache_options) as your header declares it (see "Structs that grow").

/// Fills *options with the defaults (refpool/cache_option_fields.h).
/// Errors: INVALID_ARGUMENT (a NULL pointer, a bad size).
REFPOOL_C_API refpool_status refpool_cache_options_init(refpool_cache_options* options, size_t options_size);

/// Fills *options with the defaults plus REFPOOL_CONF's cache options.
/// Errors: INVALID_ARGUMENT, CONFIG (bad REFPOOL_CONF; the message names the key).
REFPOOL_C_API refpool_status refpool_cache_options_from_environment(refpool_cache_options* options,
                                                                    size_t options_size);

/// Sets the options a conf string names, in REFPOOL_CONF's spelling ("rounding:pow2:4,segments:off");
/// the other fields keep their values. Errors: INVALID_ARGUMENT (a NULL pointer, a bad size), CONFIG
/// (not key:value, an unknown key, a process-wide key such as log, a bad value: the message names
/// the key and its allowed values; an option your struct is too small to hold); *options is
/// unchanged on error.
REFPOOL_C_API refpool_status refpool_cache_options_parse(refpool_cache_options* options, size_t options_size,
                                                         const char* conf);

/// Sets one option by name from its text ("rounding", "pow2:4"). Errors: as refpool_cache_options_parse.
REFPOOL_C_API refpool_status refpool_cache_options_set(refpool_cache_options* options, size_t options_size,
                                                       const char* name, const char* value);

/// The number of cache options (the fields of refpool_cache_options, in order).
REFPOOL_C_API size_t refpool_cache_option_count(void);
/// Option `index`'s name, kind, place and spelling, into *out of `out_size` bytes
/// (sizeof(refpool_option_info)); its strings are static. Errors: INVALID_ARGUMENT (index >=
/// refpool_cache_option_count(), out NULL, a bad size).
REFPOOL_C_API refpool_status refpool_cache_option_info(size_t index, refpool_option_info* out, size_t out_size);

/// Creates a cache. `options` NULL means refpool_cache_options_from_environment. The caller
/// owns *out and destroys it with refpool_cache_destroy. Errors: INVALID_ARGUMENT (out NULL, a bad
/// size), CONFIG (a field its kind does not allow, e.g. a step of 0 bytes: the message names the
/// field and the values allowed; a bad REFPOOL_CONF), OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_cache_create(const refpool_cache_options* options, size_t options_size,
                                                  refpool_cache* out);

/// Destroys a cache handle and the cache: its idle blocks go back to their backends. Buffers
/// still referenced stay valid and go to their backend when their last handle is released; a
/// scope still active on the cache keeps working, uncached, until it exits.
/// Errors: INVALID_ARGUMENT, INVALID_HANDLE (already destroyed).
REFPOOL_C_API refpool_status refpool_cache_destroy(refpool_cache cache);

/// The cache's counters, into *out of `out_size` bytes: pass sizeof(refpool_cache_stats). Only
/// `out_size` bytes are written, so a program built against an older header (fewer counters) gets
/// the counters it knows; counters your header has and this library lacks are 0. Bindings that
/// want every counter by name read refpool_cache_get_stat_values.
/// Errors: INVALID_ARGUMENT (also a bad size), INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_cache_get_stats(refpool_cache cache, refpool_cache_stats* out, size_t out_size);

/// Frees least recently released idle blocks until at most `keep_bytes` idle bytes remain;
/// live buffers are never touched. Stores the bytes freed in *freed_bytes unless it is NULL.
/// Errors: INVALID_ARGUMENT, INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_cache_reclaim(refpool_cache cache, size_t keep_bytes, size_t* freed_bytes);

/// Sets the cache's idle limit (REFPOOL_UNLIMITED: none), evicting at once if needed.
/// Errors: INVALID_ARGUMENT, INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_cache_set_max_idle_bytes(refpool_cache cache, size_t max_idle_bytes);

/* ---- scopes ------------------------------------------------------------------------------ */

/// Makes `cache` the active cache of the calling thread until the scope exits: refpool_alloc
/// on this thread then goes through it. Scopes nest, the innermost wins (as refpool::scope).
/// The caller owns *out and must exit it on this thread, innermost first, before the thread
/// ends. Errors: INVALID_ARGUMENT, INVALID_HANDLE (cache destroyed), OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_scope_enter(refpool_cache cache, refpool_scope* out);

/// As refpool_scope_enter, with options (warm-up entries, a plan key) of `options_size` bytes
/// (sizeof(refpool_scope_options)); `options` NULL is a plain scope. Errors: as
/// refpool_scope_enter, INVALID_ARGUMENT for a bad size, and CONFIG (bad REFPOOL_CONF).
REFPOOL_C_API refpool_status refpool_scope_enter_with_options(refpool_cache cache, const refpool_scope_options* options,
                                                              size_t options_size, refpool_scope* out);

/// Ends a scope. Buffers it handed out that are still referenced are counted as escapes and
/// stay valid. Errors: INVALID_ARGUMENT, INVALID_HANDLE (already exited), SCOPE (not the
/// innermost scope of the calling thread, or called on another thread: the scope then stays
/// active and the handle valid; exit the inner scopes first, on the entering thread).
REFPOOL_C_API refpool_status refpool_scope_exit(refpool_scope scope);

/* ---- GPU backends and streams ------------------------------------------------------------- */

/// A new handle to the process-wide CUDA backend of `device` and `kind` (REFPOOL_MEMORY_DEVICE,
/// _DEVICE_ASYNC or _PINNED_HOST): every call names the same backend, so buffers share cache keys.
/// Owned by the caller (refpool_backend_release). Errors: INVALID_ARGUMENT (out NULL, a kind out
/// of range or HOST), BACKEND_UNAVAILABLE (no driver, no such device, built without CUDA: the
/// message says which), BACKEND.
REFPOOL_C_API refpool_status refpool_backend_cuda(int device, refpool_memory_kind kind, refpool_backend* out);

/// The same for the HIP runtime (AMD GPUs).
REFPOOL_C_API refpool_status refpool_backend_hip(int device, refpool_memory_kind kind, refpool_backend* out);

/// Tells refpool the buffer is also used on `stream` (PyTorch's recordStream): a later reuse on
/// any other stream waits for it too. Errors: INVALID_ARGUMENT, INVALID_HANDLE, USE_AFTER_FREE.
REFPOOL_C_API refpool_status refpool_record_stream(refpool_buffer buffer, void* stream);

/// Call before destroying a stream you used with refpool: waits for its work and makes refpool
/// never order after it again (idle buffers may still name it). `backend` names the runtime and
/// device (a host backend: nothing to do). Errors: INVALID_ARGUMENT, INVALID_HANDLE, BACKEND.
REFPOOL_C_API refpool_status refpool_retire_stream(refpool_backend backend, void* stream);

/* ---- free by pointer ---------------------------------------------------------------------- */

/// Gives back a buffer handed out by address (refpool_allocator_alloc), on any thread. NULL does
/// nothing. Errors: INVALID_ARGUMENT naming the pointer when refpool keeps nothing under it (never
/// handed out, or already freed: a double free); nothing is freed then.
REFPOOL_C_API refpool_status refpool_free(void* ptr);

/* ---- steps ------------------------------------------------------------------------------- */

/// Opens a step on `cache` (refpool::step): every request made through the cache without a scope
/// (refpool_alloc with options->cache, the framework allocator when `cache` is its cache), on any
/// thread, belongs to it until refpool_step_end. It is planned under options->plan when set, else
/// under the cache's own key when the cache's auto_plans option is on (the default), else plain
/// (`options` NULL: no key; `options_size`: sizeof(refpool_scope_options)). The caller owns *out; it may be ended on
/// any thread. Errors: INVALID_ARGUMENT (also a bad size), INVALID_HANDLE, SCOPE (a step is already open on the
/// cache), CONFIG, OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_step_begin(refpool_cache cache, const refpool_scope_options* options,
                                                size_t options_size, refpool_step* out);

/// Ends a step: buffers its requests got that are still referenced are counted as escapes.
/// Errors: INVALID_ARGUMENT, INVALID_HANDLE (already ended).
REFPOOL_C_API refpool_status refpool_step_end(refpool_step step);

/* ---- stats by name (for bindings) --------------------------------------------------------- */

/// The number of counters a cache has (the fields of refpool_cache_stats, in order).
REFPOOL_C_API size_t refpool_stat_count(void);
/// The name of counter `index` ("hits"); NULL when index >= refpool_stat_count(). Static storage.
REFPOOL_C_API const char* refpool_stat_name(size_t index);
/// One line saying what counter `index` counts; NULL past the end. Static storage.
REFPOOL_C_API const char* refpool_stat_description(size_t index);
/// The counters of `cache` as integers, in refpool_stat_name order, into values[0..capacity);
/// *count receives refpool_stat_count() (so a caller can size its array first with capacity 0).
/// Errors: INVALID_ARGUMENT (count NULL, values NULL with capacity > 0), INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_cache_get_stat_values(refpool_cache cache, uint64_t* values, size_t capacity,
                                                           size_t* count);
/// Restarts the cache's peaks (peak_held_bytes, peak_live_bytes) from the current values.
REFPOOL_C_API refpool_status refpool_cache_reset_peaks(refpool_cache cache);

/* ---- stats for people ---------------------------------------------------------------------- */

/// How much refpool_cache_summary says.
typedef enum refpool_summary_detail REFPOOL_ENUM_BASE {
  /// A short table (refpool::alloc_cache::summary; REFPOOL_CONF's stats_at_exit:on): requests and
  /// hit rate, allocated, reserved and idle bytes now and at their peaks, plans, backend calls,
  /// out-of-memory failures. Bytes in B, KiB, MiB, GiB, TiB.
  REFPOOL_SUMMARY_SHORT = 0,
  /// Every counter, each figure once (refpool::to_string(cache_stats); stats_at_exit:full).
  REFPOOL_SUMMARY_FULL = 1
} refpool_summary_detail;

/// The cache's counters as text for a person, into text[0..capacity), NUL-terminated. *length
/// receives the text's length without the NUL, also when `text` is too small, so a binding sizes its
/// buffer: call with text NULL and capacity 0, then with capacity *length + 1; while other threads
/// use the cache the text may grow between the two calls, so repeat until REFPOOL_OK. The layout is
/// for people and may change between versions: programs read counters from refpool_cache_get_stats
/// or refpool_cache_get_stat_values. Errors: INVALID_ARGUMENT (length NULL, text NULL with capacity
/// > 0, capacity <= *length: nothing written; a detail that is neither SHORT nor FULL),
/// INVALID_HANDLE, OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_cache_summary(refpool_cache cache, refpool_summary_detail detail, char* text,
                                                   size_t capacity, size_t* length);

/* ---- memory maps --------------------------------------------------------------------------- */

/// What a range of a cache's memory is (refpool_memory_range::state).
typedef enum refpool_range_state REFPOOL_ENUM_BASE {
  REFPOOL_RANGE_LIVE = 0,       ///< a piece handed out (held by buffers)
  REFPOOL_RANGE_IDLE = 1,       ///< cached: handed out again only by this cache
  REFPOOL_RANGE_FREE = 2,       ///< free bytes of a segment (trimmed by refpool_cache_reclaim)
  REFPOOL_RANGE_SPAN_HELD = 3,  ///< a plan's arena in use
  REFPOOL_RANGE_SPAN_IDLE = 4   ///< a plan's arena not in use now (the segment may take its bytes back)
} refpool_range_state;

/// Which pool a segment of a memory map is in (refpool_memory_segment::pool).
typedef enum refpool_segment_pool REFPOOL_ENUM_BASE {
  REFPOOL_SEGMENT_SMALL = 0,  ///< a segment of the small pool (requests up to 256 KiB by default)
  REFPOOL_SEGMENT_LARGE = 1,  ///< a segment of the large pool
  REFPOOL_SEGMENT_BLOCK = 2   ///< no segment: one idle buffer straight from the backend, listed as its own segment
} refpool_segment_pool;

/// One segment of a cache's memory map. A struct that grows (its size is passed).
typedef struct refpool_memory_segment {
  uint64_t address;          ///< its first byte (a device address for device memory)
  uint64_t reserved_bytes;   ///< address space
  uint64_t committed_bytes;  ///< bytes backed by memory: the sum of its ranges
  uint64_t first_range;      ///< its ranges are ranges[first_range .. first_range + range_count)
  uint64_t range_count;
  int32_t device;       ///< the backend's device
  int32_t memory_kind;  ///< refpool_memory_kind
  int32_t pool;         ///< refpool_segment_pool
  int32_t expandable;   ///< 1: grows and shrinks through virtual memory (PyTorch's expandable segments)
} refpool_memory_segment;

/// One range of a segment, in address order. A struct that grows (its size is passed).
typedef struct refpool_memory_range {
  uint64_t address;
  uint64_t bytes;
  uint64_t segment;  ///< the index of its segment in the segments array
  int32_t state;     ///< refpool_range_state
  int32_t unused;    ///< 0
} refpool_memory_range;

/// The memory map of `cache` (PyTorch's memory snapshot, from refpool's side): every segment of its
/// heaps, with its live and idle pieces, free bytes and plans' arenas in address order (a segment
/// that grows through virtual memory has no range over its uncommitted holes), and each idle buffer
/// of a backend the cache keeps plain buffers for (REFPOOL_SEGMENT_BLOCK), all sorted by device,
/// then address. Live plain buffers (no segments) are not listed: the cache keeps no list of them
/// (refpool_cache_get_stats counts them). Writes up to `segment_capacity` segments of
/// `segment_size` bytes each (sizeof(refpool_memory_segment)) and up to `range_capacity` ranges of
/// `range_size` bytes each, and the full counts into *segment_count and *range_count: the map is
/// complete only when both fit, so size the arrays with capacities 0 first, then repeat until both
/// counts fit (other threads may change the map between calls). The caller owns the arrays.
/// Thread-safe: taken while other threads allocate and release, each segment is consistent, and a
/// buffer handed out or given back meanwhile shows in either state. For the framework allocator,
/// pass refpool_allocator_cache's handle, and each private pool's (refpool_allocator_pool_cache).
/// Errors: INVALID_ARGUMENT (a count NULL, an array NULL with its capacity > 0, a bad size, a
/// capacity times size that overflows size_t), INVALID_HANDLE, OUT_OF_MEMORY.
REFPOOL_C_API refpool_status refpool_cache_memory_map(refpool_cache cache, refpool_memory_segment* segments,
                                                      size_t segment_capacity, size_t segment_size,
                                                      size_t* segment_count, refpool_memory_range* ranges,
                                                      size_t range_capacity, size_t range_size, size_t* range_count);

/* ---- the framework allocator -------------------------------------------------------------- */

/// Fills *options of `options_size` bytes (sizeof(refpool_allocator_options)) with the defaults:
/// CUDA, device memory. Errors: INVALID_ARGUMENT.
REFPOOL_C_API refpool_status refpool_allocator_options_init(refpool_allocator_options* options, size_t options_size);

/// Sets the framework allocator's options and its cache's options (`cache` NULL: from REFPOOL_CONF,
/// as refpool_cache_options_from_environment). Each struct comes with its size. Only before the
/// allocator's first allocation (or its cache was asked for): CONFIG afterwards, naming what is in
/// use. Every field is checked before any is taken: a rejected call leaves the allocator as it
/// was. Errors: INVALID_ARGUMENT (also a bad size), CONFIG.
REFPOOL_C_API refpool_status refpool_allocator_configure(const refpool_allocator_options* options, size_t options_size,
                                                         const refpool_cache_options* cache, size_t cache_size);

/// A new handle to the framework allocator's cache, for steps, stats and reclaim (made at first
/// use with the configured options). refpool_cache_destroy on it drops this handle only: the
/// allocator keeps its cache for the life of the process. Errors: INVALID_ARGUMENT, CONFIG.
REFPOOL_C_API refpool_status refpool_allocator_cache(refpool_cache* out);

/// Allocates `bytes` on `device` for `stream` through the framework allocator; free with
/// refpool_free. 0 bytes gives NULL. Errors: INVALID_ARGUMENT, BACKEND_UNAVAILABLE, OUT_OF_MEMORY
/// (after reclaim and retry), BACKEND.
REFPOOL_C_API refpool_status refpool_allocator_alloc(size_t bytes, int device, void* stream, void** out);

/// Memory the framework allocator holds from `device` (live, idle and segments' free bytes, private
/// pools included) is capped at `bytes` from now on (SIZE_MAX: no cap; PyTorch's
/// set_per_process_memory_fraction). Bytes already held stay; a request past the cap gets
/// OUT_OF_MEMORY once idle blocks are reclaimed. Errors: INVALID_ARGUMENT (device), CONFIG,
/// BACKEND_UNAVAILABLE.
REFPOOL_C_API refpool_status refpool_allocator_set_device_limit(int device, size_t bytes);

/// Frees the framework allocator's idle blocks back to the driver (PyTorch's empty_cache), and the
/// freeable private pools (refpool_allocator_release_pool). Pools in use keep theirs: graphs
/// captured into them replay into those bytes. Errors: CONFIG.
REFPOOL_C_API refpool_status refpool_allocator_empty_cache(void);

/// Turns the framework allocator's caching off (`on` 0) or back on (nonzero; the default), as
/// PyTorch's caching_allocator_enable does for its own: while off, each request that no private
/// pool takes is the driver's own allocation, freed to the driver when it is given back, neither
/// served nor counted by the cache (for tools that check each allocation, such as
/// compute-sanitizer). Requests routed to private pools stay in their pools. A buffer keeps the
/// way it was served, whatever the setting when it is freed. The device limit still counts both.
/// Out of memory while off, the cache's idle memory goes back and the request is made once more.
/// Any thread; requests already in flight may still see the old setting.
REFPOOL_C_API void refpool_allocator_set_caching(int on);
/// 1 while the framework allocator caches (the default), 0 after refpool_allocator_set_caching(0)
/// and under REFPOOL_NO_CACHING=on.
REFPOOL_C_API int refpool_allocator_caching(void);

/// Marks the buffer handed out at `ptr` as used on `stream` too (PyTorch's recordStream): its
/// memory is handed out again for another stream only after the work `stream` has by then.
/// Errors: INVALID_ARGUMENT (a pointer the allocator does not hold), USE_AFTER_FREE, BACKEND.
REFPOOL_C_API refpool_status refpool_allocator_record_stream(void* ptr, void* stream);

/* ---- private pools (CUDA graph capture) ----------------------------------------------------
 * A private pool is a cache of its own inside the framework allocator, named by two numbers
 * (PyTorch's MempoolId_t). Between begin and end, the requests of `device` whose stream the
 * filter accepts (a stream capturing into the graph) are served from the pool; memory freed into
 * the pool is handed out again only from it, and stays reserved (never reclaimed, never trimmed)
 * until the pool's last release. docs/frameworks.md, "CUDA graphs", has the rules and the tests. */

/// A private pool's name; {0, 0} names none.
typedef struct refpool_pool_id {
  uint64_t first;
  uint64_t second;
} refpool_pool_id;

/// Whether a request made on `stream` belongs to the pool being routed to. Called on the
/// requesting thread with the allocator's pool lock held: it must not call the allocator.
typedef int (*refpool_stream_filter)(void* context, void* stream);

/// Routes requests of `device` whose stream `filter(context, stream)` accepts to private pool
/// `pool`, made at its first begin; each begin counts one use of the pool, given back by one
/// refpool_allocator_release_pool. refpool owns `context` from this call on, also on failure:
/// it calls `drop_context(context)` (if not NULL) once the route ends. Thread-safe.
/// Errors: INVALID_ARGUMENT (null filter, pool {0, 0}, a pool already routed to on `device`),
/// CONFIG, BACKEND_UNAVAILABLE.
REFPOOL_C_API refpool_status refpool_allocator_begin_pool(int device, refpool_pool_id pool,
                                                          refpool_stream_filter filter, void* context,
                                                          void (*drop_context)(void*));

/// Ends the route begun for `pool` on `device`; the pool stays. Errors: INVALID_ARGUMENT (no such
/// route).
REFPOOL_C_API refpool_status refpool_allocator_end_pool(int device, refpool_pool_id pool);

/// Gives back one use of `pool`. At the last one the pool is freeable: it keeps its memory, also
/// what its buffers still held give back when freed, until refpool_allocator_empty_cache or until a
/// request of the framework allocator runs out of memory, either made while no route to a private
/// pool is in force (a capture may use that memory); then its idle memory goes back to the
/// driver, and the pool is dropped once no buffer of it is held (until then it stays listed and
/// counted, as in PyTorch's snapshots and memory_reserved()). PyTorch's allocator keeps a released
/// graph pool's blocks the same way, and graphs rely on it: a graph captured later may still use a
/// buffer the pool freed during the capture. A pool never begun, or released already, is ignored
/// (PyTorch releases memory pools whose requests it never routed here). Never fails for a valid
/// `device`.
/// Errors: INVALID_ARGUMENT (an active route to the pool remains).
REFPOOL_C_API refpool_status refpool_allocator_release_pool(int device, refpool_pool_id pool);

/// 1 while any route to a private pool is in force, else 0 (one atomic load): a caller that must
/// relax CUDA's stream-capture mode around requests that may reach the driver checks this first.
REFPOOL_C_API int refpool_allocator_routing_to_pools(void);

/// The private pools, freeable ones too: writes up to `capacity` ids to `ids` and their number to *count.
/// Errors: INVALID_ARGUMENT (count NULL, or ids NULL with capacity > 0).
REFPOOL_C_API refpool_status refpool_allocator_pool_ids(refpool_pool_id* ids, size_t capacity, size_t* count);

/// A new handle to private pool `pool`'s cache (stats; refpool_cache_destroy drops the handle only).
/// Errors: INVALID_ARGUMENT (no such pool).
REFPOOL_C_API refpool_status refpool_allocator_pool_cache(refpool_pool_id pool, refpool_cache* out);

/// Allocates again, in private pool `pool` of `device`, exactly the `bytes` at `address` that the
/// pool handed out before and that are idle in it now: *out == address. For restoring a pool to a
/// checkpoint (PyTorch's setCheckpointPoolState re-allocates the blocks freed since, at their
/// addresses). Those bytes are either a buffer freed into the pool whose size is what a request of
/// `bytes` gets (handed out again as a hit would be), or, where the pool carves segments (the
/// default on CUDA), bytes of its segments that are free or in idle buffers of the pool: those
/// buffers go back to their segment, and the new buffer is carved exactly there (as a miss). The
/// buffer counts as an allocation of the pool (stats, live bytes) and is freed like any buffer of
/// the allocator (refpool_free, refpool_torch_free). `stream`: the stream it is used on, ordered
/// after the streams that used those bytes, as at a reuse. Thread-safe; a request of another
/// thread may take the same bytes first. Errors: INVALID_ARGUMENT (out NULL, address NULL, 0 bytes,
/// no such pool, a device the pool never served, or bytes not idle in the pool: the message says
/// which bytes are live, or that they are not the pool's; nothing changed then), OUT_OF_MEMORY
/// (trimmed bytes there could not be committed again), BACKEND.
REFPOOL_C_API refpool_status refpool_allocator_pool_take(int device, refpool_pool_id pool, void* address, size_t bytes,
                                                         void* stream, void** out);

/* ---- graph captures refpool does not route -------------------------------------------------
 * A device-wide wait (cuCtxSynchronize, hipDeviceSynchronize) fails while any stream of the device
 * captures a graph, and invalidates that capture, whatever the thread's capture mode; no driver
 * call says whether some stream of a device captures. refpool waits for a whole device before it
 * gives virtual memory back (unmapping bytes of unknown streams) and when it reuses cached bytes of
 * streams it cannot order. The framework allocator announces its private pools' routes itself
 * (PyTorch's CUDA graph pools and use_mem_pool); a program or library that captures graphs on its
 * own streams while refpool serves memory on that device announces its captures here.
 * docs/design.md, "Stream safety", has the rules. */

/// A graph capture may run on `device` from now until the matching refpool_capture_end. Meanwhile
/// refpool makes no device-wide wait on the device: memory it would give back after one stays
/// mapped (no longer counted in the cache's reserved bytes) until the device's last announced
/// capture ends, and a request that would need one is served without the cached bytes that need
/// it. Announcements nest and count: each begin needs one end. Announce before the capture begins.
/// Thread-safe.
/// Errors: INVALID_ARGUMENT (device outside 0 to 63).
REFPOOL_C_API refpool_status refpool_capture_begin(int device);

/// Ends one announcement of refpool_capture_begin on `device`, once the capture has ended
/// (cuStreamEndCapture, hipStreamEndCapture); the device's last one waits for the device and gives
/// back what was kept for its captures, on the calling thread. Thread-safe. Errors:
/// INVALID_ARGUMENT (device outside 0 to 63, or no announcement of this API open on the device).
REFPOOL_C_API refpool_status refpool_capture_end(int device);

/* The exact signatures frameworks call, so they load these by name from librefpool and no Python
 * runs per allocation (docs/frameworks.md). They allocate through the framework allocator.
 *
 * PyTorch (torch.cuda.memory.CUDAPluggableAllocator(path, "refpool_torch_malloc",
 * "refpool_torch_free")): `stream` is the request's cudaStream_t. A 0-byte request gives NULL. On
 * failure refpool_torch_malloc throws a C++ exception (refpool::out_of_memory, a std::bad_alloc,
 * or another refpool::error), which PyTorch reports as a Python exception with refpool's message:
 * call it from C++ only. refpool_torch_free of NULL does nothing; size, device and stream are
 * what PyTorch recorded and are not needed.
 *
 * CuPy (cupy.cuda.memory.CFunctionAllocator(0, malloc, free, owner)): CuPy passes no stream, so
 * requests are made for the device's default (legacy) stream, which orders against CuPy's
 * blocking streams; `param` is unused (pass 0). On failure refpool_cupy_malloc returns NULL and
 * sets refpool_last_error. */
REFPOOL_C_API void* refpool_torch_malloc(ptrdiff_t size, int device, void* stream); /* ssize_t on Linux */
REFPOOL_C_API void refpool_torch_free(void* ptr, ptrdiff_t size, int device, void* stream);
REFPOOL_C_API void* refpool_cupy_malloc(void* param, size_t size, int device);
REFPOOL_C_API void refpool_cupy_free(void* param, void* ptr, int device);

/* ---- buffers ----------------------------------------------------------------------------- */

/// A new uninitialised buffer of `rank` dims `dims[0..rank)` (row-major) of `element_size`
/// bytes each. With `options` NULL or options->cache null: from the innermost active scope's cache
/// on this thread (an idle buffer of the same rounded byte size, whatever its previous dims), else
/// directly from `backend`. With options->cache set: through that cache from any thread, with no
/// scope (refpool::alloc_cache::allocate; the request belongs to the cache's open step).
/// options->stream: the stream the buffer is used on (reuse of an idle buffer last used on another
/// stream makes it wait for that stream). options->alignment: see refpool_alloc_options. `options_size`:
/// sizeof(refpool_alloc_options) (ignored when options is NULL). rank 0 is a scalar (dims may
/// be NULL); a zero dim gives a buffer of zero elements that owns no memory. The caller owns *out and releases it with
/// refpool_release. Errors: INVALID_ARGUMENT (null backend or out, element_size 0, dims NULL with rank > 0, an
/// alignment that is not a power of two or is above the backend's, a bad size), INVALID_HANDLE (backend or
/// cache), SIZE (overflow), OUT_OF_MEMORY, BACKEND, CONFIG (bad REFPOOL_CONF).
REFPOOL_C_API refpool_status refpool_alloc(refpool_backend backend, const size_t* dims, size_t rank,
                                           size_t element_size, const refpool_alloc_options* options,
                                           size_t options_size, refpool_buffer* out);

/// A new handle viewing the same buffer with other dims and the same element size; the element
/// count must not change. The buffer is shared (its use count grows by one); the caller owns
/// *out. Errors: INVALID_ARGUMENT, INVALID_HANDLE, SHAPE (element count differs),
/// SIZE (overflow), USE_AFTER_FREE.
REFPOOL_C_API refpool_status refpool_reshape(refpool_buffer buffer, const size_t* dims, size_t rank,
                                             refpool_buffer* out);

/// A new handle sharing the buffer, with the same dims (a refcount increment). The caller owns
/// *out. Errors: INVALID_ARGUMENT, INVALID_HANDLE, USE_AFTER_FREE.
REFPOOL_C_API refpool_status refpool_retain(refpool_buffer buffer, refpool_buffer* out);

/// Releases a handle: drops its reference (if unsafe_free did not already) and frees the handle.
/// The buffer returns to its cache, or to its backend, when its last reference goes. Releasing
/// the same handle again gives INVALID_HANDLE, never undefined behaviour.
/// Errors: INVALID_ARGUMENT (null handle), INVALID_HANDLE (already released).
REFPOOL_C_API refpool_status refpool_release(refpool_buffer buffer);

/// Drops this handle's reference to its buffer now (refpool::data_ref::unsafe_free): the buffer
/// is reusable at once if no other handle shares it. The handle stays valid for queries and must
/// still be released; refpool_data, refpool_retain and refpool_reshape on it then give
/// USE_AFTER_FREE. Idempotent. Errors: INVALID_ARGUMENT, INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_unsafe_free(refpool_buffer buffer);

/// The number of handles sharing the buffer (C++ data_refs included); 0 after unsafe_free and
/// for zero-element buffers. Errors: INVALID_ARGUMENT, INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_use_count(refpool_buffer buffer, long* out);

/// The buffer's first element (a host address for host memory); NULL for zero elements. The
/// pointer is valid while a handle holds the buffer. Errors: INVALID_ARGUMENT, INVALID_HANDLE,
/// USE_AFTER_FREE.
REFPOOL_C_API refpool_status refpool_data(refpool_buffer buffer, void** out);

/// The rank into *rank and, when `dims` is not NULL, the dims into dims[0..rank). A freed
/// buffer still has its dims. Errors: INVALID_ARGUMENT (rank NULL, or dims not NULL and
/// `capacity` < rank: *rank is then still set, so a caller can size its array), INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_dims(refpool_buffer buffer, size_t* dims, size_t capacity, size_t* rank);

/// Rank, element count and size, bytes, freed flag, into *out of `out_size` bytes
/// (sizeof(refpool_buffer_info)). Errors: INVALID_ARGUMENT (also a bad size), INVALID_HANDLE.
REFPOOL_C_API refpool_status refpool_buffer_get_info(refpool_buffer buffer, refpool_buffer_info* out, size_t out_size);

#undef REFPOOL_ENUM_BASE

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // REFPOOL_REFPOOL_H
