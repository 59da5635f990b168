"""Where the host time of a small public call goes: each step of ``compact_array`` at 2^20
elements timed alone, on the same buffers, in one process.

A small call is bound by host work (launches, allocations, the one count readback), not by
bytes, so the steps are timed as a loop of many calls on the host clock, with one device
synchronisation per call where the step itself syncs and none where it does not; the rows
say which. Peers (CUB into a preallocated buffer, PyTorch, CuPy) are timed the same way.

    python benchmarks/small_call_parts.py [--peer-lib .whl/cub_peer.so] [--log2n 20]
        [--dtype float64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import cupy
import numpy as np

from dask_compact import compact_array, compact_into
from dask_compact.backends import cupy_backend as cb
from dask_compact.backends import cupy_calls as ck
from dask_compact.backends.cupy_device import head_copy, read_counts
from dask_compact.dispatch import compact_chunk
from dask_compact.predicate import as_predicate
from dask_compact.validate import check_algorithm, check_chunk_type, check_dtype, check_output

sys.path.insert(0, str(Path(__file__).parent))


def per_call_us(fn, reps: int = 3000) -> float:
    """Median over 5 batches of the mean host microseconds of ``fn()``."""
    for _ in range(50):
        fn()
    cupy.cuda.Device().synchronize()
    batches = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps // 5):
            fn()
        cupy.cuda.Device().synchronize()
        batches.append((time.perf_counter() - t) / (reps // 5))
    return float(np.median(batches)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=20)
    ap.add_argument("--peer-lib", default=None)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = ap.parse_args()
    n = 1 << args.log2n
    dt = np.dtype(args.dtype)
    a = cupy.random.default_rng(1).random(n, dtype=dt)
    stream = cupy.cuda.get_current_stream()
    sync = stream.synchronize
    pred_fn = lambda v: v < 0.5  # noqa: E731 -- one object, as a user's loop would hold
    p = as_predicate(pred_fn)
    compact_array(a, pred_fn)
    call = ck.one_read_call(a, p, "values", "single-pass")
    scratch = cupy.empty(n, dtype=dt)
    k = int(compact_array(a, pred_fn).size)
    words = cupy.zeros(64, dtype=np.uint64)
    rows: list[tuple[str, float]] = []

    def row(name: str, fn) -> None:
        us = per_call_us(fn)
        rows.append((name, us))
        print(f"{name:60s} {us:8.2f} us", flush=True)

    row("compact_array(a, pred) [public, syncs once]", lambda: compact_array(a, pred_fn))
    row("compact_array(a, new lambda each call)", lambda: compact_array(a, lambda v: v < 0.5))
    row("cupy_backend.compact (no public checks)",
        lambda: cb.compact(a, p, "values", True, "auto", 0))
    row("compact_chunk dispatch (what compact_array calls after its checks)",
        lambda: compact_chunk(a, p, "values", True, "auto", 0))
    row("compact_array(a, pred) again [order check]", lambda: compact_array(a, pred_fn))
    row("cached one-read call alone", lambda: call(a, 0))
    out = cupy.empty(n, dtype=dt)
    cnt = cupy.zeros(1, dtype=np.int64)
    row("compact_into(a, pred, out, count=c) [public, no sync]",
        lambda: compact_into(a, pred_fn, out, count=cnt))
    row("compact_into + stream sync", lambda: (compact_into(a, pred_fn, out, count=cnt), sync()))
    row("public checks (output, algorithm, type, dtype, predicate, check)",
        lambda: (check_output("values"), check_algorithm("auto", True),
                 check_chunk_type(a, "compact_array"), check_dtype(a.dtype),
                 as_predicate(pred_fn).check(a.dtype)))
    row("_one_read_call lookup", lambda: ck.one_read_call(a, p, "values", "single-pass"))
    row(f"cupy.empty(n, {dt.name})", lambda: cupy.empty(n, dtype=dt))
    row(f"cupy.empty(k, {dt.name})", lambda: cupy.empty(k, dtype=dt))
    row("memsetAsync 64 words", lambda: cupy.cuda.runtime.memsetAsync(
        words.data.ptr, 0, words.nbytes, stream.ptr))
    pk = call.kernel
    word = cupy.zeros(1, dtype=np.uint64)  # where the count lands (a device word here)
    row("packed launch of the kernel, zeroing of its words included (no sync)",
        lambda: pk.queue(a.data.ptr, 0, scratch.data.ptr, 0, word.data.ptr, stream.ptr))
    row("packed launch + sync", lambda: (
        pk.queue(a.data.ptr, 0, scratch.data.ptr, 0, word.data.ptr, stream.ptr), sync()))
    row("_read_counts (8-byte D2H + sync)", lambda: read_counts([word]))
    row("stream.synchronize() idle", sync)
    row("_head_copy(scratch, k) (alloc + D2D memcpy)", lambda: head_copy(scratch, k))
    dst = cupy.empty(k, dtype=dt)
    d2d = cupy.cuda.runtime.memcpyDeviceToDevice
    row("memcpyAsync D2D of k elements alone (no alloc, no sync)",
        lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, scratch.data.ptr,
                                              dt.itemsize * k, d2d,
                                              stream.ptr))
    row("memcpyAsync D2D of k elements + sync",
        lambda: (cupy.cuda.runtime.memcpyAsync(dst.data.ptr, scratch.data.ptr,
                                               dt.itemsize * k, d2d,
                                               stream.ptr), sync()))
    row("cupy.cuda.get_current_stream()", cupy.cuda.get_current_stream)
    row("cupy a[a < 0.5]", lambda: a[a < 0.5])
    try:
        import torch

        t = torch.as_tensor(a, device="cuda")
        row("torch.masked_select(t, t < 0.5) [syncs for the size]",
            lambda: torch.masked_select(t, t < 0.5))
    except Exception as e:  # noqa: BLE001 -- an optional peer
        print("torch:", e)
    if args.peer_lib and Path(args.peer_lib).exists():
        from gpu_kernels import CubPeer

        peer = CubPeer(args.peer_lib)
        out = cupy.empty(n, dtype=dt)
        cnt = cupy.zeros(1, dtype=np.uint64)
        temp = cupy.empty(peer.temp_bytes(dt.name, n), dtype=np.uint8)
        row("CUB If preallocated (no sync)",
            lambda: peer.select_if(dt.name, a, out, cnt, 0.5, temp))
        row("CUB If preallocated + sync",
            lambda: (peer.select_if(dt.name, a, out, cnt, 0.5, temp), sync()))
    import cProfile
    import io
    import pstats

    for name, fn in [("compact_into", lambda: compact_into(a, pred_fn, out, count=cnt)),
                     ("compact_array", lambda: compact_array(a, pred_fn))]:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        sync()
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"cProfile of 2000 {name} calls\n{text.getvalue()}")
    try:
        from cupyx.profiler import benchmark

        for name, fn in [("compact_array", lambda: compact_array(a, pred_fn)),
                         ("compact_into", lambda: compact_into(a, pred_fn, out, count=cnt))]:
            r = benchmark(fn, n_repeat=2000, n_warmup=50)
            print(f"cupyx benchmark {name}: cpu {np.median(r.cpu_times) * 1e6:.1f} us, "
                  f"gpu {np.median(r.gpu_times[0]) * 1e6:.1f} us")
    except Exception as e:  # noqa: BLE001 -- only a cross-check
        print("cupyx benchmark:", e)
    print("\n| step | host us per call |\n|---|---|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
