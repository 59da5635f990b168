"""Multi-worker batch compaction: one worker per GPU, data born and compacted on the workers.

    python examples/multi_gpu.py                     # dask-cuda + CuPy, one worker per GPU
    python examples/multi_gpu.py --cpu --workers 4   # distributed.LocalCluster, NumPy chunks
    python examples/multi_gpu.py --scheduler tcp://HOST:8786   # `dask scheduler` +
                                                     # `dask cuda worker` on each GPU host

Every chunk is generated on a worker (CuPy or NumPy random numbers, seeded per chunk, so the
data never passes through the client), each worker owning one contiguous slab of the array as
a simulation's domain decomposition would, and persisted there. ``map_compact`` then compacts
in place: each worker is asked directly to compact its run of chunks on its GPU (no Dask
task), only the counts travel, and no chunk moves between workers. The script checks that
locality (no transfers in the task stream) and, with ``--check``, the result against NumPy
(small sizes: it gathers the data).
Without dask-cuda, CuPy or a GPU it falls back to the CPU mode.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from typing import Any

import dask.array as da
import numpy as np
from distributed import Client, get_task_stream, wait

import dask_compact


def make_block(seed: int, gpu: bool, block_info: Any = None) -> Any:
    """One chunk of uniform float32 in [0, 1), generated where the task runs."""
    (i,) = block_info[None]["chunk-location"]
    ((start, stop),) = block_info[None]["array-location"]
    if gpu:
        import cupy

        return cupy.random.default_rng(seed + i).random(stop - start, dtype=cupy.float32)
    return np.random.default_rng(seed + i).random(stop - start, dtype=np.float32)


def random_array(size: int, chunk: int, seed: int, gpu: bool) -> da.Array:
    """``size`` float32 in chunks of ``chunk``; chunk i is seeded ``seed + i``."""
    chunks = (chunk,) * (size // chunk) + ((size % chunk,) if size % chunk else ())
    if gpu:
        import cupy

        meta = cupy.empty((0,), dtype=cupy.float32)
    else:
        meta = np.empty((0,), dtype=np.float32)
    return da.map_blocks(make_block, seed, gpu, chunks=(chunks,), dtype=np.float32, meta=meta)


def gpus_usable() -> int:
    try:
        import cupy
        import dask_cuda  # noqa: F401 -- only whether it imports

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 -- no CuPy / dask-cuda, or no driver
        return 0


def start_cluster(cpu: bool, workers: int | None) -> tuple[Any, str]:
    if not cpu:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=workers)  # one worker process per GPU
        return cluster, f"LocalCUDACluster, {len(cluster.workers)} GPU workers"
    from distributed import LocalCluster

    cluster = LocalCluster(
        n_workers=workers or 2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    return cluster, f"LocalCluster, {len(cluster.workers)} worker processes (NumPy chunks)"


def born_on_workers(client: Client, size: int, chunk: int, seed: int, gpu: bool) -> da.Array:
    """One contiguous slab of whole chunks per worker, generated and persisted there; chunk i
    of the whole array is seeded ``seed + i`` wherever it lives."""
    workers = sorted(client.nthreads())
    nchunks = -(-size // chunk)
    per = -(-nchunks // len(workers))
    slabs = []
    for k, w in enumerate(workers):
        first, last = k * per, min(nchunks, (k + 1) * per)
        if last > first:
            n = min(size, last * chunk) - first * chunk
            slab = random_array(n, chunk, seed + first, gpu)
            slabs.append(client.persist(slab, workers=[w]))
    return da.concatenate(slabs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=2**28, help="elements (default 2^28)")
    ap.add_argument("--chunk", type=float, default=2**25, help="elements per chunk")
    ap.add_argument("--threshold", type=float, default=0.2, help="select x < THRESHOLD")
    ap.add_argument("--workers", type=int, help="workers (default: one per GPU; 2 with --cpu)")
    ap.add_argument("--cpu", action="store_true", help="LocalCluster with NumPy chunks")
    ap.add_argument("--scheduler", help="address of a running scheduler (multi-node cluster)")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--check", action="store_true", help="compare with NumPy (gathers data)")
    args = ap.parse_args(argv)
    size, chunk = int(args.size), int(args.chunk)

    cpu = args.cpu or gpus_usable() == 0
    if cpu and not args.cpu:
        print("no GPU with CuPy and dask-cuda here: running the CPU mode")
    if args.scheduler:
        cluster, what = contextlib.nullcontext(), f"scheduler {args.scheduler}"
    else:
        cluster, what = start_cluster(cpu, args.workers)
    with cluster, Client(args.scheduler or cluster) as client:
        if args.scheduler:
            what += f", {len(client.nthreads())} workers"
        x = born_on_workers(client, size, chunk, args.seed, gpu=not cpu)
        print(f"cluster:   {what}")
        print(
            f"input:     {size:,} float32 ({x.nbytes / 1e9:.3f} GB) in {x.npartitions} chunks "
            f"of {chunk:,}, generated on the workers, one slab each"
        )

        t0 = time.perf_counter()
        x = x.persist()
        wait(x)
        t1 = time.perf_counter()
        # The threshold is part of the predicate's constants, so every run gets new keys.
        with get_task_stream() as stream:
            y = dask_compact.map_compact(x, lambda v: v < args.threshold)
            y = y.persist()
            wait(y)
        t2 = time.perf_counter()

        n = int(y.shape[0])
        moved = sum(s["action"] == "transfer" for t in stream.data for s in t["startstops"])
        tasks = sum(t["key"][0].startswith("compact") for t in stream.data)
        print(
            f"selected:  {n:,} of {size:,} ({n / size:.2%}) where x < {args.threshold}; "
            f"{y.npartitions} output chunks of known sizes {min(y.chunks[0]):,}.."
            f"{max(y.chunks[0]):,}"
        )
        print(
            f"timing:    generate {t1 - t0:.3f} s, compact {t2 - t1:.3f} s "
            f"({x.nbytes / 1e9 / (t2 - t1):.2f} GB/s of input)"
        )
        if "-direct-" in y.name:  # each worker asked for its chunks directly: no Dask task
            print(
                f"phase 1:   {len(client.nthreads())} workers asked directly for their "
                f"{x.npartitions} chunks, {tasks} compaction tasks, {y.npartitions} output chunks"
            )
        else:
            print(
                f"tasks:     {tasks} compaction tasks for {x.npartitions} chunks on "
                f"{len(client.nthreads())} workers"
            )
        print(f"locality:  {moved} chunk transfers between workers")

        ok = moved == 0
        if args.check:
            xs, ys = x.compute(), y.compute()
            if not cpu:
                xs, ys = xs.get(), ys.get()
            expected = xs[xs < args.threshold]
            good = ys.shape == expected.shape and bool(np.array_equal(ys, expected))
            print(
                f"check:     {'OK' if good else 'MISMATCH'} against NumPy x[x < {args.threshold}]"
            )
            ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
