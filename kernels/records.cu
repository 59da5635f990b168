// Records (dask_compact.compact_records on CuPy): several aligned arrays, the fields of a
// record, compacted by one predicate over some of them. Three launches, one host sync:
//   1. dcx_rec_flags: the predicate on the fields it reads (the generated functor loads them
//      by row), one ballot word per 32 rows, and every tile's count;
//   2. dcx_tile_scan (count.cu, same module): the tile counts become exclusive tile prefixes
//      and the total, which the host reads to allocate every output field at its exact length;
//   3. dcx_rec_scatter: every field's selected rows (and their global indices) written at
//      tile prefix + warp offset + rank, from the ballot words alone.
// Why not one look-back pass like the one-array kernels: each output must be allocated at its
// exact length before anything is written, and here the count pass reads only the predicate's
// fields (one of four in the benchmark's shape) while the scatter reads the words (n/8 bytes)
// instead of evaluating the predicate again; with the prefixes known no tile waits on another,
// so the rows land in order and stable=False has nothing left to gain.
//
// A tile is BLOCK threads x ITEMS rows; warp w of tile t owns the rows
// [t*TILE + w*32*ITEMS, +32*ITEMS), lane l row  seg + j*32 + l  for j < ITEMS: one ballot per j
// is the word of 32 consecutive rows, in order. Fields are copied in units of U bytes (the
// widest of 16/8/4/2/1 dividing the row and both addresses; the launch layer picks it), so a
// float32 field is one 4-byte unit per row, a float32 (n, 3) field three.
#include "compact_tile.cuh"

namespace dcx {

// One field to copy: rows of `units` units of `unit` bytes. Read from device memory (a small
// table the launch layer writes), so one compiled scatter serves every record layout.
struct FieldCopy {
  const unsigned char* src;
  unsigned char* dst;
  long long unit;   // bytes: 1, 2, 4, 8 or 16
  long long units;  // units per row
};

// The predicate of the mask path: a bool per row, computed by CuPy from the fields.
struct RecMaskPred {
  const bool* mask;
  __device__ __forceinline__ bool operator()(long long i) const { return mask[i]; }
};

template <class U, int ITEMS>
__device__ __forceinline__ void copy_rows(const FieldCopy& f, const unsigned (&words)[ITEMS],
                                          const unsigned (&before)[ITEMS],
                                          unsigned long long base, long long seg, int lane) {
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src);
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst);
  const long long units = f.units;
  const unsigned lt = lanemask_lt();
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const unsigned w = words[j];
    if ((w >> lane) & 1u) {
      const long long row = seg + (long long)j * 32 + lane;
      const unsigned long long out = base + before[j] + __popc(w & lt);
      for (long long u = 0; u < units; ++u) dst[out * units + u] = src[row * units + u];
    }
  }
}

}  // namespace dcx

// Pass 1. A... : the functor's members (field pointers, then the predicate's constants), so a
// new threshold reuses the compiled kernel. words: ceil(n / 32) words (rows past n are 0).
template <class Pred, int BLOCK, int ITEMS, class... A>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_flags(long long n, unsigned* __restrict__ words, unsigned long long* __restrict__ counts,
              A... a) {
  static_assert(BLOCK % 32 == 0 && ITEMS <= 32, "tile shape");
  const Pred pred{a...};
  __shared__ unsigned s_warp[BLOCK / 32];
  const long long tile = blockIdx.x;
  const int warp = int(threadIdx.x >> 5), lane = int(dcx::lane_id());
  const long long seg = tile * (long long)(BLOCK * ITEMS) + (long long)warp * 32 * ITEMS;
  bool f[ITEMS];
  if (seg + 32 * ITEMS <= n) {
    // whole segment: every row's predicate first (its loads all in flight), then the ballots
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) f[j] = pred(seg + (long long)j * 32 + lane);
  } else {
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const long long i = seg + (long long)j * 32 + lane;
      f[j] = i < n && pred(i);
    }
  }
  unsigned count = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    const unsigned w = __ballot_sync(dcx::FULL_MASK, f[j]);
    if (lane == 0 && seg + (long long)j * 32 < n) words[(seg >> 5) + j] = w;
    count += __popc(w);
  }
  unsigned woff, agg;
  dcx::block_warp_offsets<unsigned, BLOCK / 32>(lane == 0, count, s_warp, woff, agg);
  if (threadIdx.x == 0) counts[tile] = agg;
}

// Pass 3. prefixes: the exclusive prefix of every tile (dcx_tile_scan). fields: nfields
// FieldCopy entries in device memory. out_idx: NULL, or the global int64 index of every row.
template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_scatter(long long n, const unsigned* __restrict__ words,
                const unsigned long long* __restrict__ prefixes, const dcx::FieldCopy* fields,
                int nfields, long long* __restrict__ out_idx, long long index_base) {
  __shared__ unsigned s_warp[BLOCK / 32];
  const long long tile = blockIdx.x;
  const int warp = int(threadIdx.x >> 5), lane = int(dcx::lane_id());
  const long long seg = tile * (long long)(BLOCK * ITEMS) + (long long)warp * 32 * ITEMS;
  unsigned w[ITEMS], before[ITEMS];
  unsigned count = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    w[j] = (seg + (long long)j * 32 < n) ? words[(seg >> 5) + j] : 0u;
    before[j] = count;
    count += __popc(w[j]);
  }
  unsigned woff, agg;
  dcx::block_warp_offsets<unsigned, BLOCK / 32>(lane == 0, count, s_warp, woff, agg);
  if (agg == 0) return;  // uniform over the block
  const unsigned long long base = prefixes[tile] + woff;
  for (int k = 0; k < nfields; ++k) {
    const dcx::FieldCopy f = fields[k];
    switch (f.unit) {  // uniform over the launch: no divergence
      case 16: dcx::copy_rows<uint4, ITEMS>(f, w, before, base, seg, lane); break;
      case 8: dcx::copy_rows<unsigned long long, ITEMS>(f, w, before, base, seg, lane); break;
      case 4: dcx::copy_rows<unsigned, ITEMS>(f, w, before, base, seg, lane); break;
      case 2: dcx::copy_rows<unsigned short, ITEMS>(f, w, before, base, seg, lane); break;
      default: dcx::copy_rows<unsigned char, ITEMS>(f, w, before, base, seg, lane); break;
    }
  }
  if (out_idx) {
    const unsigned lt = dcx::lanemask_lt();
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      if ((w[j] >> lane) & 1u) {
        out_idx[base + before[j] + __popc(w[j] & lt)] = index_base + seg + (long long)j * 32 + lane;
      }
    }
  }
}
