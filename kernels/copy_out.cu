// The copy of a ready call's selection out of its scratch into the exact-size result
// (dask_compact/backends/cupy_ready.py, OneReadCall): one launch through the packed-argument
// path. Why not cudaMemcpyAsync: device to device it cost 6.5-7.8 us of host time per call for
// 2 MiB on the H100 (benchmarks/small_call_parts.py), a fifth of a 2^20-element call, where a
// packed launch costs about 3 us.
//
// Both pointers 16-byte aligned (the launch layer checks; CuPy's allocations are): 16-byte
// vectors, then the last nbytes % 16 bytes by the first block. Grid-stride, so any grid works.
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dcx_copy_out(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
             long long nbytes) {
  const long long nvec = nbytes >> 4;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const long long stride = (long long)gridDim.x * BLOCK;
  for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < nvec; i += stride) d[i] = s[i];
  const long long done = nvec << 4;
  if (blockIdx.x == 0 && (long long)threadIdx.x < nbytes - done)
    dst[done + threadIdx.x] = src[done + threadIdx.x];
}
