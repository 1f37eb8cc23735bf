// Fault injection for failure tests: resources and virtual memory that fail chosen calls, so the
// tests reach every out-of-memory and driver-failure path. Test tooling, not part of librefpool:
// built into the test-support library (test/support/meson.build); the names stay in namespace
// refpool, as the tests have always used them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <refpool/adaptors.hpp>
#include <refpool/resource.hpp>
#include <refpool/virtual_memory.hpp>

namespace refpool {

/// Which calls an injecting adaptor fails: calls number `first` to `first + count - 1`
/// (1-based, counted from construction or the last `arm`) fail as out of memory or with
/// `backend_error`. Shared by a failing_resource and its address space, so "the Nth call"
/// counts allocations, reservations and commits in the order they happen; `arm_only` counts
/// one kind or a few (every reservation refused, say). Thread-safe.
class fault_schedule {
 public:
  enum class failure { out_of_memory, backend_error };
  /// Kinds of call, as bits to combine with `|` for arm_only().
  enum call_kind : unsigned { allocations = 1, reservations = 2, commits = 4, all_calls = 7 };

  /// Fails calls `first` .. `first + count - 1` from now on, in the given way; counts every kind.
  void arm(std::uint64_t first, std::uint64_t count = 1, failure how = failure::out_of_memory);
  /// As arm(), counting only calls of the `kinds` given (call_kind bits); other calls neither
  /// count nor fail.
  void arm_only(unsigned kinds, std::uint64_t first, std::uint64_t count = 1, failure how = failure::out_of_memory);
  /// No more failures.
  void disarm() { count_.store(0); }
  /// Calls counted since the last arm(), failed ones included.
  [[nodiscard]] std::uint64_t calls() const noexcept { return calls_.load(); }
  /// Calls made to fail since construction.
  [[nodiscard]] std::uint64_t injected() const noexcept { return injected_.load(); }

  /// Counts one call of any kind. Returns true if it must fail, and then sets `how`.
  [[nodiscard]] bool next(failure& how) noexcept;
  /// Counts one call of `kind` (ignored unless armed for it). True if it must fail; sets `how`.
  [[nodiscard]] bool next(call_kind kind, failure& how) noexcept;

 private:
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> first_{0};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<failure> how_{failure::out_of_memory};
  std::atomic<std::uint64_t> injected_{0};
  std::atomic<unsigned> kinds_{all_calls};
};

/// Virtual memory whose chosen `reserve` and `commit` calls fail, for failure tests: a failing
/// reserve returns nullptr (no address space) or throws `backend_error`; a failing commit
/// returns false (out of memory) or throws `backend_error`. Both kinds of call count in the
/// schedule; decommit and release never fail. `upstream` is not owned and must outlive the
/// adaptor. Thread-safe.
class failing_virtual_memory final : public virtual_memory {
 public:
  explicit failing_virtual_memory(virtual_memory& upstream,
                                  std::shared_ptr<fault_schedule> schedule = std::make_shared<fault_schedule>());

  std::size_t granularity() const noexcept override { return upstream_.granularity(); }
  void* reserve(std::size_t bytes) override;
  bool commit(void* addr, std::size_t bytes) override;
  void decommit(void* addr, std::size_t bytes) noexcept override { upstream_.decommit(addr, bytes); }
  void release(void* addr, std::size_t bytes) noexcept override { upstream_.release(addr, bytes); }

  [[nodiscard]] fault_schedule& schedule() const noexcept { return *schedule_; }

 private:
  virtual_memory& upstream_;
  std::shared_ptr<fault_schedule> schedule_;
};

/// Makes chosen calls fail, for failure tests: calls number `first` to `first + count - 1`
/// (1-based, counted from construction or the last `arm`) return nullptr / false (out of
/// memory) or throw `backend_error`. Thread-safe.
///
/// The calls counted are those that obtain memory: allocate(), and reserve() and commit() of its
/// address space (a failing_virtual_memory over the upstream's, sharing the schedule, when the
/// upstream has one). Counting them in one sequence lets a sweep that fails "the Nth call"
/// reach every path, whether a segment grows through virtual memory or by allocation.
class failing_resource final : public resource_adaptor {
 public:
  using failure = fault_schedule::failure;

  explicit failing_resource(std::shared_ptr<resource> upstream);

  /// Fails calls `first` .. `first + count - 1` from now on, in the given way.
  void arm(std::uint64_t first, std::uint64_t count = 1, failure how = failure::out_of_memory) {
    schedule_->arm(first, count, how);
  }
  /// As arm(), counting only the kinds of call given (fault_schedule::call_kind bits).
  void arm_only(unsigned kinds, std::uint64_t first, std::uint64_t count = 1, failure how = failure::out_of_memory) {
    schedule_->arm_only(kinds, first, count, how);
  }
  /// No more failures.
  void disarm() { schedule_->disarm(); }
  /// Calls counted since the last arm(), failed ones included.
  [[nodiscard]] std::uint64_t calls() const noexcept { return schedule_->calls(); }
  /// Calls made to fail since construction.
  [[nodiscard]] std::uint64_t injected() const noexcept { return schedule_->injected(); }

  std::string_view name() const noexcept override { return name_; }
  void* allocate(std::size_t bytes, stream_ref stream) override;
  void deallocate(void* ptr, std::size_t bytes, stream_ref stream) noexcept override;
  /// A failing_virtual_memory over the upstream's address space, or nullptr if it has none.
  virtual_memory* address_space() noexcept override { return address_space_.get(); }

 private:
  std::shared_ptr<fault_schedule> schedule_;
  std::unique_ptr<failing_virtual_memory> address_space_;
  std::string name_;
};

}  // namespace refpool
