// refpool::hip in a build without HIP support: everything links, and every call says why it
// cannot work.
#include <refpool/error.hpp>
#include <refpool/hip.hpp>

namespace refpool::hip {

namespace {
constexpr const char* reason =
    "refpool was built without HIP support (no hip/hip_runtime_api.h found, or -Dhip=disabled)";
[[noreturn]] void unavailable() { throw backend_unavailable(std::string("refpool: HIP is unavailable: ") + reason); }
}  // namespace

bool available() noexcept { return false; }
std::string unavailable_reason() { return reason; }
int device_count() { unavailable(); }
int runtime_version() { unavailable(); }
int driver_version() { unavailable(); }
std::string device_name(int) { unavailable(); }
std::pair<std::size_t, std::size_t> memory_info(int) { unavailable(); }
backend device(int, memory_kind) { unavailable(); }
stream::stream(int) { unavailable(); }
stream::~stream() = default;
stream& stream::operator=(stream&&) noexcept { return *this; }
void stream::synchronize() const { unavailable(); }
void synchronize(stream_ref, int) { unavailable(); }
void retire_stream(stream_ref, int) { unavailable(); }
module::module(int, std::string_view) { unavailable(); }
module::~module() = default;
kernel module::function(const char*) const { unavailable(); }
void launch(const kernel&, dims3, dims3, stream_ref, void**, unsigned) { unavailable(); }
void copy(void*, const void*, std::size_t, stream_ref, int) { unavailable(); }
void fill(void*, unsigned char, std::size_t, stream_ref, int) { unavailable(); }
void copy_peer(void*, int, const void*, int, std::size_t, stream_ref) { unavailable(); }

}  // namespace refpool::hip
