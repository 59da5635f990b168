// Records (dask_compact.compact_records on CuPy): several aligned arrays, the fields of a
// record, compacted by one predicate over some of them. Five launches, one host sync:
//   1. dcx_rec_flags: the predicate on the fields it reads (the generated functor loads them
//      by row), one ballot word per 32 rows, and every tile's count;
//   2. dcx_tile_scan_blocks (count.cu, same module): the tile counts become exclusive tile
//      prefixes and the total, which the host reads to allocate every output field at its
//      exact length;
//   3. dcx_rec_spans (a thread per span): the spans (SPAN rows, whole tiles) of the copy
//      sorted into two work lists by their selected rows, from the tile prefixes; the sized
//      call reads the lists' lengths with the total (its one sync) and launches each form on
//      exactly its spans;
//   4. the copy of every field's selected rows (and their global indices), from the ballot
//      words alone, in two forms launched one after the other, each taking its list's spans:
//      a span with at least `dense_from` selected rows is copied by dcx_rec_scatter (one block
//      per tile and field: a whole tile of a stride-1 column staged through shared memory by
//      16-byte loads and stores, other columns by each lane its own rows at tile prefix + warp
//      offset + rank), a sparser one by dcx_rec_gather (one block per span: the selected rows
//      listed in shared memory, then every field copied through the list by all the block's
//      threads). The
//      choice is per span, on the device, so the sync-free call chooses as well as the sized
//      one, and a selection dense in one part of the input and sparse in another gets each
//      form where it is faster. Until 2026-11-29 both forms were launched over every span,
//      each block testing its own: on one H200 at 2^28 rows of four float32 fields the
//      scatter's blocks with nothing to copy took 0.35 ms at p = .05 (of a 1.8 ms call), the
//      gather's 0.06 ms at p = .95. Measured on the
//      H100 at 2^28 rows of four float32 fields: p = .05: scatter 1.8 ms, gather 1.1 ms; p =
//      .5: 2.65 / 2.55 ms; p = .95: 3.2 / 3.7 ms (the list costs a serial walk of the set bits
//      and shared memory that limits the resident blocks; with few rows per word the scatter's
//      lanes are mostly idle and its loads few). With the staged columns (one H200, the forms
//      over every span): p = .05 / .3 / .5 / .7 / .95: scatter 1.40 / 1.59 / 1.72 / 1.90 /
//      2.15 ms (per lane: 1.54 / 1.84 / 1.99 / 2.13 / 2.35), gather at p = .3 1.47 ms, so the
//      crossover moved from one half to 0.4 (cupy_tuning.REC_DENSE_FROM).
// Why not one look-back pass like the one-array kernels: each output must be allocated at its
// exact length before anything is written, and here the count pass reads only the predicate's
// fields (one of four in the benchmark's shape) while the scatter reads the words (n/8 bytes)
// instead of evaluating the predicate again; with the prefixes known no tile waits on another,
// so the rows land in order and stable=False has nothing left to gain. Measured on the H100
// (2026-12-06, benchmarks/results/2026-12-06_h100_3466f36_records_lookback_pass_ab.md): pass 1
// with look-back (one tile a block) copying the predicate's fields into outputs sized from the
// previous call took 1.7-1.9 / 2.8-3.0 / 3.4-3.6 ms at p = .05 / .5 / .95 against 1.39 / 2.64
// / 3.27 for these passes; the look-back alone cost 0.5 ms, and the copy it saved 0.04-0.17.
//
// A tile is BLOCK threads x ITEMS rows; warp w of tile t owns the rows
// [t*TILE + w*32*ITEMS, +32*ITEMS), lane l row  seg + j*32 + l  for j < ITEMS: one ballot per j
// is the word of 32 consecutive rows, in order. Fields are copied in units of U bytes (the
// widest of 16/8/4/2/1 dividing the row and both addresses; the launch layer picks it), so a
// float32 field is one column of 4-byte units, a float32 (n, 3) field rows of three.
#include "compact_tile.cuh"

namespace dcx {

// One field to copy: rows of `stride` units of `unit` bytes (a float32 (n, 3) field: three
// 4-byte units). Read from device memory (a small table the launch layer writes), so one
// compiled scatter serves every record layout. A row of several units is one entry, copied
// whole by one block (staged through shared memory, or a warp a row): until
// 2026-11-29 each unit was an entry of its own, copied by its own blocks, and a ray batch's
// (n, 3) fields took 5x the bytes floor (one H200, 2^28 rows: 16.5 ms at p = .5, slower than
// cupy.take or torch's indexing), the three units' stores to one sector from blocks far apart.
struct FieldCopy {
  const unsigned char* src;
  unsigned char* dst;
  long long unit;    // bytes: 1, 2, 4, 8 or 16
  long long stride;  // units per row
};

// Unit c of every row of f as a column of its own (rows stride units apart).
__device__ __forceinline__ FieldCopy unit_column(const FieldCopy& f, long long c) {
  return FieldCopy{f.src + c * f.unit, f.dst + c * f.unit, f.unit, f.stride};
}

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
// Rows of one unit each (every 1-D field, rows of 2, 4, 8 or 16 bytes); wider rows are
// staged or copied by copy_whole_rows.
template <class U, int ITEMS>
__device__ __forceinline__ void copy_rows(const FieldCopy& f, const unsigned (&words)[ITEMS],
                                          unsigned long long base, long long seg, int lane) {
  // the lane's first row and the segment's first output; a lane's rows are 32 rows apart
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src) + (seg + lane);
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst) + (long long)base;
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
      if ((words[g + j] >> lane) & 1u) v[j] = src[(long long)(g + j) * 32];
    }
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      const unsigned w = words[g + j];
      if ((w >> lane) & 1u) dst[(long long)(before + __popc(w & lt))] = v[j];
      before += __popc(w);
    }
  }
}

// Rows of several units of the warp segment whose rows are not staged (the last, partial
// tile, or rows too wide for the stage): the warp walks the segment's selected rows in order
// and its lanes copy each row's units (unit l, l + 32, ... of a row by lane l). A lane per row
// and a loop over its units inlined here took the scatter from 64 to 128 registers (half the
// resident blocks for every column, the staged ones included); this loop keeps a few.
template <class U, int ITEMS>
__device__ __forceinline__ void copy_whole_rows(const FieldCopy& f, const unsigned* segwords,
                                                unsigned long long base, long long seg,
                                                long long n, int lane) {
  // segwords: the segment's ballot words in global memory (read again, and cached: indexing
  // the registers' copy by a loop variable put it on the stack for every path)
  const long long per = f.stride;  // units a row
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src);
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst) + (long long)base * per;
  long long k = 0;  // the segment's selected rows copied so far
#pragma unroll 1
  for (int j = 0; j < ITEMS && seg + (long long)j * 32 < n; ++j) {
#pragma unroll 1
    for (unsigned w = segwords[j]; w; w &= w - 1u, ++k) {
      const long long row = seg + (long long)j * 32 + (__ffs(w) - 1);
#pragma unroll 1
      for (long long c = lane; c < per; c += 32) dst[k * per + c] = src[row * per + c];
    }
  }
}

template <bool B>
struct Flag {
  static constexpr bool value = B;
};

// fn(U{}, Flag<ONE>{}) with U the unsigned type of f.unit bytes and ONE = (f.stride == 1): the
// copy loops are compiled once per unit width and stride form, and each block picks its
// field's (both are uniform over the block), so one kernel serves every record layout.
template <bool ONE, class Fn>
__device__ __forceinline__ void by_width(long long unit, Fn& fn) {
  switch (unit) {
    case 16: fn(uint4{}, Flag<ONE>{}); break;
    case 8: fn((unsigned long long)0, Flag<ONE>{}); break;
    case 4: fn(0u, Flag<ONE>{}); break;
    case 2: fn((unsigned short)0, Flag<ONE>{}); break;
    default: fn((unsigned char)0, Flag<ONE>{}); break;
  }
}

template <class Fn>
__device__ __forceinline__ void by_unit(const FieldCopy& f, Fn fn) {
  if (f.stride == 1) {
    by_width<true>(f.unit, fn);  // every 1-D field: constant offsets
  } else {
    by_width<false>(f.unit, fn);
  }
}

// Selected rows of span s (SPAN rows, a whole number of TILE-row tiles), from the exclusive
// tile prefixes (prefixes[tiles] is the total).
template <int TILE, int SPAN>
__device__ __forceinline__ unsigned span_count(long long n, const unsigned long long* prefixes,
                                               long long s) {
  static_assert(SPAN % TILE == 0, "a span is whole tiles");
  const long long tiles = (n + TILE - 1) / TILE;
  const long long first = s * (SPAN / TILE);
  const long long next = first + SPAN / TILE < tiles ? first + SPAN / TILE : tiles;
  return unsigned(prefixes[next] - prefixes[first]);
}

}  // namespace dcx

// Pass 1. A... : the functor's members (field pointers, then the predicate's constants), so a
// new threshold reuses the compiled kernel. words: ceil(n / 32) words (rows past n are 0);
// counts: tiles + 3 + ceil(tiles / SCAN_TILE) entries (the tile counts, the total, the two
// lists' lengths and the tile scan's status words).
template <class Pred, int BLOCK, int ITEMS, int SCAN_TILE, class... A>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_flags(long long n, unsigned* __restrict__ words, unsigned long long* __restrict__ counts,
              unsigned* __restrict__ warp_offsets, A... a) {
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
  if (lane == 0) warp_offsets[tile * (BLOCK / 32) + warp] = woff;
  // counts[tiles] is the total (dcx_tile_scan_blocks writes it); the words after it are the
  // lengths of the copy's work lists, which dcx_rec_spans accumulates, and the status words
  // of the scan's blocks (SCAN_TILE tiles each): zeroed here, for the next launches. In 32
  // bits: in 64 (a count passed as an argument, or computed here) ptxas gave the kernel of a
  // complex128 functor an 8-byte spill, which the compile test refuses.
  const unsigned zeros = 2u + (gridDim.x + unsigned(SCAN_TILE) - 1u) / unsigned(SCAN_TILE);
  const unsigned z = blockIdx.x * unsigned(BLOCK) + threadIdx.x;  // blocks past zeros: unused
  if (blockIdx.x <= zeros / unsigned(BLOCK) && z < zeros) counts[gridDim.x + 1ull + z] = 0;
}

// Pass 3. The spans of the copy in two work lists: lists[0 .. d) the spans with at least
// dense_from selected rows (dcx_rec_scatter's), lists[nspans .. nspans + s) those with fewer
// but some (dcx_rec_gather's); d and s accumulate in counts[tiles + 1] and counts[tiles + 2]
// (zeroed by dcx_rec_flags). One thread per span, one atomic per warp and list: the lists come
// out in about the spans' order, which no result depends on (a span's rows land at its tile
// prefixes). (One block walking every span in order took 0.1 ms at 2^28 rows on one H200.)
template <int TILE, int SPAN>
__global__ void dcx_rec_spans(long long n, unsigned long long* __restrict__ counts,
                              unsigned dense_from, unsigned* __restrict__ lists) {
  const long long tiles = (n + TILE - 1) / TILE;
  const long long nspans = (n + SPAN - 1) / SPAN;
  const long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned c = s < nspans ? dcx::span_count<TILE, SPAN>(n, counts, s) : 0u;
  const bool dense = c != 0 && c >= dense_from, sparse = c != 0 && c < dense_from;
  const unsigned dm = __ballot_sync(dcx::FULL_MASK, dense);
  const unsigned sm = __ballot_sync(dcx::FULL_MASK, sparse);
  unsigned long long dbase = 0, sbase = 0;
  if (dcx::lane_id() == 0) {
    if (dm) dbase = atomicAdd(&counts[tiles + 1], (unsigned long long)__popc(dm));
    if (sm) sbase = atomicAdd(&counts[tiles + 2], (unsigned long long)__popc(sm));
  }
  dbase = __shfl_sync(dcx::FULL_MASK, dbase, 0);
  sbase = __shfl_sync(dcx::FULL_MASK, sbase, 0);
  const unsigned lt = dcx::lanemask_lt();
  if (dense) lists[dbase + __popc(dm & lt)] = unsigned(s);
  if (sparse) lists[nspans + sbase + __popc(sm & lt)] = unsigned(s);
}

namespace dcx {

// The length of a work list: `known` where the host read it (the sized call, whose grid is
// the list), else read here (the sync-free call, whose grid covers every span).
__device__ __forceinline__ long long list_length(const unsigned long long* counts,
                                                 long long tiles, int which, long long known) {
  return known >= 0 ? known : (long long)counts[tiles + 1 + which];
}

// The tile's ballot words into s_words and each word's selected rows before it in the tile
// into s_pre (the warp's segment offset plus a scan of its ITEMS words; s_pre[TILE / 32]: the
// tile's count). myword: word (lane % ITEMS) of the warp's segment; woff: the segment's offset
// in its tile (pass 1). The caller synchronises before reading them.
template <int BLOCK, int ITEMS>
__device__ __forceinline__ void tile_prefixes(unsigned myword, unsigned woff, unsigned* s_words,
                                              unsigned* s_pre) {
  constexpr int TILE = BLOCK * ITEMS;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  const unsigned cnt = lane < ITEMS ? unsigned(__popc(myword)) : 0u;
  const unsigned inc = warp_inclusive_scan(cnt);
  if (lane < ITEMS) {
    s_words[warp * ITEMS + lane] = myword;
    s_pre[warp * ITEMS + lane] = woff + inc - cnt;
    if (warp == BLOCK / 32 - 1 && lane == ITEMS - 1) s_pre[TILE / 32] = woff + inc;  // count
  }
}

// Row r of a 16-byte load of rows of U bytes (r a constant once unrolled: register moves and
// shifts; a union of the load and a row array put it on the stack).
template <class U>
__device__ __forceinline__ U row_of(const uint4& v, int r) {
  constexpr int PER_WORD = 4 / int(sizeof(U)) > 0 ? 4 / int(sizeof(U)) : 1;
  if (sizeof(U) == 8) {
    const unsigned lo = r == 0 ? v.x : v.z, hi = r == 0 ? v.y : v.w;
    return U((unsigned long long)hi << 32 | lo);
  }
  const int q = r / PER_WORD;  // the 32-bit word holding the row
  const unsigned w = q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;
  return U(w >> (8 * int(sizeof(U)) * (r % PER_WORD)));
}

// One stride-1 column of a whole tile (rows of U bytes, U <= 8, both column addresses 16-byte
// aligned) through shared memory: the tile's rows read by 16-byte loads (all issued before
// anything else), the selected ones placed in shared memory at their rank, then the selected
// run written by 16-byte stores (the run's first and last partial 16 bytes row by row). The
// per-lane form (copy_rows) spends a load, a store and their address arithmetic on every row;
// here a load carries 16 / U rows and a store 16 / U selected ones, and every global access is
// coalesced. myword: word (lane % ITEMS) of the warp's segment; woff: the segment's offset in
// its tile (pass 1); tile_base: the tile's exclusive prefix. s_stage: TILE * U + 16 bytes,
// 16-byte aligned; s_words, s_pre: TILE / 32 and TILE / 32 + 1 words. Every thread of the block
// calls it.
template <class U, int BLOCK, int ITEMS>
__device__ __forceinline__ void stage_tile(const FieldCopy& f, long long row0,
                                           unsigned long long tile_base, unsigned myword,
                                           unsigned woff, unsigned char* s_stage,
                                           unsigned* s_words, unsigned* s_pre) {
  constexpr int TILE = BLOCK * ITEMS;
  constexpr int R = 16 / int(sizeof(U));  // rows per 16-byte chunk
  constexpr int PER = TILE / R / BLOCK;   // chunks per thread
  static_assert(TILE % (R * BLOCK) == 0 && ITEMS <= 32, "tile shape");
  const uint4* __restrict__ src =
      reinterpret_cast<const uint4*>(f.src + row0 * (long long)sizeof(U));
  uint4 c[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) c[k] = src[k * BLOCK + int(threadIdx.x)];
  tile_prefixes<BLOCK, ITEMS>(myword, woff, s_words, s_pre);
  __syncthreads();
  U* stage = reinterpret_cast<U*>(s_stage);
  const unsigned shift = unsigned(tile_base % R);  // the first output row's place in its 16 bytes
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const int r0 = (k * BLOCK + int(threadIdx.x)) * R;  // the chunk's first row in the tile
    const unsigned w = s_words[r0 >> 5];
    const int sh = r0 & 31;
    const unsigned bits = (w >> sh) & ((1u << R) - 1u);
    const unsigned slot = s_pre[r0 >> 5] + shift + __popc(w & ((1u << sh) - 1u));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if ((bits >> r) & 1u) stage[slot + __popc(bits & ((1u << r) - 1u))] = row_of<U>(c[k], r);
    }
  }
  __syncthreads();
  const unsigned end = shift + s_pre[TILE / 32];  // staged slots [shift, end)
  const unsigned long long first = tile_base - shift;  // output row of slot 0 (16-byte aligned)
  uint4* dstv = reinterpret_cast<uint4*>(f.dst) + first / R;
  U* dstu = reinterpret_cast<U*>(f.dst) + first;
  for (unsigned q = threadIdx.x; q * R < end; q += BLOCK) {
    if (q * R >= shift && q * R + R <= end) {
      dstv[q] = reinterpret_cast<const uint4*>(s_stage)[q];
    } else {  // the run's partial first or last 16 bytes, shared with the tiles beside it
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const unsigned at = q * R + unsigned(r);
        if (at >= shift && at < end) dstu[at] = stage[at];
      }
    }
  }
}

// The widest row the staged copy takes: a tile of them in at most 32 KiB of shared memory (8
// bytes at the default 4096-row tile).
template <int TILE>
struct StageMaxUnit {
  static constexpr int value =
      TILE * 8 <= 32768 ? 8 : TILE * 4 <= 32768 ? 4 : TILE * 2 <= 32768 ? 2 : TILE <= 32768;
};

// stage_tile where a thread's share of the tile is whole 16-byte loads (ITEMS * U >= 16; every
// width at the default 16 rows a thread) and a tile of U-byte rows fits the shared memory.
// False: the per-lane form copies the column.
template <class U, int BLOCK, int ITEMS>
__device__ __forceinline__ bool stage_fits(const FieldCopy& f, long long row0,
                                           unsigned long long base, unsigned myword,
                                           unsigned woff, unsigned char* s_stage,
                                           unsigned* s_words, unsigned* s_pre) {
  if constexpr (ITEMS * sizeof(U) >= 16 && sizeof(U) <= StageMaxUnit<BLOCK * ITEMS>::value) {
    stage_tile<U, BLOCK, ITEMS>(f, row0, base, myword, woff, s_stage, s_words, s_pre);
    return true;
  } else {
    return false;
  }
}

// The shared memory of the staged copies for a tile of TILE rows (StageMaxUnit's columns),
// and the widest row (bytes) that stage_rows takes there: 32 rows and their list (1022 bytes
// at the default 4096-row tile, 510 at 2048 rows).
template <int TILE>
struct Stage {
  static constexpr long long bytes = (long long)TILE * StageMaxUnit<TILE>::value + 16;
  static constexpr long long max_row = bytes / 32 - 2;
};

// A whole tile of a field whose rows are several units (W units of T bytes a row, T the
// field's unit up to 4 bytes: float32 (n, 3) as 3 words, float64 (n, 3) as 6, uint8 (n, 3)
// as 3 bytes; rows of at most Stage<TILE>::max_row bytes) through shared memory, in passes
// of as many rows as the stage holds with their list (a multiple of 32 rows): the bytes copied
// into shared memory as they are by coalesced 16-byte loads (T-sized ones where the field is
// not 16-byte aligned; 4 a thread in flight; every pass starts 16-byte aligned as the tile
// does, p and row0 being multiples of 32 rows) while the selected rows are listed by rank (2
// bytes each, after the rows), then the pass's selected rows written as one run of units by
// coalesced T-sized stores, unit q from row list[q / W] (a multiply-high: exact here, q * (W -
// 1) < 2^32). Placing each loaded word at its row's rank as it arrived held more registers
// than a plain copy. Every thread of the block calls it; s_words and s_pre as tile_prefixes
// leaves them.
template <class T, int BLOCK, int ITEMS>
__device__ __forceinline__ void stage_rows(const FieldCopy& f, long long row0,
                                           unsigned long long tile_base,
                                           unsigned char* s_stage, unsigned capacity,
                                           const unsigned* s_words, const unsigned* s_pre) {
  constexpr unsigned TILE = unsigned(BLOCK) * ITEMS;
  constexpr unsigned PER16 = 16u / sizeof(T);  // units a 16-byte load
  constexpr unsigned LOADS = 4;  // a thread's loads in flight (8 held 80 registers)
  const unsigned row_bytes = unsigned(f.unit * f.stride);
  const unsigned W = row_bytes / unsigned(sizeof(T));
  const unsigned magic = unsigned((0x100000000ull + W - 1u) / W);
  const unsigned sub = (capacity / (row_bytes + 2u)) & ~31u;  // rows a pass
  T* stage = reinterpret_cast<T*>(s_stage);
  unsigned short* list = reinterpret_cast<unsigned short*>(s_stage + sub * row_bytes);
  const T* __restrict__ src = reinterpret_cast<const T*>(f.src) + row0 * W;
  T* __restrict__ dst = reinterpret_cast<T*>(f.dst);
  const bool vec = (reinterpret_cast<unsigned long long>(f.src) & 15ull) == 0;
  for (unsigned p = 0; p < TILE; p += sub) {
    const unsigned rows = TILE - p < sub ? TILE - p : sub;
    const unsigned first = s_pre[p >> 5];                   // the tile's selected rows before p
    const unsigned count = s_pre[(p + rows) >> 5] - first;  // the pass's
    const unsigned all = rows * W;  // units; rows * row_bytes is a multiple of 32 bytes
    if (vec) {
      const uint4* __restrict__ src4 = reinterpret_cast<const uint4*>(src + (long long)p * W);
      uint4* stage4 = reinterpret_cast<uint4*>(s_stage);
      for (unsigned i0 = threadIdx.x; i0 < all / PER16; i0 += BLOCK * LOADS) {
        uint4 v[LOADS];
#pragma unroll
        for (int j = 0; j < int(LOADS); ++j) {
          const unsigned i = i0 + unsigned(j) * BLOCK;
          if (i < all / PER16) v[j] = src4[i];
        }
#pragma unroll
        for (int j = 0; j < int(LOADS); ++j) {
          const unsigned i = i0 + unsigned(j) * BLOCK;
          if (i < all / PER16) stage4[i] = v[j];
        }
      }
    } else {
      for (unsigned i0 = threadIdx.x; i0 < all; i0 += BLOCK * LOADS) {
        T v[LOADS];
#pragma unroll
        for (int j = 0; j < int(LOADS); ++j) {
          const unsigned i = i0 + unsigned(j) * BLOCK;
          if (i < all) v[j] = src[(long long)p * W + i];
        }
#pragma unroll
        for (int j = 0; j < int(LOADS); ++j) {
          const unsigned i = i0 + unsigned(j) * BLOCK;
          if (i < all) stage[i] = v[j];
        }
      }
    }
    for (unsigned q = threadIdx.x; q < rows; q += BLOCK) {  // the selected rows by rank
      const unsigned r = p + q;
      const unsigned wd = s_words[r >> 5];
      if ((wd >> (r & 31u)) & 1u)
        list[s_pre[r >> 5] + __popc(wd & ((1u << (r & 31u)) - 1u)) - first] =
            (unsigned short)q;
    }
    __syncthreads();
    T* out = dst + (long long)(tile_base + first) * W;
    for (unsigned q = threadIdx.x; q < count * W; q += BLOCK) {
      const unsigned e = __umulhi(q, magic);  // q / W: the run's row
      out[q] = stage[list[e] * W + (q - e * W)];
    }
    __syncthreads();  // the next pass overwrites the stage
  }
}

// The staged copy where it applies (uniform over the block): a whole tile, and a stride-1
// column of at most 8-byte rows with both addresses 16-byte aligned (stage_tile), or rows of
// several units, at most Stage<TILE>::max_row bytes (stage_rows). False: the per-lane form
// copies it.
template <int BLOCK, int ITEMS>
__device__ __forceinline__ bool staged_copy(const FieldCopy& f, long long tile, long long n,
                                            const unsigned* words,
                                            const unsigned long long* prefixes,
                                            const unsigned* warp_offsets) {
  constexpr long long TILE = (long long)BLOCK * ITEMS;
  const unsigned long long at =
      reinterpret_cast<unsigned long long>(f.src) | reinterpret_cast<unsigned long long>(f.dst);
  if ((tile + 1) * TILE > n) return false;
  const bool rows = f.stride != 1;
  if (rows ? f.unit * f.stride > Stage<TILE>::max_row : f.unit > 8 || (at & 15ull) != 0)
    return false;
  const int warp = int(threadIdx.x >> 5), lane = int(lane_id());
  const long long seg = tile * TILE + (long long)warp * 32 * ITEMS;
  const unsigned myword = words[(seg >> 5) + lane % ITEMS];
  const unsigned woff = warp_offsets[tile * (BLOCK / 32) + warp];
  const unsigned long long base = prefixes[tile];
  const long long row0 = tile * TILE;
  // one set of shared memory for every width (each stage_fits' own would add up past the 48
  // KiB of static shared memory)
  __shared__ __align__(16) unsigned char s_stage[Stage<TILE>::bytes];
  __shared__ unsigned s_words[TILE / 32];
  __shared__ unsigned s_pre[TILE / 32 + 1];
  if (rows) {
    tile_prefixes<BLOCK, ITEMS>(myword, woff, s_words, s_pre);
    __syncthreads();
    const unsigned cap = unsigned(sizeof(s_stage));
    if (f.unit == 1) {
      stage_rows<unsigned char, BLOCK, ITEMS>(f, row0, base, s_stage, cap, s_words, s_pre);
    } else if (f.unit == 2) {
      stage_rows<unsigned short, BLOCK, ITEMS>(f, row0, base, s_stage, cap, s_words, s_pre);
    } else {  // 4-, 8- and 16-byte units as 4-byte words
      stage_rows<unsigned, BLOCK, ITEMS>(f, row0, base, s_stage, cap, s_words, s_pre);
    }
    return true;
  }
  switch (f.unit) {
    case 8:
      return stage_fits<unsigned long long, BLOCK, ITEMS>(f, row0, base, myword, woff, s_stage,
                                                          s_words, s_pre);
    case 4:
      return stage_fits<unsigned, BLOCK, ITEMS>(f, row0, base, myword, woff, s_stage, s_words,
                                                s_pre);
    case 2:
      return stage_fits<unsigned short, BLOCK, ITEMS>(f, row0, base, myword, woff, s_stage,
                                                      s_words, s_pre);
    default:
      return stage_fits<unsigned char, BLOCK, ITEMS>(f, row0, base, myword, woff, s_stage,
                                                     s_words, s_pre);
  }
}

}  // namespace dcx

// Pass 4, scatter form. Grid (blocks, columns + 1): blockIdx.y is the column (fields: nfields
// FieldCopy entries in device memory), and blockIdx.y == nfields writes the global int64 index
// of every selected row into out_idx (when given). Block x takes tile x of the dense spans'
// tiles (lists[0 .. d), SPAN / TILE tiles each; blocks past them exit), or, with lists null
// (the sized call knew that no span is sparse), tile x itself: the list's load before every
// other one cost 0.2 ms at p = .95 (2^28 rows of four float32 fields, one H200). One tile a
// block, no loop: walking several took 128 registers against 58 (half the resident blocks)
// and 1.5x the time at p = .95. prefixes: the exclusive prefix of every tile
// (dcx_tile_scan_blocks); warp_offsets: every warp segment's offset in its tile (pass 1).
// Warps are independent (no barrier): a warp's loads (its words, its tile's prefix and its
// offset) go out together, and one memory latency later its rows' loads. (With a block scan
// of the warp counts first, two dependent loads and a barrier per block, the scatter took 2.3
// ms for four float32 columns of 2^28 rows at p = 0.05 on the H100, and 1.6 ms with each warp
// counting the words of the warps before it instead; a warp walking several segments held
// more registers than it saved latency: 127-255.)
// STAGE: the columns dcx::staged_copy takes (whole tiles of stride-1 columns) go through shared
// memory by 16-byte loads and stores; the others, and the indices, by the per-lane form.
template <int BLOCK, int ITEMS, int SPAN, bool STAGE>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_scatter(long long n, const unsigned* __restrict__ words,
                const unsigned long long* __restrict__ prefixes,
                const unsigned* __restrict__ warp_offsets, const dcx::FieldCopy* fields,
                int nfields, long long* __restrict__ out_idx, long long index_base,
                const unsigned* __restrict__ lists, long long known) {
  constexpr long long TILE = (long long)BLOCK * ITEMS;
  constexpr long long PER = SPAN / TILE;  // tiles per span
  static_assert(SPAN % TILE == 0, "a span is whole tiles");
  const long long tiles = (n + TILE - 1) / TILE;
  const long long i = blockIdx.x;
  long long tile = i;
  if (lists != nullptr) {
    if (i >= dcx::list_length(prefixes, tiles, 0, known) * PER) return;
    tile = (long long)lists[i / PER] * PER + i % PER;
  }
  if (tile >= tiles) return;  // the last span's tiles past n
  const int field = int(blockIdx.y);
  if (STAGE && field < nfields) {
    const dcx::FieldCopy f = fields[field];
    if (dcx::staged_copy<BLOCK, ITEMS>(f, tile, n, words, prefixes, warp_offsets)) return;
  }
  const int warp = int(threadIdx.x >> 5), lane = int(dcx::lane_id());
  const long long seg = tile * TILE + (long long)warp * 32 * ITEMS;
  const unsigned long long base = prefixes[tile] + warp_offsets[tile * (BLOCK / 32) + warp];
  unsigned w[ITEMS];
  unsigned any = 0;
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) {
    w[j] = (seg + (long long)j * 32 < n) ? words[(seg >> 5) + j] : 0u;
    any |= w[j];
  }
  if (__all_sync(dcx::FULL_MASK, any == 0u)) return;  // nothing selected in the segment
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
  dcx::by_unit(f, [&](auto u, auto one) {
    if constexpr (decltype(one)::value) {
      dcx::copy_rows<decltype(u), ITEMS>(f, w, base, seg, lane);
    } else {
      dcx::copy_whole_rows<decltype(u), ITEMS>(f, words + (seg >> 5), base, seg, n, lane);
    }
  });
}

namespace dcx {

// One field's selected rows of a span, gathered through the span's row list: entry k (row
// row0 + list[k]) goes to output row base + k, `per` units of each row (from unit `c0`; rows
// `stride` units apart), the run's units in order: unit q is unit q % per of entry q / per, so
// consecutive threads read a row's units together and write consecutive units (the stores are
// coalesced at every density, the loads whenever the selection is dense). R units per thread
// are loaded before any is stored (the compiler cannot move a load above a store through
// another pointer), so R loads per thread are in flight whatever the density. ONE: one unit a
// row, per = stride = 1. total * per < 2^32.
template <class U, int BLOCK, int R, bool ONE>
__device__ __forceinline__ void gather_units(const FieldCopy& f, long long c0, unsigned per,
                                             const unsigned short* list, unsigned total,
                                             long long row0, unsigned long long base) {
  const long long stride = ONE ? 1 : f.stride;
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src) + row0 * stride + c0;
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst) + (long long)base * stride + c0;
  const unsigned all = ONE ? total : total * per;
  for (unsigned k0 = threadIdx.x; k0 < all; k0 += BLOCK * R) {
    U v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned k = k0 + r * BLOCK;
      if (k < all) {
        const unsigned e = ONE ? k : k / per;  // the entry
        v[r] = src[(long long)list[e] * stride + (k - e * per)];
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const unsigned k = k0 + r * BLOCK;
      if (k < all) {
        const unsigned e = ONE ? k : k / per;
        dst[(long long)e * stride + (k - e * per)] = v[r];
      }
    }
  }
}

// One field's selected rows of a span: whole rows as one run of units (gather_units), or, where
// a span's units would pass 2^32 (rows of over 2^16 units), unit after unit.
template <class U, int BLOCK, int R, bool ONE>
__device__ __forceinline__ void gather_field(const FieldCopy& f, const unsigned short* list,
                                             unsigned total, long long row0,
                                             unsigned long long base) {
  if (ONE || (unsigned long long)total * (unsigned long long)f.stride <= 0xffffffffull) {
    gather_units<U, BLOCK, R, ONE>(f, 0, ONE ? 1u : unsigned(f.stride), list, total, row0, base);
  } else {
    for (long long c = 0; c < f.stride; ++c)
      gather_units<U, BLOCK, R, ONE>(f, c, 1u, list, total, row0, base);
  }
}

}  // namespace dcx

// Pass 4, list form. Block x takes the sparse span lists[nspans + x] (blocks past the list
// exit; a span is BLOCK * WORDS * 32 rows, a whole number of flags tiles, so its output
// starts at its first tile's prefix): every thread reads WORDS ballot words, a block scan of
// their popcounts gives each word's place, the selected rows' offsets in the span go to a
// shared-memory list (2 bytes each), and then every column (and the indices) is copied
// through the list by all the block's threads (gather_field, R units a thread in flight). The
// list is built once for every column, and every thread has rows to copy at every density.
// MIN_BLOCKS: the resident blocks per SM the registers must allow (a sparse span gives a
// thread one or two rows a column, so the loads in flight come from the resident blocks, not
// from R).
template <int BLOCK, int WORDS, int TILE, int MIN_BLOCKS, int R>
__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS)
dcx_rec_gather(long long n, const unsigned* __restrict__ words,
               const unsigned long long* __restrict__ prefixes,
               const unsigned* __restrict__ warp_offsets, const dcx::FieldCopy* fields,
               int nfields, long long* __restrict__ out_idx, long long index_base,
               const unsigned* __restrict__ lists, long long known) {
  constexpr int SPAN = BLOCK * WORDS * 32;
  static_assert(SPAN % TILE == 0 && SPAN <= 65536, "a span is whole tiles, offsets in 16 bits");
  __shared__ unsigned short s_list[SPAN];
  __shared__ unsigned s_warp[BLOCK / 32];
  const long long tiles = (n + TILE - 1) / TILE;
  const long long nspans = (n + SPAN - 1) / SPAN;
  const long long todo = dcx::list_length(prefixes, tiles, 1, known);
  const long long nwords = (n + 31) >> 5;
  const int first = int(threadIdx.x) * WORDS;  // the thread's first word in the span
  if ((long long)blockIdx.x >= todo) return;
  const long long row0 = (long long)lists[nspans + blockIdx.x] * SPAN;
  const long long w0 = (row0 >> 5) + first;
  const unsigned long long base = prefixes[row0 / TILE];
  unsigned w[WORDS];
  unsigned count = 0;
#pragma unroll
  for (int j = 0; j < WORDS; ++j) {
    w[j] = (w0 + j < nwords) ? words[w0 + j] : 0u;
    count += __popc(w[j]);
  }
  unsigned total;  // the span's selected rows
  unsigned at = dcx::block_exclusive_scan<unsigned, BLOCK>(count, s_warp, total);
#pragma unroll
  for (int j = 0; j < WORDS; ++j) {
    const unsigned row = unsigned(first + j) * 32u;
    for (unsigned x = w[j]; x; x &= x - 1u) s_list[at++] = (unsigned short)(row + __ffs(x) - 1);
  }
  __syncthreads();
  if (out_idx != nullptr) {
    for (unsigned k = threadIdx.x; k < total; k += BLOCK)
      out_idx[base + k] = index_base + row0 + s_list[k];
  }
  for (int c = 0; c < nfields; ++c) {
    const dcx::FieldCopy f = fields[c];
    dcx::by_unit(f, [&](auto u, auto one) {
      dcx::gather_field<decltype(u), BLOCK, R, decltype(one)::value>(f, s_list, total, row0,
                                                                    base);
    });
  }
}

namespace dcx {

// One field's rows of the warp segment, all of them, for a stable split: a selected row goes
// to base + (selected rows of the segment before it), another to `rest` + (its row - the
// selected rows before it), where base is the segment's selected offset and rest the total
// selected minus the rows before the segment. Loads batched as in copy_rows.
template <class U, int ITEMS, bool ONE>
__device__ __forceinline__ void split_rows(const FieldCopy& f, const unsigned (&words)[ITEMS],
                                           unsigned long long base, long long rest, long long seg,
                                           long long n, int lane) {
  const long long stride = ONE ? 1 : f.stride;
  const U* __restrict__ src = reinterpret_cast<const U*>(f.src) + (seg + lane) * stride;
  U* __restrict__ dst = reinterpret_cast<U*>(f.dst);
  const unsigned lt = lanemask_lt();
  constexpr int WANT = sizeof(U) >= 16 ? 4 : 8;
  constexpr int GROUP = ITEMS < WANT ? ITEMS : WANT;
  static_assert(ITEMS % GROUP == 0, "ITEMS must be a multiple of 8 (or below it)");
  unsigned before = 0;  // selected rows of the segment before row group g
#pragma unroll
  for (int g = 0; g < ITEMS; g += GROUP) {
    U v[GROUP];
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      if (seg + (long long)(g + j) * 32 + lane < n) v[j] = src[(long long)(g + j) * 32 * stride];
    }
#pragma unroll
    for (int j = 0; j < GROUP; ++j) {
      const long long r = (long long)(g + j) * 32 + lane;  // row in the segment
      const unsigned w = words[g + j];
      const unsigned sel = before + __popc(w & lt);   // selected rows of the segment before r
      if (seg + r < n) {
        const long long at = ((w >> lane) & 1u) ? (long long)(base + sel) : rest + r - sel;
        dst[at * stride] = v[j];
      }
      before += __popc(w);
    }
  }
}

}  // namespace dcx

// Stable split (dask_compact.partition), pass 3 after the records' passes 1 and 2: every row
// of every column (and its global index, blockIdx.y == nfields) written, the selected rows
// first in order, then the others in order. Grid and places as dcx_rec_scatter; a row's place
// is known from the words and the prefixes alone, so no tile waits on another and the input is
// read once here (and once by the predicate in pass 1).
template <int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
dcx_rec_split(long long n, const unsigned* __restrict__ words,
              const unsigned long long* __restrict__ prefixes,
              const unsigned* __restrict__ warp_offsets, const dcx::FieldCopy* fields,
              int nfields, long long* __restrict__ out_idx, long long index_base) {
  constexpr long long TILE = (long long)BLOCK * ITEMS;
  const long long tile = blockIdx.x;
  const int field = int(blockIdx.y);
  const int warp = int(threadIdx.x >> 5), lane = int(dcx::lane_id());
  const long long seg = tile * TILE + (long long)warp * 32 * ITEMS;
  if (seg >= n) return;
  const unsigned long long total = prefixes[(n + TILE - 1) / TILE];
  const unsigned long long base = prefixes[tile] + warp_offsets[tile * (BLOCK / 32) + warp];
  // the segment's first unselected row goes after the total and the seg - base unselected
  // rows before the segment
  const long long rest = (long long)total + seg - (long long)base;
  unsigned w[ITEMS];
#pragma unroll
  for (int j = 0; j < ITEMS; ++j) w[j] = (seg + (long long)j * 32 < n) ? words[(seg >> 5) + j] : 0u;
  if (field == nfields) {
    const unsigned lt = dcx::lanemask_lt();
    unsigned done = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const long long r = (long long)j * 32 + lane;
      const unsigned sel = done + __popc(w[j] & lt);
      if (seg + r < n)
        out_idx[((w[j] >> lane) & 1u) ? (long long)(base + sel) : rest + r - sel] =
            index_base + seg + r;
      done += __popc(w[j]);
    }
    return;
  }
  const dcx::FieldCopy f = fields[field];
  dcx::by_unit(f, [&](auto u, auto one) {
    for (long long c = 0; c < (decltype(one)::value ? 1 : f.stride); ++c)
      dcx::split_rows<decltype(u), ITEMS, decltype(one)::value>(dcx::unit_column(f, c), w, base,
                                                                rest, seg, n, lane);
  });
}
