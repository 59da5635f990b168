"""CPU, public ``compact_array`` on small NumPy arrays against NumPy, per call.

A user filtering many small arrays in a loop (a detector frame's events, a tile's rays) pays
the call's fixed cost every time: NumPy's ``a[a < p]`` costs a few microseconds at a thousand
elements. Each case: a predicate written as a user writes it (a lambda, a string), called
again and again on one array of n float32 elements (uniform in [0, 1), ``x < 0.5``), best of
``--rounds`` rounds of ``--calls`` calls, ours and NumPy's in turn in one process; ratio =
NumPy's time / ours (> 1: we are faster). Sizes 2^6 to 2^16, values and indices
(``np.flatnonzero``), and ``compact_records`` of four float32 fields with the predicate on one
against NumPy's recipe (the mask once, then each field indexed by it).

An A/B of two versions of the package runs this script once per arm and round (``PYTHONPATH``
chooses the package), each appending to one CSV, then ``--report`` writes the table and chart:

    PYTHONPATH=/old python benchmarks/cpu_small_calls.py --tag old --csv ab.csv
    PYTHONPATH=.    python benchmarks/cpu_small_calls.py --tag new --csv ab.csv   # and again
    python benchmarks/cpu_small_calls.py --report ab.csv --out benchmarks/results/NAME
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

SIZES = tuple(1 << k for k in range(6, 17, 2))
P = 0.5


def per_call_us(fn, calls: int, rounds: int) -> float:
    """The best of ``rounds`` rounds' mean microseconds per call of ``fn()``."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def measure(tag: str, calls: int, rounds: int) -> list[dict]:
    import dask_compact
    from dask_compact import compact_array

    rows = []
    rng = np.random.default_rng(0)
    for n in SIZES:
        a = rng.random(n, dtype=np.float32)
        for output, numpy_call in (("values", lambda: a[a < P]),
                                   ("indices", lambda: np.flatnonzero(a < P))):
            want = numpy_call()
            for form, pred in (("lambda", lambda v: v < P), ("string", f"x < {P}")):
                got = compact_array(a, pred, output=output)
                np.testing.assert_array_equal(got, want)
                ours = per_call_us(lambda: compact_array(a, pred, output=output), calls, rounds)
                theirs = per_call_us(numpy_call, calls, rounds)
                rows.append({"tag": tag, "version": dask_compact.__file__, "n": n,
                             "output": output, "form": form, "ours_us": round(ours, 3),
                             "numpy_us": round(theirs, 3)})
                print(f"{tag} n={n:6d} {output:7s} {form:6s} ours {ours:7.2f} us  "
                      f"numpy {theirs:7.2f} us  ratio {theirs / ours:5.2f}x", flush=True)
        # a record of four float32 fields, the predicate on one, against NumPy's recipe
        fields = {k: rng.random(n, dtype=np.float32) for k in "abcd"}

        def recipe(fields=fields):
            m = fields["a"] < P
            return {k: v[m] for k, v in fields.items()}

        want = recipe()
        for form, pred in (("lambda", lambda a: a < P), ("string", f"a < {P}")):
            got = dask_compact.compact_records(fields, pred)
            assert all(np.array_equal(got[k], want[k]) for k in want)
            ours = per_call_us(lambda: dask_compact.compact_records(fields, pred), calls // 4,
                               rounds)
            theirs = per_call_us(recipe, calls // 4, rounds)
            rows.append({"tag": tag, "version": dask_compact.__file__, "n": n,
                         "output": "records", "form": form, "ours_us": round(ours, 3),
                         "numpy_us": round(theirs, 3)})
            print(f"{tag} n={n:6d} records {form:6s} ours {ours:7.2f} us  "
                  f"numpy {theirs:7.2f} us  ratio {theirs / ours:5.2f}x", flush=True)
    return rows


def report(path: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path) as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["tag"], r["output"], r["form"], int(r["n"]))].append(r)
    tags = sorted({r["tag"] for r in rows})
    lines = [f"# CPU small calls: compact_array and compact_records vs NumPy, per call "
             f"({len(rows)} rows)", "",
             "Microseconds per call, median over the arm's runs (each the best of its rounds); "
             "ratio = NumPy's time / ours (> 1: ours faster), each run's own NumPy.", "",
             "| tag | output | form | " + " | ".join(f"n = {n}" for n in SIZES) + " |",
             "|---|---|---|" + "---|" * len(SIZES)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tag in tags:
        for output in ("values", "indices", "records"):
            for form in ("lambda", "string"):
                cells, xs, ys = [], [], []
                for n in SIZES:
                    g = groups.get((tag, output, form, n), [])
                    if not g:
                        cells.append("")
                        continue
                    ours = statistics.median(float(r["ours_us"]) for r in g)
                    ratio = statistics.median(float(r["numpy_us"]) / float(r["ours_us"])
                                              for r in g)
                    cells.append(f"{ours:.1f} us ({ratio:.2f}x)")
                    xs.append(n)
                    ys.append(ratio)
                lines.append(f"| {tag} | {output} | {form} | " + " | ".join(cells) + " |")
                ax.plot(xs, ys, marker="o", label=f"{tag} {output} {form}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements (float32, x < 0.5)")
    ax.set_ylabel("NumPy's time / ours")
    ax.set_title("compact_array on small NumPy arrays, one core")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=110)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="ours")
    ap.add_argument("--csv", type=Path, default=None, help="append the rows to this CSV")
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--report", type=Path, default=None, help="a CSV to report on, then stop")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-small-calls"))
    args = ap.parse_args()
    if args.report is not None:
        report(args.report, args.out)
        return
    rows = measure(args.tag, args.calls, args.rounds)
    if args.csv is not None:
        new = not args.csv.exists()
        with open(args.csv, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
