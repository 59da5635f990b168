// Stable split of one array (dask_compact.partition_array on CuPy data, values or both): every
// element written once, the selected ones first in input order, then the others in input order.
//
// After dcx_count (count.cu, same tile shape) left every tile's count in its status word and
// dcx_tile_scan (same file) turned them into exclusive prefixes and the total, a tile's two
// places are known before it runs: its selected elements go to prefixes[tile] onward, its
// others to total + (tile_start - prefixes[tile]) onward (the elements before the tile minus
// the selected ones among them). One block per tile, no tile waits on another:
//   1. load the tile's vectors and flag them (WarpLoad, as the compaction kernels);
//   2. ranks of the selected elements in the warp segment (warp_ranks), the warp offsets and
//      the tile's count (block_warp_offsets);
//   3. stage the whole tile permuted in shared memory: the selected elements at their ranks,
//      then the others ranked the same way from the complement of the flags, after the tile's
//      count and the others of earlier segments;
//   4. copy out: consecutive threads on consecutive outputs, two runs (coalesced).
// Why: the records' split (dcx_rec_split) reads one element per lane and scatters each warp's
// stores over two runs: 1.40-1.42 ms for 2^28 float32 on the H100 against 1.24-1.26 ms here.
// For indices alone it stays the faster (it reads the ballot words, not the input again), so
// cupy_split.py sends those there.
// Template parameters and shared memory as dcx_scatter (scatter.cu).
#include "compact_tile.cuh"

// Resident blocks asked of ptxas: one tile per block and nothing overlaps a block's loads with
// its stores, so several blocks per SM must. Types of up to 4 bytes: 1024 threads per SM, 64
// registers each (left alone, ptxas gave float32 84: one 512-thread block per SM). Wider
// types: no bound (their 32 loaded elements alone take 64 registers, and 128 spilled).
template <class T, int BLOCK>
constexpr int partition_min_blocks() {
  return sizeof(T) >= 8 ? 1 : 1024 / BLOCK;
}

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class... P>
__global__ void __launch_bounds__(BLOCK, partition_min_blocks<T, BLOCK>())
dcx_partition(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
              long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
              const unsigned long long* __restrict__ prefixes,
              const unsigned long long* __restrict__ d_total, P... p) {
  using namespace dcx;
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  typedef TileShape<T, BLOCK, ITEMS> S;
  typedef WarpLoad<T, Pred, SRC, ITEMS, (SRC == SRC_FUSED) || (OUT & OUT_VALUES)> Load;
  __shared__ unsigned s_warp[S::WARPS];
  const Pred pred{p...};
  const long long tile = blockIdx.x;
  const long long tile_start = tile * S::TILE;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  T* s_vals = reinterpret_cast<T*>(dcx_smem);
  u16* s_pos = reinterpret_cast<u16*>(dcx_smem + ((OUT & OUT_VALUES) ? S::TILE * sizeof(T) : 0));

  // 1. flags
  const long long seg = tile_start + (long long)warp * S::SEG;
  const bool fast = fast_ok(in, mask, SRC) && tile_start + S::TILE <= n;
  Vec<T> vals[S::NV];
  const unsigned bits = Load::run(in, mask, seg, n, fast, pred, vals);

  // 2. ranks, warp offsets, the tile's count
  unsigned base[S::NV];
  const unsigned wcount = warp_ranks<S::VEC, S::NV>(bits, base);
  unsigned woff, agg;
  block_warp_offsets<unsigned, S::WARPS>(lane == 0, wcount, s_warp, woff, agg);

  // 3. the tile permuted into shared memory: the selected elements at their ranks (the
  //    compaction's staging), then the others the same way from the complement of the flags,
  //    after the tile's count and the others of earlier segments (one rank array reused, so
  //    the registers stay those of the compaction kernels)
  TileSteps<T, OUT, BLOCK, ITEMS>::stage(bits, base, woff, vals, s_vals, s_pos, warp, lane);
  unsigned valid = ITEMS >= 32 ? ~0u : ((1u << ITEMS) - 1u);
  if (!fast) {  // the last tile (or a misaligned view): elements past n are not the others
    valid = 0u;
#pragma unroll
    for (int v = 0; v < S::NV; ++v)
#pragma unroll
      for (int j = 0; j < S::VEC; ++j)
        valid |= unsigned(seg + (long long)(v * 32 * S::VEC + lane * S::VEC + j) < n)
                 << (v * S::VEC + j);
  }
  const unsigned others = ~bits & valid;
  warp_ranks<S::VEC, S::NV>(others, base);
  TileSteps<T, OUT, BLOCK, ITEMS>::stage(others, base, agg + unsigned(warp * S::SEG) - woff,
                                         vals, s_vals, s_pos, warp, lane);
  __syncthreads();

  // 4. two coalesced runs
  const unsigned long long before = prefixes[tile];
  const unsigned long long rest = *d_total + (unsigned long long)tile_start - before;
  const long long left = n - tile_start;
  const unsigned in_tile = left < S::TILE ? unsigned(left) : unsigned(S::TILE);
  for (unsigned i = threadIdx.x; i < in_tile; i += BLOCK) {
    const unsigned long long to = i < agg ? before + i : rest + (i - agg);
    if (OUT & OUT_VALUES) out_vals[to] = s_vals[i];
    if (OUT & OUT_INDICES) out_idx[to] = index_base + tile_start + (long long)s_pos[i];
  }
}
