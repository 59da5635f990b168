"""The record path's CPU gather of one column in its forms, swept over p in one process: the
scalar loops (``numpy_gather._gather1``: set bits visited below 24 rows a word, every row
stored above) against AVX-512's compress (``_gather1_compress``, where the CPU has it), and a
plain copy of the selected volume into an existing array (what the gather cannot beat).

Every form runs on the same column and mask in turn, repetition after repetition, into an
existing output, and the fastest run of each is kept (on a shared 2-core machine runs of one
form vary by 50%, interleaved minima compare forms to a few percent). Internal: the public
call's numbers come from ``records_bench.py --device cpu``.

    python benchmarks/cpu_gather_sweep.py [--log2n 24] [--reps 15] [--out DIR] [--sha SHA]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import label

from dask_compact.backends import numpy_gather
from dask_compact.codegen.numba_compress import COMPRESS_ITEMSIZES, HAVE_COMPRESS

PS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 0.95, 0.99)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=24)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--ps", type=float, nargs="+", default=list(PS))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sha", default=None)
    a = ap.parse_args()
    if not HAVE_COMPRESS:
        raise SystemExit("this CPU (or numba's target) has no AVX-512F: one form only")
    today, device, sha = label(False, a.sha)
    n = 1 << a.log2n
    rng = np.random.default_rng(0)
    key = rng.random(n)
    lines = [f"# CPU gather forms, {today}, {device}, git {sha}, 2^{a.log2n} rows, fastest of "
             f"{a.reps} interleaved runs into an existing output, ms", "",
             "| column | p | scalar | compress | copy of the selected rows | compress vs scalar |",
             "|---|---|---|---|---|---|"]
    forms = {"scalar": numpy_gather._gather1, "compress": numpy_gather._gather1_compress}
    units = [(np.uint8, "1-byte (uint8)"), (np.uint16, "2-byte (int16)"),
             (np.uint32, "4-byte (float32)"), (np.uint64, "8-byte (float64)")]
    for unit, name in units:
        if np.dtype(unit).itemsize not in COMPRESS_ITEMSIZES:
            continue
        src = rng.integers(0, np.iinfo(unit).max, size=n, dtype=unit)
        for p in a.ps:
            mask = key < p
            words = np.zeros(((n + 63) // 64) * 8, np.uint8)
            words[: (n + 7) // 8] = np.packbits(mask, bitorder="little")
            bits = words.view("<u8")
            want = src[mask]
            dst = np.empty(want.size, unit)
            best = dict.fromkeys([*forms, "copy"], float("inf"))
            for r in range(a.reps):
                for f_name, f in forms.items():
                    t0 = time.perf_counter()
                    f(bits, n, src, dst)
                    best[f_name] = min(best[f_name], time.perf_counter() - t0)
                    if r == 0:
                        assert np.array_equal(dst, want), (f_name, name, p)
                t0 = time.perf_counter()
                dst[:] = src[: want.size]
                best["copy"] = min(best["copy"], time.perf_counter() - t0)
            row = (f"| {name} | {p} | {best['scalar'] * 1e3:.2f} | {best['compress'] * 1e3:.2f} "
                   f"| {best['copy'] * 1e3:.2f} | {best['scalar'] / best['compress']:.2f}x |")
            lines.append(row)
            print(row, flush=True)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / f"cpu-gather-sweep-{today}-2p{a.log2n}-{sha}.md"
        path.write_text("\n".join(lines) + "\n")
        print(path)


if __name__ == "__main__":
    main()
