"""Every public GPU call on device memory that held other data: a kernel that reads a scratch,
status or output word before the call wrote it fails here, whatever ran before.

CuPy's memory pool hands a freed block to the next allocation that fits as it is, so such a
fault shows only where the block held something else: on fresh memory (a new cudaMalloc, zeros
in practice) it passes, after another test it may not, and the suite's order decides. Here each
call runs twice, under two garbage patterns, and both results must equal NumPy's bit for bit
(``np.asarray(x)[pred(x)]``, ``np.flatnonzero``, ``np.cumsum``, the stable split, ``np.sort``,
``np.argsort(kind="stable")``) and each other. Per run (:func:`poisoned`):

* the default pool is emptied (``free_all_blocks``), then blocks of the call's sizes and
  larger (1x, 2x, 4x the input's bytes, and three each of 256 B to 64 KiB) are allocated, filled
  with the pattern and freed (``del``, no ``free_all_blocks``): the call's ``cupy.empty`` gets
  them back dirty;
* and while the call runs, every allocation (of any thread: the dask tests' worker threads
  too) is filled with the pattern before it is handed out, through an allocator that wraps
  the default pool's ``malloc``; so the test does not hang on which block the pool picks.

Patterns: 0xFF bytes (NaN, -1, a look-back status word with both flag bits set, a tile
dispenser past the last tile), then 0x7F and 0x80 bytes block by block (large positive and
tiny negative values, status words that claim an AGGREGATE or an INCLUSIVE prefix of a
garbage count). Before the first run the ready calls and the workspaces kept between calls
(``cupy_backend``'s ready and repeated calls, this thread's tile words, the records' ready
calls, their column tables) are dropped, so the first run allocates them under the poison;
the second run keeps them, so it reuses the first run's memory (the repeated calls' path).
docs/design.md, "Where things run", says what this file is for.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402
from conftest import scan_data, scan_reference  # noqa: E402

import dask_compact  # noqa: E402
from dask_compact import (  # noqa: E402
    compact_array,
    compact_into,
    compact_records,
    compact_records_into,
    partition_array,
    scan_array,
)
from dask_compact.backends import cupy_calls as ck  # noqa: E402
from dask_compact.backends import (  # noqa: E402
    cupy_into_repeat,
    cupy_launchers,
    cupy_ready,
    cupy_records_common,
    cupy_records_ready,
    cupy_records_repeat,
    cupy_shaped,
    cupy_tuning,
)

pytestmark = pytest.mark.gpu

SIZES = [0, 1, 31, 33, 1023, 1025, 4099, 70_001, 2**20 + 3]
PS = [0.0, 0.05, 0.5, 1.0]
OUTPUTS = ["values", "indices", "both"]
DTYPES = ["float32", "float64", "int8", "uint16", "int32", "int64", "float16", "bool"]
# Each run's garbage: the bytes of its blocks, in turn (see the module's docstring).
PATTERNS = ((0xFF,), (0x7F, 0x80))
SMALL_BLOCKS = [256 << s for s in range(9) for _ in range(3)]  # 256 B .. 64 KiB, three each


# ------------------------------------------------------------------------- the poison -------


def _fill(ptr: int, nbytes: int, byte: int) -> None:
    cupy.cuda.runtime.memsetAsync(ptr, byte, nbytes, cupy.cuda.get_current_stream().ptr)


def _poison_pool(nbytes: int, pattern: tuple[int, ...]) -> None:
    """The default pool's cache emptied, then refilled with blocks of the pattern (freed)."""
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()  # what the pool caches from now on is these blocks
    sizes = [max(nbytes, 512) * k for k in (1, 2, 4)] + SMALL_BLOCKS
    blocks = [cupy.empty(s, dtype=cupy.uint8) for s in sizes]  # all live at once: distinct
    for j, b in enumerate(blocks):
        _fill(b.data.ptr, b.nbytes, pattern[j % len(pattern)])
    cupy.cuda.get_current_stream().synchronize()
    del blocks  # back to the pool, dirty; no free_all_blocks


@contextlib.contextmanager
def poisoned(pattern: tuple[int, ...], nbytes: int) -> Iterator[None]:
    """Inside: the pool's free blocks and every new allocation hold the pattern (see the
    module's docstring); the device is synchronised before the allocator is restored."""
    _poison_pool(nbytes, pattern)
    pool_malloc = cupy.get_default_memory_pool().malloc
    turn = itertools.count()

    def malloc(size: int) -> Any:
        mem = pool_malloc(size)
        if size:
            # in the allocating stream's order, as the pool hands blocks out by stream
            _fill(mem.ptr, size, pattern[next(turn) % len(pattern)])
        return mem

    before = cupy.cuda.get_allocator()
    # the global allocator, not using_allocator's thread-local one: dask's threads allocate too
    cupy.cuda.set_allocator(malloc)
    try:
        yield
        cupy.cuda.Device().synchronize()
    finally:
        cupy.cuda.set_allocator(before)


def forget_kept_calls() -> None:
    """Drop what calls keep for the next call (ready calls with their scratch and words, the
    repeated calls, this thread's tile words, the records' calls and column tables): the next
    call allocates them anew."""
    # the shaped calls too (a string's or function's new numbers run them): a test's second
    # call of "x < 0.5" took the shape's kept IntoCall the first one left and made no ready call
    # of its own (found on the H200 on 2026-12-02, eighteenth session, in a whole-suite run)
    for cache in (ck._ready_calls, ck._repeat_calls, cupy_into_repeat._repeats,
                  cupy_into_repeat._shaped, cupy_shaped.shaped_calls,
                  cupy_records_ready._calls,
                  cupy_records_ready._by_content, cupy_records_repeat._repeats,
                  cupy_records_repeat._into_repeats, cupy_records_common._tables):
        cache.clear()
    cupy_launchers._reused.by_key = {}


def host(x: Any) -> Any:
    """CuPy arrays (also in tuples, lists and dicts, and dask arrays computed on the threaded
    scheduler) as NumPy arrays."""
    if isinstance(x, cupy.ndarray):
        return cupy.asnumpy(x)
    if isinstance(x, da.Array):
        with dask.config.set(scheduler="threads"):
            return host(x.compute())
    if isinstance(x, dict):
        return {k: host(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(host(v) for v in x)
    return x


def assert_bits(got: Any, want: Any, what: str = "") -> None:
    """Equal dtype, shape and bytes (NaN payloads and signed zeros included)."""
    if not isinstance(want, np.ndarray):
        assert got == want, (what, got, want)
        return
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (what, got.dtype, got.shape,
                                                                 want.dtype, want.shape)
    if got.tobytes() != want.tobytes():
        g = got.view(np.uint8).reshape(got.shape[0], -1)
        w = want.view(np.uint8).reshape(want.shape[0], -1)
        bad = np.flatnonzero((g != w).any(axis=1))
        raise AssertionError(f"{what}: {len(bad)} of {len(got)} rows differ, the first at "
                             f"{bad[0]}: {got[bad[0]]!r} against {want[bad[0]]!r}")


def assert_same(a: Any, b: Any, what: str = "") -> None:
    """Two runs' results (host form) equal bit for bit."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_same(a[k], b[k], f"{what}[{k}]")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), what
        for j, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{what}[{j}]")
    else:
        assert_bits(a, b, what)


def twice(call: Callable[[], Any], nbytes: int, what: str,
          canon: Callable[[Any], Any] = lambda r: r) -> Any:
    """``call()`` under each pattern (kept calls dropped before the first run): its result on
    the host (after ``canon``, for results whose order is not specified), checked equal
    between the runs."""
    runs = []
    for j, pattern in enumerate(PATTERNS):
        if j == 0:
            forget_kept_calls()
        with poisoned(pattern, nbytes):
            runs.append(canon(host(call())))
    assert_same(runs[0], runs[1], f"{what}, the two runs")
    return runs[0]


# ---------------------------------------------------------------- data and predicates -------


def make(n: int, dtype: str, seed: int) -> np.ndarray:
    """Uniform keys in [0, 1) as the dtype (integers 0..99, bools half true); floats of 33
    elements or more carry NaNs and -0.0, which a compaction moves as bits."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    u = rng.random(n)
    if dt == np.dtype(bool):
        return u < 0.5
    if dt.kind in "iu":
        return np.floor(u * 100).astype(dt)
    a = u.astype(dt)
    if n >= 33:
        a[7::29] = np.nan
        a[11::31] = -0.0
    return a


def threshold(dtype: str, p: float, kind: str) -> tuple[Any, Callable[[np.ndarray], Any]]:
    """A predicate selecting about ``p`` of make()'s values, as ``kind``: "string", "callable"
    (traced: another kernel), or "mask" (untraceable: the mask path); and its NumPy form.
    Thresholds are exact in every dtype, so NumPy's comparison is the kernels'."""
    if np.dtype(dtype) == np.dtype(bool):
        # bools by callables (a string compares them with numbers)
        if p == 0.0:
            return (lambda v: v & ~v), (lambda v: v & ~v)
        if p == 1.0:
            return (lambda v: v | ~v), (lambda v: v | ~v)
        if kind == "mask":
            return (lambda v: v.astype(np.int8) > 0), (lambda v: v)
        return (lambda v: v), (lambda v: v)
    t: float
    if np.dtype(dtype).kind in "iu":
        t = int(round(p * 100))
    else:
        t = {0.0: -1.0, 0.05: 0.0625, 0.5: 0.5, 1.0: 2.0}[p]
    if kind == "string":
        return f"x < {t!r}", (lambda v: v < t)
    if kind == "callable":  # NaNs selected too: another functor
        return (lambda v: (v < t) | (v != v)), (lambda v: (v < t) | (v != v))
    return (lambda v: v.astype(np.float64) < t), (lambda v: v.astype(np.float64) < t)


def want_of(a: np.ndarray, mask: np.ndarray, output: str) -> Any:
    m = np.asarray(mask).ravel()
    values = a.ravel()[m]
    indices = np.flatnonzero(m).astype(np.int64)
    return {"values": values, "indices": indices, "both": (values, indices)}[output]


def unordered(output: str) -> Callable[[Any], Any]:
    """The hybrid kernel's result in a fixed order (tiles land in the order they finish):
    by index where there are indices, else by the values' bits."""

    def canon(r: Any) -> Any:
        if output == "both":
            o = np.argsort(r[1], kind="stable")
            return r[0][o], r[1][o]
        if output == "indices":
            return np.sort(r)
        u = np.dtype(f"u{r.dtype.itemsize}")
        return np.sort(r.view(u)).view(r.dtype)

    return canon


def rotation(i: int, j: int) -> str:
    """One output per (size, p): each output at every size over the p's."""
    return OUTPUTS[(i + j) % 3]


# ----------------------------------------------------------------------- compact_array -------

# Every call counts first (no one-read path, whatever the predicate's memo learnt before).
COUNT_FIRST = {"FAST_SMALL_CALLS": False, "ONE_READ_ALWAYS_BYTES": 0, "ONE_READ_MARGIN": 0.0}
# id -> (algorithm, stable, the module switches): the CuPy backend's every path for a call
ARRAY_CONFIGS = {
    "auto:ready": ("auto", True, {}),  # the ready one-read call, then the repeated call
    "auto-unstable:ready": ("auto", False, {}),  # up to 2^22: the single-pass ready call
    "single-pass:one-read": ("single-pass", True, {"FAST_SMALL_CALLS": False}),
    "single-pass:count-first": ("single-pass", True, COUNT_FIRST),
    "single-pass:prefix": ("single-pass", True, {**COUNT_FIRST, "EXACT_MODE": "prefix"}),
    "three-pass": ("three-pass", True, {}),
    "hybrid:ready": ("hybrid", False, {}),
    "hybrid:one-read": ("hybrid", False, {"FAST_SMALL_CALLS": False}),
    "hybrid:count-first": ("hybrid", False, COUNT_FIRST),
    "scan": ("scan", True, {}),
}
# which predicate forms run where: the string everywhere, the others on a few dtypes
KINDS = {"float32": ("string", "callable", "mask"), "int32": ("string", "callable"),
         "float16": ("string", "callable"), "int8": ("string", "mask"),
         "bool": ("string", "mask")}


def _switch(monkeypatch: pytest.MonkeyPatch, switches: dict[str, Any]) -> None:
    for name, value in switches.items():
        monkeypatch.setattr(cupy_tuning, name, value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(ARRAY_CONFIGS))
def test_compact_array(config: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    algorithm, stable, switches = ARRAY_CONFIGS[config]
    _switch(monkeypatch, switches)
    kinds = KINDS.get(dtype, ("string",))
    for i, n in enumerate(SIZES):
        a_np = make(n, dtype, seed=i)
        a = cupy.asarray(a_np)
        for j, p in enumerate(PS):
            kind = kinds[(i + j) % len(kinds)]
            pred, ref = threshold(dtype, p, kind)
            output = rotation(i, j)
            want = want_of(a_np, ref(a_np), output)
            canon = (lambda r: r) if stable else unordered(output)
            got = twice(lambda: compact_array(a, pred, output=output, stable=stable,
                                              algorithm=algorithm),
                        a_np.nbytes, f"{config} {dtype} n={n} p={p} {kind} {output}", canon)
            assert_same(got, canon(want), f"{config} {dtype} n={n} p={p} {kind} {output}")


def test_calls_of_other_sizes_between(monkeypatch: pytest.MonkeyPatch) -> None:
    """One predicate on sizes up and down, each call under a pattern with nothing dropped
    between them: what a call keeps (per size, per thread) is reused after calls of other
    sizes. compact_array and compact_into (a caller's uint64 count) in turn."""
    sizes = [70_001, 33, 2**20 + 3, 1025, 70_001, 4099, 33, 2**20 + 3]
    for config in ("auto:ready", "single-pass:count-first", "hybrid:ready"):
        algorithm, stable, switches = ARRAY_CONFIGS[config]
        order = (lambda r: r) if stable else unordered("values")
        with monkeypatch.context() as m:
            _switch(m, switches)
            forget_kept_calls()
            for i, n in enumerate(sizes):
                a_np = make(n, "float32", seed=100 + i)
                a = cupy.asarray(a_np)
                want = want_of(a_np, a_np < 0.5, "values")
                with poisoned(PATTERNS[i % 2], a_np.nbytes):
                    got = host(compact_array(a, "x < 0.5", stable=stable, algorithm=algorithm))
                    vals = cupy.empty(n, np.float32)
                    count = cupy.empty(1, np.uint64)
                    compact_into(a, "x < 0.5", vals, count=count, stable=stable,
                                 algorithm=algorithm)
                    into = cupy.asnumpy(vals[:int(cupy.asnumpy(count)[0])])
                assert_bits(order(got), order(want), f"{config} n={n}")
                assert_bits(order(into), order(want), f"{config} compact_into n={n}")


# ------------------------------------------------------------------------ compact_into -------

INTO_CONFIGS = {
    "auto:ready": ("auto", True, {}),  # cupy_ready.IntoCall
    "auto-unstable:ready": ("auto", False, {}),
    "hybrid:ready": ("hybrid", False, {}),
    "single-pass:general": ("single-pass", True, {"FAST_SMALL_CALLS": False}),
    "hybrid:general": ("hybrid", False, {"FAST_SMALL_CALLS": False}),
    "three-pass": ("three-pass", True, {}),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int64", "bool"])
@pytest.mark.parametrize("config", list(INTO_CONFIGS))
def test_compact_into(config: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first ``count`` entries of the caller's buffers (allocated under the poison too),
    with a caller's count of either dtype (0xFF.. / 0x7F.. before the call) and without."""
    algorithm, stable, switches = INTO_CONFIGS[config]
    _switch(monkeypatch, switches)
    for i, n in enumerate(SIZES):
        a_np = make(n, dtype, seed=10 + i)
        a = cupy.asarray(a_np)
        for j, p in enumerate(PS):
            pred, ref = threshold(dtype, p, "string" if (i + j) % 2 else "callable")
            output = rotation(i, j)
            count_dtype = (None, np.int64, np.uint64)[(i + 2 * j) % 3]

            def call() -> Any:
                vals = cupy.empty(n, a.dtype) if output != "indices" else None
                idx = cupy.empty(n, np.int64) if output != "values" else None
                out = (vals, idx) if output == "both" else vals if output == "values" else idx
                count = None if count_dtype is None else cupy.empty(1, count_dtype)
                got = compact_into(a, pred, out, output=output, count=count, stable=stable,
                                   algorithm=algorithm)
                assert count is None or got is count
                k = int(cupy.asnumpy(got)[0])
                head = tuple(None if b is None else b[:k] for b in (vals, idx))
                return head if output == "both" else head[0] if output == "values" else head[1]

            what = f"{config} {dtype} n={n} p={p} {output} count={count_dtype}"
            canon = (lambda r: r) if stable else unordered(output)
            got = twice(call, a_np.nbytes, what, canon)
            assert_same(got, canon(want_of(a_np, ref(a_np), output)), what)


# ---------------------------------------------------------------------- compact_records -------


def record(n: int, seed: int) -> dict[str, np.ndarray]:
    """Fields of 1, 2, 4, 8 and 12 bytes a row, rows of several units, and one the predicate
    does not read."""
    rng = np.random.default_rng(seed)
    return {
        "e": rng.random(n).astype(np.float32),
        "k": rng.integers(0, 5, n).astype(np.int8),
        "h": rng.integers(0, 60_000, n).astype(np.uint16),
        "pos": rng.random((n, 3)).astype(np.float32),
        "r64": rng.random((n, 2)),
        "id": np.arange(n, dtype=np.int64) * 3 + 1,
        "flag": rng.random(n) < 0.3,
    }


def record_pred(p: float, kind: str) -> tuple[Any, Callable[[dict[str, np.ndarray]], Any]]:
    t = {0.0: -1.0, 0.05: 0.0625, 0.5: 0.5, 1.0: 2.0}[p]
    if kind == "string":
        return f"(e < {t!r}) & (k != 9)", (lambda f: (f["e"] < t) & (f["k"] != 9))
    if kind == "callable":
        return (lambda e, h: (e < t) & (h >= 0)), (lambda f: (f["e"] < t) & (f["h"] >= 0))
    return (lambda e: e.astype(np.float64) < t), (lambda f: f["e"].astype(np.float64) < t)


def record_want(f: dict[str, np.ndarray], mask: np.ndarray, indices: bool) -> dict[str, Any]:
    out = {name: a[mask] for name, a in f.items()}
    if indices:
        out["indices"] = np.flatnonzero(mask).astype(np.int64)
    return out


# id -> (switches of cupy_tuning, REC_DENSE_FROM): the ready call and the general one,
# each copy form alone (0.0: every span to the scatter; 2.0: every span to the list form)
RECORD_CONFIGS = {
    "ready": ({}, None),
    "general": ({"FAST_SMALL_CALLS": False}, None),
    "ready:scatter": ({}, 0.0),
    "general:gather": ({"FAST_SMALL_CALLS": False}, 2.0),
}


@pytest.mark.parametrize("config", list(RECORD_CONFIGS))
def test_compact_records(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    switches, dense_from = RECORD_CONFIGS[config]
    _switch(monkeypatch, switches)
    if dense_from is not None:
        monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", dense_from)
    kinds = ("string", "callable", "mask")
    for i, n in enumerate(SIZES):
        f_np = record(n, seed=20 + i)
        f = {name: cupy.asarray(v) for name, v in f_np.items()}
        nbytes = sum(v.nbytes for v in f_np.values())
        for j, p in enumerate(PS):
            kind = kinds[(i + j) % 3]
            pred, ref = record_pred(p, kind)
            indices = (i + j) % 2 == 0
            what = f"records {config} n={n} p={p} {kind} indices={indices}"
            got = twice(lambda: compact_records(f, pred, indices=indices), nbytes, what)
            assert_same(got, record_want(f_np, ref(f_np), indices), what)


@pytest.mark.parametrize("config", ["ready", "general"])
def test_compact_records_into(config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync-free form into the caller's buffers (every field, or some and the indices),
    with and without a caller's count."""
    switches, _ = RECORD_CONFIGS[config]
    _switch(monkeypatch, switches)
    for i, n in enumerate(SIZES):
        f_np = record(n, seed=40 + i)
        f = {name: cupy.asarray(v) for name, v in f_np.items()}
        nbytes = sum(v.nbytes for v in f_np.values())
        for j, p in enumerate(PS):
            pred, ref = record_pred(p, ("string", "callable")[(i + j) % 2])
            some = (i + j) % 2 == 1
            names = ["pos", "id", "k"] if some else list(f_np)
            with_count = j % 2 == 0

            def call() -> Any:
                out = {name: cupy.empty_like(f[name]) for name in names}
                if some:
                    out["indices"] = cupy.empty(n, np.int64)
                count = cupy.empty(1, np.int64) if with_count else None
                got = compact_records_into(f, pred, out, count=count)
                assert count is None or got is count
                k = int(cupy.asnumpy(got)[0])
                return {name: b[:k] for name, b in out.items()}

            what = f"records_into {config} n={n} p={p} some={some} count={with_count}"
            got = twice(call, nbytes, what)
            want = record_want(f_np, ref(f_np), some)
            assert_same(got, {name: want[name] for name in got}, what)


# --------------------------------------------------------------------------- partition -------


@pytest.mark.parametrize("dtype", DTYPES)
def test_partition_array(dtype: str) -> None:
    """Values (count, tile scan, dcx_partition) and indices alone (the records' passes)."""
    kinds = KINDS.get(dtype, ("string",))
    for i, n in enumerate(SIZES):
        a_np = make(n, dtype, seed=60 + i)
        a = cupy.asarray(a_np)
        for j, p in enumerate(PS):
            kind = kinds[(i + j) % len(kinds)]
            pred, ref = threshold(dtype, p, kind)
            output = rotation(i, j)
            m = np.asarray(ref(a_np)).ravel()
            order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)]).astype(np.int64)
            values = a_np.ravel()[order]
            want = {"values": (values, int(m.sum())), "indices": (order, int(m.sum())),
                    "both": (values, order, int(m.sum()))}[output]
            what = f"partition {dtype} n={n} p={p} {kind} {output}"
            got = twice(lambda: partition_array(a, pred, output=output), a_np.nbytes, what)
            assert_same(tuple(got), want, what)


# ------------------------------------------------------------------------------- scans -------

SCAN_INPUTS = [  # (input dtype, dtype= argument): NumPy's accumulators and explicit ones
    ("int32", np.int64), ("int32", None), ("int32", np.int32), ("int8", None), ("int8", np.int32),
    ("uint16", None), ("int64", None), ("bool", None), ("float32", None), ("float64", None),
]


def scan_input(n: int, dtype: str, seed: int) -> np.ndarray:
    """conftest.scan_data's input (integers over their whole range: their sums wrap, as
    NumPy's do), but small integers for floats: their sums are exact in any order, so a float
    scan is held to NumPy's bits."""
    if np.dtype(dtype).kind == "f":
        return np.random.default_rng(seed).integers(-8, 9, n).astype(dtype)
    return scan_data(dtype, n, seed)


@pytest.mark.parametrize("dtype, acc", SCAN_INPUTS)
@pytest.mark.parametrize("alg", ["lookback", "shared", "thread-efficient", "work-efficient",
                                 "naive"])
def test_scan_array(alg: str, dtype: str, acc: Any) -> None:
    for i, n in enumerate(SIZES):
        if alg == "naive" and n > 70_001 and dtype not in ("int32", "float32"):
            continue  # a launch per level over the whole array: the large size on two dtypes
        a_np = scan_input(n, dtype, seed=80 + i)
        a = cupy.asarray(a_np)
        want_acc = np.cumsum(np.zeros(0, a_np.dtype)).dtype if acc is None else np.dtype(acc)
        for exclusive in (False, True):
            what = f"scan {alg} {dtype}->{want_acc} n={n} exclusive={exclusive}"
            got = twice(lambda: scan_array(a, exclusive=exclusive, algorithm=alg, dtype=acc),
                        a_np.nbytes, what)
            assert_bits(got, scan_reference(a_np, exclusive, want_acc), what)


# ---------------------------------------------------------------- dask arrays of CuPy -------


def cupy_chunks(a: np.ndarray, chunks: Any) -> Any:
    return da.from_array(a, chunks=chunks).map_blocks(cupy.asarray, dtype=a.dtype,
                                                       meta=cupy.empty((0,), a.dtype))


DASK_SIZES = [0, 1, 33, 1025, 70_001, 2**20 + 3]


def threaded(call: Callable[[], Any]) -> Callable[[], Any]:
    """``call`` with dask's threaded scheduler (what an eager call computes at once)."""

    def run() -> Any:
        with dask.config.set(scheduler="threads"):
            return call()

    return run


def _chunking(n: int) -> Any:
    """Odd chunks, an empty one among them where there is room."""
    if n < 40:
        return max(1, n)
    step = n // 7 + 1
    sizes = [step] * (n // step) + ([n % step] if n % step else [])
    return (tuple(sizes[:2] + [0] + sizes[2:]),)


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint16", "float64"])
def test_dask_map_compact_cumsum_partition(dtype: str) -> None:
    """map_compact (every output and kernel), compact by a mask, flatnonzero, partition and
    cumsum (every scan) over dask arrays of CuPy chunks, on the threaded scheduler."""
    algorithms = [("auto", True), ("single-pass", True), ("three-pass", True),
                  ("hybrid", False), ("scan", True)]
    scans = ["auto", "lookback", "shared", "thread-efficient", "work-efficient", "naive"]
    for i, n in enumerate(DASK_SIZES):
        a_np = make(n, dtype, seed=120 + i)
        x = cupy_chunks(a_np, _chunking(n))
        for j, p in enumerate(PS):
            pred, ref = threshold(dtype, p, ("string", "callable")[(i + j) % 2])
            output = rotation(i, j)
            algorithm, stable = algorithms[(i + j) % len(algorithms)]
            what = f"map_compact {dtype} n={n} p={p} {output} {algorithm}"
            canon = (lambda r: r) if stable else unordered(output)

            def mapped() -> Any:
                with dask.config.set(scheduler="threads"):
                    return x.map_compact(pred, output=output, stable=stable,
                                         algorithm=algorithm)

            got = twice(mapped, a_np.nbytes // 7 + 1, what, canon)
            assert_same(got, canon(want_of(a_np, ref(a_np), output)), what)
        # a mask (compact_masked on each chunk) and flatnonzero
        pred, ref = threshold(dtype, 0.5, "string")
        m = np.asarray(ref(a_np)).ravel()
        mask = cupy_chunks(m, _chunking(n))

        def by_mask() -> Any:
            with dask.config.set(scheduler="threads"):
                return (dask_compact.compact(x, mask, output="both"),
                        dask_compact.flatnonzero(mask))

        got = twice(by_mask, a_np.nbytes // 7 + 1, f"compact by mask {dtype} n={n}")
        assert_same(got, (want_of(a_np, m, "both"), want_of(a_np, m, "indices")),
                    f"compact by mask {dtype} n={n}")
        # partition (both outputs), eager: persisted on the threaded scheduler
        order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)]).astype(np.int64)

        def split() -> Any:
            with dask.config.set(scheduler="threads"):
                return dask_compact.partition(x, pred, output="both")

        got = twice(split, a_np.nbytes // 7 + 1, f"partition {dtype} n={n}")
        assert_same(tuple(got), (a_np[order], order, int(m.sum())), f"partition {dtype} n={n}")
        # cumsum: integers (floats of small integers), exact in any order
        s_np = scan_input(n, dtype, seed=140 + i)
        s = cupy_chunks(s_np, _chunking(n))
        alg = scans[i % len(scans)]
        acc = np.cumsum(np.zeros(0, s_np.dtype)).dtype
        for exclusive in (False, True):
            what = f"cumsum {dtype} n={n} {alg} exclusive={exclusive}"
            got = twice(threaded(lambda: dask_compact.cumsum(s, exclusive=exclusive,
                                                             algorithm=alg)),
                        s_np.nbytes // 7 + 1, what)
            assert_bits(got, scan_reference(s_np, exclusive, acc), what)


@pytest.mark.usefixtures("one_bucket_per_chunk")
@pytest.mark.parametrize("local", ["auto", "radix"])
@pytest.mark.parametrize("dtype", ["float32", "int8", "uint16", "int64", "float64"])
def test_dask_sort_argsort(dtype: str, local: str) -> None:
    """sort and argsort of dask arrays of CuPy chunks (the chunk steps of cupy_sort or the
    radix sort from partition_array, the buckets' exchange), one chunk (the local sort alone)
    and several. Values without NaN and -0.0, whose order among equals np.sort leaves open."""
    for i, n in enumerate(DASK_SIZES):
        if local == "radix" and n > 70_001 and dtype not in ("float32", "int64"):
            continue  # a split per key bit: the large size on two dtypes
        rng = np.random.default_rng(160 + i)
        a_np = rng.integers(-50, 50, n).astype(dtype) if dtype[0] == "i" else (
            rng.integers(0, 900, n).astype(dtype) if dtype[0] == "u"
            else (rng.standard_normal(n) * 10).round(1).astype(dtype) + 0)  # no -0.0
        for chunks in (max(1, n), _chunking(n)):
            x = cupy_chunks(a_np, chunks)
            what = f"sort {dtype} n={n} local={local} chunks={chunks}"
            got = twice(threaded(lambda: dask_compact.sort(x, local=local)), a_np.nbytes, what)
            assert_bits(got, np.sort(a_np), what)
            got = twice(threaded(lambda: dask_compact.argsort(x, local=local)), a_np.nbytes,
                        "arg" + what)
            assert_bits(got, np.argsort(a_np, kind="stable").astype(np.int64), "arg" + what)


# ------------------------------------------------------- a block still written elsewhere -------


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "general"])
def test_compact_into_makes_its_count_in_the_order_of_its_stream(
        ready: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """compact_into(..., stream=s) without a count makes one: in s's order, since the call
    writes it there. CuPy's pool hands a freed block to the next allocation on the stream it
    was freed on at once, the work still queued there on it included: a count made on the
    default stream while that stream still had to write a block just freed got that block,
    the call stored the count on s, and the default stream's write landed on it afterwards
    (-7 here; until 2026-12-01, found by reading the code: not yet run on a GPU)."""
    monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", ready)
    s = cupy.cuda.Stream(non_blocking=True)
    a_np = make(4099, "float32", seed=7)
    want = int(np.count_nonzero(a_np < 0.5))
    a = cupy.asarray(a_np)
    out = cupy.empty(a.size, a.dtype)
    busy = cupy.ones(1 << 27, np.float32)  # 512 MiB: a few ms of work on the default stream
    compact_into(a, "x < 0.5", out, stream=s)  # the ready call made and kept beforehand
    for _ in range(4):
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        tmp = cupy.empty(1, np.int64)  # a block of its own, the count's size class
        freed = tmp.data.ptr
        for _ in range(8):
            busy *= 1.0
        tmp.fill(-7)  # queued behind the busy work
        del tmp  # free at once, its fill still to come
        count = compact_into(a, "x < 0.5", out, stream=s)
        # the block the default stream has still to write is not the count's (whatever the
        # timing: the pool gives it only to an allocation in the default stream's order)
        assert count.data.ptr != freed
        s.synchronize()
        cupy.cuda.Device().synchronize()  # the fill has landed wherever it lands
        assert int(count.get()[0]) == want
        assert_bits(cupy.asnumpy(out[:want]), a_np[a_np < 0.5])


def test_repeated_compact_records_into_frees_its_workspace_in_its_streams_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """compact_records_into again on the same arguments with ``stream=s`` runs the ready call
    it kept; where that call's workspace is not kept (over KEEP_SCRATCH_BYTES: 2^26 rows; 0
    here, so at any size) the call makes it, queues the kernels that use it on s and frees it
    on return. Made on the current stream (until 2026-12-01), it went back to that stream's
    share of the pool while s had still to run on it: the next allocation on the default
    stream got it and wrote into the ballot words and tile counts s was reading (found by
    reading the code: not yet run on a GPU). Made in s's order, it goes back to s's share."""
    monkeypatch.setattr(cupy_records_ready, "KEEP_SCRATCH_BYTES", 0)
    n = (1 << 20) + 3
    f_np = record(n, seed=7)
    mask = f_np["e"] < 0.5
    f = {name: cupy.asarray(v) for name, v in f_np.items()}
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())  # the fields were written on the default one
    out = {"id": cupy.empty(n, np.int64), "pos": cupy.empty((n, 3), np.float32)}
    count = cupy.empty(1, np.int64)
    busy = cupy.ones(1 << 27, np.float32)
    forget_kept_calls()
    compact_records_into(f, "e < 0.5", out, count=count, stream=s)  # checked; keeps its call
    s.synchronize()
    (call,) = [c for c in cupy_records_ready._by_content._items.values() if c.n == n]
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        with s:
            for _ in range(8):
                busy *= 1.0  # s is busy a few ms: the call's kernels run after it returns
        compact_records_into(f, "e < 0.5", out, count=count, stream=s)  # the repeated call
        junk = cupy.empty(call.ws_bytes, np.uint8)  # on the default stream
        # not the workspace s has still to use (counts_ptr: where the call's last one began)
        assert junk.data.ptr != call.counts_ptr
        junk.fill(0)
        del junk
        s.synchronize()
        k = int(count.get()[0])
        assert k == int(mask.sum())
        assert_bits(cupy.asnumpy(out["id"][:k]), f_np["id"][mask], "id")
        assert_bits(cupy.asnumpy(out["pos"][:k]), f_np["pos"][mask], "pos")


def test_compact_into_kept_call_makes_its_words_in_the_order_of_its_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ready call that compact_into(..., stream=s) keeps holds its tile words, used by
    every launch on s. Made on the current stream (until 2026-12-01), they went back to that
    stream's share of CuPy's pool when the call was evicted, while s could still have a launch
    using them: the default stream's next allocation of their size got them (written beside
    the count fix, from a poisoned-pool probe's note). Made in s's order, they go back to s's
    share."""
    monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", True)
    s = cupy.cuda.Stream(non_blocking=True)
    a_np = make(70001, "float32", seed=11)
    mask = a_np < 0.5
    a = cupy.asarray(a_np)
    out = cupy.empty(a.size, a.dtype)
    count = cupy.empty(1, np.int64)
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        forget_kept_calls()
        cupy.get_default_memory_pool().free_all_blocks()
        compact_into(a, "x < 0.5", out, count=count, stream=s)  # makes and keeps its call
        s.synchronize()
        calls = [c for _, c in ck._ready_calls._items.values()
                 if isinstance(c, cupy_ready.IntoCall)]
        assert len(calls) == 1
        words = calls[0].kernel.words
        ptr, nbytes = words.data.ptr, words.nbytes
        del calls, words
        forget_kept_calls()  # the call evicted: its words freed
        junk = cupy.empty(nbytes, np.uint8)  # on the default stream
        assert junk.data.ptr != ptr
        del junk
        compact_into(a, "x < 0.5", out, count=count, stream=s)
        s.synchronize()
        k = int(count.get()[0])
        assert k == int(mask.sum())
        assert_bits(cupy.asnumpy(out[:k]), a_np[mask])


@pytest.mark.parametrize("call", ["ready", "general", "records"])
def test_compact_into_converts_its_input_in_the_order_of_its_stream(
        call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """compact_into(..., stream=s) of a CuPy view of the other byte order (CuPy makes no such
    arrays, only views of a swapped dtype) converts it to a native copy first, which the
    call's kernel on s reads: the copy is made on s. Made on the current stream (until
    2026-12-01, thirteenth session; left by the twelfth session's probes), here busy a few
    ms, it was queued behind that work in a block the current stream had just freed, while
    s's kernel read the block at once: 0xFF bytes (NaNs), nothing selected. compact_records_into
    (``records``) made its copy on s already; checked the same way."""
    monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", call != "general")
    s = cupy.cuda.Stream(non_blocking=True)
    a_np = make(70001, "float32", seed=13)
    mask = a_np < 0.5
    swapped = a_np.astype(a_np.dtype.newbyteorder())
    a = cupy.asarray(swapped.view(np.uint8)).view(swapped.dtype)
    ids = cupy.arange(a.size, dtype=np.int64)
    out = cupy.empty(a.size, np.float32)
    rows = {"id": cupy.empty(a.size, np.int64)}
    count = cupy.empty(1, np.int64)
    busy = cupy.ones(1 << 27, np.float32)  # 512 MiB: a few ms of work on the default stream

    def run() -> None:
        if call == "records":
            compact_records_into({"e": a, "id": ids}, "e < 0.5", rows, count=count, stream=s)
        else:
            compact_into(a, "x < 0.5", out, count=count, stream=s)

    cupy.cuda.Device().synchronize()  # the input written (on the default stream) before s reads it
    run()  # the kernels built, the ready call kept
    s.synchronize()
    for _ in range(3):
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        junk = cupy.empty(a.nbytes, np.uint8)  # the copy's size, on the default stream
        junk.fill(0xFF)
        cupy.cuda.Device().synchronize()
        del junk  # back to the default stream's share, NaN bytes
        for _ in range(8):
            busy *= 1.0
        run()
        s.synchronize()
        k = int(count.get()[0])
        assert k == int(mask.sum())
        if call == "records":
            assert_bits(cupy.asnumpy(rows["id"][:k]), np.flatnonzero(mask), "id")
        else:
            assert_bits(cupy.asnumpy(out[:k]), a_np[mask], "values")
    cupy.cuda.Device().synchronize()
