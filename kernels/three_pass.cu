// algorithm="three-pass": the seed algorithm as published (Bakunas-Milanowski et al.,
// multi-level ballot/popc compaction), generalised to any length, dtype and output.
//
//   dcx_tp_flags    pass 1: each warp evaluates the predicate on its 1024-element group (32
//                   subgroups of 32), stores the 32 subgroup ballots (the group's predicate
//                   bitmask, n/8 bytes in all) and the group's count (n/1024 words);
//   dcx_tp_scan     pass 2: exclusive scan of the group counts -> each group's output offset,
//                   and the total (the one number the host reads to size the output);
//   dcx_tp_scatter  pass 3: each warp re-derives every selected element's rank from the stored
//                   ballots (__shfl_sync broadcasts, __popc counts) and writes it straight to
//                   its place; for values it reads only the input vectors that hold a selected
//                   element, for indices it does not read the input at all.
// The input is read once for the predicate; the bitmask is what pass 3 reads instead of
// re-evaluating it (what made the published version strong for output="indices").
#include "block_scan.cuh"
#include "compact_tile.cuh"

// Tuning comes from the launch layer as template parameters (dask_compact/backends/
// cupy_tuning.py: BLOCK threads per block of the flags and scatter kernels, the scan's BLOCK
// and ITEMS); TP_GROUP is the algorithm's structure (a warp's 32 lanes x 32 subgroups), which
// the launch layer mirrors (a compile test compares them).
namespace dcx {
constexpr int TP_GROUP = 1024;  // elements per warp group (32 subgroups x 32 lanes)
}  // namespace dcx

template <class T, class Pred, int SRC, int BLOCK, class... P>
__global__ void __launch_bounds__(BLOCK)
dcx_tp_flags(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
             unsigned* __restrict__ bitmask, unsigned* __restrict__ group_counts, P... p) {
  using namespace dcx;
  constexpr int VEC = vec_traits<T>::VEC;
  constexpr int NV = 32 / VEC;                 // vectors per lane for the whole group
  constexpr int NB = NV < 8 ? NV : 8;          // vectors held in registers at a time
  constexpr int BATCH = 32 * NB * VEC;         // elements per batch
  const Pred pred{p...};
  const long long group = (long long)blockIdx.x * (BLOCK / 32) + (threadIdx.x >> 5);
  const long long seg = group * TP_GROUP;
  if (seg >= n) return;  // whole warp leaves together
  const int lane = int(lane_id());
  const bool aligned = fast_ok(in, mask, SRC);
  unsigned myword = 0, count = 0;
#pragma unroll
  for (int b = 0; b < NV / NB; ++b) {
    const long long start = seg + (long long)b * BATCH;
    Vec<T> vals[NB];
    const unsigned bits = WarpLoad<T, Pred, SRC, NB * VEC, SRC == SRC_FUSED>::run(
        in, mask, start, n, aligned && start + BATCH <= n, pred, vals);
#pragma unroll
    for (int k = 0; k < NB * VEC; ++k) {
      const unsigned w = __ballot_sync(FULL_MASK, (bits >> k) & 1u);  // subgroup b*NB*VEC + k
      if (lane == b * NB * VEC + k) myword = w;
      count += __popc(w);
    }
  }
  bitmask[group * 32 + lane] = myword;
  if (lane == 0) group_counts[group] = count;
}

template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_tp_scan(const unsigned* __restrict__ counts, long long ngroups,
            unsigned long long* __restrict__ offsets, unsigned long long* status,
            unsigned long long* d_total) {
  dcx::scan_counts_lookback<unsigned, BLOCK, ITEMS>(counts, ngroups, offsets, status, d_total);
}

template <class T, int OUT, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dcx_tp_scatter(const T* __restrict__ in, long long n, long long index_base,
               const unsigned* __restrict__ bitmask, const unsigned long long* __restrict__ offsets,
               T* __restrict__ out_vals, long long* __restrict__ out_idx) {
  using namespace dcx;
  constexpr int VEC = vec_traits<T>::VEC;
  constexpr int NV = 32 / VEC;
  const long long group = (long long)blockIdx.x * (BLOCK / 32) + (threadIdx.x >> 5);
  const long long seg = group * TP_GROUP;
  if (seg >= n) return;
  const int lane = int(lane_id());
  const unsigned lt = lanemask_lt();
  const unsigned myword = bitmask[group * 32 + lane];
  const bool fast = (seg + TP_GROUP <= n) && (reinterpret_cast<unsigned long long>(in) % 16 == 0);
  unsigned long long run = offsets[group];
#pragma unroll 4
  for (int v = 0; v < NV; ++v) {
    unsigned lane_bits = 0, pre = 0, tot = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const unsigned w = __shfl_sync(FULL_MASK, myword, v * VEC + j);  // subgroup (v, j)
      lane_bits |= ((w >> lane) & 1u) << j;
      pre += __popc(w & lt);
      tot += __popc(w);
    }
    if (lane_bits) {
      const long long first = seg + (long long)v * 32 * VEC + (long long)lane * VEC;
      Vec<T> x;
      if (OUT & OUT_VALUES) {
        if (fast) {
          x.raw = load_stream16(in + first);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            if ((lane_bits >> j) & 1u) x.v[j] = in[first + j];
        }
      }
      unsigned long long r = run + pre;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if ((lane_bits >> j) & 1u) {
          if (OUT & OUT_VALUES) out_vals[r] = x.v[j];
          if (OUT & OUT_INDICES) out_idx[r] = index_base + first + j;
          ++r;
        }
      }
    }
    run += tot;
  }
}
