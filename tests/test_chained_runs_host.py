"""The chained runs of the GPU backend (``cupy_exact._run_chained``, ``queue_chain``,
``_chained_overflow``; 2026-12-02, sixteenth session) without a GPU: NumPy stand-ins for the
device arrays and for the single-pass kernel, which honours its ``cap``, its chained start
word and its count word as kernels/single_pass.cu does (every count whole, nothing written at
or past cap). What this checks is the host's side: which runs chain, the room, the ends read
back, the overflow's copy and reruns, compact_runs' slices, against NumPy. The kernels
themselves: ``tests/gpu/test_chained_runs.py``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import numpy as np
import pytest

from dask_compact.backends import cupy_backend as cb
from dask_compact.backends import cupy_exact as ce
from dask_compact.backends import cupy_tuning as ct
from dask_compact.backends.cupy_device import NO_CAP
from dask_compact.backends.cupy_launchers import Plan, TileWords
from dask_compact.backends.cupy_ready import speculated


class _Device:
    id = 0

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


class _Chunk(np.ndarray):
    """A chunk on the stand-in device."""

    @property
    def device(self) -> _Device:  # type: ignore[override]
        return _Device()


def _poisoned(n: int, dtype: Any) -> np.ndarray:
    a = np.empty(n, dtype)
    a.view(np.uint8)[:] = 0xA5
    return a


def _words(*args: Any, **kwargs: Any) -> TileWords:
    w = np.zeros(3, np.uint64)
    return TileWords(w, None, w[0:1], w[0:1], w[2:3])


class _Kernel:
    """The single-pass kernel (and the hybrid, in order) on the stand-ins: ``main`` writes
    the chunk's selection from its start (``start[0]``, else 0) below ``cap`` and stores the
    start plus the whole count in ``ws.count``."""

    def __init__(self) -> None:
        self.launches: list[tuple[int, bool, bool]] = []  # (n, capped, chained)

    def count(self, plan: Plan, reuse: bool = False) -> TileWords:
        ws = _words()
        ws.count[0] = len(_selected(plan))
        return ws

    def main(self, plan: Plan, index_base: int, vals: Any, idx: Any, ws: TileWords,
             exact: bool = False, cap: Any = NO_CAP, start: Any = None) -> None:
        at = int(start[0]) if start is not None else 0
        pos = _selected(plan)
        self.launches.append((plan.n, cap != NO_CAP, start is not None))
        lim = len(pos) if cap == NO_CAP else max(0, min(len(pos), int(cap) - at))
        if vals is not None:
            vals[at:at + lim] = np.asarray(plan.flat)[pos[:lim]]
        if idx is not None:
            idx[at:at + lim] = index_base + pos[:lim]
        ws.count[0] = at + len(pos)


def _selected(plan: Plan) -> np.ndarray:
    return np.flatnonzero(np.asarray(plan.flat) < plan.params[0])


class _Spec:
    def __init__(self, algorithm: str, dtype: np.dtype) -> None:
        self.algorithm, self.dtype = algorithm, dtype
        self.tuning = types.SimpleNamespace(tile=4096)


class _Pred:
    """What the runs read of a predicate: its memo, and ``x < t``."""

    def __init__(self, t: float = 0.5) -> None:
        self.memo: dict = {}
        self.t = t


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-ins installed; returns the kernel (its launches) and the spies."""
    kernel = _Kernel()

    def copy(dst: Any, dst_at: int, src: Any, src_at: int, k: int, stream_ptr: Any = None) -> None:
        dst[dst_at:dst_at + k] = src[src_at:src_at + k]

    def memset0(a: Any) -> None:
        a[:] = 0

    # ndarray: cupy_device.head_rows makes a result over the head of its allocation, as
    # NumPy's constructor over a buffer does
    fake = types.SimpleNamespace(empty=_poisoned, ndarray=np.ndarray,
                                 cuda=types.SimpleNamespace(Device=lambda *a: _Device()))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(ce, "LAUNCHERS", {"single-pass": kernel, "hybrid": kernel})
    monkeypatch.setattr(ce, "output_empty", _poisoned)
    monkeypatch.setattr(ce, "memset0", memset0)
    monkeypatch.setattr(ce, "read_words", lambda w: [int(x) for x in w])
    monkeypatch.setattr(ce, "read_counts", lambda ws: [int(w[0]) for w in ws])
    monkeypatch.setattr(ce, "device_copy", copy)
    monkeypatch.setattr(ce, "tile_words", _words)
    monkeypatch.setattr(ce, "with_count", lambda alg, ws, c: dataclasses.replace(ws, count=c))
    monkeypatch.setattr(ce, "make_plan", lambda b, pred, mask, output, alg, *a: Plan(
        b, None, (pred.t,), _Spec(alg, np.dtype(b.dtype)), output, memo=pred.memo))
    spy = types.SimpleNamespace(kernel=kernel, chained=[], overflows=[])
    run, over = ce._run_chained, ce._chained_overflow
    monkeypatch.setattr(ce, "_run_chained", lambda live, output, sink=None: (
        spy.chained.append(len(live)) or run(live, output, sink)))
    monkeypatch.setattr(ce, "_chained_overflow", lambda live, output, v, i, ends, room: (
        spy.overflows.append((room, list(ends))) or over(live, output, v, i, ends, room)))
    return spy


def _chunks(rng: np.random.Generator, sizes: list[int], ps: list[float],
            dtype: str = "float32") -> list[np.ndarray]:
    """Chunks of which about ``p`` are under 0.5 (0.25 against 1.25)."""
    return [np.where(rng.random(n) < p, 0.25, 1.25).astype(dtype).view(_Chunk)
            for n, p in zip(sizes, ps)]


def _want(run: list[np.ndarray], bases: list[int], output: str) -> tuple:
    v = np.concatenate([np.asarray(b)[np.asarray(b) < 0.5] for b in run])
    i = np.concatenate([np.flatnonzero(np.asarray(b) < 0.5) + base
                        for b, base in zip(run, bases)])
    return {"values": (v,), "indices": (i,), "both": (v, i)}[output]


def _check(got: Any, want: tuple, output: str) -> None:
    parts = got if output == "both" else (got,)
    assert len(parts) == len(want)
    for g, w in zip(parts, want):
        np.testing.assert_array_equal(np.asarray(g), w)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_a_run_chains_after_its_first_call_and_overflows_exactly(device, output):
    """compact_many: the first run not chained, the later ones chained with the room
    speculated from the previous fraction over the run's length; rising within a run (the
    head copied, the rest run again), overflowing at the first chunk (all run again),
    falling, none, all; equal to NumPy each time, stable or not."""
    rng = np.random.default_rng(2)
    pred = _Pred()
    sizes = [20011, 1025, 0, 31, 40009]
    prev = None
    for ps in ([0.5] * 5, [0.95, 0.6, 0, 0.3, 0.05], [0.05, 0.3, 0, 0.6, 0.95],
               [0.9, 0.1, 0, 0.1, 0.1], [0.0] * 5, [1.0] * 5, [1.0] * 5, [0.3] * 5):
        for stable in (True, False):
            run = _chunks(rng, sizes, ps)
            bases = [7, 30_000, 40_000, 41_000, 50_000]
            want = _want(run, bases, output)
            k, n = len(want[0]), sum(sizes)
            before = len(device.chained), len(device.overflows)
            _check(cb.compact_many(run, pred, output, stable, "auto", bases), want, output)
            if prev is None:
                assert len(device.chained) == before[0]
            else:
                assert device.chained[before[0]:] == [4]
                room = speculated(prev, n)
                assert len(device.overflows) == before[1] + (k > room), (ps, k, room)
            prev = pred.memo[("fraction", np.dtype("float32"), output)]
            assert prev == k / n
    heads = [ends[0] <= room for room, ends in device.overflows]
    assert any(heads) and not all(heads)  # both overflow paths


def test_compact_runs_slices_one_chain(device):
    """compact_runs: one chain over every run's chunks, each run's output its slice; runs of
    one chunk and of empty chunks only."""
    rng = np.random.default_rng(3)
    pred = _Pred()
    shape = [[1025, 0, 31], [40009], [0], [33, 4096, 1], [1]]
    for step, p in enumerate((0.2, 0.2, 0.7, 0.1, 1.0)):
        runs = [_chunks(rng, r, [p] * len(r)) for r in shape]
        bases = [[10_000_000 * j + 50_000 * i for i in range(len(r))] for j, r in enumerate(shape)]
        got = cb.compact_runs(runs, pred, "both", True, "auto", bases)
        assert len(got) == len(runs)
        for g, r, bs in zip(got, runs, bases):
            _check(g, _want(r, bs, "both"), "both")
        assert device.chained == [7] * step


def test_what_does_not_chain(device, monkeypatch):
    """A first run, CHAINED_RUNS = False, explicit hybrid and three-pass algorithms, a
    predicate without a memo (the mask path): as before."""
    rng = np.random.default_rng(4)
    pred = _Pred()
    run = _chunks(rng, [4099, 33], [0.4, 0.4])
    want = _want(run, [0, 5000], "values")
    monkeypatch.setattr(ct, "CHAINED_RUNS", False)
    for _ in range(2):
        _check(cb.compact_many(run, pred, "values", True, "auto", [0, 5000]), want, "values")
    _check(cb.compact_many(run, pred, "values", False, "hybrid", [0, 5000]), want, "values")
    assert not device.chained
    monkeypatch.setattr(ct, "CHAINED_RUNS", True)
    _check(cb.compact_many(run, pred, "values", False, "hybrid", [0, 5000]), want, "values")
    assert not device.chained  # the hybrid, chosen by the caller
    _check(cb.compact_many(run, pred, "values", False, "auto", [0, 5000]), want, "values")
    assert device.chained == [2]  # stable=False, auto: the single-pass kernel, chained
    live = [(dataclasses.replace(p, memo=None), b) for p, b in
            [(ce.make_plan(c, pred, None, "values", "single-pass"), 0) for c in run]]
    assert not ce._chains(live, "values")


@pytest.mark.parametrize("room", [0, 1, 100, 2000, 2001])
def test_the_chain_writes_nothing_at_or_past_its_room(device, room):
    """queue_chain's kernels into poisoned outputs larger than the selection: the head up to
    the room, nothing past it, the whole ends."""
    rng = np.random.default_rng(room)
    pred = _Pred()
    run = _chunks(rng, [5000, 31, 1, 9000], [0.1, 1.0, 1.0, 0.1])
    live = [(ce.make_plan(c, pred, None, "both", "single-pass"), 7) for c in run]
    want_v, want_i = _want(run, [7] * 4, "both")
    k = len(want_v)
    v, i = np.full(20_000, -3.5, np.float32), np.full(20_000, -9, np.int64)
    ends = ce.read_words(ce.queue_chain(live, v, i, room))
    assert ends == list(np.cumsum([np.count_nonzero(np.asarray(c) < 0.5) for c in run]))
    w = min(room, k)
    np.testing.assert_array_equal(v[:w], want_v[:w])
    np.testing.assert_array_equal(i[:w], want_i[:w])
    assert (v[w:] == -3.5).all() and (i[w:] == -9).all()
    assert all(chained and capped for _, capped, chained in device.kernel.launches)
