"""What the per-call benchmarks (records_bench.py, partition_bench.py) share: whole-call
timing, the run's label (date, device, commit) and the files a run leaves (markdown, CSV,
throughput-vs-p chart)."""

from __future__ import annotations

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


def label(gpu: bool, sha: str | None) -> tuple[str, str, str]:
    """(today, device in words, commit) of this run."""
    sha = sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
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
