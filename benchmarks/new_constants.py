"""Small GPU calls whose predicate's constant changes at every call (a threshold chosen per
batch), against the same threshold every call and the naive peers given the new threshold:
``torch.masked_select`` and CuPy's ``a[a < t]``. 2^20 float32 by default; median and 90th
percentile microseconds per call including a device synchronisation, inputs rotated over 8
buffers. Every form is checked against NumPy first.

    python benchmarks/new_constants.py [--log2n 20] [--reps 300]
"""

from __future__ import annotations

import argparse
import time

import cupy
import numpy as np

from dask_compact import compact_array

try:
    import torch
except ImportError:  # the table then has no torch row
    torch = None


_T = 0.5  # the threshold by_global reads (set per call by its row)


def by_global(v):
    """A function of a global threshold and a NumPy ufunc: its values include a module,
    so its shape is found by the slower road (predicate/function_shape.py)."""
    return (v < _T) & ~np.isnan(v)


def with_global(a, t: float):
    global _T
    _T = t
    return compact_array(a, by_global)


def timed(fn, reps: int) -> tuple[float, float]:
    for k in range(20):
        fn(k)
    cupy.cuda.Device().synchronize()
    out = []
    for k in range(reps):
        t = time.perf_counter()
        fn(k)
        cupy.cuda.Device().synchronize()
        out.append(time.perf_counter() - t)
    return float(np.median(out)) * 1e6, float(np.percentile(out, 90)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--log2n", type=int, default=20)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    n = 1 << args.log2n
    rng = cupy.random.default_rng(0)
    bufs = [rng.random(n, dtype=np.float32) for _ in range(8)]
    ts = [float(t) for t in np.random.default_rng(1).uniform(0.3, 0.7, 400)]

    def closure(t: float):
        return lambda v: v < t

    for k in range(5):
        a, t = bufs[k % 8], ts[k]
        h = cupy.asnumpy(a)
        for pred in (f"x < {t!r}", closure(t)):
            np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)), h[h < t])
        np.testing.assert_array_equal(cupy.asnumpy(with_global(a, t)), h[h < t])
    rows = {
        "compact_array string, same threshold": lambda k: compact_array(bufs[k % 8], "x < 0.5"),
        "compact_array string, new threshold each call":
            lambda k: compact_array(bufs[k % 8], f"x < {ts[k % 400]!r}"),
        "compact_array lambda, same threshold":
            lambda k: compact_array(bufs[k % 8], lambda v: v < 0.5),
        "compact_array lambda, new threshold each call":
            lambda k: compact_array(bufs[k % 8], closure(ts[k % 400])),
        "compact_array function of a global, new each call":
            lambda k: with_global(bufs[k % 8], ts[k % 400]),
        "cupy a[a < t], new threshold": lambda k: bufs[k % 8][bufs[k % 8] < ts[k % 400]],
    }
    if torch is not None:
        tb = [torch.as_tensor(b, device="cuda") for b in bufs]
        rows["torch.masked_select, new threshold"] = (
            lambda k: torch.masked_select(tb[k % 8], tb[k % 8] < ts[k % 400]))
    print(f"2^{args.log2n} float32, {args.reps} calls: median / p90 us per call with a sync")
    for name, fn in rows.items():
        med, p90 = timed(fn, args.reps)
        print(f"{name:48s} {med:8.1f} / {p90:8.1f}", flush=True)


if __name__ == "__main__":
    main()
