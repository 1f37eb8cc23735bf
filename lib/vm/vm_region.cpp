// vm_region: reserve, commit, decommit and release with their failure rules (vm_region.hpp).
#include "vm/vm_region.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include <refpool/error.hpp>
#include <refpool/virtual_memory.hpp>

#include "backend_state.hpp"

namespace refpool::detail {

vm_region vm_region::reserve(backend_state& backend, virtual_memory& vm, std::size_t bytes) {
  vm_region region;
  region.commits_.reserve(4);  // before the reservation: nothing to undo if this throws
  void* at = vm.reserve(bytes);
  if (at == nullptr) return region;  // no address space left: the caller falls back
  const std::size_t granularity = vm.granularity();
  if (reinterpret_cast<std::uintptr_t>(at) % granularity != 0) {
    vm.release(at, bytes);
    throw backend_error(fmt::format("refpool: {} reserved address space at {}, not aligned to its {} B granularity",
                                    backend.res().name(), at, granularity),
                        -1);
  }
  region.backend_ = &backend;
  region.vm_ = &vm;
  region.base_ = reinterpret_cast<std::uintptr_t>(at);
  region.reserved_ = bytes;
  region.granularity_ = granularity;
  return region;
}

vm_region& vm_region::operator=(vm_region&& other) noexcept {
  if (this != &other) {
    free_reservation();
    backend_ = std::exchange(other.backend_, nullptr);
    vm_ = std::exchange(other.vm_, nullptr);
    base_ = std::exchange(other.base_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
    committed_ = std::exchange(other.committed_, 0);
    granularity_ = std::exchange(other.granularity_, 0);
    commits_ = std::move(other.commits_);
    other.commits_.clear();
  }
  return *this;
}

std::size_t vm_region::first_ending_after(std::size_t offset) const noexcept {
  const auto it =
      std::partition_point(commits_.begin(), commits_.end(), [&](const commit_record& c) { return c.end() <= offset; });
  return static_cast<std::size_t>(it - commits_.begin());
}

bool vm_region::commit(std::size_t offset, std::size_t bytes) {
  const std::size_t at = first_ending_after(offset);
  const bool overlaps = at < commits_.size() && commits_[at].offset < offset + bytes;
  if (vm_ == nullptr || bytes == 0 || offset % granularity_ != 0 || bytes % granularity_ != 0 || offset > reserved_ ||
      bytes > reserved_ - offset || overlaps)
    throw std::logic_error(
        fmt::format("refpool: cannot commit {} B at offset {} of a region of {} B (a bug in "
                    "refpool)",
                    bytes, offset, reserved_));
  commits_.reserve(commits_.size() + 1);  // so that recording a commit cannot fail after it
  if (!vm_->commit(reinterpret_cast<void*>(base_ + offset), bytes)) return false;
  commits_.insert(commits_.begin() + static_cast<std::ptrdiff_t>(at), commit_record{offset, bytes});
  committed_ += bytes;
  backend_->count_commit(bytes);
  return true;
}

void vm_region::decommit(std::size_t index) noexcept {
  const commit_record c = commits_[index];
  vm_->decommit(reinterpret_cast<void*>(base_ + c.offset), c.bytes);
  commits_.erase(commits_.begin() + static_cast<std::ptrdiff_t>(index));
  committed_ -= c.bytes;
  backend_->count_decommit(c.bytes);
}

void vm_region::free_reservation() noexcept {
  if (vm_ == nullptr) return;
  // The last commit first: a heap's tail goes before its start, as it was made.
  while (!commits_.empty()) decommit(commits_.size() - 1);
  vm_->release(reinterpret_cast<void*>(base_), reserved_);
  abandon();
}

void vm_region::abandon() noexcept {
  commits_.clear();
  committed_ = 0;
  vm_ = nullptr;
  backend_ = nullptr;
  base_ = 0;
  reserved_ = 0;
  granularity_ = 0;
}

}  // namespace refpool::detail
