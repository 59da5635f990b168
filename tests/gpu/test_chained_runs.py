"""Chained runs: a run of chunks compacted by one task (``compact_many``, ``compact_runs``:
map_compact's grouped tasks), once its predicate has selected on the dtype and output, writes
every chunk straight into one output sized from that fraction over the run's length, each
chunk's kernel starting where the previous one's ended (a device word, kernels/single_pass.cu
``d_start``); a run that selects more than that room runs again where it overflowed
(cupy_exact._run_chained, _chained_overflow; 2026-12-02, sixteenth session). Against NumPy:
every dtype and output, fractions rising, falling and overflowing within a run, odd chunk
sizes, empty chunks, runs of one chunk.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from gpu_helpers import held_bytes  # noqa: E402

from dask_compact.backends import cupy_backend as cb  # noqa: E402
from dask_compact.backends import cupy_exact as ce  # noqa: E402
from dask_compact.backends import cupy_tuning as ct  # noqa: E402
from dask_compact.backends.cupy_ready import speculated  # noqa: E402
from dask_compact.predicate.core import Predicate  # noqa: E402
from dask_compact.predicate.expr import Call, Param, Var  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
OUTPUTS = ["values", "indices", "both"]


def predicate(dtype: str) -> Predicate:
    """A new predicate (an empty memo) selecting what :func:`chunk` marks: ``x`` for bool,
    ``real(x) < 50`` for complex, ``x < 50`` otherwise."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return Predicate(Var(), (), None, "x")
    kind = "int" if dt.kind in "iu" else "float"
    x = Call("real", (Var(),)) if dt.kind == "c" else Var()
    return Predicate(Call("less", (x, Param(0, kind))), (50,), None, "x < 50")


def chunk(rng: np.random.Generator, n: int, p: float, dtype: str) -> np.ndarray:
    """``n`` elements of which about ``p`` are selected by :func:`predicate`; floats with
    NaNs among the rest and signed zeros among the selected."""
    dt = np.dtype(dtype)
    sel = rng.random(n) < p
    if dt == np.bool_:
        return sel
    low, high = rng.integers(0, 50, n), rng.integers(50, 100, n)
    if dt.kind in "iu":
        return np.where(sel, low, high).astype(dt)
    v = np.where(sel, low + rng.random(n) * 0.5, high + rng.random(n) * 0.5)
    if dt.kind == "f":
        v[~sel & (rng.random(n) < 0.05)] = np.nan
        v[sel & (rng.random(n) < 0.05)] = -0.0
        v[sel & (rng.random(n) < 0.05)] = 0.0
    if dt.kind == "c":
        v = v + 1j * rng.random(n)
    return v.astype(dt)


def want(pred: Predicate, host: list[np.ndarray], bases: list[int], output: str):
    masks = [np.asarray(pred.mask(h), dtype=bool) for h in host]
    v = np.concatenate([h[m] for h, m in zip(host, masks)]) if host else np.empty(0)
    i = (np.concatenate([np.flatnonzero(m) + b for m, b in zip(masks, bases)])
         if host else np.empty(0, np.int64))
    return {"values": (v,), "indices": (i,), "both": (v, i)}[output]


def check(got: Any, wanted: tuple, output: str) -> None:
    parts = got if output == "both" else (got,)
    assert len(parts) == len(wanted)
    for g, w in zip(parts, wanted):
        assert isinstance(g, cupy.ndarray)
        g = cupy.asnumpy(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        if g.dtype.kind in "fc":  # bytes: NaNs and signed zeros as NumPy's
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
        else:
            np.testing.assert_array_equal(g, w)


def bases_of(sizes: list[int], first: int = 5) -> list[int]:
    out, at = [], first
    for n in sizes:
        out.append(at)
        at += n + 1000  # gaps: chunks of a run need not be consecutive in the input
    return out


class Spy:
    """The chained runs and overflows taken (room, ends) while installed."""

    def __init__(self, monkeypatch: Any) -> None:
        self.chained: list[int] = []
        self.overflows: list[tuple[int, list[int]]] = []
        run, over = ce._run_chained, ce._chained_overflow

        def chained(live, output, sink=None):
            self.chained.append(len(live))
            return run(live, output, sink)

        def overflow(live, output, vals, idx, ends, room):
            self.overflows.append((room, list(ends)))
            return over(live, output, vals, idx, ends, room)

        monkeypatch.setattr(ce, "_run_chained", chained)
        monkeypatch.setattr(ce, "_chained_overflow", overflow)


# (sizes, fractions) of the runs of one test, in order: a first run (nothing learned: counts
# first or reads once), then fractions falling, rising (the large chunk last: the first chunks
# fit, the rest runs again), overflowing at the first chunk, none, all after none, all again,
# odd sizes with empty chunks, runs of one chunk, a run of empty chunks only.
BIG = (1 << 18) + 7  # 16-64 tiles (4096-16384 elements a tile)
STEPS = [
    ([65_537, 1025, 0, BIG], [0.5, 0.5, 0.0, 0.5]),
    ([65_537, 1025, 0, BIG], [0.95, 0.6, 0.0, 0.05]),
    ([65_537, 1025, 0, BIG], [0.05, 0.3, 0.0, 0.95]),
    ([BIG, 31, 1025], [0.6, 0.1, 0.1]),
    ([BIG, 31, 0, 1025], [0.0, 0.0, 0.0, 0.0]),
    ([33, 0, BIG, 1], [1.0, 0.0, 1.0, 1.0]),
    ([33, 0, BIG, 1], [1.0, 0.0, 1.0, 1.0]),
    ([1, 31, 33, 0, 1023, 1025, 8191, 4099, 65_521], [0.3, 0.9, 0.5, 0, 0.4, 0.6, 0.2, 0.7, 0.4]),
    ([1025], [0.4]),
    ([1], [1.0]),
    ([0, 0], [0.0, 0.0]),
    ([BIG], [0.45]),
    ([BIG, 31], [0.0, 0.0]),
    # after a fraction of 0 the room is SPECULATE_SLACK elements: the first chunk alone
    # selects more, and the whole run runs again
    ([BIG, 33], [1.0, 1.0]),
]


# every dtype with both outputs (values and indices, one kernel); each output alone on a few
# (a module each to compile: the GPU check stays short)
DTYPE_OUTPUTS = ([(d, "both") for d in DTYPES]
                 + [(d, o) for d in ("int8", "uint16", "float32", "complex128")
                    for o in ("values", "indices")])


@pytest.mark.parametrize("dtype,output", DTYPE_OUTPUTS)
def test_runs_chain_after_a_first_run_and_match_numpy(dtype, output, monkeypatch):
    """compact_many over STEPS: every run equal to NumPy; the first one not chained (nothing
    learned), every later run with a chunk chained, into outputs of speculated(previous
    fraction, run length) elements whose head the result is, and run again iff it selected
    more than that. stable=False with algorithm="auto" takes the same chained run once the
    predicate has selected (the order kept)."""
    spy = Spy(monkeypatch)
    pred = predicate(dtype)
    rng = np.random.default_rng([len(dtype), len(output)])
    key = ("fraction", np.dtype(dtype), output)
    prev = None
    firsts_fit = whole_reruns = 0
    for step, (sizes, ps) in enumerate(STEPS):
        host = [chunk(rng, n, p, dtype) for n, p in zip(sizes, ps)]
        bases = bases_of(sizes)
        wanted = want(pred, host, bases, output)
        k, n = int(wanted[0].size), sum(sizes)
        for stable in (True, False):
            before, overs = len(spy.chained), len(spy.overflows)
            got = cb.compact_many([cupy.asarray(h) for h in host], pred, output, stable,
                                  "auto", bases)
            check(got, wanted, output)
            if n == 0:
                assert len(spy.chained) == before  # nothing to run
                continue
            if prev is None:
                assert len(spy.chained) == before, step  # the first run: nothing learned
            else:
                assert spy.chained[before:] == [sum(1 for s in sizes if s)], step
                room = speculated(prev, n)
                if k > room:
                    assert len(spy.overflows) == overs + 1, (step, k, room)
                    r, ends = spy.overflows[-1]
                    assert r == room and ends[-1] == k
                    firsts_fit += ends[0] <= room
                    whole_reruns += ends[0] > room
                else:
                    assert len(spy.overflows) == overs, (step, k, room)
                    for g in (got if output == "both" else (got,)):
                        assert held_bytes(g) >= room * g.itemsize
            prev = pred.memo[key]
            assert prev == k / n
    assert firsts_fit and whole_reruns  # both overflow paths taken


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64", "complex128"])
def test_a_chain_writes_only_below_its_room(dtype, output):
    """cupy_exact.queue_chain into poisoned outputs larger than the run's selection: the
    first min(room, k) elements are the run's selection in order, nothing at or past room is
    touched (rooms at 0, 1, inside the first chunk, at a chunk's end, inside a later chunk,
    k - 1, k, k + 1, n), and the ends are the chunks' whole cumulative counts."""
    pred = predicate(dtype)
    rng = np.random.default_rng(3)
    sizes, ps = [300_007, 33, 1, 65_537, 4097], [0.3, 0.9, 1.0, 0.7, 0.0]
    host = [chunk(rng, n, p, dtype) for n, p in zip(sizes, ps)]
    bases = bases_of(sizes, first=0)
    wanted = want(pred, host, bases, output)
    counts = [int(np.asarray(pred.mask(h)).sum()) for h in host]
    ends = list(np.cumsum(counts))
    k, n = ends[-1], sum(sizes)
    live = [(ce.make_plan(cupy.asarray(h), pred, None, output, "single-pass"), b)
            for h, b in zip(host, bases)]
    dt = np.dtype(dtype)
    sentinel = np.array(7 if dt.kind in "iu" else -3.5, dt)
    for room in sorted({0, 1, 31, counts[0] // 2, ends[0], ends[1], ends[2] - 1,
                        ends[3] - 17, k - 1, k, k + 1, n}):
        vals = cupy.full(n, sentinel, dt) if output != "indices" else None
        idx = cupy.full(n, -9, np.int64) if output != "values" else None
        got_ends = ce.read_words(ce.queue_chain(live, vals, idx, room))
        assert got_ends == ends, room
        w = min(room, k)
        for out, wv, poison in ((vals, wanted[0], sentinel), (idx, wanted[-1], -9)):
            if out is None:
                continue
            o = cupy.asnumpy(out)
            if dt.kind in "fc":
                np.testing.assert_array_equal(o[:w].view(np.uint8), wv[:w].view(np.uint8))
            else:
                np.testing.assert_array_equal(o[:w], wv[:w])
            assert (o[w:] == poison).all(), (room, int((o[w:] != poison).sum()))


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("dtype", ["int8", "float32", "float64", "uint64"])
def test_compact_runs_chain_every_run_of_a_task(dtype, output, monkeypatch):
    """compact_runs (every run one worker thread holds, one output each): one chain over all
    the task's chunks, each run's output its slice; runs of one chunk, an empty run, empty
    chunks; rising, falling and overflowing calls; against NumPy."""
    spy = Spy(monkeypatch)
    pred = predicate(dtype)
    rng = np.random.default_rng(11)
    shape = [[1025, 0, 31], [BIG], [0], [33, 4096, 1], [65_537]]
    for step, ps in enumerate(([0.2] * 5, [0.2] * 5, [0.05, 0.1, 0, 0.9, 0.95],
                               [0.9, 0.5, 0, 0.1, 0.0], [0.0] * 5, [1.0] * 5, [0.5] * 5)):
        runs = [[chunk(rng, n, p, dtype) for n in r] for r, p in zip(shape, ps)]
        bases = [bases_of(r, first=10_000_000 * j) for j, r in enumerate(shape)]
        got = cb.compact_runs([[cupy.asarray(b) for b in r] for r in runs], pred, output, True,
                              "auto", bases)
        assert len(got) == len(runs)
        for g, r, bs in zip(got, runs, bases):
            check(g, want(pred, r, bs, output), output)
        # the first call learns; every later one is one chain over the 7 chunks not empty
        assert spy.chained == [7] * step
    assert spy.overflows  # the rises (to 0.5 in the large chunk, to everything) overflowed


@pytest.mark.parametrize("output", OUTPUTS)
def test_runs_do_not_chain_before_a_first_run_or_when_switched_off(output, monkeypatch):
    """Nothing learned: a run counts first or reads once, as before; CHAINED_RUNS = False:
    never chained, whatever was learned; a mask-path run (compact_masked's plans carry no
    memo) never. Results equal NumPy every time."""
    spy = Spy(monkeypatch)
    pred = predicate("float32")
    rng = np.random.default_rng(5)
    sizes = [BIG, 1025, 0, 33]
    host = [chunk(rng, n, 0.3, "float32") for n in sizes]
    bases = bases_of(sizes)
    wanted = want(pred, host, bases, output)
    blocks = [cupy.asarray(h) for h in host]
    monkeypatch.setattr(ct, "CHAINED_RUNS", False)
    for _ in range(2):
        check(cb.compact_many(blocks, pred, output, True, "auto", bases), wanted, output)
    assert not spy.chained
    monkeypatch.setattr(ct, "CHAINED_RUNS", True)
    check(cb.compact_many(blocks, pred, output, True, "auto", bases), wanted, output)
    assert spy.chained == [3]  # learned by the runs above (counted first or read once)
    fresh = predicate("float32")
    check(cb.compact_many(blocks, fresh, output, True, "auto", bases), wanted, output)
    assert spy.chained == [3]  # a new predicate: nothing learned
    # explicit algorithms keep theirs: the hybrid (unordered between tiles) and three-pass
    for alg, stable in (("hybrid", False), ("three-pass", True)):
        got = cb.compact_many(blocks, fresh, output, stable, alg, bases)
        parts = got if output == "both" else (got,)
        for g, w in zip(parts, wanted):
            np.testing.assert_array_equal(np.sort(cupy.asnumpy(g)), np.sort(w))
    assert spy.chained == [3]


@pytest.mark.parametrize("output", OUTPUTS)
def test_a_run_that_overflows_the_device_falls_back(output, monkeypatch):
    """A chained run whose outputs do not fit (a MemoryError from their allocation) runs as
    before (reads once or counts first): the same result."""
    pred = predicate("int32")
    rng = np.random.default_rng(8)
    sizes = [4099, 0, 1025]
    host = [chunk(rng, n, 0.5, "int32") for n in sizes]
    bases = bases_of(sizes)
    wanted = want(pred, host, bases, output)
    blocks = [cupy.asarray(h) for h in host]
    check(cb.compact_many(blocks, pred, output, True, "auto", bases), wanted, output)
    spy = Spy(monkeypatch)
    calls = []
    real = ce.output_empty

    def first_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise MemoryError("no room (a test)")
        return real(*args, **kwargs)

    monkeypatch.setattr(ce, "output_empty", first_fails)
    check(cb.compact_many(blocks, pred, output, True, "auto", bases), wanted, output)
    assert spy.chained == [2] and len(calls) > 1
