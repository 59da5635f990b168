"""How fast one GPU worker receives another's device arrays, by the routes a sort's exchange
could take: Dask's own transfer (a task on worker B depending on arrays held by worker A, over
the cluster's protocol) and CUDA IPC (A exports a handle to each array's allocation, B maps it
and copies from it over NVLink with one ``cudaMemcpyAsync``).

    python benchmarks/exchange_probe.py --gpus 2 --protocol ucx --arrays 16 --mib 256

Prints one line per route and repetition: seconds, GB/s into B.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_STORE: dict = {}


def _make(n_arrays: int, mib: int, seed: int) -> list:
    import cupy

    rng = cupy.random.default_rng(seed)
    out = [rng.random(mib * 2**18, dtype=cupy.float32) for _ in range(n_arrays)]
    cupy.cuda.runtime.deviceSynchronize()
    return out


def _take(*arrays) -> float:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()
    return float(sum(int(a.nbytes) for a in arrays))


def _export(n_arrays: int, mib: int, seed: int) -> list:
    import cupy

    from dask_compact.backends.cuda_ipc import _base

    arrays = _make(n_arrays, mib, seed)
    _STORE[seed] = arrays
    out = []
    for a in arrays:
        ptr = a.data.ptr
        out.append((bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)), ptr - _base(ptr), a.nbytes))
    return out


def _busy(ms: float) -> None:
    """Queue about ``ms`` milliseconds of work on this worker's GPU and return at once."""
    import cupy

    a = _STORE.setdefault("busy", cupy.random.default_rng(0).random(2**28, dtype=cupy.float32))
    for _ in range(max(1, int(ms / 7))):  # cupy.sort of 2^28 float32: ~7 ms on an H100
        cupy.sort(a)


def _drop(seed: int) -> None:
    _STORE.pop(seed, None)


def _import(handles: list) -> dict:
    import cupy

    rt = cupy.cuda.runtime
    stream = cupy.cuda.Stream(non_blocking=True)
    t0 = time.perf_counter()
    opened = {}
    for h, _, _ in handles:
        if h not in opened:
            opened[h] = rt.ipcOpenMemHandle(h, rt.cudaIpcMemLazyEnablePeerAccess)
    t1 = time.perf_counter()
    outs = []
    for h, off, nbytes in handles:
        dst = cupy.empty(nbytes, cupy.uint8)
        rt.memcpyAsync(dst.data.ptr, opened[h] + off, nbytes, rt.memcpyDeviceToDevice,
                       stream.ptr)  # fmt: skip
        outs.append(dst)
    stream.synchronize()
    t2 = time.perf_counter()
    for p in opened.values():
        rt.ipcCloseMemHandle(p)
    t3 = time.perf_counter()
    return dict(open=t1 - t0, copy=t2 - t1, close=t3 - t2, mapped=len(opened),
                bytes=sum(n for _, _, n in handles))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--protocol", default="ucx")
    ap.add_argument("--arrays", type=int, default=16)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    from dask_cuda import LocalCUDACluster
    from distributed import Client, wait

    sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
    # By reference (this file run as __main__ would be pickled by value, each call with a
    # fresh _STORE, so the exported arrays would die as _export returns)
    from exchange_probe import _busy, _drop, _export, _import, _make, _take

    cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(args.gpus)),
                               threads_per_worker=1, dashboard_address=None,
                               device_memory_limit=None, protocol=args.protocol)  # fmt: skip
    with cluster, Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        dst, srcs = workers[0], workers[1:]
        print("workers", workers, flush=True)
        for shape in ((1, args.mib), (args.arrays, args.mib)):
            for rep in range(args.reps):
                seed = 1000 * rep + shape[0]
                # Dask's transfer: the arrays held by each source, one task on dst taking all
                futs = [client.submit(_make, shape[0], shape[1], seed + i, workers=[s],
                                      pure=False)  # fmt: skip
                        for i, s in enumerate(srcs)]
                wait(futs)
                parts = [client.submit(lambda v, i=i: v[i], f, workers=[s], pure=False)
                         for f, s in zip(futs, srcs) for i in range(shape[0])]
                wait(parts)
                t0 = time.perf_counter()
                nbytes = client.submit(_take, *parts, workers=[dst], pure=False).result()
                dt = time.perf_counter() - t0
                print(f"dask {args.protocol} {len(srcs)} src x {shape[0]} x {shape[1]} MiB rep "
                      f"{rep}: {dt:.4f} s, {nbytes / dt / 1e9:.1f} GB/s into dst", flush=True)
                del parts, futs
                # CUDA IPC: sources export handles, dst maps, copies, unmaps
                handles = []
                for i, s in enumerate(srcs):
                    handles += client.run(_export, shape[0], shape[1], seed + 100 + i,
                                          workers=[s])[s]  # fmt: skip
                t0 = time.perf_counter()
                r = client.run(_import, handles, workers=[dst])[dst]
                dt = time.perf_counter() - t0
                print(f"ipc {len(srcs)} src x {shape[0]} x {shape[1]} MiB rep {rep}: "
                      f"{dt:.4f} s whole run ({r['bytes'] / dt / 1e9:.1f} GB/s); inside: "
                      f"open {r['open'] * 1e3:.2f} ms ({r['mapped']} mappings), copy "
                      f"{r['copy'] * 1e3:.2f} ms ({r['bytes'] / r['copy'] / 1e9:.1f} GB/s), "
                      f"close {r['close'] * 1e3:.2f} ms", flush=True)
                for i, s in enumerate(srcs):
                    client.run(_drop, seed + 100 + i, workers=[s])
        # What mapping costs: one allocation of each size, with both GPUs idle, with the
        # exporting GPU busy, with the importing GPU busy
        src = srcs[0]
        for mib in (256, 1024, 4096):
            for busy in ("idle", "exporter busy", "importer busy"):
                seed = 7000 + mib + len(busy)
                handles = client.run(_export, 1, mib, seed, workers=[src])[src]
                if busy != "idle":
                    client.run(_busy, 150, workers=[src if busy.startswith("exp") else dst])
                r = client.run(_import, handles, workers=[dst])[dst]
                print(f"map one {mib} MiB allocation, {busy}: open {r['open'] * 1e3:.2f} ms, "
                      f"copy {r['copy'] * 1e3:.2f} ms, close {r['close'] * 1e3:.2f} ms",
                      flush=True)  # fmt: skip
                client.run(_drop, seed, workers=[src])
                client.run(lambda: __import__("cupy").cuda.runtime.deviceSynchronize())


if __name__ == "__main__":
    main()
