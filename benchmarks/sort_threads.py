"""dask_compact.sort / argsort of NumPy chunks under dask's threaded scheduler, beside one
bucket (``buckets=1``: one NumPy sort of the joined chunks) and the naive
``np.sort(x.compute())`` / ``np.argsort(x.compute(), kind="stable")``, in one process.

It measured whether NumPy chunks in one process gain from the sample sort's buckets, which
CuPy chunks there do not (``sort_graph.one_device``): on the GPU host's 16 cores they do
(``results/sort-threads-numpy-2026-12-07-h100-host-cpu-1356526.txt``). Prints median ms of 5
calls after a warm-up: 2^log2n float32 in chunks of 2^c, the whole array and ``x[x < 0.5]``.

    python benchmarks/sort_threads.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import dask
import dask.array as da
import numpy as np

import dask_compact

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import timed_ms


def t(f) -> float:
    """Median ms of 5 calls of ``f`` after one warm-up call (NumPy chunks: nothing to sync)."""
    return round(timed_ms(f, lambda: None, reps=5, warm=1), 1)


def main() -> None:
    print("cores", len(os.sched_getaffinity(0)))
    sort, argsort = dask_compact.sort, dask_compact.argsort
    with dask.config.set(scheduler="threads"):
        for log2n, c in ((24, 21), (26, 23), (26, 22)):
            x = da.random.default_rng(1).random(2**log2n, chunks=2**c,
                                                dtype=np.float32).persist()
            s = x[x < 0.5]
            print(log2n, c,
                  "sort default", t(lambda: sort(x)), "b1", t(lambda: sort(x, buckets=1)),
                  "np", t(lambda: np.sort(x.compute())),
                  "| sel default", t(lambda: sort(s)), "sel b1", t(lambda: sort(s, buckets=1)),
                  "np sel", t(lambda: np.sort(s.compute())),
                  "| arg default", t(lambda: argsort(x)),
                  "arg b1", t(lambda: argsort(x, buckets=1)),
                  "np arg", t(lambda: np.argsort(x.compute(), kind="stable")), flush=True)


if __name__ == "__main__":
    main()
