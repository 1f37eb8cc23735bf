// Kernels for the CUDA tests and examples, compiled to PTX at build time and loaded with
// cuModuleLoadData. Plain, obviously correct code: the tests check refpool, not kernel speed.
#include <cstdint>

extern "C" {

__global__ void saxpy(std::uint32_t n, float a, const float* x, float* y) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// out[blockIdx.x] = sum of this block's elements; the host adds the partial sums.
__global__ void partial_sums(std::uint32_t n, const float* x, double* out) {
  __shared__ double sums[256];
  double s = 0;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += x[i];
  sums[threadIdx.x] = s;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sums[0];
}

__global__ void fill_u32(std::uint32_t* p, std::uint32_t n, std::uint32_t value) {
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

// Waits `nanoseconds` on the GPU clock, then fills: a long writer that exposes missing stream order.
__global__ void wait_then_fill_u32(std::uint32_t* p, std::uint32_t n, std::uint32_t value, std::uint64_t nanoseconds) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (std::uint64_t now = start; now - start < nanoseconds;) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = value;
}

// C (m x n) = op(A) * op(B), row-major; op transposes when the flag is set. One thread per output.
__global__ void matmul(std::uint32_t m, std::uint32_t n, std::uint32_t k, const float* a, int transpose_a,
                       const float* b, int transpose_b, float* c) {
  const std::uint32_t row = blockIdx.y * blockDim.y + threadIdx.y;
  const std::uint32_t col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float acc = 0;
  for (std::uint32_t i = 0; i < k; ++i) {
    const float av = transpose_a ? a[i * m + row] : a[row * k + i];
    const float bv = transpose_b ? b[col * k + i] : b[i * n + col];
    acc += av * bv;
  }
  c[row * n + col] = acc;
}

__global__ void relu(std::uint32_t n, const float* x, float* y) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0 ? x[i] : 0;
}

// dx = dy where the forward input was positive, else 0.
__global__ void relu_backward(std::uint32_t n, const float* x, const float* dy, float* dx) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dx[i] = x[i] > 0 ? dy[i] : 0;
}

// d = (y - t) * scale
__global__ void difference(std::uint32_t n, const float* y, const float* t, float scale, float* d) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = (y[i] - t[i]) * scale;
}

}  // extern "C"
