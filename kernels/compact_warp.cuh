// Warp level of the multi-level ballot/popc compaction (Bakunas-Milanowski et al.).
//
// A warp owns a *segment* of 32 * ITEMS consecutive elements (ITEMS = 32 gives the paper's
// 1024-element group). It reads it with 16-byte vector loads in a warp-striped arrangement:
// vector v of lane l holds elements  v*32*VEC + l*VEC + j,  j < VEC  (VEC = 16 / sizeof(T)), so
// every load instruction of the warp covers 512 consecutive bytes (fully coalesced). The
// predicate of each element becomes one bit of the lane's `bits` word (bit v*VEC + j).
//
// The 32 elements {v*32*VEC + l*VEC + j : l < 32} of one (v, j) pair are a *subgroup*: one
// __ballot_sync gives its 32-bit mask, __popc its count, __popc(mask & lanemask_lt) the number
// of selected elements of lower lanes. Element order (v, then l, then j) is the input order, so
// these counts give every element its exact rank inside the segment.
#pragma once
#include "dcx_types.cuh"

namespace dcx {

constexpr unsigned FULL_MASK = 0xffffffffu;

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }
__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned r;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(r));
  return r;
}

// Elements per 16-byte vector.
template <class T>
struct vec_traits {
  static constexpr int VEC = sizeof(T) >= 16 ? 1 : int(16 / sizeof(T));
};

// One 16-byte vector of T, viewable as raw words (for the load) or as VEC elements.
template <class T>
union Vec {
  uint4 raw;
  T v[vec_traits<T>::VEC];
};

// Streaming 16-byte load through the non-coherent path without L1 allocation: every input
// byte is read exactly once, so caching it in L1 only evicts the staging data of other tiles.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// VEC mask bytes (the flags of one vector of T) in one load of VEC bytes.
template <int BYTES>
struct mask_word;
template <>
struct mask_word<16> {
  __device__ static unsigned bits(const bool* p) {
    uint4 w = *reinterpret_cast<const uint4*>(p);
    return bytes4(w.x) | (bytes4(w.y) << 4) | (bytes4(w.z) << 8) | (bytes4(w.w) << 12);
  }
  // bit j = byte j != 0 (NumPy bools are 0 or 1, but any non-zero byte counts as true)
  __device__ static unsigned bytes4(unsigned w) {
    return ((w & 0xffu) != 0) | (((w >> 8) & 0xffu) != 0) << 1 | (((w >> 16) & 0xffu) != 0) << 2 |
           ((w >> 24) != 0) << 3;
  }
};
template <>
struct mask_word<8> {
  __device__ static unsigned bits(const bool* p) {
    uint2 w = *reinterpret_cast<const uint2*>(p);
    return mask_word<16>::bytes4(w.x) | (mask_word<16>::bytes4(w.y) << 4);
  }
};
template <>
struct mask_word<4> {
  __device__ static unsigned bits(const bool* p) {
    return mask_word<16>::bytes4(*reinterpret_cast<const unsigned*>(p));
  }
};
template <>
struct mask_word<2> {
  __device__ static unsigned bits(const bool* p) {
    unsigned short w = *reinterpret_cast<const unsigned short*>(p);
    return ((w & 0xffu) != 0) | ((w >> 8) != 0) << 1;
  }
};
template <>
struct mask_word<1> {
  __device__ static unsigned bits(const bool* p) { return *reinterpret_cast<const u8*>(p) != 0; }
};

// Flags come either from the fused predicate applied to the values (SRC_FUSED) or from a
// separate boolean mask array (SRC_MASK: the mask path, where the predicate ran elsewhere).
constexpr int SRC_FUSED = 0;
constexpr int SRC_MASK = 1;

// The predicate of the mask path: the flag is the mask byte itself (never called on values).
struct MaskPred {
  template <class T>
  __device__ bool operator()(const T&) const { return false; }
};

// Load the lane's NV vectors of the warp segment starting at element `seg` and evaluate the
// flags. `fast` (whole segment in range and 16-byte aligned pointers) selects vector loads;
// otherwise each element is loaded alone behind a bounds check (tails, misaligned views).
// Values are loaded only when LOAD_VALUES (needed for the predicate or for the output).
// The fast path is split in two (issue(), then flags()) so a persistent block can put the next
// tile's loads in flight before it waits on the look-back of the current one.
template <class T, class Pred, int SRC, int ITEMS, bool LOAD_VALUES>
struct WarpLoad {
  static constexpr int VEC = vec_traits<T>::VEC;
  static constexpr int NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0 && ITEMS <= 32, "ITEMS must be a multiple of VEC and <= 32");

  // Fast path, part 1: issue the 16-byte loads (values) and mask loads; nothing waits yet.
  __device__ __forceinline__ static void issue(const T* __restrict__ in, const bool* __restrict__ mask,
                                               long long seg, Vec<T> (&vals)[NV], unsigned (&mbits)[NV]) {
    const long long first = seg + (long long)lane_id() * VEC;
    if (LOAD_VALUES) {
#pragma unroll
      for (int v = 0; v < NV; ++v) vals[v].raw = load_stream16(in + first + (long long)v * 32 * VEC);
    }
    if (SRC == SRC_MASK) {
#pragma unroll
      for (int v = 0; v < NV; ++v) mbits[v] = mask_word<VEC>::bits(mask + first + (long long)v * 32 * VEC);
    }
  }

  // Fast path, part 2: the flag word from what issue() loaded.
  __device__ __forceinline__ static unsigned flags(const Pred& pred, const Vec<T> (&vals)[NV],
                                                   const unsigned (&mbits)[NV]) {
    unsigned bits = 0;
    if (SRC == SRC_MASK) {
#pragma unroll
      for (int v = 0; v < NV; ++v) bits |= mbits[v] << (v * VEC);
    } else {
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int j = 0; j < VEC; ++j) bits |= unsigned(pred(vals[v].v[j])) << (v * VEC + j);
    }
    return bits;
  }

  // Element-wise path (tails, misaligned views): load and evaluate behind bounds checks.
  __device__ __forceinline__ static unsigned guarded(const T* __restrict__ in, const bool* __restrict__ mask,
                                                     long long seg, long long n, const Pred& pred,
                                                     Vec<T> (&vals)[NV]) {
    const int lane = int(lane_id());
    unsigned bits = 0;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const long long i = seg + (long long)v * 32 * VEC + (long long)lane * VEC + j;
        bool f = false;
        if (i < n) {
          if (LOAD_VALUES) vals[v].v[j] = in[i];
          f = (SRC == SRC_MASK) ? (*reinterpret_cast<const u8*>(mask + i) != 0) : pred(vals[v].v[j]);
        }
        bits |= unsigned(f) << (v * VEC + j);
      }
    }
    return bits;
  }

  __device__ __forceinline__ static unsigned run(const T* __restrict__ in,
                                                 const bool* __restrict__ mask, long long seg,
                                                 long long n, bool fast, const Pred& pred,
                                                 Vec<T> (&vals)[NV]) {
    if (fast) {
      unsigned mbits[NV];
      issue(in, mask, seg, vals, mbits);
      return flags(pred, vals, mbits);
    }
    return guarded(in, mask, seg, n, pred, vals);
  }
};

// Inclusive scan over the warp's lanes (Kogge-Stone with __shfl_up_sync), for any integer type.
template <class U>
__device__ __forceinline__ U warp_inclusive_scan(U x) {
  const unsigned lane = lane_id();
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const U o = __shfl_up_sync(FULL_MASK, x, d);
    if (lane >= unsigned(d)) x += o;
  }
  return x;
}

// Exclusive rank, inside the warp's segment, of the first element of each of the lane's
// vectors (base[v]), and the segment's count. The in-lane rank of element (v, j) is then
// base[v] + popc(bits of vector v below j).
//
// Small VEC (4-byte and wider types): the paper's form, one ballot per 32-element subgroup.
// Large VEC (1- and 2-byte types, 8 or 16 elements per vector): VEC ballots per vector would
// cost more instructions than the memory time of the bytes they cover, so the lane counts its
// own VEC bits with one popc and the warp scans those counts with __shfl_up_sync instead
// (the paper's second level); two vectors' counts travel packed in one 32-bit word.
template <int VEC, int NV>
__device__ __forceinline__ unsigned warp_ranks(unsigned bits, unsigned (&base)[NV]) {
  constexpr unsigned VMASK = VEC >= 32 ? 0xffffffffu : ((1u << VEC) - 1u);
  unsigned run = 0;
  if constexpr (VEC <= 4) {
    const unsigned lt = lanemask_lt();
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      unsigned pre = 0, tot = 0;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const unsigned b = __ballot_sync(FULL_MASK, (bits >> (v * VEC + j)) & 1u);
        pre += __popc(b & lt);
        tot += __popc(b);
      }
      base[v] = run + pre;
      run += tot;
    }
  } else {
#pragma unroll
    for (int v = 0; v < NV; v += 2) {
      // counts of vectors v (low half) and v+1 (high half); a warp total is <= 32*16 = 512
      unsigned c = __popc((bits >> (v * VEC)) & VMASK);
      if (v + 1 < NV) c |= unsigned(__popc((bits >> ((v + 1) * VEC)) & VMASK)) << 16;
      const unsigned inc = warp_inclusive_scan(c);
      const unsigned tot = __shfl_sync(FULL_MASK, inc, 31);
      const unsigned exc = inc - c;
      base[v] = run + (exc & 0xffffu);
      run += tot & 0xffffu;
      if (v + 1 < NV) {
        base[v + 1] = run + (exc >> 16);
        run += tot >> 16;
      }
    }
  }
  return run;
}

// Sum over the warp (64-bit), result in every lane.
__device__ __forceinline__ unsigned long long warp_sum_u64(unsigned long long x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(FULL_MASK, x, d);
  return x;
}
__device__ __forceinline__ unsigned warp_sum_u32(unsigned x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(FULL_MASK, x, d);
  return x;
}

}  // namespace dcx
