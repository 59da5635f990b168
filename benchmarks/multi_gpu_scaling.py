"""Multi-GPU scaling: map_compact on 1, 2, 4 GPUs of one host (dask-cuda, one worker per GPU).

CuPy-backed random data is generated ON the workers and persisted; each repetition then runs
``map_compact`` (known sizes, persisted) with a new threshold (new keys), and, as the peer,
``x[x < p]`` + ``compute_chunk_sizes()`` + persist on the same cluster. Reported: throughput
(input bytes per second), scaling efficiency (throughput_k / (k * throughput_1)), and the Dask
overhead per chunk (wall time per chunk of a run over many tiny chunks, where the kernels take
microseconds). Results: CSV, markdown and a PNG plot.

    python benchmarks/multi_gpu_scaling.py --log2n 32 --chunk-log2 28 --gpus 1 2 4 --out DIR
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np


def _gen(block_info=None, *, seed: int):
    import cupy

    info = block_info[None]
    (start, stop), = info["array-location"]
    i = info["chunk-location"][0]
    return cupy.random.default_rng(seed + i).random(stop - start, dtype=cupy.float32)


def random_gpu_array(n: int, chunk: int, seed: int):
    import cupy
    import dask.array as da

    nb = -(-n // chunk)
    chunks = ((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()),)
    assert len(chunks[0]) == nb
    return da.map_blocks(_gen, chunks=chunks, dtype=np.float32, meta=cupy.empty(0, np.float32),
                         seed=seed, name=f"gpu-random-{n}-{chunk}-{seed}")


def run_k(k: int, n: int, chunk: int, reps: int, p: float) -> dict:
    import dask_compact  # noqa: F401
    from dask_cuda import LocalCUDACluster
    from distributed import Client, futures_of, wait

    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(k)), dashboard_address=None,
                          threads_per_worker=1) as cluster, Client(cluster) as client:
        x = random_gpu_array(n, chunk, seed=7).persist()
        wait(x)
        holders = {w for ws in client.who_has(futures_of(x)).values() for w in ws}
        ours, peer = [], []
        for r in range(reps + 1):
            t = p + r * 1e-7  # a new threshold each time: new keys, nothing reused
            t0 = time.perf_counter()
            y = x.map_compact(lambda v: v < t)
            wait(y)
            t1 = time.perf_counter()
            z = x[x < t]
            z.compute_chunk_sizes()
            z = z.persist()
            wait(z)
            t2 = time.perf_counter()
            assert y.shape == z.shape
            if r:  # round 0 compiles the kernel on every worker
                ours.append(t1 - t0)
                peer.append(t2 - t1)
            del y, z
        # Dask overhead per chunk: many tiny chunks, so the kernels take microseconds.
        tiny = random_gpu_array(256 * 4096, 4096, seed=9).persist()
        wait(tiny)
        tiny.map_compact(lambda v: v < 0.5)  # warm-up
        t0 = time.perf_counter()
        for r in range(3):
            s = 0.5 + (r + 1) * 1e-7
            wait(tiny.map_compact(lambda v: v < s))
        per_chunk = (time.perf_counter() - t0) / 3 / tiny.numblocks[0]
        selected = int(float(p) * n)
    t_ours, t_peer = statistics.median(ours), statistics.median(peer)
    return dict(gpus=k, n=n, chunk=chunk, chunks=-(-n // chunk), p=p, workers_holding=len(holders),
                map_compact_s=t_ours, peer_s=t_peer, speedup_vs_peer=t_peer / t_ours,
                GBps_input=n * 4 / t_ours / 1e9, overhead_per_chunk_ms=per_chunk * 1e3,
                approx_selected=selected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=32)
    ap.add_argument("--chunk-log2", type=int, default=28)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    import cupy

    ngpu = cupy.cuda.runtime.getDeviceCount()
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    for k in args.gpus:
        if k > ngpu:
            print(f"skip {k} GPUs: only {ngpu} present", flush=True)
            continue
        row = run_k(k, 2**args.log2n, 2**args.chunk_log2, args.reps, args.p)
        rows.append(row)
        print(row, flush=True)
    base = rows[0]["GBps_input"] / rows[0]["gpus"] if rows else 1
    for r in rows:
        r["efficiency"] = r["GBps_input"] / (r["gpus"] * base)
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or os.environ.get("GIT_SHA", "unknown")
    except Exception:
        sha = os.environ.get("GIT_SHA", "unknown")
    sha = os.environ.get("GIT_SHA", sha)
    stamp = f"{dt.date.today().isoformat()}-{ngpu}x{name.replace(' ', '_')}-{sha}"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"multi-gpu-{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# map_compact scaling, {name}, {dt.date.today()}, git {sha}, 2^{args.log2n} "
             f"float32 in chunks of 2^{args.chunk_log2}, p={args.p}", "",
             "| GPUs | map_compact s | GB/s (input) | efficiency | x[x<p]+ccs+persist s | "
             "speed-up | Dask overhead / chunk ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['map_compact_s']:.4f} | {r['GBps_input']:.0f} | "
                     f"{100 * r['efficiency']:.0f}% | {r['peer_s']:.4f} | "
                     f"{r['speedup_vs_peer']:.2f}x | {r['overhead_per_chunk_ms']:.2f} |")
    (args.out / f"multi-gpu-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r["gpus"] for r in rows]
    ax.plot(ks, [r["GBps_input"] for r in rows], "-o", label="map_compact")
    ax.plot(ks, [base * k for k in ks], ":", color="gray", label="ideal (linear)")
    ax.plot(ks, [r["n"] * 4 / r["peer_s"] / 1e9 for r in rows], "--x",
            label="x[x<p] + compute_chunk_sizes + persist")
    ax.set_xlabel("GPUs (one dask-cuda worker each)")
    ax.set_ylabel("input GB/s")
    ax.set_xticks(ks)
    ax.legend()
    ax.grid(alpha=0.3)
    ax.set_title(f"2^{args.log2n} float32, p={args.p}, {name}")
    fig.tight_layout()
    fig.savefig(args.out / f"multi-gpu-{stamp}.png", dpi=120)


if __name__ == "__main__":
    main()
