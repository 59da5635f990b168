// Tile prefixes between the blocks of one launch: decoupled look-back (single pass, order kept)
// and one atomic per tile (the paper's hybrid, order between tiles not kept).
//
// Status word of a tile, 64 bits, written and read whole (so no fence orders flag and value):
//   bits 63..62  0 = nothing yet, 1 = AGGREGATE (the tile's own count), 2 = INCLUSIVE (count of
//                all tiles up to and including this one)
//   bits 61..0   the count (chunks beyond 2^31 elements need the 64-bit width)
// The launch layer zeroes the status array before a launch, or a count kernel fills it with
// AGGREGATE words first (the exact-size path): then no look-back ever waits.
#pragma once
#include "compact_warp.cuh"

namespace dcx {

constexpr unsigned long long STATUS_AGG = 1ull << 62;
constexpr unsigned long long STATUS_INC = 2ull << 62;
constexpr unsigned long long STATUS_VALUE = (1ull << 62) - 1ull;

__device__ __forceinline__ void status_store(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long status_load(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Decoupled look-back (Merrill & Garland): a tile publishes its aggregate as soon as it has
// counted, then warp 0 walks back over its predecessors, 32 at a time (one per lane), adding
// aggregates until it meets an inclusive prefix. Blocks start in blockIdx order, so every
// predecessor a tile waits for is resident or finished: no deadlock (CUB relies on the same).
// Its sleeps (template parameters, as the scan's scan_lookback; the defaults are the measured
// kernel, and every entry of the launch layer's table, cupy_tuning.Tuning, keeps them until
// measured: benchmarks/lookback_sleeps_ab.py): POLL > 0: a lane whose predecessor has published nothing
// sleeps POLL ns before reading it again; POLL == 0: it reads again at once. WAIT > 0: the
// warp sleeps WAIT ns before its first read (CUB's delay for the L2 latency of a word just
// published: 1140 ns for sm_90 floats, with polls of 688 ns); WAIT < 0: it sleeps -WAIT ns
// only where its first read found a predecessor that had published nothing (the count-first
// path, whose words are all published before the launch, never sleeps). None of them changes
// which values are added, or in which order.
template <int POLL = 20, int WAIT = 0, bool CHAINED = false>
struct LookbackPrefix {
  static constexpr bool KNOWN = false;
  unsigned long long* status;  // one word per tile
  unsigned long long* d_count;  // the last tile writes the total here
  // CHAINED (dcx_single_pass's VARIANT bit 1, the "chain" role): a chunk of a chained run,
  // whose first tile's exclusive prefix is the word d_start holds (its start in the run's
  // output): every prefix and the total are offset by it. Read by the first tile only, where
  // the prefix was the constant 0. A template parameter, not a null test at run time: with the
  // test in every kernel, ptxas gave 6 of the 168 sm_90 instantiations of dcx_single_pass
  // fewer registers and spills (4-8 bytes), and others up to 16 more registers.
  const unsigned long long* d_start = nullptr;

  // Thread 0 only, before the (slow) staging, so successors can look past us early.
  __device__ __forceinline__ void publish_aggregate(long long tile, unsigned long long agg) const {
    if constexpr (CHAINED) {
      if (tile == 0) {
        status_store(status, STATUS_INC | (*d_start + agg));
        return;
      }
    }
    status_store(status + tile, (tile == 0 ? STATUS_INC : STATUS_AGG) | agg);
  }

  // Whole warp 0. Returns the exclusive prefix of `tile`; publishes its inclusive prefix.
  __device__ __forceinline__ unsigned long long exclusive_prefix(long long tile, long long num_tiles,
                                                                 unsigned long long agg) const {
    const int lane = int(lane_id());
    unsigned long long prefix = 0;
    if (tile == 0) {
      if constexpr (CHAINED) prefix = *d_start;
    } else {
      long long pred = tile - 1;
      if constexpr (WAIT > 0) __nanosleep(WAIT);
      [[maybe_unused]] bool first = true;
      while (true) {
        const long long idx = pred - lane;
        unsigned long long s = idx >= 0 ? status_load(status + idx) : STATUS_INC;
        if constexpr (WAIT < 0) {
          if (first && __any_sync(FULL_MASK, (s >> 62) == 0)) {
            __nanosleep(-WAIT);
            if ((s >> 62) == 0) s = status_load(status + idx);
          }
          first = false;
        }
        // Wait until every predecessor in the window has published at least its aggregate.
        while (__any_sync(FULL_MASK, (s >> 62) == 0)) {
          if ((s >> 62) == 0) {
            if constexpr (POLL > 0) __nanosleep(POLL);
            s = status_load(status + idx);
          }
        }
        const unsigned inc = __ballot_sync(FULL_MASK, (s >> 62) == 2);
        // Lanes up to the nearest inclusive word (lowest lane = nearest tile) contribute.
        const int stop = inc ? __ffs(inc) - 1 : 31;
        prefix += warp_sum_u64(lane <= stop ? (s & STATUS_VALUE) : 0ull);
        if (inc) break;
        pred -= 32;
      }
      if (lane == 0) status_store(status + tile, STATUS_INC | (prefix + agg));
    }
    if (lane == 0 && tile == num_tiles - 1) *d_count = prefix + agg;
    return prefix;
  }
};

// The paper's hybrid: one atomicAdd per tile claims the tile's place in the output. Tiles land
// in the order they finish counting; inside a tile the order is kept. The counter ends as the
// total count.
struct AtomicPrefix {
  static constexpr bool KNOWN = false;
  unsigned long long* d_count;  // zeroed before the launch

  __device__ __forceinline__ void publish_aggregate(long long, unsigned long long) const {}

  __device__ __forceinline__ unsigned long long exclusive_prefix(long long, long long,
                                                                 unsigned long long agg) const {
    unsigned long long p = 0;
    if (lane_id() == 0 && agg) p = atomicAdd(d_count, agg);
    return __shfl_sync(FULL_MASK, p, 0);
  }
};

// Tile prefixes known before the launch (the exact-size path: count kernel -> dcx_tile_scan):
// thread 0 reads the tile's exclusive prefix at the top of its iteration, nobody waits on
// another tile, and tiles land in input order.
struct KnownPrefix {
  static constexpr bool KNOWN = true;
  const unsigned long long* prefixes;  // exclusive prefix of every tile (dcx_tile_scan)

  __device__ __forceinline__ unsigned long long known(long long tile) const { return prefixes[tile]; }
  __device__ __forceinline__ void publish_aggregate(long long, unsigned long long) const {}
  __device__ __forceinline__ unsigned long long exclusive_prefix(long long tile, long long,
                                                                 unsigned long long) const {
    return prefixes[tile];  // not called (KNOWN)
  }
};

}  // namespace dcx
