// Virtual memory of a GPU's device memory over the runtime table (CUDA: cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess; HIP: the hipMem* calls of the same names): address space
// reserved once, one physical allocation created and mapped per commit, and a record of which
// physical allocation backs which committed range, so decommit unmaps and releases exactly those.
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include <refpool/error.hpp>

#include "gpu/captures.hpp"
#include "runtime_api.hpp"

namespace refpool::detail::gpu {

namespace {

class gpu_virtual_memory final : public virtual_memory, public kept_for_capture {
 public:
  gpu_virtual_memory(const runtime_api& api, int device, std::size_t granularity)
      : api_(api), device_(device), granularity_(granularity) {}

  std::size_t granularity() const noexcept override { return granularity_; }

  void* reserve(std::size_t bytes) override {
    check_size(bytes, "reserve");
    device_guard guard(api_, device_);
    const relaxed_capture_mode relaxed(api_);  // a capture in global mode must not refuse it
    void* ptr = nullptr;
    const status code = api_.vm_reserve(&ptr, bytes, granularity_);
    if (code == api_.out_of_memory) return nullptr;  // no address space left
    check(api_, code, api_.vm_reserve.name, fmt::format("{} B on device {}", bytes, device_));
    std::lock_guard lock(mutex_);
    reservations_[address(ptr)] = bytes;
    return ptr;
  }

  // Each step that fails undoes the ones before it, so a failed commit holds nothing; out of
  // memory from any of them is `false`, any other error `backend_error`.
  bool commit(void* addr, std::size_t bytes) override {
    check_size(bytes, "commit");
    {
      std::lock_guard lock(mutex_);
      retry_stale(address(addr), address(addr) + bytes);
      check_uncommitted_range(addr, bytes);
    }
    device_guard guard(api_, device_);
    const relaxed_capture_mode relaxed(api_);
    handle physical = nullptr;
    const status created = api_.vm_create(&physical, bytes, device_);
    if (created == api_.out_of_memory) return false;
    const std::string where = fmt::format("{} B at {} on device {}", bytes, addr, device_);
    check(api_, created, api_.vm_create.name, where);
    if (const status mapped = api_.vm_map(addr, bytes, physical); mapped != api_.success) {
      (void)api_.vm_release(physical);
      if (mapped == api_.out_of_memory) return false;
      throw_error(api_, mapped, api_.vm_map.name, where);
    }
    if (const status opened = api_.vm_set_access(addr, bytes, device_); opened != api_.success) {
      (void)api_.vm_unmap(addr, bytes);
      (void)api_.vm_release(physical);
      if (opened == api_.out_of_memory) return false;
      throw_error(api_, opened, api_.vm_set_access.name, where);
    }
    std::lock_guard lock(mutex_);
    pieces_[address(addr)] = {bytes, physical, true, false, false};
    return true;
  }

  void decommit(void* addr, std::size_t bytes) noexcept override {
    if (api_.torn_down()) return;  // at exit, after the runtime's teardown
    std::lock_guard lock(mutex_);
    const auto start = address(addr);
    // Each commit is one physical allocation, unmapped and released whole: a range that cuts one
    // cannot be given back.
    for (const auto& [at, piece] : pieces_)
      if (at < start + bytes && at + piece.bytes > start && (at < start || at + piece.bytes > start + bytes)) {
        std::fprintf(stderr,
                     "refpool: virtual_memory::decommit(%p, %zu) on device %d cuts the committed range [%p, +%zu), "
                     "one physical allocation: nothing was decommitted\n",
                     addr, bytes, device_, reinterpret_cast<void*>(at), piece.bytes);
        return;
      }
    free_pieces(start, start + bytes);
  }

  void release(void* addr, std::size_t bytes) noexcept override {
    if (api_.torn_down()) return;
    std::lock_guard lock(mutex_);
    const auto start = address(addr);
    const auto it = reservations_.find(start);
    if (it == reservations_.end() || it->second != bytes) {
      std::fprintf(stderr, "refpool: virtual_memory::release(%p, %zu) on device %d: not a range reserve() returned\n",
                   addr, bytes, device_);
      return;
    }
    free_pieces(start, start + bytes);  // anything still committed (the caller should have decommitted)
    if (has_pieces(start, start + bytes)) {
      // Kept mapped for want of a wait (a graph capture): the driver refuses to free a range with
      // mappings, so the range goes with its last piece, at a later free_pieces that waits.
      releases_pending_[start] = bytes;
      return;
    }
    free_reservation(it);
  }

 private:
  struct piece {
    std::size_t bytes;
    handle physical;
    bool mapped;
    /// Decommitted as far as refpool knows, but the driver refused to unmap or release it: the
    /// next commit over its range and the release of its reservation try again.
    bool stale;
    /// Stale because the device's wait before unmapping failed (a graph capture): still mapped,
    /// and given back after the next wait that succeeds.
    bool unwaited = false;
  };

  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  // Whether a piece (mapped or stale) lies in [start, end). Called with mutex_ held.
  bool has_pieces(std::uintptr_t start, std::uintptr_t end) const {
    const auto it = pieces_.lower_bound(start);
    return it != pieces_.end() && it->first < end;
  }

  // Frees a reservation that holds no piece. Called with mutex_ held.
  void free_reservation(std::map<std::uintptr_t, std::size_t>::iterator reservation) noexcept {
    void* const addr = reinterpret_cast<void*>(reservation->first);
    const std::size_t bytes = reservation->second;
    try {
      device_guard guard(api_, device_);
      const relaxed_capture_mode relaxed(api_);
      check(api_, api_.vm_free(addr, bytes), api_.vm_free.name, fmt::format("{} B at {}", bytes, addr));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    reservations_.erase(reservation);
  }

  void check_size(std::size_t bytes, const char* call) const {
    if (bytes == 0 || bytes % granularity_ != 0)
      throw refpool::invalid_argument(
          fmt::format("refpool: virtual_memory::{} of {} B on device {}: the size must be a non-zero "
                      "multiple of the granularity, {} B",
                      call, bytes, device_, granularity_));
  }

  // Throws unless [addr, addr + bytes) is granule-aligned, inside one reserved range, and has no
  // committed byte. Called with mutex_ held.
  void check_uncommitted_range(void* addr, std::size_t bytes) const {
    const auto start = address(addr);
    auto reservation = reservations_.upper_bound(start);
    const bool reserved = reservation != reservations_.begin() &&
                          start + bytes <= std::prev(reservation)->first + std::prev(reservation)->second;
    const bool aligned = reserved && (start - std::prev(reservation)->first) % granularity_ == 0;
    const auto next = pieces_.lower_bound(start);
    const bool overlaps = (next != pieces_.end() && next->first < start + bytes) ||
                          (next != pieces_.begin() && std::prev(next)->first + std::prev(next)->second.bytes > start);
    if (!reserved || !aligned || overlaps)
      throw refpool::invalid_argument(
          fmt::format("refpool: virtual_memory::commit({}, {}) on device {}: {}", addr, bytes, device_,
                      !reserved  ? "the range is not inside one range reserve() returned"
                      : !aligned ? "the range does not start at a multiple of the granularity"
                                 : "part of the range is already committed"));
  }

  // Unmaps and releases every piece inside [start, end), after waiting for the device: unmapping
  // does not wait for kernels or copies in flight on the range (PyTorch's expandable segments
  // synchronise before cuMemUnmap for the same reason), and the heap cannot name every stream that
  // used a free range. Decommits are rare (trim, reclaim). A piece the driver refuses to unmap or
  // release is reported and kept as stale, for retry_stale. While a graph capture may run on the
  // device (gpu/captures.hpp: the wait would break it), or when the wait fails, nothing is unmapped
  // under work that may be in flight: the pieces stay mapped, stale, and go at the next free_pieces
  // whose wait succeeds (a later trim or reclaim), at a commit over their range, or with their
  // reservation.
  // Called with mutex_ held.
  void free_pieces(std::uintptr_t start, std::uintptr_t end) noexcept {
    auto it = pieces_.lower_bound(start);
    if (it == pieces_.end() || it->first >= end) return;
    const auto keep_unwaited = [&] {
      for (; it != pieces_.end() && it->first + it->second.bytes <= end; ++it)
        it->second.stale = it->second.unwaited = true;
    };
    const device_wait wait = permit_device_wait(device_, this);
    if (!wait) return keep_unwaited();  // the wait itself would break the capture
    try {
      device_guard guard(api_, device_);
      if (!wait_for_device()) return keep_unwaited();
      while (it != pieces_.end() && it->first + it->second.bytes <= end) it = free_piece(it);
      free_kept();
    } catch (const std::exception& e) {  // the device cannot be made current: the pieces stay
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  // The pieces kept while announced captures ran go once the last is over (gpu/captures.hpp).
  void settle() noexcept override {
    std::lock_guard lock(mutex_);
    const device_wait wait = permit_device_wait(device_, this);
    if (!wait) return;  // another capture began meanwhile
    try {
      device_guard guard(api_, device_);
      if (wait_for_device()) free_kept();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  // Waits for every stream of the device; false (said on stderr) if the runtime refused. A context
  // that is gone (at exit, after the runtime's teardown) has no work in flight. Called with the
  // device current.
  bool wait_for_device() const {
    const status code = api_.device_synchronize();
    if (code == api_.success || api_.context_gone(code)) return true;
    std::fprintf(stderr, "%s\n",
                 error_text(code, api_.device_synchronize.name, "before unmapping (kept, to retry)").c_str());
    return false;
  }

  // After a wait for the device: the pieces an earlier free_pieces kept for want of one go, and then
  // the reservations released meanwhile. Called with mutex_ held and the device current.
  void free_kept() noexcept {
    for (auto kept = pieces_.begin(); kept != pieces_.end();)
      kept = kept->second.unwaited ? free_piece(kept) : std::next(kept);
    for (auto pending = releases_pending_.begin(); pending != releases_pending_.end();) {
      const auto [at, bytes] = *pending;
      if (has_pieces(at, at + bytes)) {
        ++pending;
        continue;
      }
      pending = releases_pending_.erase(pending);
      if (const auto reservation = reservations_.find(at); reservation != reservations_.end())
        free_reservation(reservation);
    }
  }

  // Unmaps and releases one piece; the next one. Called with mutex_ held and the device current.
  std::map<std::uintptr_t, piece>::iterator free_piece(std::map<std::uintptr_t, piece>::iterator it) noexcept {
    piece& p = it->second;
    p.unwaited = false;  // every caller has waited for the device
    const relaxed_capture_mode relaxed(api_);  // after the wait, which a capture must still refuse
    void* ptr = reinterpret_cast<void*>(it->first);
    if (p.mapped) {
      if (const status code = api_.vm_unmap(ptr, p.bytes); code != api_.success) {
        report(code, api_.vm_unmap.name, ptr, p);
        p.stale = true;
        return std::next(it);
      }
      p.mapped = false;
    }
    if (const status released = api_.vm_release(p.physical); released != api_.success) {
      report(released, api_.vm_release.name, ptr, p);
      p.stale = true;
      return std::next(it);
    }
    return pieces_.erase(it);
  }

  // Frees the stale pieces that overlap [start, end), where a commit is about to be made.
  // Throws `backend_error` if the driver still refuses. Called with mutex_ held.
  void retry_stale(std::uintptr_t start, std::uintptr_t end) {
    auto it = pieces_.lower_bound(start);
    if (it != pieces_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > start) --it;
    while (it != pieces_.end() && it->first < end) {
      if (!it->second.stale) {
        ++it;
        continue;
      }
      device_guard guard(api_, device_);
      if (it->second.unwaited) {  // kept because the wait before unmapping failed: wait now
        const device_wait wait = permit_device_wait(device_, nullptr);
        if (!wait)
          throw stream_order_unavailable(
              fmt::format("refpool: cannot commit {:#x} on device {} now: its last memory still waits to be "
                          "unmapped, and waiting for the device would break a graph capture",
                          it->first, device_),
              -1);
        check(api_, api_.device_synchronize(), api_.device_synchronize.name, "before unmapping");
      }
      const auto stale = it->first;
      it = free_piece(it);
      if (pieces_.count(stale) != 0)
        throw backend_error(fmt::format("refpool: device {} still refuses to give back the physical allocation "
                                        "at {:#x} that a commit needs the range of",
                                        device_, stale),
                            -1);
    }
  }

  void report(status code, std::string_view call, void* ptr, const piece& p) const noexcept {
    try {
      const std::string where = fmt::format("{} B at {} on device {} (kept, to retry)", p.bytes, ptr, device_);
      std::fprintf(stderr, "%s\n", error_text(code, call, where).c_str());
    } catch (...) {}
  }

  std::string error_text(status code, std::string_view call, const std::string& where) const {
    try {
      throw_error(api_, code, call, where);
    } catch (const backend_error& e) {
      return e.what();
    }
  }

  const runtime_api& api_;
  const int device_;
  const std::size_t granularity_;
  std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> reservations_;  // start -> bytes
  /// Reservations released while pieces in them were kept for want of a wait: start -> bytes.
  std::map<std::uintptr_t, std::size_t> releases_pending_;
  std::map<std::uintptr_t, piece> pieces_;              // committed ranges by start: one physical allocation each
};

}  // namespace

std::unique_ptr<virtual_memory> make_virtual_memory(const runtime_api& api, int device) noexcept {
  try {
    device_guard guard(api, device);
    bool supported = false;
    std::size_t granularity = 0;
    if (api.vm_supported(device, &supported) != api.success || !supported) return nullptr;
    if (api.vm_granularity(device, &granularity) != api.success || granularity == 0) return nullptr;
    return std::make_unique<gpu_virtual_memory>(api, device, granularity);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace refpool::detail::gpu
