// Block-wide scans of one value per warp or per thread: the warp scans with __shfl_up_sync
// (compact_warp.cuh), lane 31 (or any chosen writer) puts the warp's total in shared memory,
// and after one barrier every thread adds up the totals of the warps before its own (the shape
// of CUB's BlockScan with its warp-scans algorithm). One primitive for the tile kernels (warp
// counts -> warp offsets in the tile and the tile's count), the count kernel, the tile-count
// scan and the three-pass group-count scan.
#pragma once
#include "compact_warp.cuh"

namespace dcx {

// Each warp's exclusive offset among the block's WARPS warps (`woff`) and the block's total
// (`total`), from one value per warp written by the lane for which `writer` holds. One
// __syncthreads inside, so every thread of the block must call it; `s_warp` (WARPS words of
// shared memory) must not be rewritten before every thread has passed a later barrier.
template <class U, int WARPS>
__device__ __forceinline__ void block_warp_offsets(bool writer, U warp_value, U* s_warp, U& woff,
                                                   U& total) {
  const int warp = int(threadIdx.x >> 5);
  if (writer) s_warp[warp] = warp_value;
  __syncthreads();
  woff = U(0);
  total = U(0);
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const U c = s_warp[w];
    woff += (w < warp) ? c : U(0);
    total += c;
  }
}

// Exclusive prefix of every thread's `x` over the block (in thread order) and the block's
// total. Same rules as block_warp_offsets.
template <class U, int BLOCK>
__device__ __forceinline__ U block_exclusive_scan(U x, U* s_warp, U& total) {
  const U inc = warp_inclusive_scan(x);
  U woff;
  block_warp_offsets<U, BLOCK / 32>(lane_id() == 31, inc, s_warp, woff, total);
  return woff + inc - x;
}

}  // namespace dcx
