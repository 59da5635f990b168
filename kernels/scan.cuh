// Prefix sums (scans) of one array: the tile and warp logic shared by the scan kernels of
// scan.cu (docs/design.md, Scan). Entry points and their launch order are in scan.cu; the
// launch layer is dask_compact/backends/cupy_scan.py.
//
// Types: T is the input's storage type (b8 for NumPy bool, then the integer and float types of
// dcx_types.cuh), A the accumulator and output type (int, long long, unsigned, unsigned long
// long, float, double), chosen by the host as NumPy's cumsum chooses it. Integer sums wrap
// modulo 2^bits as NumPy's do (signed ones are added through their unsigned type, so nothing
// here relies on signed overflow).
#pragma once
#include "lookback.cuh"

namespace dcx {

// NumPy bool as a scan input: one byte, any non-zero byte counts as 1 (as compaction's masks).
struct __align__(1) b8 {
  u8 v;
};

// Input element -> accumulator: NumPy's cast (bool as 0/1, integers widened or wrapped).
// dcx::cast converts float32 <-> float64 by PTX without .ftz: CuPy compiles with -ftz=true,
// under which A(x) flushed float32 subnormals (a float32 scan of them into float64 came back
// all zeros on an H200, 2026-12-01, where NumPy's cumsum keeps them).
template <class A, class T>
struct to_acc_t {
  __device__ __forceinline__ static A f(T x) { return cast<A>(x); }
};
template <class A>
struct to_acc_t<A, b8> {
  __device__ __forceinline__ static A f(b8 x) { return A(x.v != 0); }
};
template <class A, class T>
__device__ __forceinline__ A to_acc(T x) {
  return to_acc_t<A, T>::f(x);
}

// a + b; integers wrap (signed through unsigned: defined behaviour, the same bits).
template <class A>
struct add_t {
  __device__ __forceinline__ static A f(A a, A b) { return a + b; }
};
// float32 sums by PTX without .ftz (dcx_types.cuh): -ftz=true flushed subnormal sums to 0.
template <>
struct add_t<float> {
  __device__ __forceinline__ static float f(float a, float b) { return f32_add(a, b); }
};
template <>
struct add_t<int> {
  __device__ __forceinline__ static int f(int a, int b) { return int(u32(a) + u32(b)); }
};
template <>
struct add_t<long long> {
  __device__ __forceinline__ static long long f(long long a, long long b) {
    return (long long)(u64(a) + u64(b));
  }
};
template <class A>
__device__ __forceinline__ A sadd(A a, A b) {
  return add_t<A>::f(a, b);
}
// The sums' identity is written A(-0.0) throughout (0 for integer A): -0.0 + v is v for every
// float v, where 0.0 + -0.0 is 0.0, so a prefix of -0.0s started from 0.0 came back 0.0 where
// np.cumsum keeps -0.0 (a probe of 2026-12-01; the CPU loop starts at the first element).

// Bits of a 4- or 8-byte accumulator, for the status words.
template <class A>
__device__ __forceinline__ u64 acc_bits(A v) {
  static_assert(sizeof(A) == 4 || sizeof(A) == 8, "4- or 8-byte accumulators");
  if constexpr (sizeof(A) == 4) {
    union {
      A a;
      u32 u;
    } c;
    c.a = v;
    return u64(c.u);
  } else {
    union {
      A a;
      u64 u;
    } c;
    c.a = v;
    return c.u;
  }
}
template <class A>
__device__ __forceinline__ A acc_from_bits(u64 b) {
  if constexpr (sizeof(A) == 4) {
    union {
      A a;
      u32 u;
    } c;
    c.u = u32(b);
    return c.a;
  } else {
    union {
      A a;
      u64 u;
    } c;
    c.u = b;
    return c.a;
  }
}

// Inclusive scan over the warp's lanes (Kogge-Stone, __shfl_up_sync), any accumulator type.
template <class A>
__device__ __forceinline__ A warp_scan_incl(A x) {
  const unsigned lane = lane_id();
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const A o = __shfl_up_sync(FULL_MASK, x, d);
    if (lane >= unsigned(d)) x = sadd(x, o);
  }
  return x;
}

// Sum over the warp (butterfly: every lane adds the same pairs, so every lane gets the same
// bits, floats included).
template <class A>
__device__ __forceinline__ A warp_reduce(A x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = sadd(x, __shfl_xor_sync(FULL_MASK, x, d));
  return x;
}

// A word of BYTES bytes (the raw type of one vector load or store).
template <int BYTES>
struct raw_word;
template <>
struct raw_word<16> {
  typedef uint4 type;
};
template <>
struct raw_word<8> {
  typedef uint2 type;
};
template <>
struct raw_word<4> {
  typedef unsigned type;
};
template <>
struct raw_word<2> {
  typedef unsigned short type;
};
template <>
struct raw_word<1> {
  typedef unsigned char type;
};

// N consecutive elements of T moved as one word (N * sizeof(T) <= 16 bytes).
template <class T, int N>
union Pack {
  typename raw_word<int(N * sizeof(T))>::type raw;
  T v[N];
};

// A sum as the output type O: itself, or the low bits of a 4-byte unsigned A in a narrower
// integer (two's complement, as NumPy's narrow cumsum wraps). Through the bits: a conversion
// to a signed type of a value out of its range is defined only from C++20.
template <class O, class A>
__device__ __forceinline__ O narrowed(A v) {
  if constexpr (is_same<O, A>::value) {
    return v;
  } else {
    static_assert(sizeof(O) < sizeof(A) && A(-1) > A(0),
                  "narrowed: the low bits of an unsigned sum");
    Pack<O, 1> p;
    p.raw = typename raw_word<int(sizeof(O))>::type(v);
    return p.v[0];
  }
}

// ---------------------------------------------------------------------------------------------
// Look-back status of the tiles of one launch (decoupled look-back, Merrill & Garland), for any
// 4- or 8-byte accumulator. Flag: 0 nothing yet, 1 AGGREGATE (the tile's own sum), 2 INCLUSIVE
// (the sum of every tile up to and including it, plus the launch's base).
//
// 4-byte A: one 64-bit word per tile, flag in the high half and the value's bits in the low
//   half, written and read whole (st/ld.relaxed.gpu.u64, lookback.cuh): no fence orders them.
// 8-byte A: two 64-bit words per tile (16 bytes, 16-byte aligned): the value's bits, then the
//   flag (high half) with a check of the value (low half), written and read by one 16-byte
//   access each (st/ld.relaxed.gpu.v2.u64): one load per predecessor, as CUB's 16-byte tile
//   descriptors. Until 2026-11-26 a flag word and two value slots per tile, the flag stored
//   with st.release after the value and loaded with ld.acquire before it: two dependent loads
//   per predecessor (int32 -> int64 at 2^28: 0.81x CUB). PTX does not promise that a vector
//   access is one access, so a reader checks that the value matches its flag word's check and
//   otherwise reads the tile as not yet published (a mixed read is retried, never summed).
// The launch layer zeroes the words before each launch.
constexpr unsigned SCAN_NONE = 0u, SCAN_AGG = 1u, SCAN_INC = 2u;

__device__ __forceinline__ void status_store2(unsigned long long* p, unsigned long long a,
                                              unsigned long long b) {
  asm volatile("st.relaxed.gpu.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b)
               : "memory");
}
__device__ __forceinline__ void status_load2(const unsigned long long* p, unsigned long long& a,
                                             unsigned long long& b) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(p)
               : "memory");
}
// The check a wide status word carries of its value (any mix of two writes of different values
// fails it but for a 2^-32 chance).
__device__ __forceinline__ u32 status_check(u64 bits) {
  return u32(bits) ^ u32(bits >> 32) ^ 0x9e3779b9u;
}

template <class A>
struct ScanStatus {
  static constexpr bool WIDE = sizeof(A) == 8;
  unsigned long long* words;  // one per tile (4-byte A), two per tile (8-byte A)

  __device__ __forceinline__ void publish(long long tile, unsigned flag, A v) const {
    const u64 bits = acc_bits(v);
    if constexpr (WIDE) {
      status_store2(words + 2 * tile, bits, (u64(flag) << 32) | status_check(bits));
    } else {
      status_store(words + tile, (u64(flag) << 32) | bits);
    }
  }

  // The tile's flag; its value in v when the flag is not SCAN_NONE.
  __device__ __forceinline__ unsigned read(long long tile, A& v) const {
    if constexpr (WIDE) {
      u64 bits, w;
      status_load2(words + 2 * tile, bits, w);
      const unsigned f = unsigned(w >> 32);
      if (f == SCAN_NONE || u32(w) != status_check(bits)) return SCAN_NONE;
      v = acc_from_bits<A>(bits);
      return f;
    } else {
      const u64 w = status_load(words + tile);
      v = acc_from_bits<A>(w);
      return unsigned(w >> 32);
    }
  }
};

// Whole warp: the exclusive prefix of `tile` (> 0), including the launch's base (tile 0 folds
// it into its inclusive word). Lane l looks at predecessor tile - 1 - l, 32 at a time, waits
// until all 32 have published something, and adds the values up to the nearest INCLUSIVE
// word. Tiles are blockIdx.x, and blocks start in blockIdx order, so every predecessor a tile
// waits for is running or done: no deadlock (CUB relies on the same).
// Polling (template parameters for benchmarks/scan_tuning.py; the defaults are the measured
// kernel): POLL > 0: a lane whose predecessor has published nothing sleeps POLL ns before
// reading it again; POLL == 0: it reads again at once; POLL < 0: the whole warp sleeps,
// from -POLL ns doubling up to 1024 ns (an exponential back-off). WAIT > 0: the warp sleeps
// WAIT ns before its first read (CUB's "L2 write latency" delay, 1140 ns for float on sm_90).
// None of them changes which values are added, or in which order.
template <class A, int POLL = 20, int WAIT = 0>
__device__ __forceinline__ A scan_lookback(const ScanStatus<A>& st, long long tile) {
  const int lane = int(lane_id());
  A prefix = A(-0.0);
  long long pred = tile - 1;
  if constexpr (WAIT > 0) __nanosleep(WAIT);
  [[maybe_unused]] unsigned backoff = POLL < 0 ? unsigned(-POLL) : 0u;
  while (true) {
    const long long idx = pred - lane;
    A v = A(-0.0);
    unsigned f = idx >= 0 ? st.read(idx, v) : SCAN_INC;
    while (__any_sync(FULL_MASK, f == SCAN_NONE)) {
      if constexpr (POLL < 0) {
        __nanosleep(backoff);
        backoff = backoff < 512u ? 2u * backoff : 1024u;
        if (f == SCAN_NONE) f = st.read(idx, v);
      } else if (f == SCAN_NONE) {
        if constexpr (POLL > 0) __nanosleep(POLL);
        f = st.read(idx, v);
      }
    }
    const unsigned incl = __ballot_sync(FULL_MASK, f == SCAN_INC);
    const int stop = incl ? __ffs(incl) - 1 : 31;  // lowest lane = nearest tile
    prefix = sadd(prefix, warp_reduce(lane <= stop ? v : A(-0.0)));
    if (incl) break;
    pred -= 32;
  }
  return prefix;
}

// Loads of a full tile with cache hints that __ldg and __ldcs do not give (CACHE bits 2 and 3
// of ScanTile, for benchmarks/scan_tuning.py): read-only path without L1 allocation
// (ld.global.nc.L1::no_allocate) and/or the 256-byte L2 prefetch size; with bit 0 (.cs) only
// the prefetch size applies. 4-, 8- and 16-byte words; narrower ones keep __ldg / __ldcs.
#define DCX_SCAN_HINTED_LOAD(NAME, Q)                                                        \
  __device__ __forceinline__ uint4 NAME(const uint4* p) {                                    \
    uint4 v;                                                                                 \
    asm("ld.global" Q ".v4.u32 {%0, %1, %2, %3}, [%4];"                                     \
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));                              \
    return v;                                                                                \
  }                                                                                          \
  __device__ __forceinline__ uint2 NAME(const uint2* p) {                                    \
    uint2 v;                                                                                 \
    asm("ld.global" Q ".v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));           \
    return v;                                                                                \
  }                                                                                          \
  __device__ __forceinline__ unsigned NAME(const unsigned* p) {                              \
    unsigned v;                                                                              \
    asm("ld.global" Q ".u32 %0, [%1];" : "=r"(v) : "l"(p));                                 \
    return v;                                                                                \
  }
DCX_SCAN_HINTED_LOAD(ld_nc_na, ".nc.L1::no_allocate")
DCX_SCAN_HINTED_LOAD(ld_nc_256, ".nc.L2::256B")
DCX_SCAN_HINTED_LOAD(ld_nc_na_256, ".nc.L1::no_allocate.L2::256B")
DCX_SCAN_HINTED_LOAD(ld_cs_256, ".cs.L2::256B")
#undef DCX_SCAN_HINTED_LOAD

template <int CACHE, class R>
__device__ __forceinline__ R tile_load(const R* p) {
  if constexpr ((CACHE & 12) != 0 && sizeof(R) >= 4) {
    if constexpr ((CACHE & 1) != 0) {
      return ld_cs_256(p);  // bit 3 (bit 2 is for the read-only path)
    } else if constexpr ((CACHE & 12) == 12) {
      return ld_nc_na_256(p);
    } else if constexpr ((CACHE & 4) != 0) {
      return ld_nc_na(p);
    } else {
      return ld_nc_256(p);
    }
  } else if constexpr ((CACHE & 1) != 0) {
    return __ldcs(p);
  } else {
    return __ldg(p);
  }
}

// ---------------------------------------------------------------------------------------------
// One tile of the single-pass scan: BLOCK threads, each warp owning a segment of ROWS rows of
// 32 * VEC consecutive elements. Lane l holds elements  row * 32 * VEC + l * VEC + j  (j < VEC)
// of its warp's segment: every load and store instruction of the warp covers 32 * VEC
// consecutive elements, as one vector per lane (VEC * sizeof(A) = 16 bytes where aligned), so
// memory is read and written fully coalesced with no shared-memory transpose. The scan inside
// a row is the lane's own VEC elements in order, then a warp scan of the lanes' sums; rows are
// chained by a warp-uniform carry. Then one block-wide pass over the warp totals, the
// look-back for the tile's prefix, and the stores.
// CACHE (full tiles' vector accesses): bit 0 loads with ld.global.cs (evict first) instead of
// the read-only path (ld.global.nc), bit 1 stores with st.global.cs: each byte is touched once,
// so neither needs to stay in L1 or L2 (measured per accumulator size, cupy_scan_source.TABLE).
// Bits 2 and 3 (sweeps only, see tile_load): L1::no_allocate on the read-only loads, and the
// L2::256B prefetch size. POLL and WAIT: the look-back's polling (scan_lookback). SCHED
// (sweeps only): 0 warp 0 publishes the aggregate and looks back after the block's barrier;
// 1 warp 0 looks back as soon as its own rows are scanned, while the other warps scan theirs,
// and warp 1 publishes the aggregate (named barriers: run_early). The same additions in the
// same order either way.
template <class T, class A, int BLOCK, int ROWS, int VEC, int CACHE = 0, int POLL = 20,
          int WAIT = 0, int SCHED = 0>
struct ScanTile {
  static constexpr int WARPS = BLOCK / 32;
  static constexpr int SEG = ROWS * 32 * VEC;  // elements per warp
  static constexpr long long TILE = (long long)SEG * WARPS;
  static_assert(BLOCK % 32 == 0 && BLOCK <= 1024, "BLOCK: whole warps");
  static_assert(VEC * sizeof(A) <= 16 && VEC * sizeof(T) <= 16, "one vector per lane and row");

  // Load the lane's elements (vector loads on a full, aligned tile; else guarded, 0 past n).
  __device__ __forceinline__ static void load(const T* __restrict__ in, long long seg, long long n,
                                              bool full, A (&x)[ROWS][VEC]) {
    const int lane = int(lane_id());
    if (full) {
      typedef typename raw_word<int(VEC * sizeof(T))>::type raw_t;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        Pack<T, VEC> p;
        const raw_t* src = reinterpret_cast<const raw_t*>(in + seg + (long long)(r * 32 + lane) * VEC);
        p.raw = tile_load<CACHE>(src);
#pragma unroll
        for (int j = 0; j < VEC; ++j) x[r][j] = to_acc<A>(p.v[j]);
      }
    } else {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const long long i = seg + (long long)(r * 32 + lane) * VEC + j;
          x[r][j] = i < n ? to_acc<A>(in[i]) : A(-0.0);
        }
    }
  }

  // In place: x becomes each element's prefix inside the warp's segment (exclusive or
  // inclusive). Returns the segment's sum (the same in every lane).
  __device__ __forceinline__ static A warp_prefixes(A (&x)[ROWS][VEC], bool exclusive) {
    const int lane = int(lane_id());
    A run = A(-0.0);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      A s = A(-0.0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A t = sadd(s, x[r][j]);
        x[r][j] = exclusive ? s : t;
        s = t;
      }
      const A incl = warp_scan_incl(s);
      A before = __shfl_up_sync(FULL_MASK, incl, 1);
      if (lane == 0) before = A(-0.0);
      const A off = sadd(run, before);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x[r][j] = sadd(off, x[r][j]);
      run = sadd(run, __shfl_sync(FULL_MASK, incl, 31));
    }
    return run;
  }

  // O: the output type, A itself or a narrower integer (the sums' low bits: scan.py's narrow
  // dtypes, summed in a 4-byte A, stored without a second pass over an A-wide copy).
  template <class O>
  __device__ __forceinline__ static void store(O* __restrict__ out, long long seg, long long n,
                                               bool full, A add, const A (&x)[ROWS][VEC]) {
    const int lane = int(lane_id());
    if (full) {
      typedef typename raw_word<int(VEC * sizeof(O))>::type raw_t;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        Pack<O, VEC> p;
#pragma unroll
        for (int j = 0; j < VEC; ++j) p.v[j] = narrowed<O>(sadd(add, x[r][j]));
        raw_t* dst = reinterpret_cast<raw_t*>(out + seg + (long long)(r * 32 + lane) * VEC);
        if constexpr ((CACHE & 2) != 0) {
          __stcs(dst, p.raw);
        } else {
          *dst = p.raw;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const long long i = seg + (long long)(r * 32 + lane) * VEC + j;
          if (i < n) out[i] = narrowed<O>(sadd(add, x[r][j]));
        }
    }
  }

  // From the warp totals in shared memory: the sum of those before `warp` (its offset in the
  // tile) and of all (the tile's aggregate), added in warp order (both schedules, SCHED).
  __device__ __forceinline__ static void warp_totals(const A* s_warp, int warp, A& woff, A& agg) {
    woff = A(-0.0);
    agg = A(-0.0);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const A c = s_warp[w];
      if (w < warp) woff = sadd(woff, c);
      agg = sadd(agg, c);
    }
  }

  // The whole tile `tile` (blockIdx.x): every thread of the block calls it once.
  template <class O>
  __device__ __forceinline__ static void run(const T* __restrict__ in, O* __restrict__ out,
                                             long long n, A base, bool exclusive,
                                             const ScanStatus<A>& st, A* d_total, long long tile,
                                             long long num_tiles, A* s_warp, A* s_prefix) {
    const int lane = int(lane_id());
    const int warp = int(threadIdx.x >> 5);
    const long long seg = tile * TILE + (long long)warp * SEG;
    const bool full = tile * TILE + TILE <= n;  // the same for the whole block
    A x[ROWS][VEC];
    load(in, seg, n, full, x);
    const A wsum = warp_prefixes(x, exclusive);
    if (lane == 0) s_warp[warp] = wsum;
    if constexpr (SCHED == 1 && WARPS >= 2) {
      run_early(out, seg, n, full, base, st, d_total, tile, num_tiles, s_warp, s_prefix, x);
      return;
    }
    __syncthreads();
    A woff, agg;
    warp_totals(s_warp, warp, woff, agg);
    if (warp == 0) {
      A prefix = base;
      if (tile == 0) {
        if (lane == 0) st.publish(0, SCAN_INC, sadd(base, agg));
      } else {
        if (lane == 0) st.publish(tile, SCAN_AGG, agg);
        prefix = scan_lookback<A, POLL, WAIT>(st, tile);
        if (lane == 0) st.publish(tile, SCAN_INC, sadd(prefix, agg));
      }
      if (lane == 0) {
        *s_prefix = prefix;
        if (d_total != nullptr && tile == num_tiles - 1) *d_total = sadd(prefix, agg);
      }
    }
    __syncthreads();
    store(out, seg, n, full, sadd(*s_prefix, woff), x);
  }

  // SCHED 1: warp 0 does not wait for the other warps' totals before it looks back. Named
  // barriers (PTX bar.arrive / bar.sync, the producer-consumer form): 1, every thread: warp 0
  // arrives, the others wait for all the warp totals; warp 1 then adds them up (the order of
  // the SCHED 0 loop), publishes the aggregate (tile 0: its inclusive prefix) and hands it to
  // warp 0 through barrier 2 (warps 0 and 1); warp 0, its look-back done, waits there,
  // publishes the inclusive prefix; barrier 0 (__syncthreads) before the stores. A tile's
  // aggregate never waits on its own look-back, so no tile waits on a later one.
  template <class O>
  __device__ __forceinline__ static void run_early(O* __restrict__ out, long long seg, long long n,
                                                   bool full, A base, const ScanStatus<A>& st,
                                                   A* d_total, long long tile, long long num_tiles,
                                                   A* s_warp, A* s_prefix, const A (&x)[ROWS][VEC]) {
    const int lane = int(lane_id());
    const int warp = int(threadIdx.x >> 5);
    __shared__ A s_agg;
    A woff = A(-0.0);
    if (warp == 0) {
      asm volatile("bar.arrive 1, %0;" ::"n"(BLOCK) : "memory");
      const A prefix = tile == 0 ? base : scan_lookback<A, POLL, WAIT>(st, tile);
      asm volatile("bar.sync 2, 64;" ::: "memory");
      const A agg = s_agg;
      if (lane == 0) {
        if (tile > 0) st.publish(tile, SCAN_INC, sadd(prefix, agg));
        *s_prefix = prefix;
        if (d_total != nullptr && tile == num_tiles - 1) *d_total = sadd(prefix, agg);
      }
    } else {
      asm volatile("bar.sync 1, %0;" ::"n"(BLOCK) : "memory");
      A agg;
      warp_totals(s_warp, warp, woff, agg);
      if (warp == 1) {
        if (lane == 0) {
          if (tile == 0) {
            st.publish(0, SCAN_INC, sadd(base, agg));
          } else {
            st.publish(tile, SCAN_AGG, agg);
          }
          s_agg = agg;
        }
        asm volatile("bar.arrive 2, 64;" ::: "memory");
      }
    }
    __syncthreads();
    store(out, seg, n, full, sadd(*s_prefix, woff), x);
  }
};

// ---------------------------------------------------------------------------------------------
// The textbook block scan of GPU Gems 3, ch. 39 (Harris, Sengupta, Owens): BLOCK threads scan
// 2 * BLOCK elements in shared memory with Blelloch's up-sweep and down-sweep, each index
// padded by one word per 32 (CONFLICT_FREE_OFFSET) so the strided tree accesses of one warp
// fall into different banks.
constexpr int SCAN_LOG_BANKS = 5;
__device__ __forceinline__ int conflict_free(int i) { return i + (i >> SCAN_LOG_BANKS); }

template <class A, int BLOCK>
__device__ __forceinline__ A shared_block_exclusive(A* temp) {
  constexpr int TILE = 2 * BLOCK;
  const int t = int(threadIdx.x);
  int offset = 1;
#pragma unroll 1
  for (int d = TILE >> 1; d > 0; d >>= 1) {  // up-sweep (reduce)
    __syncthreads();
    if (t < d) {
      const int ai = conflict_free(offset * (2 * t + 1) - 1);
      const int bi = conflict_free(offset * (2 * t + 2) - 1);
      temp[bi] = sadd(temp[bi], temp[ai]);
    }
    offset <<= 1;
  }
  __syncthreads();
  const A total = temp[conflict_free(TILE - 1)];
  __syncthreads();  // every thread has read the total before thread 0 clears it
  if (t == 0) temp[conflict_free(TILE - 1)] = A(-0.0);
#pragma unroll 1
  for (int d = 1; d < TILE; d <<= 1) {  // down-sweep
    offset >>= 1;
    __syncthreads();
    if (t < d) {
      const int ai = conflict_free(offset * (2 * t + 1) - 1);
      const int bi = conflict_free(offset * (2 * t + 2) - 1);
      const A u = temp[ai];
      temp[ai] = temp[bi];
      temp[bi] = sadd(temp[bi], u);
    }
  }
  __syncthreads();
  return total;
}

}  // namespace dcx
