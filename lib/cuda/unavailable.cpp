// refpool::cuda in a build without CUDA support: everything links, and every call says why it
// cannot work.
#include <refpool/cuda.hpp>
#include <refpool/error.hpp>

namespace refpool::cuda {

namespace {
constexpr const char* reason = "refpool was built without CUDA support (no cuda.h found, or -Dcuda=disabled)";
[[noreturn]] void unavailable() { throw backend_unavailable(std::string("refpool: CUDA is unavailable: ") + reason); }
}  // namespace

bool available() noexcept { return false; }
std::string unavailable_reason() { return reason; }
int device_count() { unavailable(); }
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

}  // namespace refpool::cuda
