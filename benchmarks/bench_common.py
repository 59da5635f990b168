"""What the benchmark scripts share: whole-call timing, CUDA-event timing of batches, the
run's label (date, device, commit), random input generated on a cluster's workers, and the
files a run leaves (markdown, CSV, throughput-vs-p chart)."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np


def timed_ms(fn, sync, reps: int, warm: int = 2) -> float:
    """Median wall milliseconds of ``fn()`` followed by ``sync()`` (the device finished),
    after ``warm`` untimed calls."""
    for _ in range(warm):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


class EventTimer:
    """Median over ``reps`` batches of ``batch`` calls (CUDA events), per call, after
    ``warmup`` calls; ``fn(k)`` uses input buffer k % nbuf. Batches let the host enqueue ahead
    of the GPU, so a call's time is its device time wherever it does not synchronise itself
    (ours, CUB, a copy); CuPy's and PyTorch's calls that synchronise pay that in every call."""

    def __init__(self, reps: int, warmup: int = 3, batch: int = 4) -> None:
        self.reps, self.warmup, self.batch = reps, warmup, batch

    def __call__(self, fn, nbuf: int) -> float:
        import cupy

        for k in range(self.warmup):
            fn(k % nbuf)
        cupy.cuda.get_current_stream().synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times, k = [], 0
        for _ in range(self.reps):
            start.record()
            for _ in range(self.batch):
                fn(k % nbuf)
                k += 1
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / self.batch)
        return float(np.median(times))


def sync_device() -> None:
    """Wait for this process's GPU work (nothing where CuPy is not installed); run on each
    worker of a GPU cluster before a timer stops."""
    try:
        import cupy
    except ImportError:
        return
    cupy.cuda.runtime.deviceSynchronize()


def floor_on_worker(keys: list, threshold: float, reps: int, dask_worker=None) -> float:
    """On a worker: seconds to compact the chunks it holds among ``keys`` by calling the
    phase-1 chunk function directly (no Dask), synchronised; median of ``reps``."""
    from dask_compact.chunk import compact_blocks
    from dask_compact.predicate import as_predicate

    blocks = [dask_worker.data[k] for k in keys if k in dask_worker.data]
    if not blocks:
        return 0.0
    times = []
    for r in range(reps + 1):
        pred = as_predicate(lambda v, t=threshold + r * 1e-7: v < t)
        sync_device()
        t0 = time.perf_counter()
        out = compact_blocks(blocks, pred, "values", True, "auto", [0] * len(blocks), True)
        sync_device()
        if r:
            times.append(time.perf_counter() - t0)
        del out
    return float(np.median(times))


def git_sha() -> str:
    """The checkout's short commit ("unknown" outside a git checkout)."""
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def _gen(block_info=None, *, seed: int, gpu: bool):
    info = block_info[None]
    ((start, stop),) = info["array-location"]
    i = info["chunk-location"][0]
    if gpu:
        import cupy

        return cupy.random.default_rng(seed + i).random(stop - start, dtype=cupy.float32)
    return np.random.default_rng(seed + i).random(stop - start, dtype=np.float32)


def random_array(n: int, chunk: int, seed: int, gpu: bool, name: str):
    """``n`` uniform float32 in chunks of ``chunk``, each generated where its task runs (CuPy
    chunks when ``gpu``), not persisted; ``name`` is the dask key prefix."""
    import dask.array as da

    chunks = ((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()),)
    meta = np.empty(0, np.float32)
    if gpu:
        import cupy

        meta = cupy.empty(0, np.float32)
    return da.map_blocks(_gen, chunks=chunks, dtype=np.float32, meta=meta, seed=seed, gpu=gpu,
                         name=name)


def selection_args(description: str) -> argparse.ArgumentParser:
    """The options of the one-GPU selection benchmarks: 2^``--log2n`` float32 in chunks of
    2^``--chunk-log2``, ``--p`` selected, ``--reps`` timed calls."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--chunk-log2", type=int, default=25)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--reps", type=int, default=7)
    return ap


def label(gpu: bool, sha: str | None) -> tuple[str, str, str]:
    """(today, device in words, commit) of this run."""
    sha = sha or git_sha()
    if gpu:
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    else:
        device = f"cpu ({platform.machine()}, {len(os.sched_getaffinity(0))} cores)"
    return dt.date.today().isoformat(), device, sha


def plot_vs_p(series: dict[str, tuple[list, list]], path: Path, title: str, unit: str) -> None:
    """One line per label: throughput (``unit`` per second, in G) against the selected
    fraction p; ``series[label] = (ps, rates in G/s)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (ps, rates) in series.items():
        ax.plot(ps, rates, marker="o", label=name)
    ax.set_xlabel("selected fraction p")
    ax.set_ylabel(f"{unit} per second (G/s)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def save(out: Path, stem: str, text: list[str], rows: list[dict]) -> None:
    """``stem``.md (the printed tables) and ``stem``.csv (every row) under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text("\n".join(text) + "\n")
    with open(out / f"{stem}.csv", "w", newline="") as fh:
        keys = sorted({k for r in rows for k in r})
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def file_stem(kind: str, today: str, device: str, sha: str, gpu: bool) -> str:
    safe = device.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    return f"{kind}-{today}-{safe if gpu else 'cpu'}-{sha}"
