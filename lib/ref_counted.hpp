// Intrusively counted objects: `ref_counted<T>` gives T retain()/release() over the one count
// (refpool/detail/ref_count.hpp); the last release deletes the T. Objects start with one owner.
#pragma once

#include <refpool/detail/ref_count.hpp>

namespace refpool::detail {

template <class Derived>
class ref_counted {
 public:
  ref_counted(const ref_counted&) = delete;
  ref_counted& operator=(const ref_counted&) = delete;

  void retain() const noexcept { refs_.increment(); }
  /// retain() unless the last owner went already (ref_count::increment_if_owned); false then.
  [[nodiscard]] bool retain_if_owned() const noexcept { return refs_.increment_if_owned(); }
  void release() const noexcept {
    if (refs_.decrement()) delete static_cast<const Derived*>(this);
  }

 protected:
  ref_counted() noexcept = default;
  ~ref_counted() = default;

 private:
  mutable ref_count refs_{1};
};

}  // namespace refpool::detail
