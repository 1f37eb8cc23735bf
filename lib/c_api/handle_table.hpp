// The C API's handle tables: ids with a kind tag and a generation, so a stale or foreign handle is
// an error naming what is wrong with it, never a use of freed memory.
#pragma once

#include <refpool/refpool.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "c_api/last_error.hpp"

namespace refpool::c_api {

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

}  // namespace refpool::c_api
