// The per-thread stack of scopes and guards, and the allocation entry point that consults it.
#include <refpool/data_ref.hpp>
#include <refpool/error.hpp>
#include <refpool/scope.hpp>

#include <cstdio>
#include <exception>
#include <thread>

#include <fmt/format.h>

#include "alloc_log.hpp"
#include "block.hpp"
#include "cache_state.hpp"
#include "env_config.hpp"

namespace refpool {

namespace detail {
namespace {

// Initial-exec: one pointer of static TLS, so the hit path reads it without a call.
[[gnu::tls_model("initial-exec")]] thread_local scope_frame* current_frame = nullptr;

void push(scope_frame& frame) noexcept {
  frame.previous = current_frame;
  frame.open = true;
  current_frame = &frame;
}

// Unlinks `frame` if it is the innermost open frame of this thread; throws scope_error if not.
void pop(scope_frame& frame, std::string_view what) {
  if (!frame.open) return;
  if (current_frame != &frame) {
    bool on_this_thread = false;
    for (const scope_frame* f = current_frame; f != nullptr; f = f->previous) on_this_thread |= f == &frame;
    throw scope_error(fmt::format(
        "refpool: {} closed out of order: {}", what,
        on_this_thread ? "a scope or guard opened after it on this thread is still open; close that first"
                       : "it is not open on this thread (scopes must end on the thread that opened them)"));
  }
  current_frame = frame.previous;
  frame.open = false;
}

[[noreturn]] void terminate_with(const scope_error& e) noexcept {
  fmt::print(stderr, "{}\n", e.what());
  std::fflush(stderr);
  std::terminate();
}

}  // namespace

block* allocate_direct(const backend& be, std::size_t bytes, stream_ref stream) {
  auto made = std::make_unique<block>();
  void* ptr = be.state()->allocate(bytes, stream);
  if (ptr == nullptr)
    throw out_of_memory(fmt::format("refpool: out of memory: {} could not allocate {} B on device {} "
                                    "(uncached allocation: no cache to reclaim); the backend has {} B outstanding",
                                    be.name(), bytes, be.device(), be.outstanding_bytes()),
                        bytes, be.device());
  made->ptr = ptr;
  made->capacity = bytes;
  made->requested = bytes;
  made->backend = be.state().get();
  made->direct_backend = be.state();
  made->last_stream = stream;
  made->refs.store(1, std::memory_order_relaxed);
  return made.release();
}

}  // namespace detail

scope::scope(alloc_cache& cache, scope_options options) {
  detail::cache_state& state = cache.state();
  const bool bypass = detail::environment().no_caching;
  frame_.cache = &state;
  bool nested = false;
  for (const detail::scope_frame* f = detail::current_frame; f != nullptr && !nested; f = f->previous) {
    if (f->cache == &state) {  // nested on a cache already active here: share its state
      frame_.lease = f->lease;
      frame_.run = f->run;
      nested = true;
    }
  }
  if (!nested) {
    const bool warmup = state.count_entry(bypass ? static_cast<std::size_t>(-1) : options.uncached_warmup_entries);
    if (!warmup) {
      frame_.lease = state.lease(std::this_thread::get_id());
      frame_.owns_lease = frame_.lease != nullptr;
    }
    if (frame_.lease != nullptr && !options.plan.empty()) {
      frame_.run = new detail::plan_run(state, std::string(options.plan));
      frame_.owns_run = true;
    }
  }
  state.retain();
  detail::push(frame_);
}

scope::~scope() {
  try {
    close();
  } catch (const scope_error& e) {
    detail::terminate_with(e);
  }
}

void scope::close() {
  if (!frame_.open) return;
  detail::pop(frame_, "a refpool scope was");
  if (frame_.owns_run) {
    frame_.run->finish(frame_.lease);
    frame_.run->release();
  }
  frame_.run = nullptr;
  frame_.owns_run = false;
  if (frame_.owns_lease) frame_.cache->give_back(frame_.lease);
  frame_.cache->release();
  frame_.lease = nullptr;
  frame_.owns_lease = false;
}

uncached_guard::uncached_guard() { detail::push(frame_); }

uncached_guard::~uncached_guard() {
  try {
    close();
  } catch (const scope_error& e) {
    detail::terminate_with(e);
  }
}

void uncached_guard::close() { detail::pop(frame_, "a refpool uncached_guard was"); }

bool caching_active() noexcept {
  const detail::scope_frame* f = detail::current_frame;
  return f != nullptr && f->lease != nullptr;
}

data_ref allocate(const backend& be, std::size_t bytes, stream_ref stream) {
  if (!be) throw error("refpool: allocate from a null backend");
  if (bytes == 0)
    throw size_error("refpool: cannot allocate 0 bytes (zero-element arrays need no buffer: empty<T> "
                     "makes them without allocating)");
  const detail::scope_frame* f = detail::current_frame;
  detail::block* b = nullptr;
  if (f != nullptr && f->run != nullptr) {
    b = f->run->acquire(f->lease, be, bytes, stream);
  } else if (f != nullptr && f->lease != nullptr) {
    b = f->cache->acquire(*f->lease, be, bytes, stream);  // the scope read the environment already
  } else {
    detail::environment();  // a bad REFPOOL_CONF fails here, clearly, and the log is open before use
    b = detail::allocate_direct(be, bytes, stream);
  }
  if (detail::alloc_log* log = detail::active_log()) log->record(true, b->ptr, bytes, stream);
  return data_ref(b);
}

}  // namespace refpool
