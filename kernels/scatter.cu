// Exact-size path of algorithm="single-pass" without look-back: dcx_count (count.cu) wrote
// every tile's count, dcx_tile_scan their exclusive prefixes; this kernel runs the same tile
// code as the hybrid (persistent blocks, next tile's loads in flight during the copy-out), but
// each tile's place in the output is read from `prefixes` instead of claimed with an atomic, so
// the order is kept and no tile ever waits for another. Same template parameters as
// dcx_hybrid (hybrid.cu).
#include "compact_tile.cuh"

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class... P>
__global__ void __launch_bounds__(BLOCK, dcx::tile_min_blocks<T>())
dcx_scatter(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
            long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
            const unsigned long long* __restrict__ prefixes, unsigned long long* tile_counter, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  const dcx::KnownPrefix policy{prefixes};
  dcx::compact_tiles<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                      pred, policy, tile_counter, dcx_smem);
}
