// Code objects for the fake HIP runtime, in the two formats hipModuleLoadData takes: a clang
// offload bundle ("__CLANG_OFFLOAD_BUNDLE__", what `hipcc --genco` writes) and a bare AMDGPU ELF.
// Their payload is not machine code but a list of kernel names ("fake-hip-kernels:fill_u8"),
// which the fake runs on the host. Tests build images with these; the fake reads them.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace fake_hip {

inline constexpr std::string_view bundle_magic = "__CLANG_OFFLOAD_BUNDLE__";
inline constexpr std::string_view kernels_prefix = "fake-hip-kernels:";

struct bundle_entry {
  std::string id;  ///< "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"
  std::string payload;
};

inline std::string kernels(std::initializer_list<std::string_view> names) {
  std::string out(kernels_prefix);
  for (std::string_view name : names) out.append(name).append(",");
  return out;
}

inline void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

inline std::uint64_t get_u64(std::string_view in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)]);
  return v;
}

/// A bundle with a host entry (as hipcc writes) and `entries`.
inline std::string make_bundle(std::vector<bundle_entry> entries) {
  entries.insert(entries.begin(), {"host-x86_64-unknown-linux-gnu-", ""});
  std::string header(bundle_magic);
  put_u64(header, entries.size());
  std::size_t header_size = header.size();
  for (const auto& e : entries) header_size += 24 + e.id.size();
  std::string payloads;
  for (const auto& e : entries) {
    put_u64(header, header_size + payloads.size());
    put_u64(header, e.payload.size());
    put_u64(header, e.id.size());
    header += e.id;
    payloads += e.payload;
  }
  return header + payloads;
}

/// The entries of the bundle at `image`, which hipModuleLoadData gets without a size: the header
/// says where everything is. Empty when `image` does not start with the bundle magic.
inline std::vector<bundle_entry> read_bundle(const char* image) {
  std::vector<bundle_entry> out;
  for (std::size_t i = 0; i < bundle_magic.size(); ++i)  // stops at the first difference
    if (image[i] != bundle_magic[i]) return out;
  const std::string_view in(image, ~std::size_t{0} >> 1);
  const std::uint64_t count = get_u64(in, bundle_magic.size());
  std::size_t at = bundle_magic.size() + 8;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t offset = get_u64(in, at), bytes = get_u64(in, at + 8), id = get_u64(in, at + 16);
    out.push_back({std::string(in.substr(at + 24, id)), std::string(in.substr(offset, bytes))});
    at += 24 + id;
  }
  return out;
}

/// AMDGPU ELF e_flags values the tests use (LLVM's EF_AMDGPU_MACH_* and code object v4+ features).
inline constexpr unsigned elf_mach_gfx906 = 0x02f, elf_mach_gfx90a = 0x03f, elf_mach_gfx1030 = 0x036;
inline constexpr unsigned elf_xnack_off_v4 = 0x200, elf_sramecc_on_v4 = 0xc00;
inline constexpr std::size_t elf_header_bytes = 64;

/// A 64-bit AMDGPU ELF header (code object v4 unless told) followed by `payload`.
inline std::string make_elf(unsigned flags, std::string_view payload, unsigned char abi_version = 2) {
  std::string out(elf_header_bytes, '\0');
  const unsigned char ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 64, abi_version};
  std::memcpy(out.data(), ident, sizeof ident);
  out[16] = 3;                       // e_type: ET_DYN
  out[18] = static_cast<char>(224);  // e_machine: EM_AMDGPU
  out[20] = 1;                       // e_version
  for (int i = 0; i < 4; ++i) out[48 + static_cast<std::size_t>(i)] = static_cast<char>(flags >> (8 * i));
  out[52] = static_cast<char>(elf_header_bytes);  // e_ehsize
  return out + std::string(payload);
}

}  // namespace fake_hip
