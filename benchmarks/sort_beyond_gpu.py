"""Sort an array larger than one GPU's memory on several GPUs (dask_compact.sort, CuPy chunks).

The array: float32, ``--factor`` (default 1.5) times the memory of one GPU, in chunks of
2^``--chunk-log2``, generated on the workers and never persisted (each chunk is made where a
task needs it, so the input never sits anywhere whole). The cluster: a dask-cuda
LocalCUDACluster of ``--gpus`` GPUs, one worker each, spilling device memory to the host past
``--device-limit`` (a fraction of a GPU's memory) as dask-cuda does. The naive route, shown to
fail first: ``x.compute()`` + ``cupy.sort`` needs the whole array on one GPU, and one GPU
cannot even allocate it (``cupy.empty`` raises OutOfMemoryError).

One allocator on each GPU (``--rmm async``, the default): dask-cuda moves a spilled chunk back
to the device through distributed's deserializer, which allocates with RMM where it is
installed, else with numba's ``cuMemAlloc``; without RMM the first run (62d0e40, 2x H100)
failed there with CUDA_ERROR_OUT_OF_MEMORY while the device's free memory sat in CuPy's own
pool (cached blocks of the arrays just spilled). With ``rmm_async=True`` and
``rmm_allocator_external_lib_list=["cupy"]`` CuPy and the deserializer share RMM's pool of
``cudaMallocAsync``.

Timed: ``dask_compact.sort(x)`` until every output chunk is held. Checked on the workers,
chunk by chunk: every output chunk sorted, chunks in order across the array, the same number
of elements as the input, and the same multiset (two order-independent sums of the elements'
bit patterns, mod 2^64, input against output). Reported: the times, what the workers spilled
to the host, and the peak device memory of each GPU (nvidia-smi, sampled every 0.2 s).

    python benchmarks/sort_beyond_gpu.py --gpus 2 --out benchmarks/results

Writes ``sort-beyond-gpu-DATE-DEVICE-SHA.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import git_sha
from bench_common import random_array as generated
from sort_bench import _sorted_and_held, _summary

MASK = (1 << 64) - 1


def _checksum(b) -> Any:
    """(count, sum of bits, sum of mixed bits) of one chunk, mod 2^64, as a (1, 3) uint64
    NumPy array: both sums are the same for any order of the same elements."""
    xp = np
    if type(b).__module__.startswith("cupy"):
        import cupy as xp
    u = b.view(xp.uint32).astype(xp.uint64)
    mixed = (u * xp.uint64(0x9E3779B97F4A7C15)) ^ (u << xp.uint64(29)) ^ xp.uint64(0x5BD1E995)
    s1 = int(u.sum(dtype=xp.uint64))
    s2 = int((mixed * mixed).sum(dtype=xp.uint64))
    return np.array([[len(b), s1 & MASK, s2 & MASK]], dtype=np.uint64)


def checksums(x) -> tuple[int, int, int]:
    s = x.map_blocks(_checksum, new_axis=1, chunks=((1,) * x.numblocks[0], (3,)),
                     dtype=np.uint64, meta=np.empty((0, 3), np.uint64)).compute()  # fmt: skip
    total = (int(sum(map(int, s[:, k]))) & MASK for k in (1, 2))
    return (int(s[:, 0].sum()), *total)


class GpuMemory:
    """Peak memory used per GPU (MiB), from ``nvidia-smi`` sampling in the background."""

    def __init__(self, period_ms: int = 200) -> None:
        self.peak: dict[int, int] = {}
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
             f"-lms={period_ms}"], stdout=subprocess.PIPE, text=True)  # fmt: skip
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                i, used = (int(v) for v in line.split(","))
            except ValueError:
                continue
            self.peak[i] = max(self.peak.get(i, 0), used)

    def stop(self) -> dict[int, int]:
        self.proc.terminate()
        self.proc.wait()
        return dict(sorted(self.peak.items()))


def _spilled(dask_worker=None) -> dict:
    """What this worker holds: keys and bytes on the device, on the host (spilled), on disk."""
    from dask.sizeof import sizeof

    data = dask_worker.data
    out = {}
    for tier in ("device", "host", "disk"):
        d = getattr(data, tier, None)
        if d is not None:
            out[tier] = (len(d), None if tier == "disk" else sum(sizeof(v) for v in d.values()))
    return out


def _watch(client, done: threading.Event, t0: float, period: float = 15.0) -> None:
    """Every ``period`` s until ``done``: what each worker holds, so a run cut short by a
    time limit still tells how far it got."""
    while not done.wait(period):
        try:
            held = client.run(_spilled)
        except Exception as e:  # noqa: BLE001 -- progress only
            held = repr(e)
        print(f"[{time.perf_counter() - t0:.0f} s] {held}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--factor", type=float, default=1.5, help="array bytes / one GPU's memory")
    ap.add_argument("--chunk-log2", type=int, default=28)
    ap.add_argument("--device-limit", type=float, default=0.6,
                    help="dask-cuda's device_memory_limit, a fraction of a GPU's memory")
    ap.add_argument("--protocol", default="tcp", choices=["tcp", "ucx"])
    ap.add_argument("--rmm", default="async", choices=["async", "none"],
                    help="async: CuPy and dask's deserializer allocate from RMM's async pool; "
                    "none: CuPy's own pool (spilled chunks come back through numba's allocator)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sha", default=None)
    args = ap.parse_args()
    sha = args.sha or git_sha()

    import cupy

    ngpu = cupy.cuda.runtime.getDeviceCount()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode()
    gpu_bytes = cupy.cuda.Device(0).mem_info[1]
    chunk = 2**args.chunk_log2
    nchunks = math.ceil(args.factor * gpu_bytes / (4 * chunk))
    n = nchunks * chunk
    host_bytes = int(subprocess.run(["awk", "/MemTotal/ {print $2}", "/proc/meminfo"],
                                    capture_output=True, text=True).stdout) * 1024  # fmt: skip
    lines = [f"# dask_compact.sort beyond one GPU's memory, {args.gpus}x {name}, "
             f"{dt.date.today()}, git {sha}", ""]  # fmt: skip
    lines.append(f"- GPUs present {ngpu}, used {args.gpus}; one GPU's memory "
                 f"{gpu_bytes / 2**30:.1f} GiB; host memory {host_bytes / 2**30:.0f} GiB")
    lines.append(f"- array: {n:,} float32 = {4 * n / 2**30:.1f} GiB = "
                 f"{4 * n / gpu_bytes:.2f}x one GPU's memory, {nchunks} chunks of 2^"
                 f"{args.chunk_log2}, generated on the workers (uniform [0, 1), seeded per "
                 "chunk), not persisted")
    print("\n".join(lines), flush=True)
    if args.gpus > ngpu:
        raise SystemExit(f"{args.gpus} GPUs asked, {ngpu} present")

    # the naive route: the whole array on one GPU
    try:
        cupy.empty(n, cupy.float32)
        naive = "allocated (the array fits one GPU: raise --factor)"
    except cupy.cuda.memory.OutOfMemoryError as e:
        naive = f"`cupy.empty({n}, float32)` on one GPU raises OutOfMemoryError ({e})"
    cupy.get_default_memory_pool().free_all_blocks()
    lines.append(f"- naive route (`x.compute()` then `cupy.sort`): {naive}")
    print(lines[-1], flush=True)

    from dask_cuda import LocalCUDACluster
    from distributed import Client

    import dask_compact

    limit = int(args.device_limit * gpu_bytes)
    lines.append(f"- cluster: LocalCUDACluster, {args.gpus} workers of one thread, protocol "
                 f"{args.protocol}, device_memory_limit {limit / 2**30:.1f} GiB per GPU "
                 "(spilled to host memory beyond it), memory_limit auto, allocator: "
                 + ("RMM async pool, CuPy's allocations included" if args.rmm == "async"
                    else "CuPy's memory pool"))  # fmt: skip
    print(lines[-1], flush=True)
    t_start = time.perf_counter()
    cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(args.gpus)), threads_per_worker=1,
                               dashboard_address=None, device_memory_limit=limit,
                               protocol=args.protocol,
                               **(dict(rmm_async=True, rmm_allocator_external_lib_list=["cupy"])
                                  if args.rmm == "async" else {}))  # fmt: skip
    with cluster, Client(cluster) as client:
        workers = set(client.scheduler_info()["workers"])
        lines.append(f"- cluster start {time.perf_counter() - t_start:.1f} s")
        x = generated(n, chunk, 11, True, f"sort-beyond-input-{n}-{chunk}")
        t = time.perf_counter()
        want = checksums(x)
        t_in = time.perf_counter() - t
        lines.append(f"- input checksums (one pass generating every chunk) {t_in:.1f} s")
        print(lines[-1], flush=True)

        mem = GpuMemory()
        done = threading.Event()
        t = time.perf_counter()
        watch = threading.Thread(target=_watch, args=(client, done, t), daemon=True)
        watch.start()
        phases: list = []
        try:
            y = _sorted_and_held(dask_compact.sort, x, phases)
        finally:
            done.set()
        t_sort = time.perf_counter() - t
        peak = mem.stop()
        steps = " / ".join(f"{d:.1f}" for d in phases[0]) if phases else "n/a"
        held = client.run(_spilled)
        lines.append(f"- **sort: {t_sort:.1f} s** until every output chunk was held "
                     f"({4 * n / t_sort / 1e9:.2f} GB/s of input), {y.numblocks[0]} output "
                     f"chunks; steps (local sorts and sample / histogram / exchange and "
                     f"merges): {steps} s")
        lines.append("- peak device memory used during the sort (nvidia-smi): "
                     + ", ".join(f"GPU {i} {v / 1024:.1f} GiB" for i, v in peak.items()))
        lines.append("- held after the sort, per worker (keys, bytes): " + "; ".join(
            f"{w.rsplit(':', 1)[-1]}: " + ", ".join(
                f"{tier} {k}" + (f" / {b / 2**30:.1f} GiB" if b is not None else "")
                for tier, (k, b) in h.items()) for w, h in held.items()))  # fmt: skip
        print("\n".join(lines[-3:]), flush=True)

        t = time.perf_counter()
        s = y.map_blocks(_summary, new_axis=1, chunks=((1,) * y.numblocks[0], (4,)),
                         dtype=float, meta=np.empty((0, 4))).compute()  # fmt: skip
        got = checksums(y)
        t_check = time.perf_counter() - t
        ok = {
            "elements": int(s[:, 0].sum()) == n and got[0] == n,
            "every chunk sorted": bool(s[:, 1].all()),
            "chunks in order": bool(np.all(s[1:, 2] >= s[:-1, 3])),
            "same multiset (checksums)": got == want,
            "no worker lost": set(client.scheduler_info()["workers"]) == workers,
        }
        lines.append(f"- checks ({t_check:.1f} s, on the workers): "
                     + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in ok.items()))
        print(lines[-1], flush=True)
        del y
    lines.append(f"- result: {'PASS' if all(ok.values()) else 'FAIL'}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / (f"sort-beyond-gpu-{dt.date.today()}-{args.gpus}x{name.replace(' ', '_')}"
                       f"-{sha}.md")  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    print(lines[-1], path, flush=True)
    if not all(ok.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
