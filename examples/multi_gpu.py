"""Multi-worker batch compaction: one worker per GPU, data born and compacted on the workers.

    python examples/multi_gpu.py                     # dask-cuda + CuPy, one worker per GPU
    python examples/multi_gpu.py --cpu --workers 4   # distributed.LocalCluster, NumPy chunks

Every chunk is generated on a worker (CuPy or NumPy random numbers, seeded per chunk, so the
data never passes through the client), persisted there, and compacted by ``map_compact`` in
place: phase 1 runs where each chunk lives, only the per-chunk counts travel, and each output
chunk stays on the worker (GPU) that holds its input chunk. The script checks that locality
and, with ``--check``, the result against NumPy (small sizes: it gathers the data).
Without dask-cuda, CuPy or a GPU it falls back to the CPU mode.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import dask.array as da
import numpy as np
from distributed import Client, wait

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

    cluster = LocalCluster(n_workers=workers or 2, threads_per_worker=1, processes=True,
                           dashboard_address=":0")
    return cluster, f"LocalCluster, {len(cluster.workers)} worker processes (NumPy chunks)"


def locality(client: Client, x: da.Array, y: da.Array) -> tuple[int, int]:
    """How many output chunks live on the worker that holds their input chunk."""
    wx, wy = client.who_has(x), client.who_has(y)  # persisted collections: key -> workers
    pairs = zip(x.__dask_keys__(), y.__dask_keys__())
    same = sum(bool(set(wx.get(a, ())) & set(wy.get(b, ()))) for a, b in pairs)
    return same, y.npartitions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=float, default=2**28, help="elements (default 2^28)")
    ap.add_argument("--chunk", type=float, default=2**25, help="elements per chunk")
    ap.add_argument("--threshold", type=float, default=0.2, help="select x < THRESHOLD")
    ap.add_argument("--workers", type=int, help="workers (default: one per GPU; 2 with --cpu)")
    ap.add_argument("--cpu", action="store_true", help="LocalCluster with NumPy chunks")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--check", action="store_true", help="compare with NumPy (gathers data)")
    args = ap.parse_args(argv)
    size, chunk = int(args.size), int(args.chunk)

    cpu = args.cpu or gpus_usable() == 0
    if cpu and not args.cpu:
        print("no GPU with CuPy and dask-cuda here: running the CPU mode")
    cluster, what = start_cluster(cpu, args.workers)
    with cluster, Client(cluster) as client:
        x = random_array(size, chunk, args.seed, gpu=not cpu)
        print(f"cluster:   {what}")
        print(f"input:     {size:,} float32 ({x.nbytes / 1e9:.3f} GB) in {x.npartitions} chunks "
              f"of {chunk:,}, generated on the workers")

        t0 = time.perf_counter()
        x = x.persist()
        wait(x)
        t1 = time.perf_counter()
        # The threshold is part of the predicate's constants, so every run gets new keys.
        y = dask_compact.map_compact(x, lambda v: v < args.threshold)
        y = y.persist()
        wait(y)
        t2 = time.perf_counter()

        n = int(y.shape[0])
        same, total = locality(client, x, y)
        print(f"selected:  {n:,} of {size:,} ({n / size:.2%}) where x < {args.threshold}; "
              f"{y.npartitions} output chunks of known sizes {min(y.chunks[0]):,}.."
              f"{max(y.chunks[0]):,}")
        print(f"timing:    generate {t1 - t0:.3f} s, compact {t2 - t1:.3f} s "
              f"({x.nbytes / 1e9 / (t2 - t1):.2f} GB/s of input)")
        print(f"locality:  {same}/{total} output chunks on the worker holding their input chunk")

        ok = same == total
        if args.check:
            xs, ys = x.compute(), y.compute()
            if not cpu:
                xs, ys = xs.get(), ys.get()
            expected = xs[xs < args.threshold]
            good = ys.shape == expected.shape and bool(np.array_equal(ys, expected))
            print(f"check:     {'OK' if good else 'MISMATCH'} against NumPy x[x < {args.threshold}]")
            ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
