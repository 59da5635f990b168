"""One arm of an A/B of repeated public GPU calls: ``compact_array`` at 2^20 with a lambda
and with a string (beside CuPy's ``a[a < p]`` and ``torch.masked_select``), and
``scan_array`` at 2^20 and 2^28 beside ``torch.cumsum``. Run one process per arm, the arms'
installs alternated by the driver (``PYTHONPATH`` pointing at each), and compare within each
arm against its peers: two processes may run at different host speeds.

    PYTHONPATH=SITE_A python benchmarks/repeat_calls_ab.py old OUT.jsonl
    PYTHONPATH=SITE_B python benchmarks/repeat_calls_ab.py new OUT.jsonl

compact_array: 16 rotating inputs, p = 0.5, wall microseconds per call with a
synchronisation, median of 5 rounds of 400 calls. Scans: float32 integers in [0, 100), wall
and host microseconds of one call (median of 60 at 2^20, 15 at 2^28) and CUDA-event ms per
call in batches of 4. Appends one JSON line to OUT.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import cupy
import numpy as np

from dask_compact import compact_array, scan_array

try:
    import torch
except ImportError:
    torch = None


def main() -> None:
    arm, path = sys.argv[1], sys.argv[2]
    sync = cupy.cuda.Device().synchronize
    p = 0.5
    res: dict[str, Any] = {"arm": arm}
    for dt in (np.float32, np.float64):
        bufs = [cupy.asarray(np.random.default_rng(k).random(1 << 20).astype(dt))
                for k in range(16)]
        cases = {"lambda": lambda k: compact_array(bufs[k], lambda v: v < p),
                 "string": lambda k: compact_array(bufs[k], "x < 0.5"),
                 "cupy": lambda k: bufs[k][bufs[k] < p]}
        if torch is not None:
            tb = [torch.as_tensor(b, device="cuda") for b in bufs]
            cases["torch"] = lambda k: torch.masked_select(tb[k], tb[k] < p)
        for f in cases.values():
            for k in range(50):
                f(k % 16)
        sync()
        times: dict[str, list[float]] = {c: [] for c in cases}
        for _ in range(5):
            for c, f in cases.items():
                ts = []
                for k in range(400):
                    t = time.perf_counter()
                    f(k % 16)
                    sync()
                    ts.append(time.perf_counter() - t)
                times[c].append(float(np.median(ts)) * 1e6)
        for c, v in times.items():
            res[f"{np.dtype(dt).name} {c}"] = round(float(np.median(v)), 2)
    for log2n in (20, 28):
        n = 1 << log2n
        sbufs = [cupy.asarray(np.random.default_rng(k).integers(0, 100, n).astype(np.float32))
                 for k in range(2)]
        scans = {"scan": lambda k: scan_array(sbufs[k])}
        if torch is not None:
            stb = [torch.as_tensor(b, device="cuda") for b in sbufs]
            scans["torch.cumsum"] = lambda k: torch.cumsum(stb[k], 0)
        for f in scans.values():
            for k in range(5):
                f(k % 2)
        sync()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        for c, f in scans.items():
            walls, host, batch4 = [], [], []
            for rnd in range(60 if log2n == 20 else 15):
                t = time.perf_counter()
                f(rnd % 2)
                h = time.perf_counter()
                sync()
                walls.append(time.perf_counter() - t)
                host.append(h - t)
                start.record()
                for k in range(4):
                    f(k % 2)
                end.record()
                end.synchronize()
                batch4.append(cupy.cuda.get_elapsed_time(start, end) / 4)
            res[f"2^{log2n} {c} wall us"] = round(float(np.median(walls)) * 1e6, 2)
            res[f"2^{log2n} {c} host us"] = round(float(np.median(host)) * 1e6, 2)
            res[f"2^{log2n} {c} batch4 ms"] = round(float(np.median(batch4)), 4)
    print(json.dumps(res), flush=True)
    with open(path, "a") as out:
        out.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
