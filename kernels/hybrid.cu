// algorithm="hybrid" (stable=False): the paper's atomic offsets. The same tile as the
// single-pass kernel, but a tile takes its place in the output with one atomicAdd instead of
// the look-back: no tile ever waits for another, and tiles land in the order they finish
// (the order inside a tile is kept). d_count must be zero before the launch; it ends as the
// total. dcx_count (count.cu, same module) sizes the output in the exact-size path.
#include "compact_tile.cuh"

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class... P>
__global__ void __launch_bounds__(BLOCK)
dcx_hybrid(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
           long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
           unsigned long long* d_count, unsigned long long* tile_counter, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  const dcx::AtomicPrefix policy{d_count};
  dcx::compact_tiles<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                      pred, policy, tile_counter, dcx_smem);
}
