"""Differential probe: predicates whose constants change from call to call, against NumPy.

A diagnostic (not a benchmark, not a test): the calls a user makes in a loop with a new
threshold each time, where the package reuses what it learned from earlier calls (a string's
kept shape, a function's learned shape, the GPU's kept and shaped calls, the repeated-call
path). For every dtype, every template and every constant, in shuffled order and twice over,
``compact_array`` (values and indices; ``stable=False`` compared as a multiset) and
``compact_into`` into buffers kept across calls must give what NumPy gives for ``a[pred(a)]``
(bit for bit, NaNs as NaNs), or both must raise (ours a ValueError, TypeError or
OverflowError). The constants cross every dtype's edges (int8's 127/128, uint64's 2^64,
float16's 65504, 2^53 + 1, -0.0, inf, nan) and are Python ints, floats, bools and NumPy
scalars, so NumPy 2's promotion rules for each are in play.

    python -P benchmarks/constants_probe.py [--gpu] [--sizes 1 33 1025 65537 1048579]
        [--seconds 150] [--dtypes int8 ...] [--out FILE]

Prints one line per disagreement and a summary; exit status 1 if any.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import re
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

import dask_compact as dc

DTYPES = ("int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "float32",
          "float64")
TEMPLATES = ("x < {}", "x + {} > 100", "x * {} == 12", "(x > {}) & (x < 50)", "x % {} == 1",
             "x // {} == 2", "abs(x - {}) < 10", "x ** 2 > {}", "x == {}", "x - {} < -150")
NUMBERS = ("0", "1", "3", "5", "100", "127", "128", "200", "255", "256", "300", "-1", "-129",
           "5.0", "0.5", "1e2", "1e-3", ".5", "5.", "1_000", "0x10", "0o7", "0b101", "2**7",
           "-0.0", "inf", "nan", "1e400", "65504", "65505", "70000", "9007199254740993",
           "18446744073709551615", "18446744073709551616", "-9223372036854775809")
MAKERS: dict[str, Callable[[Any], Callable[[Any], Any]]] = {
    "lt": lambda t: (lambda v: v < t),
    "add": lambda t: (lambda v: v + t > 100),
    "mul": lambda t: (lambda v: v * t == 12),
    "band": lambda t: (lambda v: (v > t) & (v < 50)),
    "mod": lambda t: (lambda v: v % t == 1),
    "fdiv": lambda t: (lambda v: v // t == 2),
    "absd": lambda t: (lambda v: abs(v - t) < 10),
    "pow": lambda t: (lambda v: v ** 2 > t),
    "eq": lambda t: (lambda v: v == t),
    "where": lambda t: (lambda v: np.where(v > t, v, t) > 3),
    "maximum": lambda t: (lambda v: np.maximum(v, t) == t),
    "default": lambda t: (lambda v, t=t: v - t < -150),
    "two": lambda t: (lambda v: (v > t) | (v < -t)),
    "reflected": lambda t: (lambda v: t - v > 0),
    "div": lambda t: (lambda v: v / t > 1),
}
VALUES = (0, 1, 3, 5, 100, 127, 128, 200, 255, 256, 300, -1, -129, 5.0, 0.5, 100.0, 1e-3,
          -0.0, 0.0, math.inf, math.nan, 65504, 65505.0, 70000, 2**53 + 1, 2**64 - 1, 2**64,
          -(2**63) - 1, True, False, np.int8(5), np.float32(0.5), np.uint64(7),
          np.float64(2.5), np.int64(-3))
OURS_MAY_RAISE = (ValueError, TypeError, OverflowError)


def data(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random values around the templates' constants (small ints, +-150 floats), some
    exact integers among the floats, and the dtype's extremes."""
    dt = np.dtype(dtype)
    if dt.kind == "u":
        a = rng.integers(0, 256 if dt.itemsize == 1 else 2**63, n, dtype=dt)
    elif dt.kind == "i":
        a = rng.integers(-128, 128, n).astype(dt)
    else:
        a = (rng.standard_normal(n) * 50).astype(dt)
        a[::5] = np.round(a[::5])
    if dt.kind in "iu" and n > 4:
        a[:2] = [np.iinfo(dt).min, np.iinfo(dt).max]
    return a


def numpy_mask(a: np.ndarray, pred: Any) -> np.ndarray:
    """NumPy's mask for ``pred`` on ``a``: the string evaluated with ``x`` as the array."""
    with np.errstate(all="ignore"):
        if isinstance(pred, str):
            text = re.sub(r"\bx\b", "a", pred).replace("abs(", "np.abs(")
            scope = {"a": a, "np": np, "inf": np.inf, "nan": np.nan}
            return np.asarray(eval(text, scope))  # noqa: S307 - the probe's own templates
        return np.asarray(pred(a))


def numpy_answer(a: np.ndarray, pred: Any) -> tuple[Any, Any]:
    """(selected values, None) or (None, the exception NumPy raised)."""
    try:
        return a[numpy_mask(a, pred)], None
    except Exception as e:  # noqa: BLE001 - any error NumPy raises is the reference
        return None, e


class Probe:
    def __init__(self, gpu: bool, deadline: float) -> None:
        self.gpu = gpu
        self.deadline = deadline
        self.calls = 0
        self.bad: list[str] = []
        if gpu:
            import cupy

            self.xp = cupy
        else:
            self.xp = np
        self.kept: dict[tuple[str, int], Any] = {}
        self.verbose = False

    def progress(self, what: str, start: float) -> None:
        if self.verbose:  # where a slow run spends its time (a GPU run's cold compiles)
            print(f"  {time.perf_counter() - start:7.1f} s {what}", file=sys.stderr, flush=True)

    def host(self, r: Any) -> np.ndarray:
        return self.xp.asnumpy(r) if self.gpu else np.asarray(r)

    def check(self, what: str, dtype: str, pred: Any, label: str, a: np.ndarray,
              d: Any) -> None:
        want, raised = numpy_answer(a, pred)
        for form in ("values", "indices", "unstable", "into"):
            self.calls += 1
            try:
                got = self.run(form, d, pred, dtype, a.size)
                err = None
            except Exception as e:  # noqa: BLE001 - compared with NumPy's outcome below
                got, err = None, e
            if raised is not None or err is not None:
                if raised is None or not isinstance(err, OURS_MAY_RAISE):
                    self.bad.append(
                        f"ERROR {what} {dtype} n={a.size} {form} {label}: NumPy "
                        f"{type(raised).__name__ if raised else 'answered'}, ours "
                        f"{type(err).__name__ if err else 'answered'} {str(err)[:160]}")
                continue
            expect = want
            if form == "indices":
                expect = np.flatnonzero(numpy_mask(a, pred))
            if form == "unstable":
                got, expect = np.sort(got), np.sort(want)
            same = got.dtype == expect.dtype and got.shape == expect.shape and np.array_equal(
                got, expect, equal_nan=got.dtype.kind == "f")
            if same and got.dtype.kind == "f":
                same = np.array_equal(np.signbit(got), np.signbit(expect))
            if not same:
                self.bad.append(f"WRONG {what} {dtype} n={a.size} {form} {label}: "
                                f"{got.size} values ({got.dtype}) where NumPy gives "
                                f"{expect.size} ({expect.dtype})")

    def run(self, form: str, d: Any, pred: Any, dtype: str, n: int) -> np.ndarray:
        if form == "values":
            return self.host(dc.compact_array(d, pred))
        if form == "indices":
            return self.host(dc.compact_array(d, pred, output="indices"))
        if form == "unstable":
            return self.host(dc.compact_array(d, pred, stable=False))
        key = (dtype, n)  # buffers kept across calls: the repeated and shaped into-calls
        if key not in self.kept:
            self.kept[key] = self.xp.empty(n, dtype)
        out = self.kept[key]
        count = dc.compact_into(d, pred, out)
        k = int(self.host(count)[0])
        return self.host(out[:k]).copy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="CuPy arrays (else NumPy)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 33, 1025, 65537, 1048579])
    ap.add_argument("--seconds", type=float, default=150.0, help="stop starting new sizes after")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES),
                    help="only these (one process per dtype spreads a GPU run's cold kernel "
                         "compiles over the host's cores)")
    ap.add_argument("--out", help="also write the report here")
    ap.add_argument("--verbose", action="store_true", help="each template's start on stderr")
    ap.add_argument("--stacks-every", type=float, default=0.0,
                    help="every thread's stack on stderr every so many seconds (a hang's where)")
    args = ap.parse_args()
    probe = Probe(args.gpu, time.perf_counter() + args.seconds)
    probe.verbose = args.verbose
    if args.stacks_every > 0:
        faulthandler.dump_traceback_later(args.stacks_every, repeat=True, file=sys.stderr)
    start = time.perf_counter()
    done_sizes = []
    warnings.simplefilter("ignore")  # NumPy's and ours alike: overflow in the constants' edges
    report = open(args.out, "w") if args.out else None  # noqa: SIM115 - written as it goes
    for n in args.sizes:
        if time.perf_counter() > probe.deadline:
            break
        for dtype in args.dtypes:
            if time.perf_counter() > probe.deadline:
                break
            before = len(probe.bad)
            # seeded per size and dtype: a run of some dtypes sees what a full run sees
            rng = np.random.default_rng([20261203, n, DTYPES.index(dtype)])
            a = data(dtype, n, rng)
            d = probe.xp.asarray(a)
            for template in TEMPLATES:  # strings: a kept shape per template
                probe.progress(f"n={n} {dtype} {template!r}", start)
                order = list(NUMBERS)
                for _ in range(2):
                    rng.shuffle(order)
                    for number in order:
                        text = template.format(number)
                        probe.check("string", dtype, text, repr(text), a, d)
            for name, make in MAKERS.items():  # functions: a learned shape per maker
                probe.progress(f"n={n} {dtype} {name}", start)
                order = list(range(len(VALUES)))
                for _ in range(2):
                    rng.shuffle(order)
                    for i in order:
                        t = VALUES[i]
                        label = f"{name}({t!r}: {type(t).__name__})"
                        probe.check("function", dtype, make(t), label, a, d)
            lines = probe.bad[before:] + [
                f"n={n} {dtype}: done, {probe.calls} calls so far, "
                f"{time.perf_counter() - start:.0f} s"]
            print("\n".join(lines), flush=True)
            if report:
                report.write("\n".join(lines) + "\n")
                report.flush()
        done_sizes.append(n)
    last = (f"{'GPU (CuPy)' if args.gpu else 'CPU (NumPy)'} sizes done {done_sizes} of "
            f"{args.sizes}: {probe.calls} calls, {len(probe.bad)} disagreements with NumPy, "
            f"{time.perf_counter() - start:.0f} s")
    print(last)
    if report:
        report.write(last + "\n")
        report.close()
    return 1 if probe.bad else 0


if __name__ == "__main__":
    sys.exit(main())
