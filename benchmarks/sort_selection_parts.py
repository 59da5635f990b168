"""Where the time of ``sort(x[x < p])`` goes where x is a graph to compute (not persisted),
one GPU, threaded scheduler: each step of the one-device path timed with a device sync
around it (the syncs take away what the steps would overlap, so their sum is an upper
bound), beside the whole call and the naive ``cupy.sort(x[x < p].compute())`` and its parts.

    python benchmarks/sort_selection_parts.py --reps 7 > parts.txt

Steps (sort_graph): ``_local_sorts_sized`` (the input made, selected, checked and held
unsorted: one ``get`` under a local scheduler), ``_here`` (the held chunks joined),
``_sort_whole`` (the sort).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import random_array, selection_args, timed_ms


def main() -> None:
    a = selection_args(__doc__.split("\n")[0]).parse_args()
    import cupy
    import dask

    import dask_compact
    from dask_compact import sort_graph

    sync = cupy.cuda.Device().synchronize
    steps: dict[str, list[float]] = {}

    def timed(name, fn):
        def run(*args, **kwargs):
            sync()
            t = time.perf_counter()
            out = fn(*args, **kwargs)
            sync()
            steps.setdefault(name, []).append((time.perf_counter() - t) * 1e3)
            return out
        return run

    xg = random_array(2**a.log2n, 2**a.chunk_log2, 11, True, f"sort-parts-{a.log2n}")
    selg = xg[xg < a.p]

    with dask.config.set(scheduler="threads"):
        for op, ours, lib in (("sort", dask_compact.sort, cupy.sort),
                              ("argsort", dask_compact.argsort, cupy.argsort)):
            calls = {f"{op} ours (whole call)": lambda: ours(selg),
                     f"{op} naive: {lib.__name__}(sel.compute())": lambda: lib(selg.compute()),
                     "naive part: sel.compute()": lambda: selg.compute(),
                     "sel.persist() (threads)": lambda: dask.persist(selg)}
            for name, f in calls.items():
                print(f"{name:45s} median {timed_ms(f, sync, a.reps):7.2f} ms", flush=True)
            real = {n: getattr(sort_graph, n) for n in ("_local_sorts_sized", "_here",
                                                        "_sort_whole")}
            for n, fn in real.items():
                setattr(sort_graph, n, timed(n, fn))
            try:
                ours(selg)
                steps.clear()
                for _ in range(a.reps):
                    ours(selg)
            finally:
                for n, fn in real.items():
                    setattr(sort_graph, n, fn)
            for n, ts in steps.items():
                print(f"{op} step {n:36s} median {statistics.median(ts):7.2f} ms "
                      f"min {min(ts):7.2f}", flush=True)
            steps.clear()


if __name__ == "__main__":
    main()
