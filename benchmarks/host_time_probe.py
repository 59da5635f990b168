"""Where the host time of the public GPU scan_array and compact_array calls goes.

A. 2^28 float32 and int32: CUDA-event ms per call in batches of 1 and of 4 (the batch's
   first call's host time before its first launch is in the batch's time) of
   ``scan_array``, the look-back launch alone (``cupy_scan._lookback``, output allocated
   once) and ``torch.cumsum``; the host ms of one call (the device idle before it, no
   synchronisation after).
B. ``scan_array`` at 2^10 (bound by its host time): wall per call with a synchronisation,
   and a cProfile of 3,000 calls.
C. ``compact_array`` at 2^20 float32, p = 0.5, with a lambda and with a string, beside
   ``torch.masked_select`` and CuPy's ``a[a < p]``: wall per call with a synchronisation in
   three rounds, and a cProfile of each of ours.

    python benchmarks/host_time_probe.py OUT.txt
"""
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import cupy
import numpy as np

try:
    import torch
except ImportError:
    torch = None

from dask_compact import compact_array, scan_array
from dask_compact.backends import cupy_scan
from dask_compact.backends.cupy_scan_source import ScanSpec

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import EventTimer, timed_ms  # noqa: E402 -- the scripts' shared timers

out = open(sys.argv[1], "w")


def say(*a):
    print(*a, flush=True)
    print(*a, file=out, flush=True)


stream = cupy.cuda.get_current_stream()


def batches(fn, batch, reps=15, warm=3):
    """CUDA-event ms per call of ``fn`` in batches of ``batch`` (bench_common.EventTimer)."""
    return EventTimer(reps, warmup=warm, batch=batch)(lambda _k: fn(), 1)


def host(fn, reps=30):
    ts = []
    for _ in range(reps):
        stream.synchronize()
        if torch is not None:
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    stream.synchronize()
    return float(np.median(ts)) * 1e3


def wall(fn, reps=200):
    """Wall us of ``fn`` and a synchronisation, after 20 untimed calls (bench_common)."""
    return timed_ms(fn, stream.synchronize, reps, warm=20) * 1e3


def profiled(fn, lines, sync_each):
    """cProfile of 3,000 calls of ``fn`` (a synchronisation after each, or after all), the
    ``lines`` functions of most own time."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3000):
        fn()
        if sync_each:
            stream.synchronize()
    pr.disable()
    stream.synchronize()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue()


for dt in (np.float32, np.int32):
    n = 1 << 28
    a = cupy.asarray(np.random.default_rng(1).integers(0, 100, n).astype(dt))
    acc = np.dtype(dt) if dt == np.float32 else np.dtype(np.int32)
    o = cupy.empty(n, dtype=acc)
    spec = ScanSpec.make(np.dtype(dt), acc, "lookback", True)
    mod = cupy_scan.module_for(spec)
    base = acc.type(-0.0 if acc.kind == "f" else 0)
    fns = {"public": lambda: scan_array(a, exclusive=True, dtype=acc),
           "launch": lambda: cupy_scan._lookback(mod, spec, a, o, n, base, None)}
    if torch is not None:
        t = torch.as_tensor(a, device="cuda")
        tdt = getattr(torch, acc.name)
        fns["torch"] = lambda: torch.cumsum(t, 0, dtype=tdt)
    for rnd in range(2):
        for name, f in fns.items():
            say(f"A {np.dtype(dt).name} 2^28 r{rnd} {name}: batch1 {batches(f, 1):.4f} ms, "
                f"batch4 {batches(f, 4):.4f} ms, host {host(f):.4f} ms")
    del a, o, fns
    cupy.get_default_memory_pool().free_all_blocks()

a = cupy.asarray(np.random.default_rng(2).random(1 << 10).astype(np.float32))
for f, name in ((lambda: scan_array(a), "scan_array 2^10"),):
    say(f"B {name}: wall {wall(f):.1f} us")
    say(profiled(f, 30, sync_each=False))

a = cupy.asarray(np.random.default_rng(3).random(1 << 20).astype(np.float32))
p = 0.5
cases = {"lambda": lambda: compact_array(a, lambda v: v < p),
         "string": lambda: compact_array(a, "x < 0.5")}
if torch is not None:
    ta = torch.as_tensor(a, device="cuda")
    cases["torch"] = lambda: torch.masked_select(ta, ta < p)
cases["cupy"] = lambda: a[a < p]
for rnd in range(3):
    say(f"C r{rnd} " + ", ".join(f"{k} {wall(f):.1f} us" for k, f in cases.items()))
for k in ("lambda", "string"):
    say(f"C profile {k}\n" + profiled(cases[k], 25, sync_each=True))
