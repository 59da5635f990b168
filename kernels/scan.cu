// Prefix sums of one array (dask_compact.scan_array, dask_compact.cumsum on CuPy chunks): five
// algorithms, from the textbook to a single pass at copy bandwidth (docs/design.md, Scan).
// Tile and warp logic: scan.cuh. Launch layer and tuning: dask_compact/backends/cupy_scan.py
// and cupy_scan_source.py, which name the instantiations through cupy.RawModule.
//
// Every entry point computes  out[i] = base + sum(in[0..i])  (inclusive) or
// base + sum(in[0..i-1]) (exclusive), in the accumulator type A; `base` is a chunk's global
// offset (the dask path) or 0. Sizes and indices are 64-bit: n may exceed 2^31.
//
//   "lookback"          dcx_scan_lookback: one read and one write, decoupled look-back.
//   "naive"             dcx_scan_hs_step per level (Hillis-Steele, ping-pong buffers), then
//                       dcx_scan_finish_inclusive.
//   "work-efficient"    dcx_scan_pad, dcx_scan_up_all / dcx_scan_down_all per level (a thread per
//                       padded element, only those at the level's stride work), then
//                       dcx_scan_finish_exclusive.
//   "thread-efficient"  the same with dcx_scan_up_active / dcx_scan_down_active: one thread per
//                       node of the level's tree.
//   "shared"            dcx_scan_shared_block (2 * BLOCK elements per block in shared memory,
//                       block sums out), the same on the block sums (recursively), then
//                       dcx_scan_shared_add.
//   (the total)         dcx_scan_total: no scan, the sum of `in` alone (the dask path's chunk
//                       totals of float32 sums), in two launches.
#include "scan.cuh"

// ---- lookback ---------------------------------------------------------------------------------
// One block per tile (tile = blockIdx.x). Status: see dcx::ScanStatus (one word per tile for
// 4-byte A, two for 8-byte A, zeroed). d_total (may be null): the last tile stores base + the
// sum of everything there. MINB: at least that many blocks per SM (__launch_bounds__; 0: no
// bound); EXCLUSIVE and CACHE are template parameters, not arguments: a run-time `exclusive`
// cost the 4-byte tiles 21 registers in one instantiation and not in another (ptxas's
// allocation moves with the select), which put int32 at 189 registers, two blocks per SM
// against float32's three (docs/design.md, Scan). CACHE, POLL, WAIT, SCHED: see dcx::ScanTile
// (the last three named by the launch layer only when a sweep sets them, cupy_scan_source.py).
// O: the output type, A or (after the three, named) a narrower integer that A's sums wrap into:
// np.cumsum(a, dtype=np.int16) summed in uint32 and stored as int16, 4 bytes an element moved
// against 10 for a uint32 scan and a cast.
template <class T, class A, int BLOCK, int ROWS, int VEC, int MINB, bool EXCLUSIVE, int CACHE,
          int POLL = 20, int WAIT = 0, int SCHED = 0, class O = A>
__global__ void __launch_bounds__(BLOCK, MINB)
dcx_scan_lookback(const T* __restrict__ in, O* __restrict__ out, long long n, A base,
                  unsigned long long* words, A* d_total) {
  typedef dcx::ScanTile<T, A, BLOCK, ROWS, VEC, CACHE, POLL, WAIT, SCHED> Tile;
  __shared__ A s_warp[Tile::WARPS];
  __shared__ A s_prefix;
  const dcx::ScanStatus<A> st{words};
  Tile::run(in, out, n, base, EXCLUSIVE, st, d_total, (long long)blockIdx.x, (long long)gridDim.x,
            s_warp, &s_prefix);
}

// ---- naive (Hillis-Steele) ---------------------------------------------------------------------
// One level: dst[i] = src[i] + src[i - d] (i >= d). After the levels d = 1, 2, 4, ... < n the
// buffer holds the inclusive scan (O(n log n) additions).
template <class T, class A>
__global__ void dcx_scan_hs_step(const T* __restrict__ src, A* __restrict__ dst, long long n, long long d) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    A v = dcx::to_acc<A>(src[i]);
    if (i >= d) v = dcx::sadd(v, dcx::to_acc<A>(src[i - d]));
    dst[i] = v;
  }
}

// out from an inclusive scan `incl` (the input itself when n == 1): shifted for exclusive.
template <class T, class A>
__global__ void dcx_scan_finish_inclusive(const T* __restrict__ incl, A* __restrict__ out, long long n,
                                          A base, int exclusive) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    A v = A(-0.0);
    if (!exclusive) {
      v = dcx::to_acc<A>(incl[i]);
    } else if (i > 0) {
      v = dcx::to_acc<A>(incl[i - 1]);
    }
    out[i] = dcx::sadd(base, v);
  }
}

// ---- work-efficient and thread-efficient (Blelloch) ---------------------------------------------
// buf (m = next power of two >= n elements): the input converted, zero-padded.
template <class T, class A>
__global__ void dcx_scan_pad(const T* __restrict__ in, A* __restrict__ buf, long long n, long long m) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m;
       i += (long long)gridDim.x * blockDim.x)
    buf[i] = i < n ? dcx::to_acc<A>(in[i]) : A(-0.0);
}

// One up-sweep level with a thread per element: those at the right end of a 2*stride block add
// the left half's sum (the rest of the threads idle).
template <class A>
__global__ void dcx_scan_up_all(A* buf, long long m, long long stride) {
  const long long mask = 2 * stride - 1;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m;
       i += (long long)gridDim.x * blockDim.x)
    if (((i + 1) & mask) == 0) buf[i] = dcx::sadd(buf[i], buf[i - stride]);
}

// One down-sweep level (after buf[m - 1] = 0): swap-and-add.
template <class A>
__global__ void dcx_scan_down_all(A* buf, long long m, long long stride) {
  const long long mask = 2 * stride - 1;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m;
       i += (long long)gridDim.x * blockDim.x)
    if (((i + 1) & mask) == 0) {
      const A left = buf[i - stride];
      buf[i - stride] = buf[i];
      buf[i] = dcx::sadd(buf[i], left);
    }
}

// The same levels with one thread per active node: `count` = m / (2 * stride) threads.
template <class A>
__global__ void dcx_scan_up_active(A* buf, long long count, long long stride) {
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < count;
       k += (long long)gridDim.x * blockDim.x) {
    const long long i = (k + 1) * 2 * stride - 1;
    buf[i] = dcx::sadd(buf[i], buf[i - stride]);
  }
}

template <class A>
__global__ void dcx_scan_down_active(A* buf, long long count, long long stride) {
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < count;
       k += (long long)gridDim.x * blockDim.x) {
    const long long i = (k + 1) * 2 * stride - 1;
    const A left = buf[i - stride];
    buf[i - stride] = buf[i];
    buf[i] = dcx::sadd(buf[i], left);
  }
}

// out from the exclusive scan `ex` (inclusive: plus the element itself).
template <class T, class A>
__global__ void dcx_scan_finish_exclusive(const T* __restrict__ in, const A* __restrict__ ex,
                                          A* __restrict__ out, long long n, A base, int exclusive) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    A v = ex[i];
    if (!exclusive) v = dcx::sadd(v, dcx::to_acc<A>(in[i]));
    out[i] = dcx::sadd(base, v);
  }
}

// ---- shared ---------------------------------------------------------------------------------------
// Block b scans elements [b * 2 * BLOCK, (b + 1) * 2 * BLOCK) in shared memory (coalesced loads:
// thread t takes elements t and t + BLOCK), writes base + its local prefixes to out and its sum to
// block_sums[b] (if not null). `in` and `out` may be the same array (every block reads its
// tile before any of it is written): the recursion scans the block sums in place.
template <class T, class A, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dcx_scan_shared_block(const T* in, A* out, A* __restrict__ block_sums, long long n, A base, int exclusive) {
  constexpr int TILE = 2 * BLOCK;
  __shared__ A temp[TILE + (TILE >> dcx::SCAN_LOG_BANKS)];
  const long long t0 = (long long)blockIdx.x * TILE;
  const int a = int(threadIdx.x), b = int(threadIdx.x) + BLOCK;
  const A va = t0 + a < n ? dcx::to_acc<A>(in[t0 + a]) : A(-0.0);
  const A vb = t0 + b < n ? dcx::to_acc<A>(in[t0 + b]) : A(-0.0);
  temp[dcx::conflict_free(a)] = va;
  temp[dcx::conflict_free(b)] = vb;
  const A total = dcx::shared_block_exclusive<A, BLOCK>(temp);
  if (block_sums != nullptr && threadIdx.x == 0) block_sums[blockIdx.x] = total;
  A ea = temp[dcx::conflict_free(a)], eb = temp[dcx::conflict_free(b)];
  if (!exclusive) {
    ea = dcx::sadd(ea, va);
    eb = dcx::sadd(eb, vb);
  }
  if (t0 + a < n) out[t0 + a] = dcx::sadd(base, ea);
  if (t0 + b < n) out[t0 + b] = dcx::sadd(base, eb);
}

// data[i] += offsets[i / (2 * BLOCK)]: block b adds the scanned sum of the blocks before it.
template <class A, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dcx_scan_shared_add(A* __restrict__ data, const A* __restrict__ offsets, long long n) {
  constexpr int TILE = 2 * BLOCK;
  const long long t0 = (long long)blockIdx.x * TILE;
  const A off = offsets[blockIdx.x];
  const long long i = t0 + threadIdx.x, j = i + BLOCK;
  if (i < n) data[i] = dcx::sadd(data[i], off);
  if (j < n) data[j] = dcx::sadd(data[j], off);
}

// ---- the total ----------------------------------------------------------------------------------
// partial[blockIdx.x] = the sum of this block's grid-stride share of in[0..n): a second launch
// of one block over the partials gives the sum of everything (the grid depends on n alone, so
// the order of the additions, and a float sum's bits, are the same at every call). Why not
// CuPy's own sum: under its -ftz=true a float32 sum flushes subnormal elements and partial
// sums, and a conversion from float32 flushes them, where sadd and to_acc do not.
template <class T, class A, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
dcx_scan_total(const T* __restrict__ in, A* __restrict__ partial, long long n) {
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "one warp sums the warps' sums");
  __shared__ A warps[BLOCK / 32];
  A v = A(-0.0);
  for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n;
       i += (long long)gridDim.x * BLOCK)
    v = dcx::sadd(v, dcx::to_acc<A>(in[i]));
  v = dcx::warp_reduce(v);
  if (dcx::lane_id() == 0) warps[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < BLOCK / 32 ? warps[threadIdx.x] : A(-0.0);
    v = dcx::warp_reduce(v);
    if (threadIdx.x == 0) partial[blockIdx.x] = v;
  }
}
