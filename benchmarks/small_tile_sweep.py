"""Tile shapes of the single-pass kernel at small sizes, through the public calls.

    python benchmarks/small_tile_sweep.py [--log2n 20,22] [--rounds 3] [--peer-lib LIB]

At 2^20 float32 the table's tile (512 threads x 32 elements, 16384 a tile) gives 64 tiles:
fewer blocks than an H100 has SMs. Each shape is set with ``cupy_tuning.override_tuning``
(for the run only, never the table), then ``compact_array`` (exact size) and ``compact_into``
(caller buffers) are timed as ``public_calls.py`` times them (the call and a device
synchronisation, median, inputs rotated over 16 buffers), shapes interleaved over rounds; CUB
``DeviceSelect::If`` and ``torch.masked_select`` in the same process give the scale.
A diagnostic behind a tuning decision (docs/design.md, "What is left", item 2).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import cupy
import numpy as np

from dask_compact import compact_array, compact_into
from dask_compact.backends import cupy_tuning

sys.path.insert(0, str(Path(__file__).parent))
from public_calls import timed_us  # noqa: E402

SHAPES = {4: [(512, 32), (256, 32), (512, 16), (256, 16), (128, 32), (128, 16), (256, 8)],
          8: [(256, 32), (256, 16), (128, 32), (128, 16), (256, 8), (128, 8)]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", default="20,22")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1500)
    ap.add_argument("--peer-lib", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    nbuf = 16
    cub = None
    if a.peer_lib:
        from gpu_kernels import CubPeer

        cub = CubPeer(a.peer_lib)
    try:
        import torch
    except Exception:  # noqa: BLE001 -- an optional peer
        torch = None
    results: dict[tuple, list[float]] = {}
    for log2n in (int(v) for v in a.log2n.split(",")):
        n = 1 << log2n
        for dt in a.dtypes.split(","):
            dtype = np.dtype(dt)
            bufs = [cupy.asarray(rng.random(n).astype(dtype)) for _ in range(nbuf)]
            p = a.p
            out = cupy.empty(n, dtype=dtype)
            count = cupy.zeros(1, dtype=np.int64)
            for r in range(a.rounds):
                for block, items in SHAPES[dtype.itemsize]:
                    cupy_tuning.override_tuning(dtype.itemsize,
                                                cupy_tuning.Tuning(block, items))

                    # a new predicate object per shape: a repeated call's ready state is
                    # cached per predicate object, not per tuning
                    def pred(v, p=p):
                        return v < p

                    try:
                        t1 = timed_us(lambda k: compact_array(bufs[k], pred), nbuf, a.reps)
                        t2 = timed_us(lambda k: compact_into(bufs[k], pred, out, count=count),
                                      nbuf, a.reps)
                        ok = bool((compact_array(bufs[0], pred) == bufs[0][bufs[0] < p]).all())
                    finally:
                        cupy_tuning.override_tuning(dtype.itemsize, None)
                    results.setdefault((log2n, dt, block, items, "compact_array"), []).append(t1)
                    results.setdefault((log2n, dt, block, items, "compact_into"), []).append(t2)
                    print(f"2^{log2n} {dt} {block}x{items} round {r}: compact_array {t1:.1f} us,"
                          f" compact_into {t2:.1f} us, exact {ok}", flush=True)
                if cub is not None:
                    temp = cupy.empty(cub.temp_bytes(dt, n), dtype=np.uint8)
                    results.setdefault((log2n, dt, 0, 0, "CUB If"), []).append(
                        timed_us(lambda k: cub.select_if(dt, bufs[k], out, count, float(p), temp),
                                 nbuf, a.reps))
                if torch is not None:
                    tb = [torch.as_tensor(b, device="cuda") for b in bufs]
                    results.setdefault((log2n, dt, 0, 0, "torch.masked_select"), []).append(
                        timed_us(lambda k: torch.masked_select(tb[k], tb[k] < float(p)),
                                 nbuf, a.reps))
    print("\n| size | dtype | shape | call | median us over rounds | rounds |")
    print("|---|---|---|---|---|---|")
    for (log2n, dt, block, items, call), ts in sorted(results.items()):
        shape = f"{block}x{items}" if block else "peer"
        print(f"| 2^{log2n} | {dt} | {shape} | {call} | {statistics.median(ts):.1f} | "
              f"{' / '.join(f'{t:.1f}' for t in ts)} |")


if __name__ == "__main__":
    main()
