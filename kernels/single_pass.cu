// algorithm="single-pass" (the default): one read of the input, decoupled look-back between
// tiles, selected items staged in shared memory and written out coalesced; order preserved.
//
// Entry point (a template; the launch layer in dask_compact/backends/cupy_backend.py names the
// instantiations it needs through cupy.RawModule's name_expressions): dcx_single_pass. The
// exact-size path first runs dcx_count (count.cu, same module), which fills the tile status
// words with aggregates and the chunk total, so the host can size the output exactly.
// Template parameters:
//   T      element storage type (dcx_types.cuh)       Pred   generated predicate functor
//   OUT    1 values, 2 indices, 3 both                SRC    0 fused predicate, 1 bool mask
//   BLOCK, ITEMS   tuning (threads per block, elements per thread)
//   VARIANT bit 0: 0 "classic": compact_tiles (aggregate published after the previous tile's
//             copy-out); 1 "early": compact_tiles_early (aggregate published as soon as the
//             loads arrive, look-back overlapped with the next tile's loads); see
//             compact_tile.cuh. Bit 1: a chunk of a chained run (d_start below; the launch
//             layer's "chain" role), the same kernel otherwise.
//   POLL, WAIT the look-back's sleeps (dcx::LookbackPrefix; the launch layer's tuning,
//          cupy_tuning.Tuning: 20, 0 in every entry, the kernel as measured)
//   cap    only the first cap selected elements are written (a speculative output sized from an
//          estimate: cupy_ready.OneReadCall); dcx::NO_CAP where the output holds them all. The
//          total stored in d_count is the whole count either way.
//   d_start read only where VARIANT has bit 1 (a chunk of a run compacted into one output:
//          cupy_backend._run_chained; null elsewhere): the device word holding where this
//          chunk's selection starts in the run's output, stored by the previous chunk's
//          kernel (as its d_count) or zeroed for the first. It is the first tile's exclusive
//          prefix (dcx::LookbackPrefix), so every place, the cap test and d_count are in the
//          run's output: out_vals / out_idx and cap are the run's, and d_count gets the start
//          plus this chunk's count (the next chunk's start). Kernels of one stream run in
//          order, so the word is final when read.
//   P...   the predicate's constants, passed by value as kernel arguments, so a new threshold
//          reuses the compiled kernel; the functor is built from them as Pred{p...}.
#include "compact_tile.cuh"

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, int VARIANT, int POLL,
          int WAIT, class... P>
__global__ void __launch_bounds__(BLOCK, (VARIANT & 1) ? dcx::tile_min_blocks<T>() : 0)
dcx_single_pass(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
                long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
                unsigned long long* status, unsigned long long* d_count,
                unsigned long long* tile_counter, unsigned long long cap,
                const unsigned long long* d_start, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  const dcx::LookbackPrefix<POLL, WAIT, (VARIANT & 2) != 0> policy{status, d_count, d_start};
  if constexpr ((VARIANT & 1) != 0) {
    dcx::compact_tiles_early<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                              pred, policy, tile_counter, dcx_smem, cap);
  } else {
    dcx::compact_tiles<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                        pred, policy, tile_counter, dcx_smem, cap);
  }
}
