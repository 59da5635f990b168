"""CPU benchmark: dask_compact's fused loop and Dask graph against NumPy and Dask peers.

Same data, same process, ratios printed and saved (markdown + CSV + PNG) under
benchmarks/results/. Two levels:

1. chunk: ``compact_array(a, "x < p")`` vs NumPy ``a[a < p]`` (values) and
   ``np.flatnonzero(a < p)`` (indices), float32 (``--dtype`` another: integers uniform over
   half their range), one core, sizes 2^16..2^24.
2. dask: on a LocalCluster (2 worker processes, 1 thread each), input persisted first:
   ``map_compact`` (known sizes, persisted) vs ``x[x < p]`` + ``compute_chunk_sizes()`` +
   persist vs ``map_blocks(lambda b: b[b < p])`` persist (unknown sizes).

    python benchmarks/cpu_compact.py [--quick] [--dtype float32] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core for the chunk level
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from dask_compact import compact_array  # noqa: E402

PS = (0.01, 0.05, 0.2, 0.5, 0.95)


def median_time(fn, reps: int) -> float:
    fn()  # warm-up: compilation, page faults
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def chunk_level(sizes: list[int], reps: int, dtype: str = "float32") -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    dt_ = np.dtype(dtype)
    scale = 1 if dt_.kind == "f" else 2 ** (8 * dt_.itemsize - 1)
    for n in sizes:
        a = (rng.random(n) * scale).astype(dt_) if scale > 1 else rng.random(n, dtype=dt_)
        for p in PS:
            t = float(p) if scale == 1 else int(p * scale)
            ours_v = median_time(lambda: compact_array(a, lambda v: v < t), reps)
            np_v = median_time(lambda: a[a < t], reps)
            ours_i = median_time(lambda: compact_array(a, lambda v: v < t, output="indices"), reps)
            np_i = median_time(lambda: np.flatnonzero(a < t), reps)
            assert np.array_equal(compact_array(a, lambda v: v < t), a[a < t])
            rows.append(dict(level="chunk", n=n, p=p, ours_values_ms=ours_v * 1e3,
                             numpy_values_ms=np_v * 1e3, ratio_values=np_v / ours_v,
                             ours_indices_ms=ours_i * 1e3, numpy_indices_ms=np_i * 1e3,
                             ratio_indices=np_i / ours_i))
            print(f"chunk n=2^{int(np.log2(n))} p={p}: values {np_v / ours_v:5.2f}x numpy, "
                  f"indices {np_i / ours_i:5.2f}x numpy", flush=True)
    return rows


def dask_level(n: int, nchunks: int, reps: int) -> list[dict]:
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import dask_compact  # noqa: F401

    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster):
        x = da.random.default_rng(1).random(n, chunks=n // nchunks, dtype=np.float32).persist()
        wait(x)
        for p in PS:
            times: dict[str, list[float]] = {"map_compact": [], "getitem+ccs": [], "map_blocks": []}
            for r in range(reps + 1):
                t = p + r * 1e-7  # a new threshold per repetition: new keys, no reuse
                t0 = time.perf_counter()
                y = x.map_compact(lambda v: v < t)
                wait(y)
                t1 = time.perf_counter()
                z = x[x < t]
                z.compute_chunk_sizes()
                z = z.persist()
                wait(z)
                t2 = time.perf_counter()
                w = x.map_blocks(lambda b: b[b < t], chunks=((np.nan,) * x.numblocks[0],),
                                 dtype=x.dtype, name=f"mb-{p}-{r}").persist()
                wait(w)
                t3 = time.perf_counter()
                if r:  # the first round warms up compilation on the workers
                    times["map_compact"].append(t1 - t0)
                    times["getitem+ccs"].append(t2 - t1)
                    times["map_blocks"].append(t3 - t2)
                assert y.shape == z.shape
                del y, z, w
            med = {k: statistics.median(v) for k, v in times.items()}
            rows.append(dict(level="dask", n=n, p=p, chunks=nchunks,
                             map_compact_s=med["map_compact"], getitem_ccs_s=med["getitem+ccs"],
                             map_blocks_s=med["map_blocks"],
                             speedup_vs_getitem_ccs=med["getitem+ccs"] / med["map_compact"],
                             speedup_vs_map_blocks=med["map_blocks"] / med["map_compact"]))
            print(f"dask n=2^{int(np.log2(n))} p={p}: {rows[-1]['speedup_vs_getitem_ccs']:.2f}x "
                  f"x[x<p]+compute_chunk_sizes+persist, {rows[-1]['speedup_vs_map_blocks']:.2f}x "
                  "map_blocks persist", flush=True)
        del dask
    return rows


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def save(rows: list[dict], out: Path, header: str, dtype: str = "float32") -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = f"{dt.date.today().isoformat()}-cpu-{git_sha()}"
    if dtype != "float32":
        stamp += f"-{dtype}"
    import csv

    for level in ("chunk", "dask"):
        sel = [r for r in rows if r["level"] == level]
        if not sel:
            continue
        with open(out / f"cpu-{level}-{stamp}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(sel[0]))
            w.writeheader()
            w.writerows(sel)
    lines = [header, ""]
    chunk = [r for r in rows if r["level"] == "chunk"]
    if chunk:
        lines += ["| n | p | ours values ms | numpy a[a<p] ms | ratio | ours indices ms | "
                  "np.flatnonzero ms | ratio |", "|---|---|---|---|---|---|---|---|"]
        for r in chunk:
            lines.append(f"| 2^{int(np.log2(r['n']))} | {r['p']} | {r['ours_values_ms']:.3f} | "
                         f"{r['numpy_values_ms']:.3f} | **{r['ratio_values']:.2f}x** | "
                         f"{r['ours_indices_ms']:.3f} | {r['numpy_indices_ms']:.3f} | "
                         f"**{r['ratio_indices']:.2f}x** |")
    dsk = [r for r in rows if r["level"] == "dask"]
    if dsk:
        lines += ["", "| n | chunks | p | map_compact s | x[x<p]+ccs+persist s | ratio | "
                  "map_blocks persist s | ratio |", "|---|---|---|---|---|---|---|---|"]
        for r in dsk:
            lines.append(f"| 2^{int(np.log2(r['n']))} | {r['chunks']} | {r['p']} | "
                         f"{r['map_compact_s']:.3f} | {r['getitem_ccs_s']:.3f} | "
                         f"**{r['speedup_vs_getitem_ccs']:.2f}x** | {r['map_blocks_s']:.3f} | "
                         f"**{r['speedup_vs_map_blocks']:.2f}x** |")
    (out / f"cpu-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if chunk:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for p, color in zip(PS, ("tab:purple", "tab:blue", "tab:red", "tab:orange",
                                 "tab:green")):
            sel = [r for r in chunk if r["p"] == p]
            ns = [r["n"] for r in sel]
            # Effective throughput: bytes read + bytes written, per second.
            size = np.dtype(dtype).itemsize
            gbs = lambda ms, r: (r["n"] + r["p"] * r["n"]) * size / (ms * 1e-3) / 1e9  # noqa: E731
            ax.plot(ns, [gbs(r["ours_values_ms"], r) for r in sel], "-o", color=color,
                    label=f"dask_compact p={p}")
            ax.plot(ns, [gbs(r["numpy_values_ms"], r) for r in sel], "--x", color=color,
                    label=f"NumPy a[a<p] p={p}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements")
        ax.set_ylabel("GB/s (read + written), one core")
        ax.set_title("CPU compaction throughput")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / f"cpu-throughput-{stamp}.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--dtype", default="float32", help="the chunk level's input dtype")
    args = ap.parse_args()
    sizes = [2**k for k in ((16, 20) if args.quick else (16, 18, 20, 22, 24))]
    reps = 3 if args.quick else 15
    rows = chunk_level(sizes, reps, args.dtype)
    if not args.no_dask:
        rows += dask_level(2**22 if args.quick else 2**26, 8, 2 if args.quick else 5)
    header = (f"# CPU benchmark, {dt.date.today().isoformat()}, git {git_sha()}, "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"numpy {np.__version__}, chunk level {args.dtype}")
    save(rows, args.out, header, args.dtype)


if __name__ == "__main__":
    main()
