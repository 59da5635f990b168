"""Where an eager ``map_compact`` call's time goes on the direct path, by chunk count.

A diagnostic (issue 12's one-GPU overhead), not a peer comparison (``dask_gpu.py`` is the
benchmark): on one worker (``LocalCUDACluster``; ``--cpu``: a ``LocalCluster`` of one
process and NumPy chunks) holding 2^``--log2n`` float32 persisted in each chunk count of
``--chunks``, the worker's phase-1 functions are wrapped (``direct.compact_held_runs``, the
compaction of its runs, ending with the host sync that reads the counts; and
``direct._register_from``, the registration of its pieces with the scheduler, which runs
beside it) and each call is cut, on the host's one monotonic clock, into: the request's way
to the worker (call start to the compaction's start), the compaction, how long the answer
then waited for the registration, and the rest (the answer's way back and the client's
futures and array). Then, as ``multi_gpu_scaling.py`` ends each call, a device
synchronisation on the worker through ``client.run`` (its own column). ``--lambda``: the
predicate a new ``lambda v, t=t: v < t`` each call (``multi_gpu_scaling.py``'s) instead of
a new string.

    python benchmarks/direct_call_parts.py [--cpu] [--log2n 30] [--chunks 4,16] [--reps 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def _install(dask_worker=None) -> None:
    import dask_compact.direct as d

    log = dask_worker._dcx_parts = []
    register, run = d._register_from, d.compact_held_runs

    async def timed_register(*args, **kwargs):
        t0 = time.perf_counter()
        ok = await register(*args, **kwargs)
        log.append(("register", t0, time.perf_counter()))
        return ok

    def timed_run(*args, **kwargs):
        t0 = time.perf_counter()
        out = run(*args, **kwargs)
        log.append(("compact", t0, time.perf_counter()))
        return out

    d._register_from, d.compact_held_runs = timed_register, timed_run


def _take(dask_worker=None) -> list:
    log, dask_worker._dcx_parts[:] = list(dask_worker._dcx_parts), []
    return log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--log2n", type=int, default=30)
    ap.add_argument("--chunks", default="4,16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--lambda", dest="lam", action="store_true")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
    from bench_common import random_array, sync_device
    from distributed import Client, LocalCluster, wait

    import dask_compact  # noqa: F401 -- map_compact on dask arrays

    if args.cpu:
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
    else:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=1, dashboard_address=None)
    n = 1 << args.log2n
    with cluster, Client(cluster) as client:
        client.run(_install)
        (worker,) = client.scheduler_info()["workers"]
        print("| chunks | call ms | to the worker | compaction | waiting for the registration "
              "| answer and client | registration ms (beside) | device sync by client.run |")
        print("|---|---|---|---|---|---|---|---|")
        for chunks in map(int, args.chunks.split(",")):
            x = random_array(n, n // chunks, seed=chunks, gpu=not args.cpu,
                             name=f"parts-input-{chunks}").persist()
            wait(x)
            x.map_compact("x < 0.5")  # placement asked and kernels built once
            client.run(_take)
            rows = []
            for r in range(args.reps):
                t = 0.5 + (r + 1) * 1e-6
                pred = (lambda v, t=t: v < t) if args.lam else f"x < {t}"
                t0 = time.perf_counter()
                y = x.map_compact(pred)
                t1 = time.perf_counter()
                client.run(sync_device)
                t2 = time.perf_counter()
                del y
                parts = {name: (a, b) for name, a, b in client.run(_take)[worker]}
                (c0, c1), (r0, r1) = parts["compact"], parts["register"]
                rows.append((t1 - t0, c0 - t0, c1 - c0, max(0.0, r1 - c1), t1 - max(c1, r1),
                             r1 - r0, t2 - t1))
            med = [1e3 * statistics.median(col) for col in zip(*rows)]
            print(f"| {chunks} | " + " | ".join(f"{m:.2f}" for m in med) + " |", flush=True)
            del x


if __name__ == "__main__":
    main()
