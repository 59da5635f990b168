"""CPU, public ``compact_array`` against NumPy at the sizes where glibc maps buffers fresh.

A selection's buffers of 32 MiB or more come fresh from the kernel (glibc's largest mmap
threshold), each page the call writes faulting in; smaller ones come from the heap, where the
freed results of earlier calls left pages paged in. NumPy's ``np.flatnonzero`` and ``a[m]``
allocate their exact results, ours a buffer sized from the selection (see
``numpy_backend._HEAP_BYTES``), so the calls between 2^21 and 2^24 elements are where the two
can differ by the memory they touch rather than by their loops. Each case: the median of
``--reps`` calls after a warm-up call, ours and NumPy's in turn in one process on the same
data, ratio = NumPy's time / ours. Selections: uniform at p, and rates changing along the
array (0 then 1 at the middle, 1 then 0, a linear ramp).

An A/B of two versions of the package runs this script once per arm and round (``PYTHONPATH``
chooses the package), each appending to one CSV, then ``--report`` writes the table and chart:

    PYTHONPATH=/old python benchmarks/cpu_mid_sizes.py --tag old --csv ab.csv
    PYTHONPATH=.    python benchmarks/cpu_mid_sizes.py --tag new --csv ab.csv   # and again
    python benchmarks/cpu_mid_sizes.py --report ab.csv --out benchmarks/results/NAME
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

SIZES = (1 << 21, 1 << 22, 5 << 20, 3 << 21, 1 << 23, 1 << 24)
CASES = (  # (dtype, output)
    ("float32", "indices"), ("uint8", "indices"), ("float64", "values"), ("float32", "both"),
)
PATTERNS = ("p=0.05", "p=0.2", "p=0.5", "p=0.95", "0 then 1", "1 then 0", "ramp")


def rates(pattern: str, n: int) -> np.ndarray | float:
    if pattern.startswith("p="):
        return float(pattern[2:])
    half = n // 2
    if pattern == "0 then 1":
        return np.r_[np.zeros(half), np.ones(n - half)]
    if pattern == "1 then 0":
        return np.r_[np.ones(half), np.zeros(n - half)]
    return np.linspace(0, 1, n)


def numpy_call(a: np.ndarray, output: str):
    m = a > 0
    if output == "indices":
        return np.flatnonzero(m)
    if output == "values":
        return a[m]
    return a[m], np.flatnonzero(m)


def median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def measure(tag: str, path: Path, reps: int, cases: list[tuple[str, str]], sizes: list[int],
            patterns: list[str]) -> None:
    from dask_compact import compact_array

    rng = np.random.default_rng(0)
    with path.open("a", newline="") as f:
        out = csv.writer(f)
        for dtype, output in cases:
            for n in sizes:
                for pattern in patterns:
                    keep = rng.random(n) < rates(pattern, n)
                    # selected elements positive, the rest not: "x > 0" selects exactly them
                    a = np.where(keep, rng.integers(1, 100, n), 0).astype(dtype)
                    got = compact_array(a, "x > 0", output=output)
                    want = numpy_call(a, output)
                    for g, w in zip(got, want) if output == "both" else [(got, want)]:
                        np.testing.assert_array_equal(g, w)
                    ours = median_ms(lambda: compact_array(a, "x > 0", output=output), reps)
                    peer = median_ms(lambda: numpy_call(a, output), reps)
                    out.writerow([tag, dtype, output, n, pattern, f"{ours:.4f}", f"{peer:.4f}"])
                    print(f"{tag} {dtype} {output} n={n} {pattern}: ours {ours:.2f} ms, NumPy "
                          f"{peer:.2f} ms, {peer / ours:.2f}x", flush=True)


def size_name(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else f"{n / 2**20:g} Mi"


def report(path: Path, out: Path, title: str) -> None:
    ratios: dict[tuple, list[float]] = defaultdict(list)
    times: dict[tuple, list[float]] = defaultdict(list)
    tags: list[str] = []
    with path.open() as f:
        for tag, dtype, output, n, pattern, ours, peer in csv.reader(f):
            key = (dtype, output, int(n), pattern)
            ratios[key + (tag,)].append(float(peer) / float(ours))
            times[key + (tag,)].append(float(ours))
            if tag not in tags:
                tags.append(tag)
    keys = sorted({k[:4] for k in ratios},
                  key=lambda k: (CASES.index(k[:2]), k[2], PATTERNS.index(k[3])))
    cases = [c for c in CASES if any(k[:2] == c for k in keys)]
    sizes = sorted({k[2] for k in keys})
    patterns = [p for p in PATTERNS if any(k[3] == p for k in keys)]
    head = " | ".join(f"{t} ms / vs NumPy" for t in tags)
    lines = [f"# {title}", "", f"| call | n | selection | {head} |",
             "|---|---|---|" + "---|" * len(tags)]
    for k in keys:
        cells = []
        for t in tags:
            r, ms = ratios[k + (t,)], times[k + (t,)]
            cells.append(f"{' / '.join(f'{x:.2f}' for x in ms)} / "
                         f"{min(r):.2f}-{max(r):.2f}x")
        lines.append(f"| {k[0]} {k[1]} | {size_name(k[2])} | {k[3]} | {' | '.join(cells)} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), sharey=True,
                             squeeze=False)
    for ax, case in zip(axes[0], cases):
        for t, style in zip(tags, ("--", "-", ":", "-.")):
            for j, pattern in enumerate(patterns):  # a colour per selection, a style per tag
                ys = [statistics.median(ratios[case + (n, pattern, t)]) for n in sizes]
                ax.plot([n / 2**20 for n in sizes], ys, style, marker="o", color=f"C{j}",
                        label=f"{t} {pattern}")
        ax.axhline(1, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{case[0]} {case[1]}")
        ax.set_xlabel("elements (Mi)")
    axes[0][0].set_ylabel("NumPy time / ours (>1: ours faster)")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="this")
    ap.add_argument("--csv", type=Path, default=Path("cpu_mid_sizes.csv"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--report", type=Path, help="write the table and chart of this CSV")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-mid-sizes"))
    ap.add_argument("--title", default="CPU compact_array vs NumPy at mid sizes")
    ap.add_argument("--cases", default=",".join(f"{d}:{o}" for d, o in CASES),
                    help="dtype:output pairs, e.g. float32:indices,float64:values")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="elements, e.g. 4194304")
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    args = ap.parse_args()
    if args.report:
        report(args.report, args.out, args.title)
    else:
        cases = [tuple(c.split(":")) for c in args.cases.split(",")]
        measure(args.tag, args.csv, args.reps, cases,  # type: ignore[arg-type]
                [int(n) for n in args.sizes.split(",")], args.patterns.split(","))


if __name__ == "__main__":
    main()
