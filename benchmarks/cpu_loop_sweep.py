"""The CPU compaction loop's two store forms: below which running mean of selected rows per
block of 64 a block visits only its set bits rather than storing every row
(``numba_loop.SPARSE_BELOW``), swept in one process.

Each threshold's loop is generated (``numba_loop.generate_source``) and compiled in memory,
then every variant runs on the same input in turn, repetition after repetition, and the
fastest run of each is kept: on a shared 2-core machine runs of one variant vary by 50%,
while interleaved minima compare variants to a few percent. Threshold 0: every block stores
every row (the loop before 2026-11-29, plus a popcount and the running mean a block); 65:
every block visits its set bits. Internal: the public calls' numbers come from ``cpu_compact.py``.

    python benchmarks/cpu_loop_sweep.py [--log2n 22] [--thresholds 0 44 65] [--fresh] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
import types
from pathlib import Path

import numpy as np

from dask_compact.codegen import numba_loop
from dask_compact.predicate import as_predicate

PS = (0.01, 0.05, 0.2, 0.3, 0.5, 0.8, 0.95)


def loop_for(threshold: int, dtype: str, output: str):
    """The compiled loop of ``x < p0`` with the sparse form below ``threshold`` hits."""
    saved = numba_loop.SPARSE_BELOW
    numba_loop.SPARSE_BELOW = threshold
    try:
        source = numba_loop.generate_source(as_predicate("x < 0.5").typed(dtype), output,
                                            cache=False)
    finally:
        numba_loop.SPARSE_BELOW = saved
    module = types.ModuleType(f"sweep_{threshold}_{dtype}_{output}")
    exec(compile(source, module.__name__, "exec"), module.__dict__)  # noqa: S102 - ours
    return module.compact_loop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=22)
    ap.add_argument("--thresholds", type=int, nargs="+", default=[0, 36, 44, 52, 65])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--ps", type=float, nargs="+", default=list(PS))
    ap.add_argument("--fresh", action="store_true",
                    help="a new output array each call, as compact_array makes (page faults)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    n = 1 << a.log2n
    rng = np.random.default_rng(0)
    lines = [f"# CPU loop store forms, {dt.date.today().isoformat()}, 2^{a.log2n} rows, "
             f"fastest of {a.reps} interleaved runs, ms (current SPARSE_BELOW = "
             f"{numba_loop.SPARSE_BELOW}){', a new output each call' if a.fresh else ''}", "",
             "| dtype | output | p | " + " | ".join(f"below {t}" for t in a.thresholds)
             + " | " + " | ".join(f"{a.thresholds[0]} / {t}" for t in a.thresholds[1:]) + " |",
             "|" + "---|" * (3 + 2 * len(a.thresholds) - 1)]
    for dtype in ("float32", "float64"):
        x = rng.random(n).astype(dtype)
        for output in ("values", "indices"):
            loops = {t: loop_for(t, dtype, output) for t in a.thresholds}
            vals, idx = np.empty(n, dtype), np.empty(n, np.int64)
            for p in a.ps:
                thr = np.dtype(dtype).type(p)
                args = (x, vals, thr) if output == "values" else (x, idx, np.int64(0), thr)
                want = x[x < thr] if output == "values" else np.flatnonzero(x < thr)
                best = dict.fromkeys(a.thresholds, float("inf"))
                for r in range(a.reps):
                    for t, f in loops.items():
                        t0 = time.perf_counter()
                        if a.fresh:
                            vals, idx = np.empty(n, dtype), np.empty(n, np.int64)
                            args = ((x, vals, thr) if output == "values"
                                    else (x, idx, np.int64(0), thr))
                        k = f(*args)
                        best[t] = min(best[t], time.perf_counter() - t0)
                        if r == 0:
                            got = vals[:k] if output == "values" else idx[:k]
                            assert np.array_equal(got, want), (t, dtype, output, p)
                base = best[a.thresholds[0]]
                row = (f"| {dtype} | {output} | {p} | "
                       + " | ".join(f"{best[t] * 1e3:.2f}" for t in a.thresholds) + " | "
                       + " | ".join(f"{base / best[t]:.2f}x" for t in a.thresholds[1:]) + " |")
                lines.append(row)
                print(row, flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        tag = "-fresh" if a.fresh else ""
        path = a.out / f"cpu-loop-sweep-{dt.date.today().isoformat()}-2p{a.log2n}{tag}.md"
        path.write_text("\n".join(lines) + "\n")
        print(path)


if __name__ == "__main__":
    main()
