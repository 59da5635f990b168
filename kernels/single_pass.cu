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
//   VARIANT 0 "classic": compact_tiles (aggregate published after the previous tile's copy-out)
//           1 "early": compact_tiles_early (aggregate published as soon as the loads arrive,
//             look-back overlapped with the next tile's loads); see compact_tile.cuh
//   POLL, WAIT the look-back's sleeps (dcx::LookbackPrefix; the launch layer's tuning,
//          cupy_tuning.Tuning: 20, 0 in every entry, the kernel as measured)
//   cap    only the first cap selected elements are written (a speculative output sized from an
//          estimate: cupy_ready.OneReadCall); dcx::NO_CAP where the output holds them all. The
//          total stored in d_count is the whole count either way.
//   P...   the predicate's constants, passed by value as kernel arguments, so a new threshold
//          reuses the compiled kernel; the functor is built from them as Pred{p...}.
#include "compact_tile.cuh"

template <class T, class Pred, int OUT, int SRC, int BLOCK, int ITEMS, int VARIANT, int POLL,
          int WAIT, class... P>
__global__ void __launch_bounds__(BLOCK, VARIANT == 1 ? dcx::tile_min_blocks<T>() : 0)
dcx_single_pass(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
                long long index_base, T* __restrict__ out_vals, long long* __restrict__ out_idx,
                unsigned long long* status, unsigned long long* d_count,
                unsigned long long* tile_counter, unsigned long long cap, P... p) {
  extern __shared__ __align__(16) unsigned char dcx_smem[];
  const Pred pred{p...};
  const dcx::LookbackPrefix<POLL, WAIT> policy{status, d_count};
  if constexpr (VARIANT == 1) {
    dcx::compact_tiles_early<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                              pred, policy, tile_counter, dcx_smem, cap);
  } else {
    dcx::compact_tiles<T, Pred, OUT, SRC, BLOCK, ITEMS>(in, mask, n, index_base, out_vals, out_idx,
                                                        pred, policy, tile_counter, dcx_smem, cap);
  }
}
