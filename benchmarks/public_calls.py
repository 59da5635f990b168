"""The public GPU calls as a user times them, beside what that user would write instead.

Each row is one call as a user makes it, timed whole on the host: the call, then a device
synchronisation (the result is ready), median of many repetitions after warm-up, random
uniform data in [0, 1), inputs rotated over several buffers so that small sizes do not run
from L2 alone. Selection ``x < p`` for a fraction p. The repetitions of one size, dtype and p
are taken in ``--rounds`` rounds, every call timed in each round (its turn rotating), and the
median is over all of a call's rounds: a host that slows for a while (other processes on a
shared GPU host moved 2^20 calls by up to 1.5x between the calls of one run) then slows every
call's time a little instead of one call's a lot, so the ratios hold. The CSV keeps each
call's slowest and fastest round median beside it.

* ``compact_array``: ``dask_compact.compact_array(a, lambda v: v < p)`` (exact size), also
  with ``stable=False`` and ``output="indices"``, and with the string predicate ``"x < p"``.
* ``compact_into``: the same selection into the caller's n-sized buffer and count (what CUB
  does), values and indices.
* peers, in the same process on the same buffers: CUB ``DeviceSelect::If`` into a
  preallocated n-sized buffer (and ``Flagged`` for indices), ``torch.masked_select``, CuPy
  ``a[a < p]``, and a device copy of the bytes a compaction must move (the floor).

    python benchmarks/public_calls.py --peer-lib build/cub_peer.so --out DIR [--profile]
    (the peer: nvcc -O3 -arch=sm_90 -std=c++17 -shared -Xcompiler -fPIC -cudart static \\
         -o build/cub_peer.so benchmarks/peers/cub_peer.cu)

Prints a table of microseconds and ratios to CUB, saves it (markdown, CSV) and a throughput
chart (PNG) under --out. ``--profile`` also prints where the host time of 2^20 calls goes.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import sys
import time
from pathlib import Path

import cupy
import numpy as np

import dask_compact
from dask_compact import compact_array, compact_into

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import CubPeer  # noqa: E402 -- the same ctypes wrapper as the kernel benchmark

try:
    import torch
except Exception:  # noqa: BLE001 -- PyTorch is an optional peer
    torch = None


def timed_us(fn, nbuf: int, reps: int) -> list[float]:
    """Wall microseconds of ``reps`` calls ``fn(k)``, each followed by a device
    synchronisation, after a warm-up of three."""
    sync = cupy.cuda.Device().synchronize
    for k in range(3):
        fn(k % nbuf)
    sync()
    times = []
    for k in range(reps):
        t = time.perf_counter()
        fn(k % nbuf)
        sync()
        times.append((time.perf_counter() - t) * 1e6)
    return times


def timed_rounds(impls: dict, nbuf: int, reps: int, rounds: int) -> dict[str, list[list[float]]]:
    """Every call of ``impls`` timed in each of ``rounds`` rounds of ``reps // rounds``
    repetitions, round r starting at the r-th call, so that no call always follows the same
    one: ``{name: [round's times, ...]}``."""
    names = list(impls)
    per = max(1, reps // rounds)
    got: dict[str, list[list[float]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got[name].append(timed_us(impls[name], nbuf, per))
    return got


def bench(log2n: int, dtype: np.dtype, ps: list[float], peer: CubPeer | None, rows: list[dict],
          rounds: int = 3, budget_bytes: int = 1 << 30) -> None:
    n = 1 << log2n
    nbytes = n * dtype.itemsize
    nbuf = max(1, min(16, budget_bytes // nbytes))
    rng = cupy.random.default_rng(log2n)
    bufs = [rng.random(n, dtype=np.float64).astype(dtype) for _ in range(nbuf)]
    reps = 200 if log2n <= 22 else 30 if log2n <= 26 else 10
    out_v = cupy.empty(n, dtype=dtype)
    out_i = cupy.empty(n, dtype=np.int64)
    flags = cupy.empty(n, dtype=np.uint8)
    count = cupy.zeros(1, dtype=np.uint64)
    into_count = cupy.zeros(1, dtype=np.int64)
    temp = cupy.empty(peer.temp_bytes(dtype.name, n), dtype=np.uint8) if peer else None
    tbufs = [torch.as_tensor(b, device="cuda") for b in bufs] if torch is not None else None
    for p in ps:
        want = int((cupy.asnumpy(bufs[0]) < p).sum())
        got = compact_array(bufs[0], lambda v: v < p)
        assert got.size == want, (got.size, want)
        k_bytes = want * dtype.itemsize
        impls = {
            "compact_array": lambda k: compact_array(bufs[k], lambda v: v < p),
            "compact_array stable=False": lambda k: compact_array(bufs[k], lambda v: v < p,
                                                                  stable=False),
            "compact_array indices": lambda k: compact_array(bufs[k], lambda v: v < p,
                                                             output="indices"),
            "compact_array string": lambda k: compact_array(bufs[k], f"x < {p!r}"),
            "compact_into (caller buffers)": lambda k: compact_into(
                bufs[k], lambda v: v < p, out_v, count=into_count),
            "compact_into indices (caller buffers)": lambda k: compact_into(
                bufs[k], lambda v: v < p, out_i, output="indices", count=into_count),
            "cupy a[a < p]": lambda k: bufs[k][bufs[k] < p],
            "copy floor (n read + k written)": lambda k: cupy.cuda.runtime.memcpyAsync(
                out_v.data.ptr, bufs[k].data.ptr, (nbytes + k_bytes) // 2,
                cupy.cuda.runtime.memcpyDeviceToDevice, cupy.cuda.get_current_stream().ptr),
        }
        if peer is not None:
            impls["CUB If (preallocated)"] = lambda k: peer.select_if(
                dtype.name, bufs[k], out_v, count, p, temp)
            impls["CUB Flagged indices (preallocated)"] = lambda k: peer.flagged_idx(
                dtype.name, bufs[k], flags, out_i, count, p, temp)
        if tbufs is not None:
            impls["torch.masked_select"] = lambda k: torch.masked_select(tbufs[k],
                                                                         tbufs[k] < p)
        for name, got in timed_rounds(impls, nbuf, reps, rounds).items():
            us = float(np.median([t for times in got for t in times]))
            medians = [float(np.median(times)) for times in got]
            rows.append({"impl": name, "dtype": dtype.name, "log2n": log2n, "p": p, "us": us,
                         "gbps": (nbytes + k_bytes) / us / 1e3,
                         "round_min_us": min(medians), "round_max_us": max(medians)})
            print(f"2^{log2n} {dtype.name} p={p}: {name:36s} {us:10.1f} us "
                  f"(rounds {min(medians):.1f}-{max(medians):.1f})", flush=True)
    del bufs, tbufs, out_v, out_i, flags, temp
    cupy.get_default_memory_pool().free_all_blocks()


def profile(log2n: int = 20, calls: int = 3000) -> str:
    import cProfile
    import io
    import pstats

    a = cupy.random.default_rng(0).random(1 << log2n, dtype=np.float32)
    for _ in range(20):
        compact_array(a, lambda v: v < 0.5)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        compact_array(a, lambda v: v < 0.5)
    cupy.cuda.Device().synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
    return s.getvalue()


def table(rows: list[dict], dtype: str) -> list[str]:
    sizes = sorted({r["log2n"] for r in rows if r["dtype"] == dtype})
    ps = sorted({r["p"] for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    at = {(r["impl"], r["log2n"], r["p"]): r["us"] for r in rows if r["dtype"] == dtype}
    head = "| call | " + " | ".join(f"2^{s} p={p}" for s in sizes for p in ps) + " |"
    lines = [head, "|---" * (1 + len(sizes) * len(ps)) + "|"]
    for impl in impls:
        cells = []
        for s in sizes:
            for p in ps:
                us = at.get((impl, s, p))
                cub = at.get(("CUB Flagged indices (preallocated)" if "indices" in impl
                              else "CUB If (preallocated)", s, p))
                if us is None:
                    cells.append("")
                elif cub and "CUB" not in impl:
                    cells.append(f"{us:.1f} ({cub / us:.2f}x)")
                else:
                    cells.append(f"{us:.1f}")
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="20,24,28,30")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--ps", default="0.05,0.5,0.95")
    ap.add_argument("--peer-lib", default=None)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--sha", default="")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds each size, dtype and p is timed in, every call in each")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    peer = CubPeer(args.peer_lib) if args.peer_lib and os.path.exists(args.peer_lib) else None
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    ps = [float(p) for p in args.ps.split(",")]
    rows: list[dict] = []
    for dtype in args.dtypes.split(","):
        for s in args.sizes.split(","):
            bench(int(s), np.dtype(dtype), ps, peer, rows, args.rounds)
    stem = f"public-calls-{dt.date.today()}-{device.replace(' ', '_')}-{args.sha or 'nosha'}"
    with open(out / f"{stem}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Public GPU calls {dt.date.today()} — {device}, dask-compact "
             f"{dask_compact.__version__}, sha {args.sha}", "",
             "Wall microseconds per call including a device synchronisation (median over "
             f"{args.rounds} rounds, every call timed in each, its turn rotating); in "
             "brackets CUB's time over ours (> 1: we are faster). CUB writes into a "
             "preallocated n-sized buffer; every other call allocates its exact-size result.",
             ""]
    for dtype in args.dtypes.split(","):
        lines += [f"## {dtype}", "", *table(rows, dtype), ""]
    if args.profile:
        prof = profile()
        print(prof)
        lines += ["## Host profile of 3000 calls at 2^20 (float32, p=0.5)", "", "```",
                  prof.strip(), "```"]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = sorted((r["log2n"], r["gbps"]) for r in rows
                         if r["impl"] == impl and r["dtype"] == "float32" and r["p"] == 0.5)
            if pts:
                ax.plot([2 ** s for s, _ in pts], [g for _, g in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("elements (float32, p = 0.5)")
        ax.set_ylabel("GB/s (input read + output written, per whole call)")
        ax.set_title(f"Public calls vs peers, {device}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{stem}.png", dpi=110)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
