// Stable split of one array (dask_compact.partition_array on CuPy data, values or both): every
// element written once, the selected ones first in input order, then the others in input order.
// Two routes (cupy_split.py chooses between them by the fraction the predicate selected last):
//
// Counted first (dcx_partition): dcx_count (count.cu, same tile shape) left every tile's count
// in its status word and dcx_tile_scan (same file) turned them into exclusive prefixes and the
// total, so a tile's two places are known before it runs: its selected elements go to
// prefixes[tile] onward, its others to total + (tile_start - prefixes[tile]) onward (the
// elements before the tile minus the selected ones among them). No tile waits on another. The
// input is read twice and the output written once: 3n elements moved at every fraction.
//
// One pass (dcx_partition_lookback, then dcx_reverse_tail): the tile's selected prefix comes
// from the decoupled look-back (lookback.cuh), as in the compaction's single pass; the others'
// place needs the total, which no tile knows until the last has counted, so they are written
// from the END of the output backwards (the others before the tile are tile_start - prefix,
// known with the prefix), and dcx_reverse_tail then puts out[total, n) back in input order,
// reading the total from the device (no host sync between the launches). n elements read, n
// written, then n - k read and written again: 2n + 2(n - k), under the counted route's 3n
// when more than half is selected (CUB's DevicePartition writes its rejected items the same
// way, and leaves them reversed).
//
// Per tile, both routes (one block per tile):
//   1. load the tile's vectors and flag them (WarpLoad, as the compaction kernels);
//   2. ranks of the selected elements in the warp segment (warp_ranks), the warp offsets and
//      the tile's count (block_warp_offsets);
//   3. stage the whole tile permuted in shared memory: the selected elements at their ranks,
//      then the others ranked the same way from the complement of the flags, after the tile's
//      count and the others of earlier segments;
//   4. copy out: consecutive threads on consecutive outputs, two runs (coalesced; the others'
//      run of the one-pass route is reversed by reading the staged tile from its end).
// Why staged: the records' split (dcx_rec_split) reads one element per lane and scatters each
// warp's stores over two runs: 1.40-1.42 ms for 2^28 float32 on the H100 against 1.24-1.26 ms
// counted first here. For indices alone it stays the faster (it reads the ballot words, not the
// input again), so cupy_split.py sends those there.
// Template parameters and shared memory as dcx_scatter (scatter.cu); the one-pass kernel adds
// the look-back's sleeps (POLL, WAIT: dcx::LookbackPrefix).
#include "compact_tile.cuh"

// Resident blocks asked of ptxas: one tile per block and nothing overlaps a block's loads with
// its stores, so several blocks per SM must. Types of up to 4 bytes: 1024 threads per SM, 64
// registers each (left alone, ptxas gave float32 84: one 512-thread block per SM). Wider
// types: no bound (their 32 loaded elements alone take 64 registers, and 128 spilled).
template <class T, int BLOCK>
constexpr int partition_min_blocks() {
  return sizeof(T) >= 8 ? 1 : 1024 / BLOCK;
}

namespace dcx {

// Places of the counted-first route: known before the launch, tile = blockIdx.x.
struct SplitCounted {
  static constexpr bool KNOWN = true;
  static constexpr bool BACKWARDS = false;
  const unsigned long long* prefixes;  // exclusive selected prefix of every tile
  const unsigned long long* d_total;

  __device__ __forceinline__ long long tile() const { return blockIdx.x; }
  __device__ __forceinline__ void publish(long long, unsigned) const {}
  __device__ __forceinline__ unsigned long long prefix(long long tile, long long, unsigned) const {
    return prefixes[tile];
  }
  // the place of the tile's first other: after the total, the run going forward
  __device__ __forceinline__ unsigned long long others_from(unsigned long long others_before,
                                                            long long) const {
    return *d_total + others_before;
  }
};

// Places of the one-pass route: the selected prefix by look-back (warp 0), the others from
// the end backwards; tiles handed out in launch order by a counter, so every tile a look-back
// waits on belongs to a block that has started.
template <int POLL, int WAIT>
struct SplitLookback {
  static constexpr bool KNOWN = false;
  static constexpr bool BACKWARDS = true;
  LookbackPrefix<POLL, WAIT> lookback;
  unsigned long long* tile_counter;  // zeroed before the launch

  __device__ __forceinline__ long long tile() const {
    __shared__ long long s_tile;
    if (threadIdx.x == 0) s_tile = (long long)atomicAdd(tile_counter, 1ull);
    __syncthreads();
    return s_tile;
  }
  __device__ __forceinline__ void publish(long long tile, unsigned agg) const {
    if (threadIdx.x == 0) lookback.publish_aggregate(tile, agg);
  }
  __device__ __forceinline__ unsigned long long prefix(long long tile, long long num_tiles,
                                                       unsigned agg) const {
    return lookback.exclusive_prefix(tile, num_tiles, agg);
  }
  // the place of the tile's first other: the run going backwards from there
  __device__ __forceinline__ unsigned long long others_from(unsigned long long others_before,
                                                            long long n) const {
    return (unsigned long long)(n - 1) - others_before;
  }
};

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class Places>
__device__ __forceinline__ void split_tile(const T* __restrict__ in, const bool* __restrict__ mask,
                                           long long n, long long index_base,
                                           T* __restrict__ out_vals, long long* __restrict__ out_idx,
                                           const Pred& pred, const Places& places,
                                           unsigned char* smem) {
  typedef TileShape<T, BLOCK, ITEMS> S;
  typedef WarpLoad<T, Pred, SRC, ITEMS, (SRC == SRC_FUSED) || (OUT & OUT_VALUES)> Load;
  __shared__ unsigned s_warp[S::WARPS];
  __shared__ unsigned long long s_prefix;  // the look-back's result, for every warp
  const long long tile = places.tile();
  const long long tile_start = tile * S::TILE;
  const long long num_tiles = (n + S::TILE - 1) / S::TILE;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  T* s_vals = reinterpret_cast<T*>(smem);
  u16* s_pos = reinterpret_cast<u16*>(smem + ((OUT & OUT_VALUES) ? S::TILE * sizeof(T) : 0));

  // 1. flags
  const long long seg = tile_start + (long long)warp * S::SEG;
  const bool fast = fast_ok(in, mask, SRC) && tile_start + S::TILE <= n;
  Vec<T> vals[S::NV];
  const unsigned bits = Load::run(in, mask, seg, n, fast, pred, vals);

  // 2. ranks, warp offsets, the tile's count (published at once for the look-back)
  unsigned base[S::NV];
  const unsigned wcount = warp_ranks<S::VEC, S::NV>(bits, base);
  unsigned woff, agg;
  block_warp_offsets<unsigned, S::WARPS>(lane == 0, wcount, s_warp, woff, agg);
  places.publish(tile, agg);

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
  unsigned long long before = 0;
  if constexpr (!Places::KNOWN) {  // the look-back runs while the other warps stage
    if (warp == 0) {
      const unsigned long long p = places.prefix(tile, num_tiles, agg);
      if (lane == 0) s_prefix = p;
    }
  }
  __syncthreads();
  if constexpr (Places::KNOWN) before = places.prefix(tile, num_tiles, agg);
  else before = s_prefix;

  // 4. two coalesced runs. Backwards (one pass), the others' run is still written at rising
  //    addresses, its staged elements read from the last: thread i writes out[from - last + j]
  //    with staged element in_tile - 1 - j (j = i - agg; the same places as out[from - j] =
  //    staged element agg + j).
  const unsigned long long from = places.others_from((unsigned long long)tile_start - before, n);
  const long long left = n - tile_start;
  const unsigned in_tile = left < S::TILE ? unsigned(left) : unsigned(S::TILE);
  const unsigned last = in_tile - 1u - agg;  // the others' count less one
  for (unsigned i = threadIdx.x; i < in_tile; i += BLOCK) {
    unsigned long long to = before + i;
    unsigned at = i;
    if (i >= agg) {
      to = Places::BACKWARDS ? from - last + (i - agg) : from + (i - agg);
      if (Places::BACKWARDS) at = in_tile - 1u - (i - agg);
    }
    if (OUT & OUT_VALUES) out_vals[to] = s_vals[at];
    if (OUT & OUT_INDICES) out_idx[to] = index_base + tile_start + (long long)s_pos[at];
  }
}

}  // namespace dcx

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class... P>
__global__ void __launch_bounds__(BLOCK, partition_min_blocks<T, BLOCK>())
dcx_partition(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
              long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
              const unsigned long long* __restrict__ prefixes,
              const unsigned long long* __restrict__ d_total, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  dcx::split_tile<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx, pred,
                                                   dcx::SplitCounted{prefixes, d_total}, dcx_smem);
}

// The one-pass route's split: grid = one block per tile; `status` (a word per tile) and
// `tile_counter` zeroed before the launch; the last tile stores the total in d_total.
template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, int POLL, int WAIT,
          class... P>
__global__ void __launch_bounds__(BLOCK, partition_min_blocks<T, BLOCK>())
dcx_partition_lookback(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
                       long long index_base, T* __restrict__ out_vals,
                       long long* __restrict__ out_idx, unsigned long long* status,
                       unsigned long long* d_total, unsigned long long* tile_counter, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  const dcx::SplitLookback<POLL, WAIT> places{{status, d_total}, tile_counter};
  dcx::split_tile<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx, pred,
                                                   places, dcx_smem);
}

namespace dcx {

// One round of dcx_reverse_tail on one output array (values or indices).
template <class U, int BLOCK, int ITEMS>
__device__ __forceinline__ void swap_round(U* __restrict__ out, long long k, long long n,
                                           long long half, long long r0) {
  U lo[ITEMS], hi[ITEMS];
#pragma unroll
  for (int r = 0; r < ITEMS; ++r) {
    const long long i = r0 + r * BLOCK + threadIdx.x;
    if (i < half) {
      lo[r] = out[k + i];
      hi[r] = out[n - 1 - i];
    }
  }
#pragma unroll
  for (int r = 0; r < ITEMS; ++r) {
    const long long i = r0 + r * BLOCK + threadIdx.x;
    if (i < half) {
      out[k + i] = hi[r];
      out[n - 1 - i] = lo[r];
    }
  }
}

}  // namespace dcx

// The one-pass route's second launch: out[k, n) reversed in place (k = *d_total, stored by the
// split's last tile; read here, so the host never waits between the launches). Thread t of a
// round swaps out[k + i] and out[n - 1 - i] for the ITEMS pairs i = round + r * BLOCK + t:
// consecutive per warp on both sides, and all ITEMS pairs loaded before any is stored (one
// pair per thread keeps 8 bytes of a 4-byte type in flight per thread, too few to cover the
// memory's latency). Grid-stride over rounds: any grid.
template <class T, int OUT, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_reverse_tail(T* __restrict__ out_vals, long long* __restrict__ out_idx, long long n,
                 const unsigned long long* __restrict__ d_total) {
  const long long k = (long long)*d_total;
  const long long half = (n - k) / 2;
  constexpr long long ROUND = (long long)BLOCK * ITEMS;
  for (long long r0 = (long long)blockIdx.x * ROUND; r0 < half; r0 += (long long)gridDim.x * ROUND) {
    if (OUT & dcx::OUT_VALUES) dcx::swap_round<T, BLOCK, ITEMS>(out_vals, k, n, half, r0);
    if (OUT & dcx::OUT_INDICES) dcx::swap_round<long long, BLOCK, ITEMS>(out_idx, k, n, half, r0);
  }
}
