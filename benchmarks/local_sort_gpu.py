"""Local GPU sort: the public ``dask_compact.sort`` of a one-chunk CuPy dask array (the
threaded scheduler; one chunk: the chunk's local sort, run in the caller's thread) with
``local="auto"`` (CuPy's sort per chunk) and ``local="radix"`` (the seed's LSD radix sort by
one stable split per key bit), beside ``cupy.sort`` and ``torch.sort`` of the same data in the
same process. ``sort(x)`` returns the sorted dask array held in memory, as ``cupy.sort(a)``
returns the sorted device array; ``sort(x).compute()`` adds dask's ``compute()`` (whose
finalize copies a one-chunk CuPy result, a cost of any dask array's ``compute()``: the
``x.compute()`` column). Extra, labelled column: ``split_radix.radix_order`` alone (the radix
argsort without Dask). Uniform float32 in [0, 1), host wall time of each call with a device
sync, median of --reps after one warm-up; every result checked against ``cupy.sort`` once.

    python benchmarks/local_sort_gpu.py [--log2n 20,24,28] [--reps 40] [--out DIR] [--sha SHA]

Prints a table (ms, peer time / ours) and writes it as ``local-sort-DATE-DEVICE-SHA.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import time
from pathlib import Path

import numpy as np


def timed(fn, reps: int) -> float:
    """Median host ms of ``fn()`` followed by a device sync, after one warm-up call."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e3


def main() -> None:
    import cupy
    import dask
    import dask.array as da

    import dask_compact
    from dask_compact.backends.split_radix import order_key, radix_order

    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", default="20,24,28")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sha", default=None)
    args = ap.parse_args()
    try:
        import torch
    except Exception:  # torch is an optional peer
        torch = None
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    sha = args.sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "nosha"
    lines = [f"# Local GPU sort, {dt.date.today()}, {device}, git {sha}", "",
             "float32 uniform in [0, 1); host ms per call with a device sync (median of "
             f"{args.reps} after a warm-up, of {max(3, args.reps // 8)} for the radix); ratio = "
             "peer time / ours. `dask_compact.sort` runs "
             "on a one-chunk CuPy dask array under the threaded scheduler: `sort(x)` returns "
             "the sorted array held in memory (as `cupy.sort(a)` returns it on the device), "
             "`sort(x).compute()` adds dask's `compute()` of it.", "",
             "Beside them: the same sort in plain Dask (`x.map_blocks(cupy.sort).persist()`), "
             "and `x.compute()` of the unsorted one-chunk array (what a `compute()` costs "
             "there: dask's finalize copies the chunk).", "",
             "| n | sort(x) | sort(x).compute() | sort(x, local='radix') | radix_order alone "
             "(internal) | cupy.sort | torch.sort | sort(x) vs cupy.sort | "
             "sort(x).compute() vs cupy.sort | radix vs cupy.sort | "
             "map_blocks(cupy.sort).persist() | x.compute() | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    with dask.config.set(scheduler="threads"):
        for k in (int(s) for s in args.log2n.split(",")):
            n = 1 << k
            a = cupy.random.default_rng(k).random(n, dtype=np.float32)
            x = da.from_array(a, chunks=n, asarray=False)
            want = cupy.sort(a)
            ok = all(bool(cupy.array_equal(got, want)) for got in (
                dask_compact.sort(x).compute(), dask_compact.sort(x, local="radix").compute(),
                a[radix_order(order_key(a, cupy), cupy)]))
            call = timed(lambda: dask_compact.sort(x), args.reps)
            auto = timed(lambda: dask_compact.sort(x).compute(), args.reps)
            slow = max(3, args.reps // 8)  # the radix sort: 30x the others, not a target
            radix = timed(lambda: dask_compact.sort(x, local="radix"), slow)
            inner = timed(lambda: radix_order(order_key(a, cupy), cupy), slow)
            peer = timed(lambda: cupy.sort(a), args.reps)
            tms = float("nan")
            if torch is not None:
                t = torch.as_tensor(a, device="cuda")
                tms = timed(lambda: torch.sort(t), args.reps)
            plain = timed(lambda: x.map_blocks(cupy.sort).persist(), args.reps)
            compute = timed(lambda: x.compute(), args.reps)
            row = (f"| 2^{k} | {call:.2f} | {auto:.2f} | {radix:.2f} | {inner:.2f} | {peer:.2f} | "
                   f"{tms:.2f} | {peer / call:.2f}x | {peer / auto:.2f}x | {peer / radix:.3f}x | "
                   f"{plain:.2f} | {compute:.2f} | {'ok' if ok else 'WRONG'} |")
            print(row, flush=True)
            lines.append(row)
            del a, x, want
            cupy.get_default_memory_pool().free_all_blocks()
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"local-sort-{dt.date.today()}-{device.replace(' ', '_')}-{sha}.md").write_text(
            text + "\n")


if __name__ == "__main__":
    main()
