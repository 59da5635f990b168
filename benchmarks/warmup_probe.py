"""Where the batch job's GPU warm-up spends its time: importing CuPy, the driver's start, the
context, the predicate, the CuPy backend's import and ``cupy_backend.prepare`` (profiled), in a
thread as the command runs it, alone (``none``) or beside the main thread importing zarr
(``zarr``), as the command does.

    python -P benchmarks/warmup_probe.py none|zarr

A diagnostic behind docs/design.md's start-up notes, not a benchmark.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time

T0 = time.perf_counter()


def mark(what: str) -> None:
    name = threading.current_thread().name[:10]
    print(f"{time.perf_counter() - T0:7.3f} {name} {what}", flush=True)


def warm() -> None:
    mark("warm: import cupy >")
    import cupy

    mark("warm: import cupy <")
    cupy.cuda.runtime.getDeviceCount()
    mark("warm: device count (the driver's start)")
    cupy.cuda.runtime.free(0)
    mark("warm: context")
    import numpy as np

    from dask_compact.predicate import as_predicate

    pred = as_predicate("x < 0.5")
    mark("warm: as_predicate")
    from dask_compact.backends import cupy_backend

    mark("warm: cupy_backend imported")
    prof = cProfile.Profile()
    prof.enable()
    cupy_backend.prepare(pred, np.dtype("float32"), "values")
    prof.disable()
    mark("warm: prepare")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue()[:6000])


def main() -> None:
    t = threading.Thread(target=warm, name="warmup")
    t.start()
    if sys.argv[1:] == ["zarr"]:
        mark("main: import zarr >")
        import zarr  # noqa: F401

        mark("main: import zarr <")
    t.join()
    mark("end")


if __name__ == "__main__":
    main()
