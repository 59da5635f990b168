// compact_array(..., algorithm="scan"): the textbook compaction built on a scan, kept for
// comparison with the ballot/popc kernels (docs/design.md, Scan):
//   map      dcx_scan_flags: flags[i] = pred(in[i]) (or the mask path's boolean mask)
//   scan     dcx_scan_lookback (scan.cu) over the flags: exclusive positions and the total
//   scatter  dcx_scan_scatter: every selected element written at its position
// The host reads the total between scan and scatter to allocate the exact-size output.
// Template parameters: T element storage type (dcx_types.cuh), Pred the generated functor, P...
// its constants; A the positions' type (int below 2^31 elements, long long above); OUT 1 values,
// 2 indices, 3 both.
#include "compact_warp.cuh"

template <class T, class Pred, class... P>
__global__ void dcx_scan_flags(const T* __restrict__ in, bool* __restrict__ flags, long long n, P... p) {
  const Pred pred{p...};
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    flags[i] = pred(in[i]);
}

template <class T, class A, int OUT>
__global__ void dcx_scan_scatter(const T* __restrict__ in, const bool* __restrict__ flags,
                                 const A* __restrict__ pos, long long n, long long index_base,
                                 T* __restrict__ out_vals, long long* __restrict__ out_idx) {
  const dcx::u8* f = reinterpret_cast<const dcx::u8*>(flags);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    if (f[i] != 0) {
      const long long k = (long long)pos[i];
      if (OUT & 1) out_vals[k] = in[i];
      if (OUT & 2) out_idx[k] = index_base + i;
    }
  }
}
