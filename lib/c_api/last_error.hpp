// The C API's error reporting: the thread's last-error slot, and `guarded`, the one wrapper that
// turns the core's exceptions into statuses.
#pragma once

#include <refpool/refpool.h>

#include <pthread.h>

#include <memory>
#include <new>
#include <string>
#include <utility>

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

}  // namespace refpool::c_api
