// Rounding policies: exact, fixed steps, power-of-two divisions.
#include <refpool/error.hpp>
#include <refpool/rounding.hpp>

#include <bit>

#include <fmt/format.h>

namespace refpool {

rounding_policy rounding_policy::step(std::size_t bytes) {
  if (bytes == 0) throw config_error("refpool: rounding step must be at least 1 byte");
  return {mode::step, bytes};
}

rounding_policy rounding_policy::pow2(unsigned divisions) {
  if (divisions == 0 || divisions > 64 || !std::has_single_bit(divisions))
    throw config_error(
        fmt::format("refpool: pow2 rounding divisions must be a power of two from 1 to 64, not {}", divisions));
  return {mode::pow2_divisions, divisions};
}

std::size_t rounding_policy::round_up(std::size_t bytes) const {
  std::size_t step = 1;
  switch (mode_) {
    case mode::exact: return bytes;
    case mode::step: step = parameter_; break;
    case mode::pow2_divisions: {
      const std::size_t floor = std::bit_floor(bytes);
      if (floor == bytes) return bytes;
      step = std::max<std::size_t>(floor / parameter_, 1);
      break;
    }
  }
  const std::size_t rest = bytes % step;
  std::size_t rounded = bytes;
  if (rest != 0 && __builtin_add_overflow(bytes, step - rest, &rounded))
    throw size_error(fmt::format("refpool: {} B rounded up by policy {} overflows size_t", bytes, to_string()));
  return rounded;
}

std::string rounding_policy::to_string() const {
  switch (mode_) {
    case mode::exact: return "exact";
    case mode::step: return fmt::format("step:{}", parameter_);
    case mode::pow2_divisions: return fmt::format("pow2:{}", parameter_);
  }
  return "unknown";
}

}  // namespace refpool
