// Host virtual memory through mmap, mprotect and munmap (see host_virtual_memory.hpp).
#include "host_virtual_memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include <refpool/error.hpp>

namespace refpool::detail {

namespace {

constexpr std::size_t g = host_vm_granularity;

bool granule_aligned(const void* addr, std::size_t bytes) noexcept {
  return bytes != 0 && bytes % g == 0 && reinterpret_cast<std::uintptr_t>(addr) % g == 0;
}

[[noreturn]] void die(const char* call, void* addr, std::size_t bytes, int err) noexcept {
  fmt::print(stderr, "refpool: {}({}, {} B) failed on reserved host address space: {}\n", call, addr, bytes,
             std::strerror(err));
  std::abort();
}

}  // namespace

void* host_virtual_memory::reserve(std::size_t bytes) {
  if (bytes == 0 || bytes % g != 0)
    throw backend_error(fmt::format("refpool: host virtual memory: cannot reserve {} B (not a positive multiple "
                                    "of the {} B granularity)",
                                    bytes, g),
                        EINVAL);
  if (bytes > SIZE_MAX - g) return nullptr;  // no address space is that large
  // Over-reserve by one granule and cut both ends, so the range starts at a multiple of g. No
  // MAP_NORESERVE: an inaccessible mapping is not charged anyway, and without the flag making
  // it writable (commit) is charged, as a plain allocation is.
  const std::size_t span = bytes + g;
  void* raw = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    // The arguments were checked above, so EINVAL says the length is too large for this process
    // (under valgrind a 256 GiB reservation gets it): no address space, as ENOMEM.
    if (errno == ENOMEM || errno == EINVAL) return nullptr;
    throw backend_error(
        fmt::format("refpool: host virtual memory: mmap of {} B failed: {}", span, std::strerror(errno)), errno);
  }
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + g - 1) / g * g;
  if (aligned > start) ::munmap(raw, aligned - start);
  const std::uintptr_t end = aligned + bytes;
  if (start + span > end) ::munmap(reinterpret_cast<void*>(end), start + span - end);
  return reinterpret_cast<void*>(aligned);
}

bool host_virtual_memory::commit(void* addr, std::size_t bytes) {
  if (!granule_aligned(addr, bytes))
    throw backend_error(fmt::format("refpool: host virtual memory: cannot commit {} B at {} (not granule "
                                    "aligned, granule {} B)",
                                    bytes, addr, g),
                        EINVAL);
  if (::mprotect(addr, bytes, PROT_READ | PROT_WRITE) == 0) return true;
  if (errno == ENOMEM) return false;
  throw backend_error(
      fmt::format("refpool: host virtual memory: mprotect of {} B at {} failed: {}", bytes, addr, std::strerror(errno)),
      errno);
}

void host_virtual_memory::decommit(void* addr, std::size_t bytes) noexcept {
  if (!granule_aligned(addr, bytes)) die("decommit", addr, bytes, EINVAL);
  // A fresh inaccessible mapping in place drops the pages and the commit charge at once
  // (mprotect(PROT_NONE) would keep the charge). The range stays ours throughout.
  if (::mmap(addr, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) return;
  // The kernel may refuse to split a mapping (the map count limit): the pages still go, and
  // the charge stays until the range is committed again or released.
  const int err = errno;
  if (::madvise(addr, bytes, MADV_DONTNEED) != 0) die("mmap", addr, bytes, err);
}

void host_virtual_memory::release(void* addr, std::size_t bytes) noexcept {
  if (!granule_aligned(addr, bytes)) die("release", addr, bytes, EINVAL);
  if (::munmap(addr, bytes) != 0) die("munmap", addr, bytes, errno);
}

}  // namespace refpool::detail
