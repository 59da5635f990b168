"""Small public calls by dtype: each step of a 2^20-2^22 ``compact_array`` (the public call,
``compact_into`` synchronised, the cached ready call, its kernel and wait alone, the output's
allocation) over 16 rotating input buffers (as public_calls.py: no input stays in L2), float32
and float64, p = .05 / .5 / .95, median of 600 calls with the 10th and 90th percentiles, and
cupyx.profiler.benchmark's CPU and GPU times of three of them.

Written for the question of 2026-12-05: a 2^20 float64 call measured 53-75 us at 9423dc1
against 34-38 us for float32 (one H100 run). Results:
benchmarks/results/2026-12-05_h100_1d5b40d_small_calls_float64.md.

    python benchmarks/small_calls_by_dtype.py
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import cupy
import numpy as np

from dask_compact import compact_array, compact_into
from dask_compact.backends import cupy_calls as ck
from dask_compact.backends.cupy_device import NO_CAP, output_empty
from dask_compact.backends.cupy_ready import speculated
from dask_compact.predicate import as_predicate

sys.path.insert(0, str(Path(__file__).parent))
from public_calls import timed_us  # noqa: E402 -- the public benchmark's loop

NBUF = 16


def rotating_us(fn, reps: int = 600) -> tuple[float, float, float]:
    """Median, 10th and 90th percentile microseconds of ``fn(k)`` over the buffers, each call
    followed by a device synchronisation (public_calls.timed_us)."""
    times = timed_us(fn, NBUF, reps)
    return (float(np.median(times)), float(np.percentile(times, 10)),
            float(np.percentile(times, 90)))


def steps(bufs: list, dt: np.dtype, p: float) -> dict:
    n = bufs[0].size
    pred = lambda v: v < p  # noqa: E731 -- one object, as a user's loop holds
    compact_array(bufs[0], pred)
    compact_array(bufs[1], pred)  # the second call speculates from the first's fraction
    call = ck.one_read_call(bufs[0], as_predicate(pred), "values", "single-pass")
    out = cupy.empty(n, dtype=dt)
    cnt = cupy.zeros(1, dtype=np.int64)
    cap = speculated(p, n)
    capbuf = cupy.empty(cap, dtype=dt)
    return {
        "compact_array": lambda k: compact_array(bufs[k], pred),
        "compact_into+sync": lambda k: compact_into(bufs[k], pred, out, count=cnt),
        "ready call": lambda k: call(bufs[k], 0),
        "ready _run cap (prealloc)": lambda k: call._run(bufs[k], 0, capbuf, None, cap),
        "ready _run NO_CAP into n-buf": lambda k: call._run(bufs[k], 0, out, None, NO_CAP),
        "output_empty(cap)": lambda k: output_empty(cap, dt),
        "cupy.empty(cap)": lambda k: cupy.empty(cap, dtype=dt),
    }


def main() -> None:
    from cupyx.profiler import benchmark

    for log2n in (20, 21, 22):
        for dt in (np.dtype(np.float32), np.dtype(np.float64)):
            rng = cupy.random.default_rng(3)
            bufs = [rng.random(1 << log2n, dtype=np.float64).astype(dt) for _ in range(NBUF)]
            for p in (0.05, 0.5, 0.95):
                rows = steps(bufs, dt, p)
                for name, fn in rows.items():
                    med, lo, hi = rotating_us(fn)
                    print(f"2^{log2n} {dt.name} p={p} {name:32s} {med:7.1f} us "
                          f"(p10 {lo:.1f} p90 {hi:.1f})", flush=True)
                for name in ("compact_array", "compact_into+sync", "ready _run cap (prealloc)"):
                    fn, k = rows[name], itertools.count()
                    r = benchmark(lambda fn=fn, k=k: fn(next(k) % NBUF), n_repeat=400,
                                  n_warmup=20)
                    print(f"   cupyx {name}: cpu {np.median(r.cpu_times) * 1e6:.1f} "
                          f"gpu {np.median(r.gpu_times[0]) * 1e6:.1f} us", flush=True)
            del bufs


if __name__ == "__main__":
    main()
