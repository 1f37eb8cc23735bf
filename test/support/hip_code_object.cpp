// Reading the targets of clang offload bundles and AMDGPU ELF code objects (LLVM's AMDGPUUsage:
// "Code Object Target Identification", "AMDGPU ELF Header").
#include "hip_code_object.hpp"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace refpool::test::hip_code_object {

namespace {

std::uint64_t little_endian(std::string_view bytes, std::size_t at, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = width; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

// The targets of the amdgcn entries of an offload bundle ("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
// "hip-amdgcn-amd-amdhsa-gfx906"); nullopt if the header runs past the image.
std::optional<std::vector<std::string>> bundle_targets(std::string_view image) {
  constexpr std::string_view magic = "__CLANG_OFFLOAD_BUNDLE__";
  constexpr std::string_view triple = "amdgcn-amd-amdhsa-";
  std::size_t at = magic.size();
  if (image.size() < at + 8) return std::nullopt;
  const std::uint64_t count = little_endian(image, at, 8);
  at += 8;
  std::vector<std::string> targets;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (image.size() - at < 24) return std::nullopt;
    const std::uint64_t offset = little_endian(image, at, 8), size = little_endian(image, at + 8, 8);
    const std::uint64_t id_size = little_endian(image, at + 16, 8);
    if (image.size() - at - 24 < id_size || offset > image.size() || image.size() - offset < size) return std::nullopt;
    const std::string_view id = image.substr(at + 24, id_size);
    at += 24 + id_size;
    if (const auto found = id.find(triple); found != std::string_view::npos) {
      std::string_view target = id.substr(found + triple.size());
      target.remove_prefix(std::min(target.find_first_not_of('-'), target.size()));  // the empty environment
      targets.emplace_back(target);
    }
  }
  return targets;
}

// EF_AMDGPU_MACH values of the processors ROCm 5.x supports.
struct machine {
  unsigned value;
  const char* processor;
};
constexpr machine machines[] = {
    {0x02c, "gfx900"},  {0x02d, "gfx902"},  {0x02e, "gfx904"},  {0x02f, "gfx906"},  {0x030, "gfx908"},
    {0x031, "gfx909"},  {0x032, "gfx90c"},  {0x03f, "gfx90a"},  {0x040, "gfx940"},  {0x04b, "gfx941"},
    {0x04c, "gfx942"},  {0x033, "gfx1010"}, {0x034, "gfx1011"}, {0x035, "gfx1012"}, {0x042, "gfx1013"},
    {0x036, "gfx1030"}, {0x037, "gfx1031"}, {0x038, "gfx1032"}, {0x039, "gfx1033"}, {0x03e, "gfx1034"},
    {0x03d, "gfx1035"}, {0x045, "gfx1036"}, {0x041, "gfx1100"}, {0x046, "gfx1101"}, {0x047, "gfx1102"},
    {0x044, "gfx1103"},
};

// The target in a 64-bit AMDGPU ELF header; an unknown machine is named by its number.
std::optional<std::vector<std::string>> elf_targets(std::string_view image) {
  constexpr std::size_t header_size = 64;
  constexpr unsigned em_amdgpu = 224;
  if (image.size() < header_size || image[4] != 2 || little_endian(image, 18, 2) != em_amdgpu) return std::nullopt;
  const auto flags = static_cast<unsigned>(little_endian(image, 48, 4));
  const unsigned abi_version = static_cast<unsigned char>(image[8]);
  std::string target = fmt::format("unknown machine 0x{:03x}", flags & 0xff);
  for (const machine& m : machines)
    if (m.value == (flags & 0xff)) target = m.processor;
  if (abi_version >= 2) {  // code object v4 and later: off, on, or any (unset)
    if ((flags & 0xc00) == 0x800) target += ":sramecc-";
    if ((flags & 0xc00) == 0xc00) target += ":sramecc+";
    if ((flags & 0x300) == 0x200) target += ":xnack-";
    if ((flags & 0x300) == 0x300) target += ":xnack+";
  } else if (abi_version == 1) {  // v3: a set bit means on
    if ((flags & 0x200) != 0) target += ":sramecc+";
    if ((flags & 0x100) != 0) target += ":xnack+";
  }
  return std::vector<std::string>{target};
}

}  // namespace

std::optional<std::vector<std::string>> code_object_targets(std::string_view image) {
  if (image.substr(0, 24) == "__CLANG_OFFLOAD_BUNDLE__") return bundle_targets(image);
  if (image.substr(0, 4) ==
      "\x7f"
      "ELF")
    return elf_targets(image);
  return std::nullopt;
}

bool runs_on(std::string_view target, std::string_view device) {
  const auto processor = [](std::string_view t) { return t.substr(0, t.find(':')); };
  if (processor(target) != processor(device)) return false;
  for (std::size_t at = target.find(':'); at != std::string_view::npos;) {
    const std::size_t next = target.find(':', at + 1);
    const std::string_view feature = target.substr(at, next - at);  // ":xnack-"
    if (device.find(feature) == std::string_view::npos) return false;
    at = next;
  }
  return true;
}

}  // namespace refpool::test::hip_code_object
