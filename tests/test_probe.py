"""A hostile-user probe of the API, kept small enough for CI: many edge-case calls, each of which
must give NumPy's answer or a clear ValueError/TypeError raised before anything runs.

Each test prints one tally line (`pytest -s tests/test_probe.py` shows them) and fails on any
wrong result or crash (an exception other than the documented ValueError/TypeError).
"""

from __future__ import annotations

import functools
import operator

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import DTYPES, random_array

import dask_compact
from dask_compact import compact_array, map_compact


class Tally:
    def __init__(self, area: str) -> None:
        self.area = area
        self.cases = self.wrong = self.crashes = self.refused = 0
        self.details: list[str] = []

    def check(self, label: str, call, expected) -> None:
        """``expected``: the NumPy answer (array or tuple of arrays), or None if a clear
        refusal is the right outcome."""
        self.cases += 1
        try:
            got = call()
        except (ValueError, TypeError) as e:
            self.refused += 1
            if expected is not None and not isinstance(expected, Exception):
                self.wrong += 1
                self.details.append(f"{label}: refused ({e!s:.80}) where NumPy answers")
            return
        except Exception as e:  # noqa: BLE001 - that is what the probe counts
            self.crashes += 1
            self.details.append(f"{label}: {type(e).__name__}: {e!s:.100}")
            return
        if expected is None:
            self.wrong += 1
            self.details.append(f"{label}: answered where a refusal was due")
            return
        got = got if isinstance(got, tuple) else (got,)
        exp = expected if isinstance(expected, tuple) else (expected,)
        for g, e in zip(got, exp):
            g = np.asarray(g)
            if g.shape != e.shape or not np.array_equal(g, e, equal_nan=g.dtype.kind in "fc"):
                self.wrong += 1
                self.details.append(f"{label}: {g[:5]!r} != {e[:5]!r}")
                return

    def report(self, capsys) -> None:
        with capsys.disabled():
            print(
                f"\nprobe {self.area}: {self.cases} cases, {self.wrong} wrong, "
                f"{self.crashes} crashes, {self.refused} refused up front"
            )
        assert self.wrong == 0 and self.crashes == 0, "\n".join(self.details[:20])


def _expected(a: np.ndarray, m: np.ndarray, output: str):
    flat, mf = a.ravel(), m.ravel()
    v, i = flat[mf], np.flatnonzero(mf).astype(np.int64)
    return {"values": v, "indices": i, "both": (v, i)}[output]


def _pred_for(dtype: np.dtype, kind: str):
    """A predicate selecting none / all / about half of random_array data."""
    if dtype.kind == "b":
        return {"none": lambda v: v & ~v, "all": lambda v: v | ~v, "half": lambda v: v}[kind]
    if dtype.kind == "c":
        return {"none": lambda v: v.real > 1e30, "all": lambda v: v.real > -1e30,
                "half": lambda v: v.real > 0}[kind]  # fmt: skip
    return {"none": lambda v: v > 2000, "all": lambda v: v > -2000, "half": lambda v: v > 0}[kind]


SIZES = [0, 1, 2, 31, 33, 97, 1023, 1025]


def test_probe_api_edge_calls(capsys):
    t = Tally("api")
    rng = np.random.default_rng(2026)
    outputs = ["values", "indices", "both"]
    with dask.config.set(scheduler="sync"):
        for di, name in enumerate(DTYPES):
            for order in ("=", ">"):
                dt = np.dtype(name).newbyteorder(order)
                for si, n in enumerate(SIZES):
                    a = random_array(rng, (n,), name).astype(dt)
                    for kind in ("none", "all", "half"):
                        pred = _pred_for(dt, kind)
                        out = outputs[(di + si) % 3]
                        exp = _expected(a, np.asarray(pred(a)), out)
                        chunks = max(1, n // 3)
                        t.check(
                            f"{dt.str} n={n} {kind} {out}",
                            lambda: map_compact(
                                da.from_array(a, chunks=chunks), pred, output=out, by_worker=False
                            ),
                            exp,
                        )
                        t.check(
                            f"compact_array {dt.str} n={n} {kind} {out}",
                            lambda: compact_array(a, pred, output=out),
                            exp,
                        )
        # N-D, empty axes anywhere, lazy and rebalanced outputs
        for shape, chunks in (
            ((7, 11), (3, 4)),
            ((10, 0), 5),
            ((0, 3, 2), 1),
            ((3, 0, 4), (2, 1, 2)),
            ((4, 5, 6), (2, 5, 3)),
        ):
            a = rng.standard_normal(shape)
            x = da.from_array(a, chunks=chunks)
            for out in outputs:
                exp = _expected(a, a > 0.1, out)
                t.check(f"nd {shape} {out}", lambda: map_compact(x, "x > 0.1", output=out), exp)
                t.check(
                    f"nd lazy {shape} {out}",
                    lambda: dask.compute(map_compact(x, "x > 0.1", output=out, lazy=True))[0],
                    exp,
                )
                t.check(
                    f"nd chunks=3 {shape} {out}",
                    lambda: dask.compute(map_compact(x, "x > 0.1", output=out, chunks=3))[0],
                    exp,
                )
        # arguments a careless user passes
        x = da.from_array(np.arange(10.0), chunks=4)
        for kw in (
            {"output": "value"},
            {"algorithm": "fast"},
            {"chunks": 0},
            {"chunks": -3},
            {"chunks": 10**20},
            {"chunks": 1.5},
            {"chunks": "big"},
            {"chunks": 3, "lazy": True},
            {"algorithm": "hybrid"},
        ):
            t.check(f"kwargs {kw}", lambda: map_compact(x, "x > 3", **kw), None)
        for bad in (np.arange(3), [1, 2], None, 3.0, "x"):
            t.check(f"input {type(bad).__name__}", lambda: map_compact(bad, "x > 0"), None)
        for dt in ("object", "U3", "V4"):  # (datetime64 and timedelta64 are compacted)
            t.check(
                f"dtype {dt}",
                lambda: map_compact(da.from_array(np.zeros(4, dt), chunks=2), "x == x"),
                None,
            )
        xm = da.ma.masked_greater(da.from_array(np.linspace(0, 1, 10), chunks=5), 0.9)
        t.check("masked", lambda: map_compact(xm, "x > .5"), None)
        for mask in (np.ones(9, bool), np.ones(10, int), da.ones(10, chunks=3, dtype=int)):
            t.check(
                f"mask {getattr(mask, 'dtype', None)} {mask.shape}",
                lambda: dask_compact.compact(x, mask),
                None,
            )
    t.report(capsys)


# Data with the values predicates trip over: NaN, infinities, signed zeros, extremes.
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 1e-300,
                    -1e-300, 1e300, 3.0, 2.5, -2.5, 7.0])  # fmt: skip
PREDICATES = [
    "x > 0",
    "x >= 0",
    "x == 0",
    "x != x",
    "isnan(x)",
    "~isnan(x)",
    "isinf(x) | (x < -1)",
    "isfinite(x) & (x > 0.5)",
    "signbit(x)",
    "abs(x) > 1",
    "x * 2 > 3",
    "x / 2 < 0.5",
    "x - 1 >= 0",
    "(x > 0) ^ (x < 5)",
    "where(isnan(x), 0, x) > 0",
    "floor(x) == x",
    "x % 2 == 1",
    "x // 2 > 0",
    "minimum(x, 1) < 1",
    "maximum(x, -1) > -1",
    "sqrt(abs(x)) > 1",
    "x ** 2 > 4",
    "-x > 0",
    "0.2 < x < 3",
    "not (x > 1)",
    "(x > 1) and (x < 5)",
    "(x < 0) or (x > 2)",
    "x == inf",
    "x < -inf",
    "x > nan",
    "x != nan",
]


def _special_cases() -> list[tuple[str, str]]:
    """(dtype, predicate): each predicate on three dtypes, rotating, so every pair of kinds is
    met within CI time (each new structure and dtype compiles a loop)."""
    names = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "uint64",
             "complex64", "complex128", "bool")  # fmt: skip
    return [(names[(3 * i + k) % len(names)], text)
            for i, text in enumerate(PREDICATES) for k in range(3)]


def test_probe_predicates_on_special_values(capsys):
    t = Tally("predicates")
    for name, text in _special_cases():
        _probe_special(t, name, text)
    t.report(capsys)


def numba_ahead_loops(test_name: str, params: dict) -> list | None:
    """The loops of the API and special-values probes (a compile each, most of their time),
    for tests/numba_ahead.py to build in the background first."""
    from dask_compact.predicate import as_predicate

    if test_name == "test_probe_api_edge_calls":
        cases = [(pred, name, out) for name in DTYPES for kind in ("none", "all", "half")
                 for pred in [_pred_for(np.dtype(name), kind)]
                 for out in ("values", "indices", "both")]
    elif test_name == "test_probe_predicates_on_special_values":
        cases = [(text, name, "both") for name, text in _special_cases()]
    else:
        return None
    loops = []
    for pred, name, out in cases:
        try:
            loops.append((as_predicate(pred).typed(np.dtype(name)), out))
        except (ValueError, TypeError):  # refused: no loop to build
            continue
    return loops


def _probe_special(t: Tally, name: str, text: str) -> None:
    from dask_compact.predicate import as_predicate

    if True:
        dt = np.dtype(name)
        with np.errstate(all="ignore"):
            if dt.kind in "iu":
                a = np.nan_to_num(SPECIAL, posinf=7, neginf=-7).astype(np.int64)
                a = a.astype(dt) if dt.kind == "i" else np.abs(a).astype(dt)
            elif dt.kind == "b":
                a = SPECIAL > 0
            else:
                a = SPECIAL.astype(dt)
        a = np.tile(a, 13)  # 208 elements, several chunks
        x = da.from_array(a, chunks=50)
        try:
            p = as_predicate(text)
            p.check(dt)
            with np.errstate(all="ignore"):
                m = np.asarray(p.mask(a))
        except (ValueError, TypeError):
            # NumPy itself refuses (no loop for the dtype): we must refuse too
            t.check(f"{name} {text}", lambda: map_compact(x, text), None)
            return
        # output="both" on both sides: one compiled loop per predicate and dtype serves the
        # dask call and the in-memory one (values and indices each took a loop of their own:
        # twice the compile time, this test's whole cost)
        want = (a[m], np.flatnonzero(m))
        with np.errstate(all="ignore"):
            t.check(f"{name} {text}", lambda: map_compact(x, text, output="both"), want)
            t.check(f"{name} {text} in memory",
                    lambda: compact_array(a, text, output="both"), want)


HOSTILE_STRINGS = [
    "__import__('os').system('true')",
    "x.__class__",
    "x[0] > 1",
    "[x > 1]",
    "lambda: x",
    "open('f')",
    "exec('1')",
    "eval('x')",
    "x if x else x",
    "(x := 3) > 1",
    "f'{x}' > 1",
    "x > 'a'",
    "x > b'a'",
    "x > None",
    "x in (1, 2)",
    "x is None",
    "*x",
    "x @ x > 0",
    "isnan(x, out=x)",
    "sum(x) > 0",
    "x.mean() > 0",
    "len(x) > 3",
    "globals()",
    "y > 1",
    "x > 1; x < 2",
    "x > 1\nx < 2",
    "x >",
    "",
    "   ",
    "\x00",
    "x > 1 # comment",
    "x > 1e999999",
    "x > 10 ** 10 ** 9",
    "x << 10 ** 6 > 0",
    "x > 2 ** 4096",
    "x" + " < x" * 250,
    " and ".join(["x"] * 333),
    "(" * 300 + "x" + ")" * 300,
    "-" * 300 + "x",
    "x > " + "1" * 1990,
    "abs(" * 150 + "x" + ")" * 150 + " > 1",
    "x + " * 600 + "x > 0",
    "isnan(isnan(x))",
    "where(x > 0) > 1",
    "where(x, x) > 1",
    "real(x, x) > 0",
    "x > 1 if True else 0",
    "{x: 1}",
    "{x}",
    "(x, x)",
    "...",
    "x > ...",
    "x.real > 0",
    "x > pi",
    "x > nan",
    "True",
    "False",
    "1",
    "x",
    "x + 1",
    "not x",
]


def test_probe_hostile_strings(capsys):
    """Every string is refused with a ValueError/TypeError, or gives NumPy's answer."""
    t = Tally("strings")
    a = np.random.default_rng(5).standard_normal(500)
    x = da.from_array(a, chunks=120)
    from dask_compact.predicate import as_predicate

    for j, text in enumerate(HOSTILE_STRINGS):
        for dt in ("float64", "int32") if j % 3 == 0 else ("float64",):
            arr = a if dt == "float64" else (a * 10).astype(dt)
            xx = x if dt == "float64" else da.from_array(arr, chunks=120)
            try:
                p = as_predicate(text)
                p.check(arr.dtype)
                m = np.asarray(p.mask(arr))
                exp = arr[m]
            except (ValueError, TypeError):
                exp = None
            except Exception as e:  # noqa: BLE001 - counted: the parser must not crash
                t.cases += 1
                t.crashes += 1
                t.details.append(f"{text[:40]!r}: {type(e).__name__}: {e!s:.80}")
                continue
            t.check(f"{text[:40]!r} {dt}", lambda: map_compact(xx, text), exp)
    t.report(capsys)


CHUNK_DEPENDENT = [
    lambda v: v > np.asarray(v).mean(),
    lambda v: v > v.size,
    lambda v: v > len(v),
    lambda v: v > v.shape[0],
    lambda v: v > np.linalg.norm(v),
    lambda v: v > v.sum(),
    lambda v: v > np.median(v),
    lambda v: v > float(np.mean(np.asarray(v))),
    lambda v: v > np.nanpercentile(np.asarray(v), 50),
    lambda v: v > np.sort(v)[0],
    lambda v: v > v[0],
    lambda v: v > np.cumsum(v),
    lambda v: np.diff(v) > 0,
    lambda v: v.astype(float) > v.astype(float).mean(),
    lambda v: v.astype(float) > v.astype(float).max() - 1,
    lambda v: v.astype(float) > np.asarray(v.astype(float)).std(),
    lambda v: v.astype(float) > len(v.astype(float)),
    lambda v: np.random.random(v.shape) < 0.5,
    lambda v: v > (1 if v else 0),
    lambda v: v > float(v),
    lambda v: v > int(v),
    lambda v: v > np.size(v),
    lambda v: v > np.array(v).max(),
    lambda v: v == np.roll(v, 1),
    lambda v: v > v.T[0],
    lambda v: functools.reduce(operator.and_, [v > i for i in range(5000)]),
    lambda v: functools.reduce(lambda acc, _: acc + acc, range(40), v) > 0,
]
ELEMENTWISE_MASK_PATH = [
    lambda v: np.isin(v.astype(int), [1, 3, 5]),
    lambda v: v.astype(np.float32) > 0.5,
    lambda v: np.isclose(v, 0.5, atol=0.2),
    lambda v: np.clip(v, 0, 1) > 0.5,
    lambda v: np.arctan2(v, 1.0) > 0.3,
]


def test_probe_chunk_dependent_callables(capsys):
    """Callables that look at the whole chunk are refused before anything runs; elementwise
    ones the tracer cannot record still give NumPy's answer."""
    t = Tally("callables")
    a = np.random.default_rng(6).standard_normal(1001) * 3
    for chunks in (100, 333, 1001):
        x = da.from_array(a, chunks=chunks)
        for f in CHUNK_DEPENDENT:
            t.check(f"chunk-dependent chunks={chunks}", lambda: map_compact(x, f), None)
        for f in ELEMENTWISE_MASK_PATH:
            t.check(f"elementwise chunks={chunks}", lambda: map_compact(x, f), a[np.asarray(f(a))])
    t.report(capsys)


@pytest.mark.parametrize("n", [5, 200])
def test_probe_repeated_calls_hold_no_growth(n, capsys):
    """Calls with new thresholds reuse one compiled loop (no cache growth per call)."""
    from dask_compact.codegen import numba_loop

    a = np.random.default_rng(7).random(10_000)
    compact_array(a, lambda v: v > 0.5)
    before = numba_loop.cache_info()
    for k in range(n):
        t = k / n
        np.testing.assert_array_equal(compact_array(a, lambda v, t=t: v > t), a[a > t])
    after = numba_loop.cache_info()
    assert after["builds"] == before["builds"] and after["loops"] == before["loops"]
