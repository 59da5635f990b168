// Records (dask_compact.compact_records on CuPy): several aligned arrays, the fields of a
// record, compacted by one predicate over some of them. Three launches, one host sync:
//   1. dcx_rec_flags: the predicate on the fields it reads (the generated functor loads them
//      by row), one ballot word per 32 rows, and every tile's count;
//   2. dcx_tile_scan (count.cu, same module): the tile counts become exclusive tile prefixes
//      and the total, which the host reads to allocate every output field at its exact length;
//   3. dcx_rec_scatter: every field's selected rows (and their global indices) written at
//      tile prefix + warp offset + rank, from the ballot words alone, one block per tile and
//      field.
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
// float32 field is one column of 4-byte units, a float32 (n, 3) field three.
#include "compact_tile.cuh"

namespace dcx {

// One column to copy: one unit of `unit` bytes per row, rows `stride` units apart (a field
// whose row is several units, e.g. float32 (n, 3), is `stride` columns, each starting one unit
// further). Read from device memory (a small table the launch layer writes), so one compiled
// scatter serves every record layout.
struct FieldCopy {
  const unsigned char* src;
  unsigned char* dst;
  long long unit;    // bytes: 1, 2, 4, 8 or 16
  long long stride;  // units per row
};

// The predicate of the mask path: a bool per row, computed by CuPy from the fields.
struct RecMaskPred {
  const bool* mask;
  __device__ __forceinline__ bool operator()(long long i) const { return mask[i]; }
};

// One field's selected rows of the warp segment, written at base + rank. Rows are read 8 at a
// time (4 of 16 bytes; predicated loads, all in flight) before any is written: the compiler cannot move a
// load above a store through another pointer, so a load-store pair per row left one load in
// flight per thread and the scatter was bound by memory latency (4.3-5.7 ms at 2^28 rows of
// four float32 fields on the H100).
template <class U, int ITEMS, bool ONE>
__device__ __forceinline__ void copy_rows(const FieldCopy& f, const unsigned (&words)[ITEMS],
                                          unsigned long long base, long long seg, int lane) {
  // ONE: stride 1 (every 1-D field, rows of 2, 4, 8 or 16 bytes): constant offsets
  const long long stride = ONE ? 1 : f.stride;
  // the lane's first row and the segment's first output; a lane's rows are 32 rows apart
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src) + (seg + lane) * stride;
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst) + (long long)base * stride;
  const unsigned lt = lanemask_lt();
  // 8 rows in flight (4 of 16 bytes): a block of 256 threads stays within 64 registers
  constexpr int WANT = sizeof(U) >= 16 ? 4 : 8;
  constexpr int GROUP = ITEMS < WANT ? ITEMS : WANT;
  static_assert(ITEMS % GROUP == 0, "ITEMS must be a multiple of 8 (or below it)");
  unsigned before = 0;  // selected rows of the segment before row group g
#pragma unroll
  for (int g = 0; g < ITEMS; g += GROUP) {
    U v[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      if ((words[g + j] >> lane) & 1u) v[j] = src[(long long)(g + j) * 32 * stride];
    }
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      const unsigned w = words[g + j];
      if ((w >> lane) & 1u) dst[(long long)(before + __popc(w & lt)) * stride] = v[j];
      before += __popc(w);
    }
  }
}

template <int ITEMS, bool ONE>
__device__ __forceinline__ void copy_field(const FieldCopy& f, const unsigned (&words)[ITEMS],
                                           unsigned long long base, long long seg, int lane) {
  switch (f.unit) {  // uniform over the block
    case 16: copy_rows<uint4, ITEMS, ONE>(f, words, base, seg, lane); break;
    case 8: copy_rows<unsigned long long, ITEMS, ONE>(f, words, base, seg, lane); break;
    case 4: copy_rows<unsigned, ITEMS, ONE>(f, words, base, seg, lane); break;
    case 2: copy_rows<unsigned short, ITEMS, ONE>(f, words, base, seg, lane); break;
    default: copy_rows<unsigned char, ITEMS, ONE>(f, words, base, seg, lane); break;
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

// Pass 3. Grid (tiles, columns + 1): blockIdx.y is the column (fields: nfields FieldCopy
// entries in device memory), and blockIdx.y == nfields writes the global int64 index of every
// selected row into out_idx (when given). prefixes: the exclusive prefix of every tile
// (dcx_tile_scan). Warps are independent (no barrier): a warp finds its place in the tile by
// counting the words of the tile's warps before it (at most (BLOCK/32 - 1) * ITEMS words, read
// by its lanes), so its loads (its words, the tile's prefix, those words) go out together, and
// one memory latency later its rows' loads. (With a block scan of the warp counts first, two
// dependent loads and a barrier per block, the scatter took 2.3 ms for four float32 columns of
// 2^28 rows at p = 0.05 on the H100; this 1.6 ms. A warp walking several segments held more
// registers than it saved latency: 127-255.)
template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_scatter(long long n, const unsigned* __restrict__ words,
                const unsigned long long* __restrict__ prefixes, const dcx::FieldCopy* fields,
                int nfields, long long* __restrict__ out_idx, long long index_base) {
  const long long tile = blockIdx.x;
  const int field = int(blockIdx.y);
  const int warp = int(threadIdx.x >> 5), lane = int(dcx::lane_id());
  const long long seg = tile * (long long)(BLOCK * ITEMS) + (long long)warp * 32 * ITEMS;
  const long long nwords = (n + 31) >> 5;
  const long long tile_word = (tile * (long long)(BLOCK * ITEMS)) >> 5;
  const unsigned long long prefix = prefixes[tile];
  unsigned w[ITEMS];
  unsigned any = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    w[j] = (seg + (long long)j * 32 < n) ? words[(seg >> 5) + j] : 0u;
    any |= w[j];
  }
  unsigned before = 0;
  for (int k = lane; k < warp * ITEMS && tile_word + k < nwords; k += 32)
    before += __popc(words[tile_word + k]);
  if (__all_sync(dcx::FULL_MASK, any == 0u)) return;  // nothing selected in the segment
  const unsigned long long base = prefix + dcx::warp_sum_u32(before);
  if (field == nfields) {
    const unsigned lt = dcx::lanemask_lt();
    unsigned done = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      if ((w[j] >> lane) & 1u)
        out_idx[base + done + __popc(w[j] & lt)] = index_base + seg + (long long)j * 32 + lane;
      done += __popc(w[j]);
    }
    return;
  }
  const dcx::FieldCopy f = fields[field];
  if (f.stride == 1) {
    dcx::copy_field<ITEMS, true>(f, w, base, seg, lane);
  } else {
    dcx::copy_field<ITEMS, false>(f, w, base, seg, lane);
  }
}
