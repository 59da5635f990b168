// Count pass of the exact-size path (single-pass and hybrid): a chunk's result must be
// allocated at its exact length before anything is written (docs/design.md, Memory: extra memory at
// most the output plus O(n/1024)), so the host reads this one count first. Each tile's count
// also goes to its look-back status word as an AGGREGATE (when `status` is given), so the
// single-pass kernel that follows never waits on a predecessor.
// Same template parameters as dcx_single_pass (single_pass.cu), without OUT.
//
// The single-pass exact path without look-back (cupy_backend.EXACT_MODE == "prefix") calls it
// with d_count = NULL, then dcx_tile_scan turns the status words into exclusive tile prefixes
// and writes the total; the host reads that one number, allocates, and dcx_scatter
// (scatter.cu) writes every tile at its known place.
#include "compact_tile.cuh"

template <class T, class Pred, int SRC, int BLOCK, int ITEMS, class... P>
__global__ void __launch_bounds__(BLOCK)
dcx_count(const T* __restrict__ in, const bool* __restrict__ mask, long long n,
          unsigned long long* status, unsigned long long* d_count, P... p) {
  const Pred pred{p...};
  dcx::count_tile<T, Pred, SRC, BLOCK, ITEMS>(in, mask, n, pred, status, d_count);
}

// One block: exclusive scan of the tile counts left by dcx_count (see scan_tile_counts).
template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_tile_scan(unsigned long long* words, long long num_tiles, unsigned long long* d_count) {
  dcx::scan_tile_counts<BLOCK, ITEMS>(words, num_tiles, d_count);
}

// Several blocks: exclusive scan of the tile counts in place (words[t] becomes tile t's
// exclusive prefix, *d_count the total), by decoupled look-back over `status` (one word per
// BLOCK * ITEMS tiles, zeroed before the launch). The records' tile counts (records.cu).
template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_tile_scan_blocks(unsigned long long* words, long long num_tiles, unsigned long long* d_count,
                     unsigned long long* status) {
  dcx::scan_counts_lookback<unsigned long long, BLOCK, ITEMS>(words, num_tiles, words, status,
                                                              d_count);
}
