"""Every public GPU call from 8 threads at once, each thread with its own data, on a
non-blocking stream of its own, on the legacy default stream, or on its per-thread default
stream (CuPy's ``Stream.ptds``; that arm is skipped where CuPy has none), every result
compared bit for bit with NumPy's on the host copy.

What the CuPy layer keeps between calls must never serve two threads or two streams at once:
the ready calls (``cupy_calls._ready_calls``: packed kernels with their rotating sets of
zeroed tile words, a kept scratch, the mapped count word a small exact-size call watches),
the repeated calls (``_repeat_calls``, the records' ``_repeats`` and ``_into_repeats``), each
thread's tile words (``cupy_launchers._reused``) and pinned count buffer
(``cupy_device._count_buffers``), the records' ready calls with their pinned tables and the
column tables uploaded by content (``cupy_records_common._tables`` and ``_pinned``, shared by
every thread), the per-device module caches. docs/design.md, "Where things run", lists each
and how it is kept apart.

Each thread prepares its inputs on its stream, then all wait at a barrier and call back to
back, under forced thread switching (``sys.setswitchinterval(1e-6)``, restored after); a
thread reads its results after its last call (its stream's copies), so many calls are in
flight at once. The repeated-call arms have every thread run the SAME predicate objects on the
same dtype and size, so each thread meets its own ready call, kept scratch and word sets
beside the others': where two threads shared one, the results differ. Sizes from 1 to 2^22 + 5
cross the kept-scratch bound (``cupy_ready.KEEP_SCRATCH_BYTES``) and the mapped-count bound
(``cupy_ready.SPIN_MAX_N``, also where ``stable=False`` turns to the hybrid kernel).

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402
from conftest import scan_reference, sort_input  # noqa: E402
from gpu_helpers import ArmedStream, hold_kernel  # noqa: E402

import dask_compact  # noqa: E402  (registers Array.map_compact)
from dask_compact import (  # noqa: E402
    compact_array,
    compact_into,
    compact_records,
    compact_records_into,
    partition_array,
    scan_array,
)

pytestmark = pytest.mark.gpu

THREADS = 8
CALLS = 20  # per thread; the dask arms (a graph and a scheduler run per call) take DASK_CALLS
DASK_CALLS = 8
KINDS = ["own", "legacy", "per-thread"]
OUTPUTS = ("values", "indices", "both")
PS = (0.0, 0.05, 0.5, 1.0)
# one dtype per thread (the calls of a thread rotate outputs, fractions, sizes and kernels)
DTYPES = ("float32", "float64", "int8", "uint16", "int32", "int64", "float16", "bool")
SMALL = (1, 2, 31, 33, 1023, 1025, 4099, 65_537, 262_147)
# one call of each thread: past the kept scratch (8 MiB) for most outputs, and 2^22 + 5 past
# SPIN_MAX_N (the count read after a stream sync; stable=False there runs the hybrid kernel)
BIG = (2**20 + 3, 3_000_017, 2**22 + 5)
DASK_BIG = (2**20 + 3,)  # the dask arms' one large call (NumPy's sorts of it on the host)
# (algorithm, stable) of compact_array's calls in turn: the ready one-read call (ordered, and
# stable=False up to 2^22), the hybrid's ready call (its counter read back), the general path
ALGORITHMS = (("auto", True), ("auto", False), ("hybrid", False), ("three-pass", True))


# ------------------------------------------------------------------------- the threads -------


@pytest.fixture(autouse=True)
def forced_switching() -> Iterator[None]:
    """Thread switches every microsecond (as the CPU concurrency probes run), and dask's
    threaded scheduler with a few workers for the dask arms (each thread's call gets a pool)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with dask.config.set(scheduler="threads", num_workers=4):
            yield
    finally:
        sys.setswitchinterval(before)


def stream_of(kind: str) -> Any:
    """A thread's stream: a non-blocking one of its own, the legacy default stream, or its
    per-thread default stream (``cupy.cuda.Stream.ptds``: the same object in every thread,
    another stream in each)."""
    if kind == "own":
        return cupy.cuda.Stream(non_blocking=True)
    if kind == "legacy":
        return cupy.cuda.Stream.null
    return cupy.cuda.Stream.ptds


def in_threads(kind: str, work: Callable[[int, Any, Callable[[], Any]], None],
               threads: int = THREADS) -> None:
    """``work(i, stream, start)`` in ``threads`` threads at once, each inside its stream of
    ``kind`` (``with stream:``); ``start()`` waits until every thread has made its inputs, so
    the calls overlap. The first error of any thread is raised here; a thread that has not
    ended after 5 minutes fails the test (a hang)."""
    if kind == "per-thread" and getattr(cupy.cuda.Stream, "ptds", None) is None:
        pytest.skip("this CuPy has no per-thread default stream (cupy.cuda.Stream.ptds)")
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            s = stream_of(kind)
            with s:
                work(i, s, lambda: barrier.wait(timeout=300))
                s.synchronize()
        except threading.BrokenBarrierError as e:
            errors.append(e)
        except BaseException as e:  # noqa: BLE001 -- raised in the calling thread
            errors.insert(0, e)
            barrier.abort()

    pool = [threading.Thread(target=run, args=(i,), name=f"probe-{kind}-{i}")
            for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in pool), f"a {kind}-stream thread hung"
    cupy.cuda.Device().synchronize()
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- data and predicates -------


def size_of(i: int, j: int, big: tuple[int, ...] = BIG) -> int:
    """Call j of thread i: one call of each thread large, the others small (odd) sizes."""
    return big[i % len(big)] if j == 7 else SMALL[(3 * i + j) % len(SMALL)]


def make(n: int, dtype: str, seed: int) -> np.ndarray:
    """Uniform keys in [0, 1) as the dtype (integers 0..99, bools half true); floats of 33
    elements or more carry NaNs and -0.0, which a compaction moves as bits."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return u < 0.5
    if dt.kind in "iu":
        return (u * 100).astype(dt)
    a = u.astype(dt)
    if n >= 33:
        a[7::29] = np.nan
        a[11::31] = -0.0
    return a


# bools by callables (a string compares them with numbers): module objects, so that threads
# share them as they share a string's Predicate
def _none(v: Any) -> Any:
    return v & ~v


def _all(v: Any) -> Any:
    return v | ~v


def _self(v: Any) -> Any:
    return v


def select(dtype: str, p: float) -> tuple[Any, Callable[[np.ndarray], np.ndarray]]:
    """A predicate selecting about ``p`` of make()'s values and its NumPy form (thresholds
    exact in every dtype, so NumPy's comparison is the kernels')."""
    if np.dtype(dtype).kind == "b":
        f = _none if p == 0.0 else _all if p == 1.0 else _self
        return f, f
    t: Any = round(p * 100) if np.dtype(dtype).kind in "iu" else {
        0.0: -1.0, 0.05: 0.0625, 0.5: 0.5, 1.0: 2.0}[p]
    return f"x < {t!r}", (lambda v: v < t)


def selected(a: np.ndarray, mask: np.ndarray, output: str) -> Any:
    m = np.asarray(mask).ravel()
    values = a.ravel()[m]
    indices = np.flatnonzero(m).astype(np.int64)
    return {"values": values, "indices": indices, "both": (values, indices)}[output]


def by_index(r: Any, output: str) -> Any:
    """A result of the unordered (hybrid) kernel in a fixed order: by index where there are
    indices, else by the values' bits."""
    if output == "both":
        o = np.argsort(r[1], kind="stable")
        return r[0][o], r[1][o]
    if output == "indices":
        return np.sort(r)
    u = np.dtype(f"u{r.dtype.itemsize}")
    return np.sort(r.view(u)).view(r.dtype)


# ------------------------------------------------------------------------- comparisons -------


def host(x: Any, s: Any) -> Any:
    """CuPy arrays (also in tuples and dicts) on the host, copied in ``s``'s order (``s``
    synchronised after each copy)."""
    if isinstance(x, cupy.ndarray):
        return cupy.asnumpy(x, stream=s)
    if isinstance(x, dict):
        return {k: host(v, s) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(host(v, s) for v in x)
    return x


def from_dask(y: Any, s: Any) -> Any:
    """A dask result (or a tuple of them) computed and on the host. Its chunks were made by
    the scheduler's pool threads on their default streams, or on ``s`` (a one-chunk sort runs
    in the calling thread), and dask joins them in the calling thread, on its current stream:
    so ``s`` is synchronised, then the result is computed and copied on the legacy default
    stream, whose work waits for the work before it on every blocking stream (a join on a
    non-blocking ``s`` would not wait for the pool's, which is dask's and CuPy's rule, not a
    fault of the call under test)."""
    s.synchronize()
    with cupy.cuda.Stream.null:
        r = tuple(v.compute() for v in y) if isinstance(y, tuple) else y.compute()
        return host(r, cupy.cuda.Stream.null)


def bits(got: Any, want: Any, what: str) -> None:
    """Equal dtype, shape and bytes (NaN payloads and signed zeros included), through tuples
    and dicts; a scalar by ==."""
    if isinstance(want, dict):
        assert list(got) == list(want), what
        for k in want:
            bits(got[k], want[k], f"{what}[{k}]")
        return
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for k, (g, w) in enumerate(zip(got, want)):
            bits(g, w, f"{what}[{k}]")
        return
    if not isinstance(want, np.ndarray):
        assert got == want, (what, got, want)
        return
    assert isinstance(got, np.ndarray), (what, type(got))
    assert (got.dtype, got.shape) == (want.dtype, want.shape), (
        what, got.dtype, got.shape, want.dtype, want.shape)
    g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if g.tobytes() != w.tobytes():
        bad = np.flatnonzero((g.view(np.uint8).reshape(len(g), -1)
                              != w.view(np.uint8).reshape(len(w), -1)).any(axis=1))
        raise AssertionError(f"{what}: {len(bad)} of {len(g)} rows differ, the first at "
                             f"{bad[0]}: {g[bad[0]]!r} against {w[bad[0]]!r}")


def check_all(results: list[tuple[str, Any, Any]], s: Any) -> None:
    """Each (what, device result, NumPy's) of a thread, read after its last call."""
    for what, got, want in results:
        bits(host(got, s), want, what)


# ----------------------------------------------------------------------- compact_array -------


@pytest.mark.parametrize("kind", KINDS)
def test_compact_array_from_threads(kind: str) -> None:
    """compact_array: every output, stable and not, the ready call, the hybrid's ready call
    and the general (three-pass) path, a thread's calls rotating sizes and fractions."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = DTYPES[i]
        cases = []
        for j in range(CALLS):
            n, p, output = size_of(i, j), PS[(i + j) % 4], OUTPUTS[j % 3]
            algorithm, stable = ALGORITHMS[(i + j) % len(ALGORITHMS)]
            a_np = make(n, dtype, seed=1000 * i + j)
            pred, ref = select(dtype, p)
            want = selected(a_np, ref(a_np), output)
            cases.append((f"{kind} thread {i} call {j}: {dtype} n={n} p={p} {output} "
                          f"{algorithm} stable={stable}", cupy.asarray(a_np), pred, output,
                          algorithm, stable, want if stable else by_index(want, output)))
        start()
        got = [(what, compact_array(a, pred, output=output, stable=stable,
                                    algorithm=algorithm), stable, output, want)
               for what, a, pred, output, algorithm, stable, want in cases]
        for what, r, stable, output, want in got:
            h = host(r, s)
            bits(h if stable else by_index(h, output), want, what)

    in_threads(kind, work)


# ------------------------------------------------------------------------ compact_into -------


@pytest.mark.parametrize("given", [False, True], ids=["current-stream", "stream="])
@pytest.mark.parametrize("kind", KINDS)
def test_compact_into_from_threads(kind: str, given: bool) -> None:
    """compact_into into each call's own buffers, nothing read until the thread's last call:
    on the current stream, or with ``stream=`` the thread's stream while the current one is
    the legacy default stream (the inputs and buffers made on the thread's stream, so that
    nothing of the test itself crosses streams). A caller's count of either dtype, or none."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = DTYPES[(i + 3) % len(DTYPES)]
        cases = []
        for j in range(CALLS):
            n, p, output = size_of(i, j), PS[(3 * i + j) % 4], OUTPUTS[(i + j) % 3]
            stable = (i + j // 3) % 3 != 0
            algorithm = "hybrid" if not stable and j % 2 else "auto"  # its IntoCall
            a_np = make(n, dtype, seed=2000 * i + j)
            pred, ref = select(dtype, p)
            want = selected(a_np, ref(a_np), output)
            vals = cupy.empty(n, a_np.dtype) if output != "indices" else None
            idx = cupy.empty(n, np.int64) if output != "values" else None
            count = (None, cupy.empty(1, np.int64), cupy.empty(1, np.uint64))[j % 3]
            cases.append((f"{kind} {'stream=' if given else 'current'} thread {i} call {j}: "
                          f"{dtype} n={n} p={p} {output} {algorithm} stable={stable}",
                          cupy.asarray(a_np), pred, output, (algorithm, stable), vals, idx,
                          count, want if stable else by_index(want, output)))
        start()
        done = []
        for what, a, pred, output, (algorithm, stable), vals, idx, count in (
                c[:8] for c in cases):
            out = (vals, idx) if output == "both" else vals if output == "values" else idx
            if given:
                with cupy.cuda.Stream.null:  # the current stream is another one
                    got = compact_into(a, pred, out, output=output, count=count, stream=s,
                                       stable=stable, algorithm=algorithm)
            else:
                got = compact_into(a, pred, out, output=output, count=count, stable=stable,
                                   algorithm=algorithm)
            assert count is None or got is count, what
            done.append(got)
        for (what, _, _, output, (_, stable), vals, idx, _, want), got in zip(cases, done):
            k = int(host(got, s)[0])
            head = tuple(None if b is None else host(b[:k], s) for b in (vals, idx))
            r = head if output == "both" else head[0] if output == "values" else head[1]
            bits(r if stable else by_index(r, output), want, what)

    in_threads(kind, work)


# --------------------------------------------------------------------- records -------


def record(n: int, seed: int) -> dict[str, np.ndarray]:
    """Fields of 1, 4, 8 and 12 bytes a row and a bool one; the predicates read e and k."""
    rng = np.random.default_rng(seed)
    return {
        "e": rng.random(n).astype(np.float32),
        "k": rng.integers(0, 5, n).astype(np.int8),
        "pos": rng.random((n, 3)).astype(np.float32),
        "id": np.arange(n, dtype=np.int64) * 3 + 1,
        "flag": rng.random(n) < 0.3,
    }


_THRESHOLDS = {0.0: -1.0, 0.05: 0.0625, 0.5: 0.5, 1.0: 2.0}


def _masked(t: float) -> Callable[[Any], Any]:
    """A mask-path record predicate (a call the tracer does not record) over the field e."""
    return lambda e: e.astype(np.float64) < t


# one object per fraction, shared by every thread: the general call, which uploads each new
# column table
_MASKED = {p: _masked(t) for p, t in _THRESHOLDS.items()}


def record_select(p: float, masked: bool) -> tuple[Any, Callable[[dict], np.ndarray]]:
    t = _THRESHOLDS[p]
    if masked:
        return _MASKED[p], (lambda f: f["e"].astype(np.float64) < t)
    return f"(e < {t!r}) & (k != 9)", (lambda f: (f["e"] < t) & (f["k"] != 9))


def record_want(f: dict[str, np.ndarray], m: np.ndarray, indices: bool) -> dict[str, Any]:
    out = {name: a[m] for name, a in f.items()}
    if indices:
        out["indices"] = np.flatnonzero(m).astype(np.int64)
    return out


def rows_of(i: int, j: int) -> int:
    return (2**20 + 3, 1_500_007)[i % 2] if j == 7 else SMALL[(5 * i + j) % len(SMALL)]


@pytest.mark.parametrize("kind", KINDS)
def test_compact_records_from_threads(kind: str) -> None:
    """compact_records: the ready call (a string predicate) and the general call (a mask-path
    predicate: a column table uploaded per call), with and without the indices."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        cases = []
        for j in range(CALLS):
            n, p = rows_of(i, j), PS[(i + j) % 4]
            masked, indices = (i + j) % 3 == 0, j % 2 == 0
            f_np = record(n, seed=3000 * i + j)
            pred, ref = record_select(p, masked)
            cases.append((f"{kind} thread {i} call {j}: n={n} p={p} masked={masked} "
                          f"indices={indices}", {k: cupy.asarray(v) for k, v in f_np.items()},
                          pred, indices, record_want(f_np, ref(f_np), indices)))
        start()
        results = [(what, compact_records(f, pred, indices=indices), want)
                   for what, f, pred, indices, want in cases]
        check_all(results, s)

    in_threads(kind, work)


@pytest.mark.parametrize("given", [False, True], ids=["current-stream", "stream="])
@pytest.mark.parametrize("kind", KINDS)
def test_compact_records_into_from_threads(kind: str, given: bool) -> None:
    """compact_records_into into each call's own buffers (every field, or some and the
    indices; a new column table each call), a caller's count or none, on the current stream
    or with ``stream=`` while the current one is the legacy default stream."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        cases = []
        for j in range(CALLS):
            n, p = rows_of(i, j), PS[(3 * i + j) % 4]
            some = (i + j) % 2 == 1
            f_np = record(n, seed=4000 * i + j)
            pred, ref = record_select(p, False)
            f = {k: cupy.asarray(v) for k, v in f_np.items()}
            names = ["pos", "id", "k"] if some else list(f_np)
            out = {name: cupy.empty_like(f[name]) for name in names}
            if some:
                out["indices"] = cupy.empty(n, np.int64)
            count = cupy.empty(1, np.int64) if j % 2 else None
            want = record_want(f_np, ref(f_np), some)
            cases.append((f"{kind} {'stream=' if given else 'current'} thread {i} call {j}: "
                          f"n={n} p={p} some={some}", f, pred, out, count,
                          {name: want[name] for name in out}))
        start()
        done = []
        for what, f, pred, out, count, _ in cases:
            if given:
                with cupy.cuda.Stream.null:
                    got = compact_records_into(f, pred, out, count=count, stream=s)
            else:
                got = compact_records_into(f, pred, out, count=count)
            assert count is None or got is count, what
            done.append(got)
        for (what, _, _, out, _, want), got in zip(cases, done):
            k = int(host(got, s)[0])
            bits({name: host(b[:k], s) for name, b in out.items()}, want, what)

    in_threads(kind, work)


# ------------------------------------------------------------------ partition, scan -------


@pytest.mark.parametrize("kind", KINDS)
def test_partition_array_from_threads(kind: str) -> None:
    """partition_array: values and both (count, tile scan, dcx_partition), indices alone (the
    records' passes and the empty column table every such call shares)."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = DTYPES[(i + 5) % len(DTYPES)]
        cases = []
        for j in range(CALLS):
            n, p, output = size_of(i, j), PS[(i + 3 * j) % 4], OUTPUTS[(2 * i + j) % 3]
            a_np = make(n, dtype, seed=5000 * i + j)
            pred, ref = select(dtype, p)
            m = np.asarray(ref(a_np)).ravel()
            order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)]).astype(np.int64)
            k = int(m.sum())
            want = {"values": (a_np.ravel()[order], k), "indices": (order, k),
                    "both": (a_np.ravel()[order], order, k)}[output]
            cases.append((f"{kind} thread {i} call {j}: {dtype} n={n} p={p} {output}",
                          cupy.asarray(a_np), pred, output, want))
        start()
        results = [(what, tuple(partition_array(a, pred, output=output)), want)
                   for what, a, pred, output, want in cases]
        check_all(results, s)

    in_threads(kind, work)


# input dtypes of the scans (NumPy's accumulators), one per thread
SCAN_DTYPES = ("int32", "int8", "uint16", "int64", "bool", "float32", "float64", "int16")


def scan_input(n: int, dtype: str, seed: int) -> np.ndarray:
    """Integers over their whole range (sums wrap, as NumPy's do), bools, and floats of
    small integers (sums exact in any order, so held to NumPy's bits)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind == "f":
        return rng.integers(-8, 9, n).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)


@pytest.mark.parametrize("kind", KINDS)
def test_scan_array_from_threads(kind: str) -> None:
    """scan_array: the look-back scan (its tile words per call) and the shared-memory one,
    inclusive and exclusive."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = SCAN_DTYPES[i]
        acc = np.cumsum(np.zeros(0, dtype)).dtype
        cases = []
        for j in range(CALLS):
            n = size_of(i, j)
            exclusive, algorithm = j % 2 == 0, ("auto", "shared")[(j // 2) % 2]
            a_np = scan_input(n, dtype, seed=6000 * i + j)
            cases.append((f"{kind} thread {i} call {j}: {dtype} n={n} {algorithm} "
                          f"exclusive={exclusive}", cupy.asarray(a_np), exclusive, algorithm,
                          scan_reference(a_np, exclusive, acc)))
        start()
        results = [(what, scan_array(a, exclusive=exclusive, algorithm=algorithm), want)
                   for what, a, exclusive, algorithm, want in cases]
        check_all(results, s)

    in_threads(kind, work)


# ----------------------------------------------------------------- dask arrays of CuPy -------


def cupy_chunks(a: np.ndarray, n_chunks: int) -> Any:
    """A dask array of CuPy chunks (made by the scheduler's threads), odd chunk sizes."""
    step = max(1, -(-len(a) // n_chunks))
    x = da.from_array(a, chunks=step, name=False)
    return x.map_blocks(cupy.asarray, dtype=a.dtype, meta=cupy.empty((0,), a.dtype))


@pytest.mark.parametrize("kind", KINDS)
def test_map_compact_from_threads(kind: str) -> None:
    """x.map_compact on dask arrays of CuPy chunks under the threaded scheduler, 8 calls at
    once from 8 threads (each call's tasks on a pool of that thread), every output."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = DTYPES[(i + 1) % len(DTYPES)]
        cases = []
        for j in range(DASK_CALLS):
            n, p, output = size_of(i, j, DASK_BIG), PS[(i + j) % 4], OUTPUTS[(i + 2 * j) % 3]
            a_np = make(n, dtype, seed=7000 * i + j)
            pred, ref = select(dtype, p)
            cases.append((f"{kind} thread {i} call {j}: {dtype} n={n} p={p} {output}",
                          cupy_chunks(a_np, 1 + (i + j) % 5), pred, output,
                          selected(a_np, ref(a_np), output)))
        start()
        for what, x, pred, output, want in cases:
            bits(from_dask(x.map_compact(pred, output=output), s), want, what)

    in_threads(kind, work)


SORT_DTYPES = ("float32", "int8", "uint16", "int64", "float64", "int32", "uint32", "int16")


@pytest.mark.usefixtures("one_bucket_per_chunk")
@pytest.mark.parametrize("kind", KINDS)
def test_sort_argsort_from_threads(kind: str) -> None:
    """dask_compact.sort and argsort of dask arrays of CuPy chunks: one chunk (sorted in the
    calling thread, on its stream) and several (the buckets' exchange on the pool). argsort
    is NumPy's stable argsort exactly; sort's values NumPy's by value (NaNs last; -0.0 and
    NaNs of either sign may come back as one another, as documented)."""

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        dtype = SORT_DTYPES[i]
        cases = []
        for j in range(DASK_CALLS):
            n = size_of(i, j, DASK_BIG)
            a_np = sort_input(np.random.default_rng(8000 * i + j), n, dtype)
            chunks = 1 if j % 2 == 0 else 2 + (i + j) % 4
            cases.append((f"{kind} thread {i} call {j}: {dtype} n={n} chunks={chunks}",
                          cupy_chunks(a_np, chunks), a_np))
        start()
        for what, x, a_np in cases:
            values = from_dask(dask_compact.sort(x), s)
            order = from_dask(dask_compact.argsort(x), s)
            assert values.dtype == a_np.dtype and values.shape == a_np.shape, what
            np.testing.assert_array_equal(values, np.sort(a_np), err_msg=what)
            bits(order, np.argsort(a_np, kind="stable").astype(np.int64), "arg" + what)

    in_threads(kind, work)


# ------------------------------------------------------------------ the same call again -------

# module objects every thread passes: one Predicate (a string's), one traced function
SAME = "x < 0.5"


def _same_or_nan(v: Any) -> Any:
    return (v < 0.5) | (v != v)


@pytest.mark.parametrize("n", [4099, 2**20 + 3])
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_call_from_threads(kind: str, n: int) -> None:
    """Every thread runs the same predicate objects on float32 data of one size, new data
    each call: compact_array (values, indices, both unstable: the ready and the repeated
    call, each thread's own kept scratch, word sets and mapped count word) and compact_into
    with ``stream=`` into the thread's reused buffers and count (its IntoCall). At 2^20 + 3
    the values' scratch is kept (4 MiB), both's is not (12 MiB)."""

    calls = CALLS if n < 2**16 else DASK_CALLS  # the host's NumPy work of 2^20 x 8 x 4

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        inputs = [make(n, "float32", seed=9000 * i + j) for j in range(calls)]
        device = [cupy.asarray(a) for a in inputs]
        vals = cupy.empty(n, np.float32)
        count = cupy.empty(1, np.uint64)
        start()
        kept = []
        for j, a in enumerate(device):
            kept.append((compact_array(a, SAME),
                         compact_array(a, _same_or_nan, output="indices"),
                         compact_array(a, SAME, output="both", stable=False)))
            compact_into(a, _same_or_nan, vals, count=count, stream=s)
            # the thread's buffers are written again by the next call: read them now
            k = int(host(count, s)[0])
            a_np = inputs[j]
            bits(host(vals[:k], s), a_np[(a_np < 0.5) | (a_np != a_np)],
                 f"{kind} n={n} thread {i} call {j}: compact_into")
        for j, (v, idx, both) in enumerate(kept):
            a_np, what = inputs[j], f"{kind} n={n} thread {i} call {j}"
            bits(host(v, s), a_np[a_np < 0.5], what + ": values")
            bits(host(idx, s), np.flatnonzero((a_np < 0.5) | (a_np != a_np)).astype(np.int64),
                 what + ": indices")
            bits(by_index(host(both, s), "both"), selected(a_np, a_np < 0.5, "both"),
                 what + ": both, stable=False")

    in_threads(kind, work)


SAME_RECORD = "(e < 0.5) & (k != 3)"


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_records_calls_from_threads(kind: str) -> None:
    """Every thread runs the same record predicate on one layout of 65,537 rows: fields
    refilled in place each call (a loop over batches: compact_records_into's repeated call
    on the same buffers, whose column table is found by content) and compact_records (the
    ready call with its kept workspace and pinned tables); every third call into new
    buffers (a table uploaded)."""
    n = 65_537

    def work(i: int, s: Any, start: Callable[[], Any]) -> None:
        batches = [record(n, seed=10_000 * i + j) for j in range(CALLS)]
        f = {k: cupy.empty_like(cupy.asarray(v)) for k, v in batches[0].items()}
        out = {name: cupy.empty_like(f[name]) for name in ("e", "pos", "id")}
        out["indices"] = cupy.empty(n, np.int64)
        count = cupy.empty(1, np.int64)
        start()
        kept = []
        for j, f_np in enumerate(batches):
            for name, v in f_np.items():
                f[name][...] = cupy.asarray(v)  # in place, on this thread's stream
            want = record_want(f_np, (f_np["e"] < 0.5) & (f_np["k"] != 3), True)
            kept.append((compact_records(f, SAME_RECORD, indices=True), want))
            into = out if j % 3 else {name: cupy.empty_like(b) for name, b in out.items()}
            compact_records_into(f, SAME_RECORD, into, count=count, stream=s)
            k = int(host(count, s)[0])
            bits({name: host(b[:k], s) for name, b in into.items()},
                 {name: want[name] for name in into}, f"{kind} thread {i} call {j}: into")
        for j, (got, want) in enumerate(kept):
            bits(host(got, s), want, f"{kind} thread {i} call {j}: compact_records")

    in_threads(kind, work)


@pytest.mark.parametrize("kind", ["legacy", "per-thread"])
def test_fresh_threads_one_after_another_leave_work_queued(kind: str) -> None:
    """Threads started one after another, each ending with its last call's copy still queued
    on its default stream (no synchronisation): a later thread may get an earlier one's id
    (``threading.get_ident()``, the kept calls' key until 2026-12-01) and with it, then, that
    thread's ready call, its kept scratch and word sets, while the per-thread default stream
    it runs on is another stream (``cupy_launch.thread_key`` now: an object per thread).
    Each thread's results are read by the main thread once all have ended (on the legacy
    default stream, which waits for every per-thread stream's work)."""
    if kind == "per-thread" and getattr(cupy.cuda.Stream, "ptds", None) is None:
        pytest.skip("this CuPy has no per-thread default stream (cupy.cuda.Stream.ptds)")
    n = 2**20 + 3
    inputs = [make(n, "float32", seed=11_000 + t) for t in range(THREADS)]
    device = [cupy.asarray(a) for a in inputs]
    cupy.cuda.Device().synchronize()
    got: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            with stream_of(kind):
                got[t] = [compact_array(device[t], SAME) for _ in range(3)]
        except BaseException as e:  # noqa: BLE001 -- raised in the main thread
            errors.append(e)

    for t in range(THREADS):
        th = threading.Thread(target=work, args=(t,))
        th.start()
        th.join(timeout=300)
        assert not th.is_alive(), f"thread {t} hung"
    assert not errors, errors
    cupy.cuda.Device().synchronize()
    for t, results in got.items():
        want = inputs[t][inputs[t] < 0.5]
        for r in results:
            bits(host(r, cupy.cuda.Stream.null), want, f"{kind} thread {t}")


class _Interrupted(Exception):
    """Anything raised between a read back's copies and its wait, not a KeyboardInterrupt."""


@pytest.mark.parametrize("error", [KeyboardInterrupt, _Interrupted], ids=["ctrl-c", "raised"])
@pytest.mark.parametrize("how", ["read_counts", "read_words"])
def test_a_read_back_interrupted_before_its_wait_leaves_no_late_copy(error, how, monkeypatch):
    """The counts' read backs (``cupy_device.read_counts``, ``read_words``: every exact-size
    call's one host sync) copy device words into ONE pinned buffer per thread, then
    synchronise the stream. Until 2026-12-01 (fourteenth session; noted by the ready call's
    fix, daeb377) one interrupted between its copies and its wait left its copy queued,
    to land during the thread's next read back on another stream, between that read's own
    copy and its host read (it returned the interrupted call's words for its own). The
    interrupted read back now waits for its stream before it raises: the stream is idle
    once it has raised, and every next read back, on another stream and on the same one,
    returns its own words. The interrupted copy is held behind a kernel of 20-100 us, the
    next one behind one of up to 40 us less, so that the two land close together."""
    from dask_compact.backends import cupy_device

    hold = hold_kernel()
    a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(4242)
    real = cupy.cuda.get_current_stream

    def read(words: Any) -> list[int]:
        if how == "read_counts":
            return cupy_device.read_counts([words[i:i + 1] for i in range(words.size)])
        return cupy_device.read_words(words)

    def words(stream: Any, k: int) -> tuple[list[int], Any]:
        w = rng.integers(0, 2**63, k, dtype=np.uint64)
        with stream:
            d = cupy.asarray(w)
        stream.synchronize()
        return [int(v) for v in w], d

    bad, busy, calls = [], 0, 0
    for ns in (20_000, 50_000, 100_000):
        for lag in range(0, 40_000, 2_000):
            k = 1 + calls % 5
            _, old = words(a, k)
            new_want, new = words(b, k)
            same_want, same = words(a, k)
            with a:
                hold((1,), (1,), (np.uint64(ns),))
                with monkeypatch.context() as m:
                    m.setattr(cupy.cuda, "get_current_stream",
                              lambda: ArmedStream(real(), error))  # fmt: skip
                    with pytest.raises(error):
                        read(old)
                busy += not a.done  # read at once: the interrupted copy still queued
            with b:  # at once: the thread's next read back, on another stream
                hold((1,), (1,), (np.uint64(max(0, ns - lag)),))
                if read(new) != new_want:
                    bad.append(("other stream", ns, lag))
            with a:  # and on the same one
                if read(same) != same_want:
                    bad.append(("same stream", ns, lag))
            calls += 1
    assert not bad, f"{len(bad)} read backs after an interrupted one wrong: {bad[:8]}"
    assert not busy, f"{busy} interrupted read backs left their copy queued"
