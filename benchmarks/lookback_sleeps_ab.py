"""A/B of the single-pass look-back's sleeps (``kernels/lookback.cuh``) through the public calls,
in one process, arms alternating round by round.

    python benchmarks/lookback_sleeps_ab.py --peer-lib build/cub_peer.so --out DIR [--rounds 5]
    (the peer: nvcc -O3 -arch=sm_90 -std=c++17 -shared -Xcompiler -fPIC -cudart static \\
         -o build/cub_peer.so benchmarks/peers/cub_peer.cu)

Arms, set with ``cupy_tuning.override_lookback_sleeps`` for the run only (never the table):

* ``off``: the kernel as shipped (a poll every 20 ns, no sleep before the first read);
* ``cub``: CUB's sleeps for sm_90 floats (1140 ns before the first read, 688 ns per poll), as
  the patched kernel of ``results/2026-12-01_h200_31c3bfe_compaction_lookback_sleeps_ab.md``;
* ``miss``: polls of 688 ns, 1140 ns slept only where the first read found a predecessor that
  had published nothing (so the count-first path, whose words are all published before its
  launch, never sleeps).

Each round runs every arm in turn (off, cub, miss, off, cub, miss, ...), and in each: float32
at 2^20 and 2^28, p = .05 / .5 / .95 of uniform random data, ``compact_array(a, lambda v: v < p)``
and ``compact_into`` into the caller's n-sized buffer and count, timed as ``public_calls.py``
times them (its ``timed_us``: the call, then a device synchronisation; median of the
repetitions, inputs rotated over buffers). At every switch the kept ready and repeated calls
are dropped (``cupy_backend.forget_ready_calls``), so each call runs its arm's kernel; each
arm's results are checked against CuPy's ``a[a < p]`` in the first round. CUB
``DeviceSelect::If`` into a preallocated buffer (the peer library) is timed once per round,
the scale and the device's drift between rounds. Well under a minute on one H200 (estimated,
not yet run: NVRTC builds each arm's modules in its first round; five rounds of timing take
a few seconds).

Prints a markdown table (each arm's median over the rounds, in brackets off's time over the
arm's: > 1 is faster than off; CUB's in its own column), then every round's times, and writes
both to ``--out`` (a ``.md`` path, or a directory: ``lookback-sleeps-ab-DATE-DEVICE-SHA.md``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from pathlib import Path

import numpy as np

# name -> (poll, wait) of cupy_tuning.override_lookback_sleeps; None: the kernel's defaults
ARMS = {"off": None, "cub": (688, 1140), "miss": (688, -1140)}
CALLS = ("compact_array", "compact_into")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-lib", default=None, help="CUB peer library (cub_peer.so)")
    ap.add_argument("--out", default="benchmarks/results",
                    help="the table's .md path, or a directory for it")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every arm (at least 3)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"of {', '.join(ARMS)}, in order")
    ap.add_argument("--sizes", default="20,28", help="log2 of the element counts")
    ap.add_argument("--ps", default="0.05,0.5,0.95", help="selected fractions")
    ap.add_argument("--reps-small", type=int, default=400, help="repetitions up to 2^22")
    ap.add_argument("--reps-large", type=int, default=50, help="repetitions above 2^22")
    ap.add_argument("--sha", default="", help="the commit, for the title (default: git's)")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3")
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown or len(args.arms.split(",")) < 2:
        ap.error(f"--arms: two or more of {', '.join(ARMS)}; got {args.arms!r}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # imported after the arguments are parsed, so --help needs no GPU
    import cupy

    from dask_compact import compact_array, compact_into
    from dask_compact.backends import cupy_backend, cupy_tuning

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_common import git_sha
    from gpu_kernels import CubPeer
    from public_calls import timed_us

    arms = args.arms.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    ps = [float(p) for p in args.ps.split(",")]
    peer = CubPeer(args.peer_lib) if args.peer_lib else None
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    sha = args.sha or git_sha()
    dtype = np.dtype(np.float32)

    data = {}
    for log2n in sizes:
        n = 1 << log2n
        nbuf = max(1, min(16, (1 << 30) // (n * dtype.itemsize)))
        rng = cupy.random.default_rng(log2n)
        bufs = [rng.random(n, dtype=np.float32) for _ in range(nbuf)]
        reps = args.reps_small if log2n <= 22 else args.reps_large
        temp = cupy.empty(peer.temp_bytes(dtype.name, n), dtype=np.uint8) if peer else None
        data[log2n] = (bufs, nbuf, reps, cupy.empty(n, dtype), cupy.zeros(1, np.int64),
                       cupy.zeros(1, np.uint64), temp)

    # (arm or "CUB If", call, log2n, p) -> one median per round
    times: dict[tuple, list[float]] = {}
    try:
        for r in range(args.rounds):
            for arm in arms:
                sleeps = ARMS[arm]
                cupy_tuning.override_lookback_sleeps(*(sleeps or (None,)))
                cupy_backend.forget_ready_calls()
                for log2n in sizes:
                    bufs, nbuf, reps, out, count, _, _ = data[log2n]
                    for p in ps:
                        def pred(v, p=p):
                            return v < p

                        if r == 0:
                            check(cupy, bufs[0], pred, p, out, count, arm, log2n)
                        fns = {
                            "compact_array": lambda k: compact_array(bufs[k], pred),
                            "compact_into": lambda k: compact_into(bufs[k], pred, out,
                                                                   count=count),
                        }
                        for call, fn in fns.items():
                            us = timed_us(fn, nbuf, reps)
                            times.setdefault((arm, call, log2n, p), []).append(us)
                            print(f"round {r} {arm:4s} 2^{log2n} p={p}: {call:14s} "
                                  f"{us:9.1f} us", flush=True)
            cupy_tuning.override_lookback_sleeps(None)
            cupy_backend.forget_ready_calls()
            if peer is not None:
                for log2n in sizes:
                    bufs, nbuf, reps, out, _, ucount, temp = data[log2n]
                    for p in ps:
                        us = timed_us(lambda k: peer.select_if(dtype.name, bufs[k], out, ucount,
                                                               p, temp), nbuf, reps)
                        times.setdefault(("CUB If", "", log2n, p), []).append(us)
                        print(f"round {r} CUB If 2^{log2n} p={p}: {us:9.1f} us", flush=True)
    finally:
        cupy_tuning.override_lookback_sleeps(None)
        cupy_backend.forget_ready_calls()

    lines = report(times, arms, sizes, ps, args.rounds, device, sha, peer is not None)
    text = "\n".join(lines) + "\n"
    print(text)
    out_path = Path(args.out)
    if out_path.suffix != ".md":
        out_path.mkdir(parents=True, exist_ok=True)
        out_path = out_path / (f"lookback-sleeps-ab-{dt.date.today()}-"
                               f"{device.replace(' ', '_')}-{sha}.md")
    else:
        out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    print(f"written: {out_path}")


def check(cupy, a, pred, p: float, out, count, arm: str, log2n: int) -> None:
    """The arm's compact_array and compact_into against CuPy's ``a[a < p]``."""
    from dask_compact import compact_array, compact_into

    want = a[a < p]
    got = compact_array(a, pred)
    k = int(compact_into(a, pred, out, count=count).get()[0])
    ok = (got.size == want.size == k and bool((got == want).all())
          and bool((out[:k] == want).all()))
    if not ok:
        raise SystemExit(f"arm {arm}, 2^{log2n}, p={p}: the result differs from a[a < p]")


def report(times: dict[tuple, list[float]], arms: list[str], sizes: list[int], ps: list[float],
           rounds: int, device: str, sha: str, cub: bool) -> list[str]:
    """The markdown: medians over rounds with ratios to off, then every round's times."""
    med = {k: statistics.median(v) for k, v in times.items()}
    base = arms[0]
    head = ["call", "size", "p", *(f"{a} us" + ("" if a == base else f" ({base}/{a})")
                                   for a in arms)]
    if cub:
        head.append("CUB If us")
    lines = [f"# Look-back sleeps A/B {dt.date.today()}: {device}, sha {sha}", "",
             f"float32, public calls timed as public_calls.py (call + device sync, median); "
             f"{rounds} rounds of arms {' / '.join(arms)} in one process, the median over "
             f"rounds; in brackets {base}'s time over the arm's (> 1: the arm is faster). "
             "Arms: " + "; ".join(f"{a} = {_arm_words(a)}" for a in arms) + ".", "",
             "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for call in CALLS:
        for log2n in sizes:
            for p in ps:
                cells = [call, f"2^{log2n}", f"{p}"]
                b = med.get((base, call, log2n, p))
                for a in arms:
                    m = med.get((a, call, log2n, p))
                    if m is None:
                        cells.append("")
                    elif a == base or not b:
                        cells.append(f"{m:.1f}")
                    else:
                        cells.append(f"{m:.1f} ({b / m:.3f}x)")
                if cub:
                    c = med.get(("CUB If", "", log2n, p))
                    cells.append("" if c is None else f"{c:.1f}")
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Every round (us, rounds in order):", "",
              "| arm | call | size | p | rounds |", "|---|---|---|---|---|"]
    for (arm, call, log2n, p), ts in times.items():
        lines.append(f"| {arm} | {call} | 2^{log2n} | {p} | "
                     f"{' / '.join(f'{t:.1f}' for t in ts)} |")
    return lines


def _arm_words(arm: str) -> str:
    sleeps = ARMS[arm]
    if sleeps is None:
        return "the kernel's defaults (20 ns polls, no first sleep)"
    poll, wait = sleeps
    first = (f"{wait} ns before the first read" if wait > 0
             else f"{-wait} ns after a first read that missed")
    return f"{poll} ns polls, {first}"


if __name__ == "__main__":
    main()
