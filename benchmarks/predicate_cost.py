"""What a predicate costs on the GPU through the public call: its first call (with an empty
CuPy cache, the NVRTC compile of its kernels) and its time per call on a large array.

A script, not a test. For each dtype and predicate text: ``compact_array`` on 2^20 elements
once (wall time with its compile, or its load from CuPy's cache), then on ``--n`` elements
``--reps`` times (device synchronised around each call; median and minimum), checked against
NumPy's ``a[pred(a)]``. Point ``CUPY_CACHE_DIR`` at an empty folder for a cold first call.

    CUPY_CACHE_DIR=$(mktemp -d) python -P benchmarks/predicate_cost.py --label A --round 1

``--cpu`` times NumPy arrays instead (the compiled CPU loop), each beside NumPy's own
``x[pred(x)]`` in the same process.

For an A/B of a kernel header, run it once per arm in a fresh process, the arm's header in
the installed package's ``dask_compact/kernels`` and a cache folder per arm (round 1 cold,
round 2 warm): `2026-12-03_h200_8d4e24e_fmod_out_of_line_ab.md`. ``--items`` runs the
single-pass kernels with that many elements per thread, ``--variant`` with that look-back
schedule (a tile-shape or schedule A/B in one package).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

TEXTS = ("x < 0.5", "x % 5 == 1", "x // 7 == 2", "x % 0.75 < 0.25")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--texts", nargs="+", default=list(TEXTS))
    ap.add_argument("--n", type=int, default=2**26)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--label", default="", help="the arm's name, printed on each line")
    ap.add_argument("--round", default="1", help="printed on each line")
    ap.add_argument("--items", type=int, default=0,
                    help="single-pass elements per thread instead of the table's (same block)")
    ap.add_argument("--variant", choices=("classic", "early"),
                    help="single-pass look-back schedule instead of the table's")
    ap.add_argument("--cpu", action="store_true",
                    help="NumPy arrays (the compiled CPU loop), timed beside NumPy's x[pred(x)]")
    args = ap.parse_args()
    if args.cpu and (args.items or args.variant):
        ap.error("--items and --variant set the GPU kernels; --cpu runs none")
    import dask_compact as dc
    from dask_compact.backends import cupy_tuning
    from dask_compact.predicate.parse import CONSTANTS, FUNCTIONS  # the text's names, NumPy's

    if args.cpu:
        xp, sync = np, lambda: None
    else:
        import cupy

        from dask_compact.backends import cupy_exact

        if args.variant:  # what the plan asks the table for, for this process only
            cupy_exact.variant_for = lambda itemsize, cc=None: args.variant
        xp, sync = cupy, cupy.cuda.Device().synchronize
    for dtype in args.dtypes:
        if args.items:
            size = np.dtype(dtype).itemsize
            block = cupy_tuning.tuning_for("single-pass", size).block
            cupy_tuning.override_tuning(size, cupy_tuning.Tuning(block, args.items),
                                        ("single-pass",))
        host = (np.random.default_rng(5).standard_normal(args.n) * 50).astype(dtype)
        big = xp.asarray(host)
        small = big[: 2**20].copy()
        for text in args.texts:
            sync()
            t = time.perf_counter()
            dc.compact_array(small, text)
            sync()
            first = time.perf_counter() - t
            names = {"x": host, **FUNCTIONS, **CONSTANTS}
            with np.errstate(all="ignore"):  # log of negatives: NaN, as the GPU's
                want = host[eval(text, names)]  # noqa: S307 - the script's own texts
                got = dc.compact_array(big, text)
            ok = np.array_equal(got if args.cpu else cupy.asnumpy(got), want)
            peer = ""
            if args.cpu:
                with np.errstate(all="ignore"):
                    ptimes = []
                    for _ in range(args.reps):
                        t = time.perf_counter()
                        host[eval(text, names)]  # noqa: S307 - the script's own texts
                        ptimes.append(time.perf_counter() - t)
                peer = f"  numpy x[pred] {statistics.median(ptimes) * 1e3:7.3f} ms"
            times = []
            for _ in range(args.reps):
                sync()
                t = time.perf_counter()
                dc.compact_array(big, text)
                sync()
                times.append(time.perf_counter() - t)
            print(f"{args.round} {args.label:10} {dtype} {text!r:18} first call "
                  f"{first * 1e3:8.1f} ms  n={args.n} median {statistics.median(times) * 1e3:7.3f}"
                  f" ms (min {min(times) * 1e3:.3f}){peer}  {'ok' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
