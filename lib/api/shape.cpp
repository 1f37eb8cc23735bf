// Size arithmetic of shapes and views, checked, with messages that name the dims.
#include <refpool/array.hpp>
#include <refpool/error.hpp>
#include <refpool/shape.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace refpool {

namespace {
bool multiply_overflows(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}
}  // namespace

std::size_t shape::element_count() const {
  for (std::size_t d : dims())
    if (d == 0) return 0;  // zero elements, whatever the other dims multiply to
  std::size_t count = 1;
  for (std::size_t d : dims()) {
    if (multiply_overflows(count, d, count))
      throw size_error(fmt::format("refpool: the element count of dims {} overflows size_t", to_string()));
  }
  return count;
}

std::string shape::to_string() const {
  if (rank_ == 1) return fmt::format("({},)", (*this)[0]);
  return fmt::format("({})", fmt::join(dims(), ", "));
}

namespace detail {

std::size_t checked_bytes(const shape& dims, std::size_t element_size) {
  std::size_t bytes = 0;
  if (multiply_overflows(dims.element_count(), element_size, bytes))
    throw size_error(
        fmt::format("refpool: dims {} of {}-byte elements overflow size_t bytes", dims.to_string(), element_size));
  return bytes;
}

std::size_t checked_view(const shape& dims, std::size_t element_size, std::size_t offset, std::size_t buffer_bytes) {
  const std::size_t count = checked_bytes(dims, element_size) / element_size;
  if (count == 0) return 0;
  std::size_t end = 0;
  std::size_t end_bytes = 0;
  if (__builtin_add_overflow(offset, count, &end) || multiply_overflows(end, element_size, end_bytes) ||
      end_bytes > buffer_bytes)
    throw shape_error(
        fmt::format("refpool: a view of dims {} ({}-byte elements) at element offset {} does not fit a buffer "
                    "of {} B",
                    dims.to_string(), element_size, offset, buffer_bytes));
  return count;
}

void throw_reshape_error(const shape& from, std::size_t from_elem, const shape& to, std::size_t to_elem) {
  const auto bytes = [](const shape& s, std::size_t elem) -> std::string {
    try {
      return fmt::format("{} B", checked_bytes(s, elem));
    } catch (const size_error&) {
      return "overflowing size_t";
    }
  };
  throw shape_error(
      fmt::format("refpool: cannot reshape {} of {}-byte elements ({}) to {} of {}-byte elements ({}): the byte "
                  "size must stay the same",
                  from.to_string(), from_elem, bytes(from, from_elem), to.to_string(), to_elem, bytes(to, to_elem)));
}

void throw_offset_error(std::size_t byte_offset, std::size_t to_elem) {
  throw shape_error(
      fmt::format("refpool: cannot reinterpret a view starting at byte {} as {}-byte elements: the start is not "
                  "a multiple of the element size",
                  byte_offset, to_elem));
}

}  // namespace detail
}  // namespace refpool
