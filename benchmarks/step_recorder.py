"""Timers wrapped around a job's functions: each call's interval, thread wall and thread CPU
time, for the batch diagnostics (``batch_profile.py``: per phase totals and the pool's busy
threads; ``batch_trace.py``: the steps running per 50 ms of a command)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import numpy as np


class Recorder:
    """Wraps functions to record each call's interval, thread wall and thread CPU time."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, float, float]] = []  # label, start, end, cpu
        self.lock = threading.Lock()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return real(*args, **kwargs)
            finally:
                end, cpu = time.perf_counter(), time.thread_time() - c0
                with self.lock:
                    self.calls.append((label, t0, end, cpu))

        setattr(owner, name, timed)

    def report(self) -> list[str]:
        phases: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0.0])
        for label, t0, t1, cpu in self.calls:
            p = phases[label]
            p[0] += t1 - t0
            p[1] += cpu
            p[2] += 1
            p[3] = max(p[3], t1 - t0)
        lines = [f"   {k:24s} n={int(n):4d}  thread wall {w:7.2f} s  cpu {c:7.2f} s  "
                 f"longest {m:.3f} s" for k, (w, c, n, m) in sorted(phases.items())]
        tasks = [(k, a, b) for k, a, b, _ in self.calls if k in ("read task", "write task")]
        if tasks:
            s0 = min(a for _, a, _ in tasks)
            e1 = max(b for _, _, b in tasks)
            nb = int((e1 - s0) / 0.05) + 1
            both, reads = np.zeros(nb), np.zeros(nb)
            for k, a, b in tasks:
                for i in range(int((a - s0) / 0.05), int((b - s0) / 0.05) + 1):
                    lo, hi = s0 + i * 0.05, s0 + (i + 1) * 0.05
                    share = max(0.0, min(b, hi) - max(a, lo)) / 0.05
                    both[i] += share
                    reads[i] += share if k == "read task" else 0.0
            lines.append("   busy threads per 50 ms, reads and writes / reads only:")
            lines.append("   " + " ".join(f"{x:.0f}" for x in both))
            lines.append("   " + " ".join(f"{x:.0f}" for x in reads))
        return lines
