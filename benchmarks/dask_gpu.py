"""Dask-level GPU benchmark: one GPU (dask_cuda.LocalCUDACluster), 2^30 float32 in 4 CuPy chunks.

Three ways to get a filtered, persisted dask array of ``x < p``:
  map_compact            known chunk sizes, persisted by the call (dask_compact); extra,
                         labelled rows: the same with a redundant ``.persist()`` (this row's
                         protocol until c4ec9a9), and phase 1 as Dask tasks
                         (``dask-compact.direct`` off)
  boolindex+ccs+persist  x[x < p].compute_chunk_sizes().persist()
  map_blocks persist     x.map_blocks(lambda b: b[b < p]).persist() (unknown sizes)
Every repetition uses a new threshold, so no key is reused (docs/design.md, Measuring pitfalls).
Dask's own floor on the same cluster, in the same run: a bare ``client.submit(f).result()`` and
one trivial task per chunk of ``x`` persisted and waited (what any call over the chunks pays),
and the GPU floor: the chunk function called on the worker without Dask, synchronised.
``--low-latency`` measures everything again, in the same run and cluster, after
``dask_compact.low_latency(client)`` (rows marked "(low latency)").

    python benchmarks/dask_gpu.py --out results/ [--log2n 30 --chunks 4 --reps 5] [--sha SHA]
        [--low-latency]
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=30)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ps", default="0.05,0.5,0.95")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sha", default="", help="the commit measured (default: git's HEAD here)")
    ap.add_argument("--low-latency", action="store_true",
                    help="then measure everything again after dask_compact.low_latency(client)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
    import cupy
    import dask
    import dask.array as da
    from bench_common import floor_on_worker
    from dask.core import flatten
    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    import dask_compact

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    n = 2**args.log2n
    rows = []
    with (
        LocalCUDACluster(n_workers=1, threads_per_worker=args.chunks) as cluster,
        Client(cluster) as client,
    ):
        rs = da.random.RandomState(RandomState=cupy.random.RandomState)
        x = rs.random_sample(size=n, chunks=n // args.chunks, dtype=np.float32)
        x = x.persist()
        wait(x)

        def _devname():
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            return name.decode() if isinstance(name, bytes) else name

        dev = client.run(_devname)
        meta = dict(
            device=list(dev.values())[0],
            date=datetime.date.today().isoformat(),
            git=args.sha or subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or "uncommitted",
            n=f"2^{args.log2n}",
            chunks=args.chunks,
            dask=dask.__version__,
        )
        print(json.dumps(meta), flush=True)

        def timed(fn):
            t0 = time.perf_counter()
            r = fn()
            wait(r)
            return time.perf_counter() - t0, r

        def map_compact(p):  # eager: known sizes, already persisted (waited for by timed)
            return x.map_compact(lambda v: v < p)

        def map_compact_persist(p):  # the same with a redundant .persist() (rows until c4ec9a9)
            return x.map_compact(lambda v: v < p).persist()

        def boolindex(p):
            z = x[x < p]
            z.compute_chunk_sizes()
            return z.persist()

        def map_blocks(p):
            w = x.map_blocks(
                lambda b: b[b < p],
                chunks=((np.nan,) * x.numblocks[0],),
                dtype=x.dtype,
                meta=cupy.empty(0, dtype=x.dtype),
            )
            return w.persist()

        def map_compact_tasks(p):  # internal: phase 1 as Dask tasks, not asked directly
            with dask.config.set({"dask-compact.direct": False}):
                return map_compact(p)

        keys = [f.key for f in (x.dask[k] for k in flatten(x.__dask_keys__()))]

        impls = {
            "map_compact_known_sizes (persisted)": map_compact,
            "map_compact_known_sizes + redundant .persist()": map_compact_persist,
            "map_compact_known_sizes (internal: phase 1 as tasks)": map_compact_tasks,
            "dask_boolindex+compute_chunk_sizes+persist": boolindex,
            "dask_map_blocks_mask_persist_unknown_sizes": map_blocks,
        }

        def measure(tag: str) -> dict[str, float]:
            """Rows of every impl and p (``tag`` appended to their names) and the floors."""
            for p0 in map(float, args.ps.split(",")):
                times: dict[str, list[float]] = {k: [] for k in impls}
                sizes = {}
                for rep in range(args.reps + 1):  # first repetition: warm-up (compiles, pools)
                    p = p0 + (rep + 1) * 1e-7 + len(tag) * 1e-4  # new keys every repetition
                    for name, fn in impls.items():
                        dt, r = timed(lambda: fn(p))
                        if rep:
                            times[name].append(dt)
                        if name.startswith("map_compact"):
                            sizes[name] = sum(r.chunks[0])
                        del r
                for name, ts in times.items():
                    ms = 1e3 * float(np.median(ts))
                    rows.append(
                        dict(
                            impl=name + tag,
                            log2n=args.log2n,
                            p=p0,
                            ms=round(ms, 2),
                            GBps=round(n * 4 * (1 + p0) / (ms * 1e-3) / 1e9, 1),
                            selected=sizes.get(name, ""),
                            chunks=args.chunks,
                        )
                    )
                    print(rows[-1], flush=True)
            floors = dask_floors(client, x, args.reps)
            gpu = client.run(floor_on_worker, keys, 0.5, max(5, args.reps))
            floors["GPU floor: the chunk function on the worker, no Dask, synchronised"] = (
                1e3 * max(gpu.values()))
            return {k + tag: v for k, v in floors.items()}

        floors = measure("")
        if args.low_latency:  # the same again once the cluster sends its messages at once
            dask_compact.low_latency(client)
            floors.update(measure(LOW))
    lines = [
        "# Dask on one GPU: persisted filtered array of x < p",
        "",
        "```",
        json.dumps(meta, indent=1),
        "```",
        "",
        "| impl | p | ms (median) | effective GB/s | vs map_compact |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        low = r["impl"].endswith(LOW)
        ref = next(
            q["ms"] for q in rows if q["p"] == r["p"] and q["impl"].startswith("map_compact")
            and q["impl"].endswith(LOW) == low
        )
        lines.append(f"| {r['impl']} | {r['p']} | {r['ms']} | {r['GBps']} | {r['ms'] / ref:.2f}x |")
    lines += ["", "Dask's own floor on this cluster (same run, median ms):", "",
              "| floor | ms |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in floors.items()]
    (out / "dask_gpu.md").write_text("\n".join(lines) + "\n")
    with open(out / "dask_gpu.csv", "w") as f:
        f.write("# " + json.dumps(meta) + "\n")
        f.write(",".join(rows[0]) + "\n")
        for r in rows:
            f.write(",".join(str(v) for v in r.values()) + "\n")
    print("\n".join(lines))


LOW = " (low latency)"  # rows measured after dask_compact.low_latency(client)


def _one() -> int:
    return 1


def dask_floors(client, x, reps: int) -> dict[str, float]:
    """Median ms of what any Dask call pays on this cluster: a bare task's round trip, and one
    trivial task per chunk of ``x`` persisted and waited (new keys every time)."""
    from distributed import wait

    def per_chunk(k: int) -> None:
        y = x.map_blocks(lambda b, k=k: b[:1], chunks=((1,) * x.numblocks[0],),
                         dtype=x.dtype, meta=x._meta).persist()
        wait(y)

    out = {}
    for name, fn in (("client.submit(f).result()",
                      lambda k: client.submit(_one, pure=False).result()),
                     ("one trivial task per chunk, persisted and waited", per_chunk)):
        ts = []
        for k in range(max(5, 4 * reps) + 2):
            t0 = time.perf_counter()
            fn(k)
            if k >= 2:  # two warm-up calls
                ts.append(time.perf_counter() - t0)
        out[name] = 1e3 * float(np.median(ts))
        print(f"floor {name}: {out[name]:.2f} ms", flush=True)
    return out


if __name__ == "__main__":
    main()
