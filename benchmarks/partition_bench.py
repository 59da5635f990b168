"""dask_compact.partition_array / partition as a user times them, beside what that user would
write instead, and beside our own compact_array (issue target: partition <= 1.2x its time).

GPU (``--device gpu``, float32, N = 2^28 by default, p = .05 / .5 / .95, uniform data):

* ours: ``partition_array(a, "x < p")`` (values and the split point), and
  ``output="indices"`` (the permutation);
* internal columns, labelled: the values call through each route forced
  (``cupy_tuning.SPLIT_ROUTE``: counted first, or one pass), where the public call takes the
  one its predicate's last fraction picks;
* ``compact_array(a, "x < p")`` (the selected part alone; the reference of the target);
* CuPy: ``m = a < p; cupy.concatenate([a[m], a[~m]])``;
* PyTorch: ``torch.cat([a[m], a[~m]])`` (when torch is importable);
* the bytes floor: a device copy of the input (every element read once and written once).

CPU (``--device cpu``, N = 2^24): ours against NumPy ``np.concatenate([a[m], a[~m]])``, the
copy floor, and on a dask array (threaded, 8 chunks) ``partition`` against
``da.concatenate([x[m], x[~m]])`` + ``compute_chunk_sizes()``, persisted.

    python benchmarks/partition_bench.py --device gpu --out DIR --sha SHA

Prints a table (median ms of whole calls, device synchronised; ratios peer / ours), saves it
(markdown, CSV) and a chart (PNG) under --out.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import file_stem, label, plot_vs_p, save, timed_ms

from dask_compact import compact_array, partition, partition_array
from dask_compact.backends import cupy_tuning


def gpu_rows(n: int, ps: list[float], reps: int) -> list[dict]:
    import cupy

    try:
        import torch
    except Exception:  # noqa: BLE001 -- an optional peer
        torch = None
    sync = cupy.cuda.Device().synchronize
    a = cupy.random.default_rng(0).random(n, dtype=np.float32)
    ta = torch.as_tensor(a, device="cuda") if torch is not None else None
    rows = []
    for p in ps:
        text = f"x < {p!r}"
        row: dict = {"n": n, "p": p}
        row["ours"] = timed_ms(lambda: partition_array(a, text), sync, reps)
        row["ours indices"] = timed_ms(lambda: partition_array(a, text, output="indices"),
                                       sync, reps)
        for route in ("counted", "one-pass"):
            cupy_tuning.SPLIT_ROUTE = route
            try:
                row[f"internal: {route} route"] = timed_ms(lambda: partition_array(a, text),
                                                           sync, reps)
            finally:
                cupy_tuning.SPLIT_ROUTE = "auto"
        row["compact_array"] = timed_ms(lambda: compact_array(a, text), sync, reps)

        def cupy_split():
            m = a < p
            return cupy.concatenate([a[m], a[~m]])

        row["cupy concatenate"] = timed_ms(cupy_split, sync, reps)
        if ta is not None:
            def torch_split():
                m = ta < p
                return torch.cat([ta[m], ta[~m]])

            row["torch cat"] = timed_ms(torch_split, sync, reps)
        out = cupy.empty_like(a)
        row["bytes floor"] = timed_ms(lambda: out.__setitem__(slice(None), a), sync, reps)
        rows.append(row)
    return rows


def cpu_rows(n: int, ps: list[float], reps: int) -> list[dict]:
    a = np.random.default_rng(0).random(n, dtype=np.float32)
    x = da.from_array(a, chunks=n // 8)
    rows = []
    for p in ps:
        text = f"x < {p!r}"
        row: dict = {"n": n, "p": p}
        row["ours"] = timed_ms(lambda: partition_array(a, text), lambda: None, reps)
        row["compact_array"] = timed_ms(lambda: compact_array(a, text), lambda: None, reps)

        def numpy_split():
            m = a < p
            return np.concatenate([a[m], a[~m]])

        row["numpy concatenate"] = timed_ms(numpy_split, lambda: None, reps)
        row["bytes floor"] = timed_ms(lambda: a.copy(), lambda: None, reps)
        with dask.config.set(scheduler="threads"):
            row["dask ours"] = timed_ms(lambda: partition(x, text), lambda: None, reps, 1)

            def dask_naive():
                m = x < p
                y = da.concatenate([x[m], x[~m]])
                y.compute_chunk_sizes()
                return y.persist()

            row["dask concatenate + ccs"] = timed_ms(dask_naive, lambda: None, reps, 1)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    cols = [c for c in rows[0] if c not in ("n", "p")]
    vs = [c for c in cols[1:] if c != "dask ours"]
    lines = ["| n | p | " + " | ".join(f"{c} ms" for c in cols) + " | "
             + " | ".join(f"{'dask ours' if c.startswith('dask') else 'ours'} vs {c}"
                          for c in vs) + " |",
             "|" + "---|" * (2 + len(cols) + len(vs))]
    for r in rows:
        ratios = []
        for c in cols[1:]:
            base = r["dask ours"] if c.startswith("dask ") and c != "dask ours" else r["ours"]
            if c == "dask ours":
                continue
            if c == "bytes floor":
                ratios.append(f"**{r[c] / r['ours']:.0%}** of floor")
            elif c == "compact_array":
                ratios.append(f"ours = **{r['ours'] / r[c]:.2f}x** its time")
            else:
                ratios.append(f"**{r[c] / base:.2f}x**")
        lines.append(f"| 2^{int(math.log2(r['n']))} | {r['p']} | "
                     + " | ".join(f"{r[c]:.3f}" for c in cols) + " | " + " | ".join(ratios)
                     + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--log2n", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--ps", default="0.05,0.5,0.95", help="selected fractions, comma-separated")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    args = ap.parse_args()
    ps = [float(p) for p in args.ps.split(",")]
    gpu = args.device == "gpu"
    today, device, sha = label(gpu, args.sha)
    if gpu:
        rows = gpu_rows(1 << (args.log2n or 28), ps, args.reps or 10)
    else:
        rows = cpu_rows(1 << (args.log2n or 24), ps, args.reps or 5)
    text = [f"# partition benchmark, {today}, {device}, git {sha}", "",
            "float32, uniform data, predicate x < p; median ms of whole calls (host wall, "
            "device synced); ratios are peer time / our time (floor: floor time / our time; "
            "compact_array: our time / its time).", "", *table(rows), ""]
    print("\n".join(text))
    if args.out:
        stem = file_stem("partition", today, device, sha, gpu)
        save(args.out, stem, text, rows)
        cols = [c for c in rows[0] if c not in ("n", "p")]
        series = {c: ([r["p"] for r in rows], [r["n"] / r[c] / 1e6 for r in rows]) for c in cols}
        plot_vs_p(series, args.out / f"{stem}.png", f"partition, {device}, git {sha}",
                  "elements")

if __name__ == "__main__":
    main()
