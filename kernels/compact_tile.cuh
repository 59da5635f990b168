// Block (tile) level: BLOCK threads = BLOCK/32 warps, each owning one segment of 32*ITEMS
// elements; a tile is BLOCK*ITEMS consecutive elements. Blocks are persistent: each takes tiles
// in order from a global counter (so every tile a look-back waits on is owned by a running
// block, whatever the residency) and, per tile:
//   1. ranks its selected elements inside each warp segment with ballot/popc
//      (compact_warp.cuh) from the values already in registers;
//   2. scans the warp counts through shared memory: each warp's offset in the tile and the
//      tile's count (its aggregate), published at once for the look-back;
//   3. writes every selected element to shared memory at its rank (values, and/or its 16-bit
//      position in the tile for indices), in input order;
//   4. issues the 16-byte loads of its NEXT tile (the registers are free once staged), so they
//      are in flight while
//   5. warp 0 gets the tile's place in the output from its prefix policy (decoupled look-back,
//      or one atomic for the hybrid) -- this latency was a quarter of the time without 4.;
//   6. copies the staged run out, consecutive threads on consecutive outputs (coalesced).
// Shared memory (dynamic): TILE*sizeof(T) for values, TILE*2 bytes for indices.
#pragma once
#include "block_scan.cuh"
#include "lookback.cuh"

namespace dcx {

constexpr int OUT_VALUES = 1;
constexpr int OUT_INDICES = 2;
constexpr int OUT_BOTH = 3;

template <class T>
__device__ __forceinline__ bool fast_ok(const T* in, const bool* mask, int src) {
  // Vector loads need 16-byte aligned values and VEC-byte aligned mask bytes.
  const unsigned long long a = reinterpret_cast<unsigned long long>(in);
  const unsigned long long m = reinterpret_cast<unsigned long long>(mask);
  return (a % 16 == 0) && (src != SRC_MASK || m % vec_traits<T>::VEC == 0);
}

template <class T, int BLOCK, int ITEMS>
struct TileShape {
  static constexpr int WARPS = BLOCK / 32;
  static constexpr int SEG = 32 * ITEMS;
  static constexpr int TILE = BLOCK * ITEMS;
  static constexpr int VEC = vec_traits<T>::VEC;
  static constexpr int NV = ITEMS / VEC;
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK must be a multiple of 32");
  static_assert(TILE <= 65536, "tile positions are staged as 16-bit numbers");
};

// Second __launch_bounds__ argument of the newer tile kernels (0: none). Left alone, ptxas
// (CUDA 13) gives the 1-byte kernels ~32 registers and spills a few bytes; 4 blocks of 256
// threads per SM lets them have 64, without a spill.
template <class T>
constexpr int tile_min_blocks() {
  return sizeof(T) == 1 ? 4 : 0;
}

// Shared-memory bytes a tile kernel needs (the launch layer computes the same number).
template <class T, int OUT, int BLOCK, int ITEMS>
constexpr int tile_smem_bytes() {
  return ((OUT & OUT_VALUES) ? BLOCK * ITEMS * int(sizeof(T)) : 0) +
         ((OUT & OUT_INDICES) ? BLOCK * ITEMS * 2 : 0);
}

// The bound of an output that holds every selected element (copy_out's cap).
constexpr unsigned long long NO_CAP = ~0ull;

// The steps of a tile that both schedules below take, in their own orders (the shape of CUB's
// agents; stateless: the schedules keep the registers, since an agent object holding the loaded
// vectors cost ptxas 8-17 more registers and spills on the 512-thread kernels). The other
// steps are shared too: loading and flagging (WarpLoad), ranks (warp_ranks), the warp offsets
// and the tile's count (block_warp_offsets), the tile's place (the prefix policies).
template <class T, int OUT, int BLOCK, int ITEMS>
struct TileSteps {
  typedef TileShape<T, BLOCK, ITEMS> S;

  // The warp segment's selected elements into shared memory at their ranks, in input order.
  __device__ __forceinline__ static void stage(unsigned bits, const unsigned (&base)[S::NV],
                                               unsigned woff, const Vec<T> (&vals)[S::NV],
                                               T* s_vals, u16* s_pos, int warp, int lane) {
#pragma unroll
    for (int v = 0; v < S::NV; ++v) {
      unsigned r = woff + base[v];
#pragma unroll
      for (int j = 0; j < S::VEC; ++j) {
        if ((bits >> (v * S::VEC + j)) & 1u) {
          if (OUT & OUT_VALUES) s_vals[r] = vals[v].v[j];
          if (OUT & OUT_INDICES) s_pos[r] = u16(warp * S::SEG + v * 32 * S::VEC + lane * S::VEC + j);
          ++r;
        }
      }
    }
  }

  // The staged run out, consecutive threads on consecutive outputs (coalesced). Only outputs
  // below `cap` are written: a speculative output sized from an estimate of the count
  // (cupy_ready.OneReadCall) holds cap elements, and a call that selects more sees the total
  // and runs again into an exact one. Every other launch passes NO_CAP, which folds the
  // bound away.
  __device__ __forceinline__ static void copy_out(unsigned long long prefix, unsigned agg,
                                                  unsigned long long cap,
                                                  long long tile_start, long long index_base,
                                                  const T* s_vals, const u16* s_pos,
                                                  T* __restrict__ out_vals,
                                                  long long* __restrict__ out_idx) {
    unsigned lim = agg;
    if (cap != NO_CAP)  // a constant NO_CAP (hybrid, scatter) folds this away: no registers
      lim = prefix >= cap ? 0u : (cap - prefix < (unsigned long long)agg ? unsigned(cap - prefix) : agg);
    for (unsigned i = threadIdx.x; i < lim; i += BLOCK) {
      if (OUT & OUT_VALUES) out_vals[prefix + i] = s_vals[i];
      if (OUT & OUT_INDICES) out_idx[prefix + i] = index_base + tile_start + (long long)s_pos[i];
    }
  }
};

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class Prefix>
__device__ __forceinline__ void compact_tiles(const T* __restrict__ in, const bool* __restrict__ mask,
                                              long long n, long long index_base,
                                              T* __restrict__ out_vals, long long* __restrict__ out_idx,
                                              const Pred& pred, const Prefix& prefix_policy,
                                              unsigned long long* tile_counter, unsigned char* smem,
                                              unsigned long long cap = NO_CAP) {
  typedef TileShape<T, BLOCK, ITEMS> S;
  typedef WarpLoad<T, Pred, SRC, ITEMS, (SRC == SRC_FUSED) || (OUT & OUT_VALUES)> Load;
  typedef TileSteps<T, OUT, BLOCK, ITEMS> Steps;
  __shared__ unsigned s_warp[S::WARPS];
  __shared__ unsigned long long s_prefix;
  __shared__ long long s_first;  // the first tile (read once), apart from s_next so that thread 0
  __shared__ long long s_next;   // can claim the next tile before the others have read the first

  const long long num_tiles = (n + S::TILE - 1) / S::TILE;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  const bool aligned = fast_ok(in, mask, SRC);
  T* s_vals = reinterpret_cast<T*>(smem);
  u16* s_pos = reinterpret_cast<u16*>(smem + ((OUT & OUT_VALUES) ? S::TILE * sizeof(T) : 0));

  if (threadIdx.x == 0) s_first = (long long)atomicAdd(tile_counter, 1ull);
  __syncthreads();
  long long tile = s_first;
  if (tile >= num_tiles) return;  // uniform over the block

  Vec<T> vals[S::NV];
  unsigned mbits[S::NV];
  bool fast = aligned && (tile + 1) * S::TILE <= n;
  if (fast) Load::issue(in, mask, tile * S::TILE + (long long)warp * S::SEG, vals, mbits);

  while (true) {
    const long long tile_start = tile * S::TILE;
    // the next tile's number, read by everyone after the staging barrier below (the previous
    // value was read before the look-back barrier of the last iteration)
    if (threadIdx.x == 0) s_next = (long long)atomicAdd(tile_counter, 1ull);

    // 1. flags and ranks inside the warp's segment
    const unsigned bits = fast ? Load::flags(pred, vals, mbits)
                               : Load::guarded(in, mask, tile_start + (long long)warp * S::SEG, n, pred, vals);
    unsigned base[S::NV];
    const unsigned wcount = warp_ranks<S::VEC, S::NV>(bits, base);

    // 2. warp offsets and the tile aggregate
    unsigned woff, agg;
    block_warp_offsets<unsigned, S::WARPS>(lane == 0, wcount, s_warp, woff, agg);
    if (threadIdx.x == 0) prefix_policy.publish_aggregate(tile, agg);
    // known prefixes (exact-size scatter): the tile's place, read now and seen by all after the
    // staging barrier (the last reader of the previous value passed the loop's final barrier)
    if constexpr (Prefix::KNOWN) {
      if (threadIdx.x == 0) s_prefix = prefix_policy.known(tile);
    }

    // 3. stage the selected elements in input order
    Steps::stage(bits, base, woff, vals, s_vals, s_pos, warp, lane);
    __syncthreads();  // staging done (vals free), s_next holds the next tile

    // 4. put the next tile's loads in flight
    const long long next = s_next;
    const bool more = next < num_tiles;
    fast = more && aligned && (next + 1) * S::TILE <= n;
    if (fast) Load::issue(in, mask, next * S::TILE + (long long)warp * S::SEG, vals, mbits);

    // 5. the tile's place in the output
    if constexpr (!Prefix::KNOWN) {
      if (warp == 0) {
        const unsigned long long p = prefix_policy.exclusive_prefix(tile, num_tiles, agg);
        if (lane == 0) s_prefix = p;
      }
      __syncthreads();
    }
    const unsigned long long prefix = s_prefix;

    // 6. coalesced copy-out
    Steps::copy_out(prefix, agg, cap, tile_start, index_base, s_vals, s_pos, out_vals, out_idx);
    if (!more) break;
    tile = next;
    __syncthreads();  // shared memory is restaged by the next tile
  }
}

// Single-pass, "early" schedule (VARIANT 1 of dcx_single_pass): the same tile work as
// compact_tiles, reordered so that a tile's aggregate is published as soon as its loads have
// arrived, before its block copies out the previous tile, and the look-back of the current tile
// runs while the next tile's loads are in flight. Per iteration (tile t, next tile u):
//   a. ranks of t (its flags are already in registers), stage t in shared memory; barrier
//   b. issue u's 16-byte loads;  warp 0: look-back of t  |  all warps: flags of u, warp counts
//   c. barrier; thread 0 publishes u's aggregate;  d. copy-out of t; barrier.
// In compact_tiles a claimed tile's aggregate waited for the block's look-back AND copy-out of
// the previous tile (several us at high p), so successors' look-backs waited on that chain;
// here it waits only for the loads. Shared memory as compact_tiles (one staged tile).
template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, class Lookback>
__device__ __forceinline__ void compact_tiles_early(const T* __restrict__ in, const bool* __restrict__ mask,
                                                    long long n, long long index_base,
                                                    T* __restrict__ out_vals, long long* __restrict__ out_idx,
                                                    const Pred& pred, const Lookback& lb,
                                                    unsigned long long* tile_counter, unsigned char* smem,
                                                    unsigned long long cap = NO_CAP) {
  typedef TileShape<T, BLOCK, ITEMS> S;
  typedef WarpLoad<T, Pred, SRC, ITEMS, (SRC == SRC_FUSED) || (OUT & OUT_VALUES)> Load;
  typedef TileSteps<T, OUT, BLOCK, ITEMS> Steps;
  __shared__ unsigned s_warp[S::WARPS];
  __shared__ unsigned long long s_prefix;
  __shared__ long long s_first;
  __shared__ long long s_next;

  const long long num_tiles = (n + S::TILE - 1) / S::TILE;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  const bool aligned = fast_ok(in, mask, SRC);
  T* s_vals = reinterpret_cast<T*>(smem);
  u16* s_pos = reinterpret_cast<u16*>(smem + ((OUT & OUT_VALUES) ? S::TILE * sizeof(T) : 0));

  if (threadIdx.x == 0) s_first = (long long)atomicAdd(tile_counter, 1ull);
  __syncthreads();
  long long tile = s_first;
  if (tile >= num_tiles) return;  // uniform over the block

  Vec<T> vals[S::NV];
  unsigned mbits[S::NV];
  unsigned bits, woff, agg;
  {  // prologue: flags, warp offsets and aggregate of the first tile (published at once)
    const long long seg = tile * S::TILE + (long long)warp * S::SEG;
    bits = Load::run(in, mask, seg, n, aligned && (tile + 1) * S::TILE <= n, pred, vals);
    block_warp_offsets<unsigned, S::WARPS>(lane == 0, warp_sum_u32(__popc(bits)), s_warp, woff,
                                           agg);
    if (threadIdx.x == 0) lb.publish_aggregate(tile, agg);
  }

  while (true) {
    const long long tile_start = tile * S::TILE;
    if (threadIdx.x == 0) s_next = (long long)atomicAdd(tile_counter, 1ull);

    // a. ranks inside the warp's segment, staging in input order
    unsigned base[S::NV];
    warp_ranks<S::VEC, S::NV>(bits, base);
    Steps::stage(bits, base, woff, vals, s_vals, s_pos, warp, lane);
    __syncthreads();  // staged (vals free, s_warp read by all), s_next visible

    // b. next tile's loads in flight; look-back of this tile; flags of the next tile
    const long long next = s_next;
    const bool more = next < num_tiles;
    const bool fast = more && aligned && (next + 1) * S::TILE <= n;
    const long long nseg = next * S::TILE + (long long)warp * S::SEG;
    if (fast) Load::issue(in, mask, nseg, vals, mbits);
    if (warp == 0) {
      const unsigned long long p = lb.exclusive_prefix(tile, num_tiles, agg);
      if (lane == 0) s_prefix = p;
    }
    unsigned nbits = 0;
    if (more) {
      nbits = fast ? Load::flags(pred, vals, mbits) : Load::guarded(in, mask, nseg, n, pred, vals);
      const unsigned c = warp_sum_u32(__popc(nbits));
      if (lane == 0) s_warp[warp] = c;
    }
    __syncthreads();

    // c. the next tile's offsets and aggregate, published before this tile's copy-out (written
    //    out rather than through block_warp_offsets: only when there is a next tile, behind the
    //    barrier the look-back shares; the unconditional primitive cost ptxas 10-18 registers)
    const unsigned long long prefix = s_prefix;
    unsigned nwoff = 0, nagg = 0;
    if (more) {
#pragma unroll
      for (int w = 0; w < S::WARPS; ++w) {
        const unsigned cw = s_warp[w];
        nwoff += (w < warp) ? cw : 0u;
        nagg += cw;
      }
      if (threadIdx.x == 0) lb.publish_aggregate(next, nagg);
    }

    // d. coalesced copy-out
    Steps::copy_out(prefix, agg, cap, tile_start, index_base, s_vals, s_pos, out_vals, out_idx);
    if (!more) break;
    tile = next;
    bits = nbits;
    woff = nwoff;
    agg = nagg;
    __syncthreads();  // shared memory (staging, s_warp, s_prefix, s_next) is reused
  }
}

// Count only (the first pass of the exact-size path): the tile's count goes to its status word
// as an AGGREGATE (if status is given) and into the chunk total.
template <class T, class Pred, int SRC, int BLOCK, int ITEMS>
__device__ __forceinline__ void count_tile(const T* __restrict__ in, const bool* __restrict__ mask,
                                           long long n, const Pred& pred,
                                           unsigned long long* status, unsigned long long* d_count) {
  typedef TileShape<T, BLOCK, ITEMS> S;
  constexpr bool LOAD_VALUES = (SRC == SRC_FUSED);
  __shared__ unsigned s_warp[S::WARPS];
  const long long tile = blockIdx.x;
  const long long tile_start = tile * S::TILE;
  const int warp = int(threadIdx.x >> 5);
  const bool fast = (tile_start + S::TILE <= n) && fast_ok(in, mask, SRC);
  Vec<T> vals[S::NV];
  const unsigned bits = WarpLoad<T, Pred, SRC, ITEMS, LOAD_VALUES>::run(
      in, mask, tile_start + (long long)warp * S::SEG, n, fast, pred, vals);
  unsigned woff, agg;
  block_warp_offsets<unsigned, S::WARPS>(lane_id() == 0, warp_sum_u32(__popc(bits)), s_warp,
                                         woff, agg);
  if (threadIdx.x == 0) {
    if (status) status_store(status + tile, (tile == 0 ? STATUS_INC : STATUS_AGG) | agg);
    if (d_count && agg) atomicAdd(d_count, (unsigned long long)agg);
  }
}

// Exclusive scan of the tile counts the count kernel left in the status words (one block; the
// exact-size path without look-back): words[t] becomes the exclusive prefix of tile t (a plain
// number), *d_count the total. n/TILE values (32768 for 2^28 float32), in rounds of BLOCK *
// ITEMS: 81 us for 65536 values at 1024 x 8 on one H200 (2026-11-29), where
// scan_counts_lookback below takes several blocks at once.
template <int BLOCK, int ITEMS>
__device__ __forceinline__ void scan_tile_counts(unsigned long long* words, long long num_tiles,
                                                 unsigned long long* d_count) {
  __shared__ unsigned long long s_warp[BLOCK / 32];
  unsigned long long carry = 0;
  for (long long base = 0; base < num_tiles; base += (long long)BLOCK * ITEMS) {
    const long long first = base + (long long)threadIdx.x * ITEMS;
    unsigned long long v[ITEMS];
    unsigned long long sum = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      v[j] = (first + j < num_tiles) ? (words[first + j] & STATUS_VALUE) : 0ull;
      sum += v[j];
    }
    unsigned long long tot;
    unsigned long long run = carry + block_exclusive_scan<unsigned long long, BLOCK>(sum, s_warp, tot);
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      if (first + j < num_tiles) words[first + j] = run;
      run += v[j];
    }
    carry += tot;
    __syncthreads();  // s_warp is rewritten by the next round
  }
  if (threadIdx.x == 0) *d_count = carry;
}

// Exclusive prefixes of `num` counts (C: unsigned, or 64-bit status words, of which the value
// bits are read) into `offsets`, which may be `counts` itself (a thread reads all its values
// before it writes), by several blocks: block b scans values [b*BLOCK*ITEMS, +BLOCK*ITEMS),
// thread t ITEMS consecutive ones, and takes the blocks before it by decoupled look-back over
// `status` (a word per block, zeroed before the launch); the last block writes the total to
// *d_total. One block walking 65536 values in rounds (scan_tile_counts) took 81 us on one
// H200: every round waits on its loads and barriers, the blocks here each once.
template <class C, int BLOCK, int ITEMS>
__device__ __forceinline__ void scan_counts_lookback(const C* counts, long long num,
                                                     unsigned long long* offsets,
                                                     unsigned long long* status,
                                                     unsigned long long* d_total) {
  constexpr long long TILE = (long long)BLOCK * ITEMS;
  __shared__ unsigned long long s_warp[BLOCK / 32];
  __shared__ unsigned long long s_prefix;
  const long long block = blockIdx.x;
  const long long first = block * TILE + (long long)threadIdx.x * ITEMS;  // consecutive
  unsigned long long c[ITEMS];
  unsigned long long mine = 0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    c[k] = first + k < num ? ((unsigned long long)counts[first + k] & STATUS_VALUE) : 0ull;
    mine += c[k];
  }
  // the thread sums' exclusive prefix in the block and the block's total
  unsigned long long agg;
  const unsigned long long exc = block_exclusive_scan<unsigned long long, BLOCK>(mine, s_warp, agg);
  const LookbackPrefix<> policy{status, d_total};
  if (threadIdx.x == 0) policy.publish_aggregate(block, agg);
  if (threadIdx.x < 32) {
    const unsigned long long p = policy.exclusive_prefix(block, gridDim.x, agg);
    if (threadIdx.x == 0) s_prefix = p;
  }
  __syncthreads();
  unsigned long long run = s_prefix + exc;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (first + k < num) offsets[first + k] = run;
    run += c[k];
  }
}

}  // namespace dcx
