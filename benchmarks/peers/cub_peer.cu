// CUB peers of the GPU benchmark, as a shared library loaded with ctypes (benchmarks/gpu_kernels.py)
// and called on the same CuPy device buffers as our kernels, on CuPy's current stream.
//
//   cub_select_if_<T>      values: cub::DeviceSelect::If with `x < t` (single pass, look-back)
//   cub_flagged_idx_<T>    indices, PyTorch's nonzero recipe: a flags kernel writes `x < t` as
//                          bytes, then cub::DeviceSelect::Flagged over a counting iterator
//   cub_exclusive_sum_<T>_<A>  scan (benchmarks/scan_bench.py): cub::DeviceScan::ExclusiveSum where
//                          input and output types are the same (it adds in the input type), else
//                          cub::DeviceScan::ExclusiveScan with plus and an initial value of the
//                          output type (so int32 input is added in int64, as np.cumsum adds it)
// Each returns the cudaError_t of its last call; temp_bytes == 0 asks for the size (written to
// *temp_bytes_out) and launches nothing. Build: nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC.
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda/std/functional>
#include <thrust/iterator/counting_iterator.h>
#include <cuda_runtime.h>

namespace {

template <class T>
struct LessThan {
  T t;
  __host__ __device__ __forceinline__ bool operator()(const T& x) const { return x < t; }
};

template <class T>
__global__ void flags_kernel(const T* __restrict__ in, unsigned char* __restrict__ flags, long long n, T t) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (; i < n; i += stride) flags[i] = in[i] < t;
}

template <class T>
int select_if(const void* in, void* out, unsigned long long* d_count, long long n, double thr,
              void* temp, size_t temp_bytes, size_t* temp_bytes_out, cudaStream_t s) {
  LessThan<T> op{T(thr)};
  size_t bytes = temp_bytes;
  cudaError_t e = cub::DeviceSelect::If(temp_bytes ? temp : nullptr, bytes, static_cast<const T*>(in),
                                        static_cast<T*>(out), d_count, n, op, s);
  if (temp_bytes_out) *temp_bytes_out = bytes;
  return int(e);
}

template <class T>
int flagged_idx(const void* in, unsigned char* flags, long long* out, unsigned long long* d_count,
                long long n, double thr, void* temp, size_t temp_bytes, size_t* temp_bytes_out,
                cudaStream_t s) {
  thrust::counting_iterator<long long> it(0);
  size_t bytes = temp_bytes;
  if (temp_bytes) {
    int blocks = int((n + 255) / 256 < 132 * 16 ? (n + 255) / 256 : 132 * 16);
    flags_kernel<T><<<blocks, 256, 0, s>>>(static_cast<const T*>(in), flags, n, T(thr));
  }
  cudaError_t e = cub::DeviceSelect::Flagged(temp_bytes ? temp : nullptr, bytes, it, flags, out,
                                             d_count, n, s);
  if (temp_bytes_out) *temp_bytes_out = bytes;
  return int(e);
}

template <class T, class A>
int exclusive_sum(const void* in, void* out, long long n, void* temp, size_t temp_bytes,
                  size_t* temp_bytes_out, cudaStream_t s) {
  size_t bytes = temp_bytes;
  void* t = temp_bytes ? temp : nullptr;
  cudaError_t e;
  if constexpr (cuda::std::is_same_v<T, A>) {
    e = cub::DeviceScan::ExclusiveSum(t, bytes, static_cast<const T*>(in), static_cast<A*>(out), n, s);
  } else {
    e = cub::DeviceScan::ExclusiveScan(t, bytes, static_cast<const T*>(in), static_cast<A*>(out),
                                       cuda::std::plus<>{}, A(0), n, s);
  }
  if (temp_bytes_out) *temp_bytes_out = bytes;
  return int(e);
}

}  // namespace

#define DCX_SCAN_PEER(T, A, NAME)                                                                \
  extern "C" int cub_exclusive_sum_##NAME(const void* in, void* out, long long n, void* tmp,      \
                                          size_t tb, size_t* tbo, cudaStream_t s) {              \
    return exclusive_sum<T, A>(in, out, n, tmp, tb, tbo, s);                                     \
  }

DCX_SCAN_PEER(float, float, float32_float32)
DCX_SCAN_PEER(double, double, float64_float64)
DCX_SCAN_PEER(int, int, int32_int32)
DCX_SCAN_PEER(int, long long, int32_int64)
DCX_SCAN_PEER(long long, long long, int64_int64)

#define DCX_PEER(T, NAME)                                                                        \
  extern "C" int cub_select_if_##NAME(const void* in, void* out, unsigned long long* c, long long n, \
                                      double t, void* tmp, size_t tb, size_t* tbo, cudaStream_t s) { \
    return select_if<T>(in, out, c, n, t, tmp, tb, tbo, s);                                     \
  }                                                                                              \
  extern "C" int cub_flagged_idx_##NAME(const void* in, unsigned char* f, long long* out,        \
                                        unsigned long long* c, long long n, double t, void* tmp, \
                                        size_t tb, size_t* tbo, cudaStream_t s) {                \
    return flagged_idx<T>(in, f, out, c, n, t, tmp, tb, tbo, s);                                 \
  }

DCX_PEER(float, float32)
DCX_PEER(double, float64)
DCX_PEER(int, int32)
DCX_PEER(signed char, int8)
