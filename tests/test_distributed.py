"""map_compact on a real distributed.LocalCluster of several worker processes.

Over a persisted input the workers are asked directly (tests/test_direct.py); the tests here
that check phase 1 as Dask tasks (the fallback, and ``dask-compact.direct`` off) take the
``tasks`` fixture."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time
import warnings
from collections.abc import Iterator

import dask
import dask.array as da
import distributed
import numpy as np
import pytest
from cluster_helpers import (
    cluster_for_kills,
    kill_a_worker_then_check,
    persist_placed,
    rechunk_placed_by_data,
    until_replaced,
)
from distributed import futures_of
from next_steps_helpers import check_columns, check_next_steps

import dask_compact  # noqa: F401  (registers Array.map_compact)


@pytest.fixture(scope="module")
def _cluster():
    with cluster_for_kills(n_workers=2, threads_per_worker=1, set_as_default=False) as c:
        yield c



@pytest.fixture
def tasks():
    """Phase 1 over a persisted input as Dask tasks, not asked of the workers directly."""
    with dask.config.set({"dask-compact.direct": False}):
        yield


def test_values_indices_both_on_cluster(client):
    a = np.random.default_rng(0).random(20_000).astype(np.float32)
    x = da.from_array(a, chunks=1500)
    v, i = x.map_compact(lambda q: (q > 0.2) & (q < 0.3), output="both")
    m = (a > 0.2) & (a < 0.3)
    assert v.shape == (int(m.sum()),) and v.chunks == i.chunks
    np.testing.assert_array_equal(v.compute(), a[m])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    r = x.map_compact("x > 0.9", chunks=512)
    assert set(r.chunks[0][:-1]) == {512}
    np.testing.assert_array_equal(r.compute(), a[a > 0.9])
    lz = x.map_compact("x > 0.9", lazy=True)
    np.testing.assert_array_equal(lz.compute(), a[a > 0.9])


@pytest.mark.parametrize("direct", [True, False])
def test_one_selected_element_of_a_persisted_input(client, direct):
    # the direct path cut even a one-chunk input's result into chunks (0, 0, 1): ``y + 1``
    # computed two elements more, ``x[i]`` failed with lost dependencies
    a = np.array([0.1, 0.2, 0.9, 0.4, 0.1, 0.3, 0.2])
    with dask.config.set({"dask-compact.direct": direct}):
        for chunks in (7, 2):
            x = client.persist(da.from_array(a, chunks=chunks))
            v, i = x.map_compact("x > 0.5", output="both")
            assert v.numblocks == i.numblocks == (1,)
            np.testing.assert_array_equal((v + 1).compute(), [1.9])
            np.testing.assert_array_equal((x[i] + 0).compute(), [0.9])


SPARSE = np.random.default_rng(11).random(2_000) * 0.9
SPARSE[1_234] = 0.95
PICKS = {"empty": "x < -1", "one": "x > 0.92", "sparse": "x < 0.004", "full": "x >= 0"}


@pytest.mark.parametrize("sel", PICKS)
@pytest.mark.parametrize("by_worker", [True, False])
def test_results_have_no_empty_chunks_and_what_follows_is_numpys(client, by_worker, sel):
    """Every path (a graph input; a persisted one asked directly, or as tasks: grouped by
    worker with ``by_worker``, else one per chunk) leaves out the chunks that selected
    nothing: Dask (2026.7.1) got y[::-1], std, fancy indexing, argmax and dd.concat wrong
    over them (a new-user probe)."""
    a = SPARSE
    m = {"empty": a < -1, "one": a > 0.92, "sparse": a < 0.004, "full": a >= 0}[sel]
    if sel == "sparse":  # what the test stands on: chunks of 100 that select nothing
        assert (m.reshape(-1, 100).sum(axis=1) == 0).any()
    x = da.from_array(a, chunks=100)
    held = client.persist(x)
    distributed.wait(held)
    for inp, direct in ((x, True), (held, True), (held, False)):
        with dask.config.set({"dask-compact.direct": direct}):
            v, i = inp.map_compact(PICKS[sel], output="both", by_worker=by_worker)
            y = inp.map_compact(PICKS[sel], by_worker=by_worker)
        assert v.chunks == i.chunks == y.chunks
        for r, want in ((v, a[m]), (i, np.flatnonzero(m)), (y, a[m])):
            check_next_steps(r, want)
        check_columns({"v": (v, a[m]), "i": (i, np.flatnonzero(m))})


def test_result_stays_on_workers_and_only_counts_come_back(client):
    """The persisted result is futures held by the workers, spread over both of them."""
    x = da.random.RandomState(1).random(40_000, chunks=2_000)
    y = x.map_compact("x < 0.5")
    futures = futures_of(y)
    # The result's graph is nothing but futures: using it never reruns the source graph.
    assert len(futures) == len(dict(y.dask)) == y.numblocks[0]
    who = client.who_has(futures)
    holders = {w for ws in who.values() for w in ws}
    assert len(who) == len(futures) and all(who.values())
    assert len(holders) == 2
    assert abs(len(y) - 20_000) < 1_000


def test_worker_killed_mid_compaction_loses_nothing(client):
    a = np.random.default_rng(2).random(60_000)

    def slow(b):
        time.sleep(0.15)
        return b

    x = da.from_array(a, chunks=2_000).map_blocks(slow, dtype=a.dtype)  # 30 chunks, ~2.3 s
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    killer = threading.Timer(0.8, os.kill, args=(pids[victim], signal.SIGKILL))
    killer.start()
    try:
        v, i = x.map_compact("x > 0.5", output="both")
    finally:
        killer.join()
    assert victim not in client.run(os.getpid) or client.run(os.getpid)[victim] != pids[victim]
    m = a > 0.5
    assert v.shape == (int(m.sum()),)
    np.testing.assert_array_equal(v.compute(), a[m])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    # the replacement joined (wait_for_workers(2) counts a dead worker the scheduler has not
    # yet dropped: the next test could meet the replacement joining)
    until_replaced(client, [pids[victim]], 2)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_counts_come_from_the_sizes_the_scheduler_knows(client, monkeypatch, output):
    """Eager counts on a cluster: one question to the scheduler, no count task, no worker
    asked; sizes that are not whole items fall back to count tasks. Exact either way."""
    from dask_compact import graph, workers_installed

    asked, counted = [], []
    real_ask, real_count = client.run_on_scheduler, graph._counts_of
    monkeypatch.setattr(client, "run_on_scheduler",
                        lambda f, *a, **k: asked.append(f.__name__) or real_ask(f, *a, **k))
    real_run = client.run

    def run(f, *a, **k):
        # whether the workers import dask_compact is asked again where the cluster's size
        # as the client last heard it changed (a worker killed by the test before, its
        # replacement not yet reported): that question is not one about the counts
        if f is not workers_installed.here:
            pytest.fail("a worker was asked")
        return real_run(f, *a, **k)

    monkeypatch.setattr(client, "run", run)
    # an empty record of checked clients: that question asked here every time, not only
    # where the CI's order of tests happens to leave it unanswered
    monkeypatch.setattr(workers_installed, "_checked", type(workers_installed._checked)("t"))
    monkeypatch.setattr(graph, "_counts_of", lambda *a: counted.append(1) or real_count(*a))
    a = np.random.default_rng(4).random(12_345).astype(np.float32)
    x = da.from_array(a, chunks=1_000)
    m = a > 0.3
    want = {"values": a[m], "indices": np.flatnonzero(m)}
    got = x.map_compact("x > 0.3", output=output)
    for name, g in zip(("values", "indices") if output == "both" else (output,),
                       got if output == "both" else (got,)):
        assert g.chunks[0] == tuple(int(c) for c in g.map_blocks(
            lambda b: np.array([len(b)]), chunks=(1,), dtype=int).compute())
        np.testing.assert_array_equal(g.compute(), want[name])
    assert asked.count("_held_nbytes") == 1 and not counted
    # a size the scheduler reports that is no whole number of items: counted with tasks
    monkeypatch.setattr(graph, "_held_nbytes",
                        lambda keys, itemsize=0, dask_scheduler=None: [3] * len(keys))
    got = x.map_compact("x > 0.3")
    np.testing.assert_array_equal(got.compute(), a[m])
    assert counted


def test_counts_fall_back_to_tasks_when_lengths_cannot_be_read(client, monkeypatch):
    """If a chunk's length cannot be read where it is held (its worker left, say), count tasks
    over the persisted chunks give the sizes instead; the result is the same."""
    from dask_compact import graph

    monkeypatch.setattr(graph, "_held_counts", lambda arr: None)
    a = np.random.default_rng(3).random(9_000)
    x = da.from_array(a, chunks=1_000)
    for output in ("values", "both"):
        got = x.map_compact("x > 0.7", output=output)
        v = got[0] if output == "both" else got
        assert v.shape == (int((a > 0.7).sum()),)
        np.testing.assert_array_equal(v.compute(), a[a > 0.7])


def _slabs(client, a: np.ndarray, chunk: int):
    """``a`` persisted as one contiguous slab per worker (the layout of data born on the
    workers by domain decomposition), as one dask array."""
    workers = sorted(client.nthreads())
    cut = -(-len(a) // len(workers))
    return persist_placed(client, a, chunk,
                          [(k * cut, (k + 1) * cut, w) for k, w in enumerate(workers)],
                          loose=False)


def _transfers(ts) -> int:
    return sum(s["action"] == "transfer" for t in ts.data for s in t["startstops"])


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_one_task_per_worker_run_on_slabs(client, tasks, output):
    """Chunks held by one worker in a row are compacted by one task: one output chunk per
    worker, in the original order, nothing moved between workers."""
    from distributed import get_task_stream

    a = np.random.default_rng(6).random(30_011).astype(np.float32)
    x = _slabs(client, a, 997)
    assert x.numblocks[0] > 20
    with get_task_stream() as ts:
        got = x.map_compact(lambda q: (q < 0.25) | (q > 0.9), output=output)
    m = (a < 0.25) | (a > 0.9)
    want = {"values": (a[m],), "indices": (np.flatnonzero(m),), "both": (a[m], np.flatnonzero(m))}[
        output
    ]
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        assert g.numblocks == (2,) and not any(np.isnan(g.chunks[0]))
        np.testing.assert_array_equal(g.compute(), w)
    assert _transfers(ts) == 0
    # One phase-1 task per worker. (Only those are counted: the task stream collected at the
    # block's end can miss one of the cheap getitem tasks that "both" adds, seen once in CI.)
    phase1 = "compact-fused-" if output == "both" else f"compact-{output}-fused-"
    keys = {str(t["key"]) for t in ts.data}
    assert len([k for k in keys if k.startswith(f"('{phase1}")]) == 2, sorted(keys)
    r = x.map_compact("x > 0.5", chunks=4096)
    np.testing.assert_array_equal(r.compute(), a[a > 0.5])
    per_chunk = x.map_compact("x > 0.5", by_worker=False)
    assert per_chunk.numblocks == x.numblocks
    np.testing.assert_array_equal(per_chunk.compute(), a[a > 0.5])


def test_placement_of_a_persisted_input_is_asked_once(client, tasks, monkeypatch):
    """A later call on the same persisted input reuses its placement (no scheduler round
    trip) and still compacts run by run where the data is; a newly persisted array is asked
    again. Results exact every time."""
    from distributed import get_task_stream

    asked = []
    real = client.run_on_scheduler
    monkeypatch.setattr(client, "run_on_scheduler",
                        lambda *a, **k: asked.append(a[0]) or real(*a, **k))
    a = np.random.default_rng(8).random(30_011).astype(np.float32)
    x = _slabs(client, a, 997)
    for output in ("values", "indices", "values"):
        with get_task_stream() as ts:
            got = x.map_compact("x < 0.3", output=output)
        want = a[a < 0.3] if output == "values" else np.flatnonzero(a < 0.3)
        assert got.numblocks == (2,)
        np.testing.assert_array_equal(got.compute(), want)
        assert _transfers(ts) == 0
    assert len([f for f in asked if f.__name__ == "_held_where"]) == 1
    y = _slabs(client, a * 2, 997)  # new futures
    np.testing.assert_array_equal(y.map_compact("x < 0.6").compute(), (a * 2)[a * 2 < 0.6])
    assert len([f for f in asked if f.__name__ == "_held_where"]) == 2


@pytest.mark.parametrize("direct", [True, False])
def test_the_placement_of_a_deleted_input_is_not_kept(client, direct):
    """The cached placement of a persisted input (a key and a holder per chunk) goes with the
    input: it can never be used again. Until 2026-11-30 it stayed until 64 newer inputs
    evicted it (a probe: 7.7 MB held after 8 freed inputs of 10,000 chunks)."""
    import gc

    from dask_compact import placement

    def held(keys: set) -> int:
        return sum(k[0] == id(client) and bool(keys & set(k[1]))
                   for k in list(placement._placements._items))

    rng = np.random.default_rng(22 + direct)
    with dask.config.set({"dask-compact.direct": direct}):
        for _ in range(2):
            a = rng.random(int(rng.integers(3_000, 6_000)))
            t = float(rng.random())
            x = da.from_array(a, chunks=97).persist()
            keys = {f.key for f in futures_of(x)}
            y = x.map_compact(lambda v: v < t)
            np.testing.assert_array_equal(y.compute(), a[a < t])
            assert held(keys) == 1  # cached while the input lives
            np.testing.assert_array_equal(x.map_compact("x > 0.5").compute(), a[a > 0.5])
            del x, y
            gc.collect()
            assert held(keys) == 0


def test_interleaved_placement_keeps_order(client):
    """Chunks spread over the workers by the scheduler (runs of any length): same result as
    NumPy, and a run never spans two workers."""
    from distributed import get_task_stream

    a = np.random.default_rng(7).random(40_009)
    x = da.from_array(a, chunks=1_001).persist()
    with get_task_stream() as ts:
        y = x.map_compact("x < 0.4", output="indices")
    np.testing.assert_array_equal(y.compute(), np.flatnonzero(a < 0.4))
    assert _transfers(ts) == 0 and y.numblocks[0] <= x.numblocks[0]


def test_an_input_held_by_one_worker_is_warned_about_once(client):
    """Every chunk on one of the two workers: a PerformanceWarning at the first call (the
    placement is asked then), none at the next call on the same input (its placement is
    cached), none for slabs; results exact."""
    import warnings

    from dask.array.core import PerformanceWarning
    from distributed import wait

    a = np.random.default_rng(12).random(20_011)
    one = sorted(client.nthreads())[0]
    x = client.persist(da.from_array(a, chunks=1_001), workers=[one])
    wait(x)
    with pytest.warns(PerformanceWarning, match="20 of the input's 20 chunks are held by one"):
        y = x.map_compact("x < 0.4")
    np.testing.assert_array_equal(y.compute(), a[a < 0.4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        z = x.map_compact("x < 0.5", output="indices")
        np.testing.assert_array_equal(z.compute(), np.flatnonzero(a < 0.5))
        s = _slabs(client, a, 1_001).map_compact("x < 0.4")
        np.testing.assert_array_equal(s.compute(), a[a < 0.4])


def _round_robin(client, a: np.ndarray, chunk: int):
    """``a`` persisted with chunk i on worker i mod 2: the scattered placement Dask gives a
    generated or loaded array, made deterministic."""
    workers = sorted(client.nthreads())
    # loose: a lost chunk is remade elsewhere
    return persist_placed(client, a, chunk, [(s, s + chunk, workers[k % 2])
                                             for k, s in enumerate(range(0, len(a), chunk))])


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_one_task_per_worker_whatever_the_placement(client, tasks, monkeypatch, output):
    """Chunks scattered over the workers (no two consecutive on one worker): one phase-1 task
    per worker over all its chunks, one known-size output chunk per run in the input's order,
    nothing moved, the counts read from what the tasks reported (no count task); used
    downstream, every output chunk is taken where its group lives."""
    from distributed import get_task_stream

    asked = []
    real_ask = client.run_on_scheduler
    monkeypatch.setattr(client, "run_on_scheduler",
                        lambda f, *a, **k: asked.append(f.__name__) or real_ask(f, *a, **k))
    a = np.random.default_rng(12).random(31_013).astype(np.float32)
    x = _round_robin(client, a, 1_009)
    assert x.numblocks[0] == 31
    with get_task_stream() as ts:
        got = x.map_compact(lambda q: (q < 0.25) | (q > 0.9), output=output)
    keys = {str(t["key"]) for t in ts.data}
    assert len([k for k in keys if "compact-group-" in k]) == 2, keys  # one per worker thread
    assert not [k for k in keys if "count" in k] and _transfers(ts) == 0
    # (and, where this call made the anchors, lifting their restrictions: placement._unpin)
    assert [f for f in asked if f != "_unpin"] == ["_held_where", "_reported_and_expected"]
    got = got if isinstance(got, tuple) else (got,)
    # Used right after (the scheduler has seen no other use of the result), the pieces, fused
    # into the rechunk, are placed by their data, not taken for root tasks (which the scheduler
    # spreads for balance: over 2 groups with nothing more it did, and moved whole groups),
    # and only where their group is (with an anchor on every worker they moved).
    r = rechunk_placed_by_data(client, monkeypatch, got[0], "compact-group-")
    m = (a < 0.25) | (a > 0.9)
    want = {"values": (a[m],), "indices": (np.flatnonzero(m),), "both": (a[m], np.flatnonzero(m))}
    np.testing.assert_array_equal(r.compute(), want[output][0])
    for g, w in zip(got, want[output]):
        assert g.numblocks == (31,) and g.chunks[0] == tuple(
            int(((b < 0.25) | (b > 0.9)).sum()) for b in np.array_split(a, range(1009, 31013, 1009))
        )
        np.testing.assert_array_equal(g.compute(), w)
        np.testing.assert_array_equal(g[100:5000].compute(), w[100:5000])
    with pytest.raises(ZeroDivisionError):  # a failure in a group task reaches the caller
        x.map_compact(lambda q: q > 1 / 0)


def test_scattered_placement_with_every_option(client, tasks, monkeypatch):
    """The grouped phase 1 under the other options: rebalanced output (both outputs, same
    chunks), a predicate evaluated as a mask (not traceable), stable=False, indices through
    flatnonzero, and N-D input (its blocks read as they are held when the trailing axes are
    whole). Every result against NumPy."""
    import dask_compact as dc
    from dask_compact import graph

    grouped = []
    real = graph._run_grouped
    monkeypatch.setattr(graph, "_run_grouped", lambda *a: grouped.append(1) or real(*a))

    a = np.random.default_rng(15).random(25_013)
    x = _round_robin(client, a, 1_000)
    v, i = x.map_compact("(x < 0.2) | (x > 0.7)", output="both", chunks=3_001)
    m = (a < 0.2) | (a > 0.7)
    assert v.chunks == i.chunks and set(v.chunks[0][:-1]) == {3_001}
    np.testing.assert_array_equal(v.compute(), a[m])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    keep = a[::97]
    got = x.map_compact(lambda q: np.isin(q, keep))  # untraceable: the mask path per chunk
    np.testing.assert_array_equal(got.compute(), a[np.isin(a, keep)])
    np.testing.assert_array_equal(x.map_compact("x > 0.5", stable=False).compute(), a[a > 0.5])
    ints = _round_robin(client, (a * 10).astype(np.int64), 1_000)
    np.testing.assert_array_equal(dc.flatnonzero(ints).compute(), np.flatnonzero(a * 10 >= 1))
    # N-D, rows of whole trailing axes: the tasks read the persisted blocks themselves
    rows = x.reshape(25_013, 1).rechunk((1_000, 1)).persist()
    v, i = rows.map_compact("x < 0.5", output="both")
    np.testing.assert_array_equal(v.compute(), a[a < 0.5])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(a < 0.5))
    assert len(grouped) == 5  # every call above took the grouped path
    b = np.random.default_rng(16).random((4_001, 3, 2)).astype(np.float32)
    cube = _round_robin(client, b, 250)
    assert cube.numblocks == (17, 1, 1)
    got = cube.map_compact(lambda q: q > 0.8, output="indices")
    np.testing.assert_array_equal(got.compute(), np.flatnonzero(b > 0.8))
    assert len(grouped) == 6
    split = _round_robin(client, b, 250).rechunk((250, 1, 2)).persist()  # trailing axis cut
    np.testing.assert_array_equal(split.map_compact("x > 0.8").compute(), b[b > 0.8])
    assert len(grouped) == 6  # per chunk: the ravel needs the rows whole


def test_grouped_counts_fall_back_to_tasks(client, tasks, monkeypatch):
    """Where the group tasks reported no counts (e.g. run somewhere that does not keep task
    metadata), count tasks over the groups give them: the same result."""
    from dask_compact import graph

    monkeypatch.setattr(graph, "reported", lambda keys, dask_scheduler=None: [None] * len(keys))
    a = np.random.default_rng(13).random(20_011)
    x = _round_robin(client, a, 997)
    for output in ("values", "both"):
        got = x.map_compact("x > 0.6", output=output)
        v = got[0] if output == "both" else got
        np.testing.assert_array_equal(v.compute(), a[a > 0.6])
        assert v.chunks[0] == tuple(len(b) for b in (
            c[c > 0.6] for c in np.array_split(a, range(997, 20_011, 997))))


def test_worker_killed_with_scattered_placement_loses_nothing(client, tasks, monkeypatch):
    """A worker killed once the group tasks are submitted: Dask reruns what it held (the
    input chunks from their graph, then the group tasks), and the result is exact."""
    from dask_compact import graph

    a = np.random.default_rng(14).random(24_001)
    x = _round_robin(client, a, 1_000)
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    real = graph._reported_counts

    def kill_then_read(*args):
        os.kill(pids[victim], signal.SIGKILL)
        return real(*args)

    monkeypatch.setattr(graph, "_reported_counts", kill_then_read)
    try:
        v, i = x.map_compact("x > 0.5", output="both")
        m = a > 0.5
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
        assert v.chunks == i.chunks and sum(v.chunks[0]) == int(m.sum())
    finally:
        until_replaced(client, [pids[victim]], 2)  # not wait_for_workers: see until_replaced
    assert pids[victim] not in client.run(os.getpid).values()  # it did die


def test_worker_killed_after_a_grouped_call_loses_nothing(client, tasks):
    """A worker killed after map_compact returned (scattered placement, so the result's pieces
    depend on group tasks and on anchors held by the victim too): using the result recomputes
    what the victim held, anchors included, and is exact; the next call makes new anchors on
    the new workers."""
    from dask_compact import placement

    a = np.random.default_rng(17).random(24_013)
    x = _round_robin(client, a, 1_000)
    v, i = x.map_compact("x < 0.3", output="both")
    before = placement._anchor_sets.get(id(client))
    assert before is not None and len(before) == 2  # an anchor set on each worker
    victim = kill_a_worker_then_check(client, a, a < 0.3, v, i)
    y = _round_robin(client, a * 2, 1_000)
    np.testing.assert_array_equal(y.map_compact("x < 0.6").compute(), (a * 2)[a * 2 < 0.6])
    after = placement._anchor_sets.get(id(client))
    assert after is not before and victim not in after


def test_a_call_sends_its_graph_without_waiting_for_the_clients_next_batch(client, tasks):
    """The client's stream to the scheduler writes at most once per interval (10 ms): a graph
    queued right after another message waits for the interval's end. A call sends its graph
    at once: with the stream's next write pushed 20 s away, the call still returns at once,
    and exact (as before this change, it waited for those 20 s)."""
    import time as _time

    from distributed import wait

    a = np.random.default_rng(18).random(20_011)
    x = client.persist(da.from_array(a, chunks=2_000))
    wait(x)
    x.map_compact("x < 0.1")  # placement asked, anchors made: messages of their own
    for pred, want, by_worker in (("x < 0.4", a[a < 0.4], True), ("x > 0.7", a[a > 0.7], False)):
        client.scheduler_comm.next_deadline = _time.time() + 20  # as if it had just written
        t = _time.perf_counter()
        got = x.map_compact(pred, by_worker=by_worker)  # grouped, then a task per chunk
        assert _time.perf_counter() - t < 10
        np.testing.assert_array_equal(got.compute(), want)


@pytest.mark.parametrize("by_worker", [True, False])
@pytest.mark.parametrize("scattered", [False, True])
def test_phase_one_of_a_persisted_input_is_submitted_as_futures(client, tasks, monkeypatch,
                                                                by_worker, scattered):
    """Over a persisted input, phase 1's tasks go to the scheduler as futures in one message
    (``client.map``), not through dask.array's persist of a graph over the input (which cost
    8-10 ms more per call on one H100); the result is the same."""
    import dask
    from distributed import wait

    from dask_compact import graph

    a = np.random.default_rng(41).random(30_011)
    if scattered:  # chunks spread over both workers: grouped tasks of several runs each
        x = _round_robin(client, a, 1_999)
    else:
        x = client.persist(da.from_array(a, chunks=1_999))
    wait(x)
    x.map_compact("x < 0.9")  # placement asked and anchors made first: their own messages
    calls = {"map": 0, "persist": 0}
    real_map, real_persist = type(client).map, dask.persist

    def counted_map(self, *args, **kwargs):
        calls["map"] += 1
        return real_map(self, *args, **kwargs)

    def counted_persist(*args, **kwargs):
        calls["persist"] += 1
        return real_persist(*args, **kwargs)

    monkeypatch.setattr(type(client), "map", counted_map)
    monkeypatch.setattr(graph.client_stream.dask, "persist", counted_persist)
    y = x.map_compact("x < 0.3", by_worker=by_worker)
    assert calls == {"map": 1, "persist": 0}
    np.testing.assert_array_equal(y.compute(), a[a < 0.3])
    assert sum(y.chunks[0]) == int((a < 0.3).sum())


def test_persisted_input_with_a_failed_chunk_raises_its_error(client):
    """A persisted input whose chunk failed: map_compact raises that chunk's error, and
    presents no partial result."""

    def boom(b, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:
            raise ZeroDivisionError("chunk 3 could not be made")
        return b

    a = np.random.default_rng(9).random(8_000)
    x = da.from_array(a, chunks=1_000).map_blocks(boom, dtype=a.dtype).persist()
    from distributed import wait

    wait(x)
    with pytest.raises(ZeroDivisionError, match="chunk 3"):
        x.map_compact("x > 0.5")


def test_edge_inputs_on_cluster(client):
    """Empty N-D, big-endian and persisted (by_worker) inputs on worker processes."""
    for shape, chunks in (((10, 0), 5), ((3, 0, 4), (2, 1, 2))):
        x = da.zeros(shape, chunks=chunks)
        for output in ("values", "indices"):
            r = x.map_compact("x > 0", output=output)
            assert r.shape == (0,) and r.compute().shape == (0,)
        assert x.persist().map_compact("x > 0", chunks=3).compute().shape == (0,)
    a = np.random.default_rng(5).standard_normal(10_007).astype(">f4")
    x = da.from_array(a, chunks=1000).persist()
    v, i = x.map_compact("x > 0.5", output="both")
    np.testing.assert_array_equal(v.compute(), a[a > 0.5])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(a > 0.5))
    with pytest.raises(ValueError, match="not elementwise"):
        x.map_compact(lambda q: q.astype(float) > q.astype(float).mean())


def _held_keys(dask_worker=None) -> list:
    return [str(k) for k in dask_worker.data]


@pytest.mark.parametrize("source", ["random", "from-zarr"])
def test_an_input_not_persisted_is_read_and_compacted_in_one_task(client, source, tmp_path):
    """A graph input (not persisted: generated, or read from Zarr): each chunk is made and
    compacted by one task (dask's linear fusion of the producing task with phase 1), so no
    worker keeps a copy of the input chunk once its selection exists. Exact."""
    from distributed import get_task_stream

    want = np.random.default_rng(21).random(2**20)
    if source == "random":
        x = da.random.default_rng(21).random(2**20, chunks=2**17)  # 8 chunks, nowhere yet
        want = x.compute()
    else:
        zarr = pytest.importorskip("zarr")
        path = str(tmp_path / "in.zarr")
        zarr.create_array(store=path, shape=want.shape, dtype=want.dtype,
                          chunks=(2**17,))[:] = want
        x = da.from_zarr(path)
    with get_task_stream(client) as stream:
        y = x.map_compact("x < 0.5")
    names = [k[0] if isinstance(k, tuple) else str(k) for k in (t["key"] for t in stream.data)]
    alone = [n for n in names if n.startswith(source) and "compact" not in n]
    assert not alone, alone  # no task made an input chunk by itself
    assert sum(n.startswith(source) and "compact" in n for n in names) == 8
    held = [k for ks in client.run(_held_keys).values() for k in ks]
    # ("original-from-zarr" would be the zarr array's handle, not a chunk)
    assert not [k for k in held if source in k and "compact" not in k
                and "original" not in k], held
    np.testing.assert_array_equal(y.compute(), want[want < 0.5])


def _slowly(b):
    """A chunk made 20 ms late: a call that returned before reading its input is caught
    with that input still to read, not by a race it may win."""
    time.sleep(0.02)
    return b


def _graph_input(source: str, path: str) -> tuple[da.Array, np.ndarray]:
    """A graph input (nothing persisted) of 20,000 float64 in 7 chunks, and its values."""
    a = np.random.default_rng(5).random(20_000)
    if source.startswith("from-zarr"):
        zarr = pytest.importorskip("zarr")
        zarr.open_array(path, mode="w", shape=a.shape, chunks=(3_000,), dtype="f8")[:] = a
        x = da.from_zarr(path)
        return (x.map_blocks(_slowly) if source.endswith("slow") else x), a
    if source == "random":
        x = da.random.default_rng(5).random(20_000, chunks=3_000)
        return x, x.compute()
    return da.from_array(a, chunks=3_000) + 1, a + 1


def _still_reading(input_keys: set, before: set, dask_scheduler=None) -> list:
    """On the scheduler: what an eager call left of its graph input, each key with its state.
    A key of ``input_keys`` in any state but released (in memory: a later graph naming it
    again is given that chunk; to run: it is read later, perhaps after the data changed), and
    any task not of ``before`` still to run that depends on nothing: a task reading the
    input (Dask fuses an input chunk into its consumer, under the consumer's key); every
    task of ours that may still run when a call returns depends on pieces in memory."""
    done = ("released", "forgotten", "erred")
    return [(str(k), ts.state) for k, ts in dask_scheduler.tasks.items()
            if ts.state not in done and (str(k) in input_keys or (
                str(k) not in before and ts.state != "memory" and not ts.dependencies))]


def _until_the_scheduler_knows(client, arr, timeout: float = 10.0) -> None:
    """Until every future ``arr`` holds is known to the scheduler: a call sends its graph on
    the client's batched stream, which a ``run_on_scheduler`` RPC can overtake, so a check at
    once could look before the graph of a call that did not wait had arrived (a reviewer saw
    the old code pass now and then)."""
    keys = {f.key for f in distributed.futures_of(arr)}
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(
            lambda keys, dask_scheduler=None: [k for k in keys if k not in dask_scheduler.tasks],
            keys):  # fmt: skip
        assert time.monotonic() < deadline, "the call's graph never reached the scheduler"
        time.sleep(0.01)


_EAGER_CALLS = {
    "map_compact": (lambda x: x.map_compact("x < 0.3"), lambda a: a[a < 0.3]),
    "both": (lambda x: x.map_compact("x < 0.3", output="both")[1],
             lambda a: np.flatnonzero(a < 0.3)),
    "by_worker=False": (lambda x: x.map_compact("x < 0.3", by_worker=False),
                        lambda a: a[a < 0.3]),
    "chunks": (lambda x: x.map_compact("x < 0.3", chunks=1_000), lambda a: a[a < 0.3]),
    "compact": (lambda x: dask_compact.compact(x, x < 0.3), lambda a: a[a < 0.3]),
    "flatnonzero": (lambda x: dask_compact.flatnonzero(x < 0.3),
                    lambda a: np.flatnonzero(a < 0.3)),
    "records": (lambda x: dask_compact.compact_records({"v": x, "w": x * 2}, "v < 0.3")["w"],
                lambda a: a[a < 0.3] * 2),
    "partition": (lambda x: dask_compact.partition(x, "x < 0.3")[0],
                  lambda a: np.concatenate([a[a < 0.3], a[a >= 0.3]])),
    "sort": (dask_compact.sort, np.sort),
    "argsort": (dask_compact.argsort, lambda a: np.argsort(a, kind="stable")),
    "sort, 3 buckets": (lambda x: dask_compact.sort(x, buckets=3), np.sort),
}


@pytest.mark.parametrize("source", ["from-zarr", "from-zarr-slow", "random", "from-array+1"])
def test_no_eager_call_leaves_its_graph_input_on_the_cluster(client, source, tmp_path):
    """When an eager call over a graph input returns, nothing of that input is held or still
    to run on the cluster (plain Dask's ``compute()`` gives the same: intermediates are
    released as their dependents finish). Else a store rewritten in place and read again
    under the same keys (``da.from_zarr`` names its chunks by the path) was given the old
    chunks: CI's empty selection, whose cause was the one-chunk sort (20,000 elements are
    one bucket), which returned with its input still being read."""
    x, a = _graph_input(source, str(tmp_path / "a.zarr"))
    input_keys = {str(k) for k in x.__dask_graph__()}
    for name, (call, want) in _EAGER_CALLS.items():
        before = set(_scheduler_tasks(client))
        got = call(x)
        _until_the_scheduler_knows(client, got)  # the check's RPC may overtake the graph
        left = client.run_on_scheduler(_still_reading, input_keys, before)  # else no wait
        assert not left, (name, left)
        np.testing.assert_array_equal(got.compute(), want(a))  # the result lived all along


@pytest.mark.parametrize("scheduler", ["cluster", "threads"])
def test_new_data_under_an_old_name_is_not_answered_from_an_old_result(request, scheduler,
                                                                       tmp_path):  # fmt: skip
    """A Zarr store rewritten in place keeps its dask name (da.from_zarr names it by its path):
    every eager call on it, while an earlier result lived on the cluster, built the earlier
    result's keys and got the old selection back (found by a probe). Also under the threaded
    scheduler, which holds nothing between calls."""
    if scheduler == "cluster":
        request.getfixturevalue("client")
        where = contextlib.nullcontext()
    else:
        where = dask.config.set(scheduler="threads")
    with where:
        _rewritten_in_place_then_read_again(str(tmp_path / "a.zarr"))


def _rewritten_in_place_then_read_again(path: str) -> None:
    """Every eager call over a Zarr store, then the store rewritten at once and every call
    over it again: each result holds the data it read, old or new."""
    zarr = pytest.importorskip("zarr")
    old = np.arange(20_000, dtype="f8")
    z = zarr.open_array(path, mode="w", shape=old.shape, chunks=(3_000,), dtype="f8")
    z[:] = old
    x = da.from_zarr(path)
    kept = [x.map_compact("x < 1000"), dask_compact.compact(x, x < 1000),
            dask_compact.compact_records({"v": x}, "v < 1000")["v"],
            dask_compact.partition(x, "x < 1000")[0], dask_compact.sort(x)]
    # Rewritten at once: no call left the old chunks held or still to read (CI once got an
    # empty selection while the one-chunk sort still read them; the test above)
    z[:] = old[::-1] + 0.5
    x = da.from_zarr(path)
    new = z[:]
    for got, want in ((x.map_compact("x < 1000"), new[new < 1000]),
                      (dask_compact.compact(x, x < 1000), new[new < 1000]),
                      (dask_compact.compact_records({"v": x}, "v < 1000")["v"], new[new < 1000]),
                      (dask_compact.partition(x, "x < 1000")[0],
                       np.concatenate([new[new < 1000], new[new >= 1000]])),
                      (dask_compact.sort(x), np.sort(new))):
        np.testing.assert_array_equal(got.compute(), want)
    # the first results lived all along, and hold the old data (each had read it whole)
    below = old[old < 1000]
    for got, want in zip(kept, (below, below, below,
                                np.concatenate([below, old[old >= 1000]]), old)):
        np.testing.assert_array_equal(got.compute(), want)


def test_a_store_rewritten_after_a_sort_that_waited_for_a_busy_worker(client, tmp_path):
    """CI's wrong selection made to happen: with one worker busy, the one-bucket sort's
    input chunks read by the other were held for it when the call returned, and a call after
    the store was rewritten was given them, old data (the old code: `compact` selected the
    old first 1,000 in 3 runs of 3)."""
    zarr = pytest.importorskip("zarr")
    path = str(tmp_path / "a.zarr")
    old = np.arange(20_000, dtype="f8")
    z = zarr.open_array(path, mode="w", shape=old.shape, chunks=(3_000,), dtype="f8")
    z[:] = old
    assert da.from_zarr(path).sum().compute() == old.sum()  # zarr imported on the workers
    busy = client.submit(time.sleep, 0.3, workers=[sorted(client.nthreads())[0]], pure=False)
    kept = dask_compact.sort(da.from_zarr(path))
    time.sleep(0.1)  # the free worker's chunks read (the old code returned before any was)
    z[:] = old[::-1] + 0.5
    x = da.from_zarr(path)
    np.testing.assert_array_equal(dask_compact.compact(x, x < 1000).compute(), z[:][-1000:])
    np.testing.assert_array_equal(kept.compute(), old)
    busy.result()


_PREDS = """
import numpy as np
G = 0.5
def fm(v):  # the mask path (np.isin), reading a global of its module
    return np.isin(v, [np.float32(0.125)]) | (v > G)
def set_g(value):
    global G
    G = value
"""


def test_a_module_predicate_after_its_global_changed_is_not_answered_from_an_old_result(
        client, tmp_path):  # fmt: skip
    """dask tokenizes a function of an importable module by its name: a repeated call with
    by_worker=False on a persisted input, after the global that function reads changed on
    the client and the workers, took the first call's keys and its answer (a new-user
    probe: 3,668 elements where 1,492 were right)."""
    import importlib
    import sys

    path = tmp_path / "dc_probe_preds.py"
    path.write_text(_PREDS)
    client.upload_file(str(path))  # imported on the workers
    sys.path.insert(0, str(tmp_path))
    try:
        preds = importlib.import_module("dc_probe_preds")
        a = np.random.default_rng(7).random(10_007).astype(np.float32) * 2
        x = da.from_array(a, chunks=997).persist()
        y1 = x.map_compact(preds.fm, by_worker=False)
        np.testing.assert_array_equal(y1.compute(), a[preds.fm(a)])
        preds.set_g(1.5)
        client.run(lambda: importlib.import_module("dc_probe_preds").set_g(1.5))
        y2 = x.map_compact(preds.fm, by_worker=False)
        assert y2.name != y1.name
        np.testing.assert_array_equal(y2.compute(), a[preds.fm(a)])
        assert len(y1) != len(y2)  # both alive, each its own answer
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("dc_probe_preds", None)


def test_a_second_client_on_the_cluster_is_not_warned_about_our_plugins(client):
    a = np.arange(30_000.0)
    for _ in range(2):
        with distributed.Client(client.scheduler.address) as other, \
                warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            x = other.persist(da.from_array(a, chunks=5_000))
            np.testing.assert_array_equal(x.map_compact("x < 10").compute(), a[:10])
        assert not [w for w in seen if "dask-compact" in str(w.message)], seen


def test_each_graph_form_has_its_own_output_keys(client):
    """Lazy and eager calls, by_worker on and off, a held input and the same input as a
    graph build different tasks: each takes keys of its own, so distributed never meets one
    key with two run_specs (it warned of "failures and deadlocks" when one form followed
    another under the same names: a probe's lazy call after an eager one, argsort of an
    array and then of the same array persisted)."""
    a = np.random.default_rng(4).random(3_000)
    x = da.from_array(a, chunks=700)
    held = x.persist()
    results = [
        x.map_compact("x > 0.5", by_worker=False),
        x.map_compact("x > 0.5", lazy=True),
        x.map_compact("x > 0.5"),
        held.map_compact("x > 0.5", by_worker=False),
        held.map_compact("x > 0.5", lazy=True),
        dask_compact.compact(x, x > 0.5),
        dask_compact.compact(x, x > 0.5, lazy=True),
    ]
    assert len({r.name for r in results}) == len(results)
    for r in results:
        np.testing.assert_array_equal(r.compute(), a[a > 0.5])
    fields = {"v": x, "w": x * 2}
    records = [dask_compact.compact_records(fields, "v > 0.5", lazy=lazy) for lazy in (0, 1)]
    assert records[0]["v"].name != records[1]["v"].name
    one = da.from_array(a[:1], chunks=1)
    first = dask_compact.argsort(one)
    np.testing.assert_array_equal(first.compute(), [0])
    again = dask_compact.argsort(one.persist())
    np.testing.assert_array_equal(again.compute(), [0])
    assert first.name != again.name
    logs = [m for _, m in client.get_scheduler_logs(n=10_000) if "different run_spec" in m]
    assert not logs, logs[:3]


_BAD = 1000  # a value the next predicate refuses at run time, in one chunk only
_SET = np.array([1, 5, 9])


def _fails_in_one_chunk(v):
    """A mask-path predicate (np.isin) that raises on the chunk holding ``_BAD``."""
    m = np.isin(v, _SET)
    if isinstance(v, np.ndarray) and (v == _BAD).any():
        raise ValueError("a value this predicate refuses")
    return m


def _fails_on_a_field(mass, energy):
    m = np.isin(mass, _SET)
    if isinstance(mass, np.ndarray) and (mass == _BAD).any():
        raise ValueError("a value this predicate refuses")
    return m & (energy > 0)


def _scheduler_tasks(client) -> set:
    return client.run_on_scheduler(lambda dask_scheduler: {str(k) for k in dask_scheduler.tasks})


@pytest.mark.parametrize("call", ["values", "both-by-chunk", "tasks", "partition", "records"])
def test_a_failed_call_leaves_nothing_held(client, call):
    """A call whose predicate raises in one chunk raises it and leaves no piece behind on the
    workers (a probe: 2 keys left held per failed call on a persisted input, 78 with
    by_worker=False: the exception the client keeps held the futures of the call's frames)."""
    import gc

    a = np.random.default_rng(11).integers(0, 100, 200_000)
    a[170_001] = _BAD
    x = da.from_array(a, chunks=5_000).persist()
    distributed.wait(x)
    before = _scheduler_tasks(client)
    for _ in range(2):
        with pytest.raises(ValueError, match="this predicate refuses"):
            if call == "values":
                x.map_compact(_fails_in_one_chunk)
            elif call == "both-by-chunk":
                x.map_compact(_fails_in_one_chunk, output="both", by_worker=False)
            elif call == "tasks":
                with dask.config.set({"dask-compact.direct": False}):
                    x.map_compact(_fails_in_one_chunk, chunks=7_000)
            elif call == "partition":
                dask_compact.partition(x, _fails_in_one_chunk)
            else:
                dask_compact.compact_records({"mass": x, "energy": x * 0.5 - 10},
                                             _fails_on_a_field, indices=True)
    gc.collect()
    deadline = time.monotonic() + 10
    while _scheduler_tasks(client) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _scheduler_tasks(client) - before  # (earlier tests' keys may go meanwhile)
    ok = x.map_compact(lambda v: v < 30)  # the cluster still works, and right
    np.testing.assert_array_equal(ok.compute(), a[a < 30])


def test_records_of_many_fields_on_a_cluster_and_nothing_left_held(client):
    """Past ``records_graph.ONE_GRAPH_OUTPUTS`` outputs an eager call persists phase 1 alone
    and then a getitem task per output and chunk over its futures (since 2026-12-02,
    sixteenth session, issue 11: one graph's ordering was quadratic in the fields). Every
    field (1-D and 2-D, several dtypes) and the indices as NumPy selects them, with known
    chunks; phase 1's pieces are let go once the outputs hold them; a failing predicate
    leaves nothing held either."""
    import gc

    from dask_compact import records_graph

    n_fields = records_graph.ONE_GRAPH_OUTPUTS + 4
    rng = np.random.default_rng(23)
    mass = rng.integers(0, 100, 20_003)
    arrays = {"mass": mass, "energy": rng.random(20_003) - 0.2,
              "pos": rng.random((20_003, 3)).astype(np.float32)}
    for i in range(n_fields - len(arrays)):
        arrays[f"f{i}"] = rng.integers(-9, 9, 20_003).astype([np.int8, np.float32][i % 2])
    x = {k: da.from_array(v, chunks=(5_000, *v.shape[1:])).persist() for k, v in arrays.items()}
    distributed.wait(list(x.values()))
    before = _scheduler_tasks(client)
    keep = np.isin(mass, _SET) & (arrays["energy"] > 0)
    out = dask_compact.compact_records(x, _fails_on_a_field, indices=True)
    assert list(out) == [*arrays, "indices"]
    for k, v in arrays.items():
        assert not any(np.isnan(c) for c in out[k].chunks[0]), k
        np.testing.assert_array_equal(out[k].compute(), v[keep], err_msg=k)
    np.testing.assert_array_equal(out["indices"].compute(), np.flatnonzero(keep))
    # phase 1's pieces (keys of its name, no output's) are released once the outputs hold
    # theirs: no dict of every field's rows stays in memory beside them
    from dask_compact.graph import KEPT_SUFFIX

    phase1 = {a.name.removesuffix(f"-{KEPT_SUFFIX}").replace("-0-", "-", 1)
              for a in out.values() if a.name.startswith("compact-records-0-")}
    assert len(phase1) == 1, phase1

    prefix = phase1.pop()

    def in_memory(dask_scheduler, state="memory"):
        return [str(k) for k, ts in dask_scheduler.tasks.items()
                if isinstance(k, tuple) and k[0] == prefix and state in (ts.state, None)]

    assert client.run_on_scheduler(in_memory, state=None)  # its tasks are known there
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(in_memory) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not client.run_on_scheduler(in_memory)
    del out
    bad = dict(x, mass=da.from_array(np.where(np.arange(20_003) == 17_001, _BAD, mass),
                                     chunks=5_000))
    with pytest.raises(ValueError, match="this predicate refuses"):
        dask_compact.compact_records(bad, _fails_on_a_field, indices=True)
    gc.collect()
    deadline = time.monotonic() + 10
    while _scheduler_tasks(client) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _scheduler_tasks(client) - before


def _eager_calls(x: da.Array) -> dict:
    """Every eager builder over ``x`` (map_compact, compact, partition, sort, records), as
    NumPy arrays, with ``compute`` given where the result is."""
    k = dask_compact.partition(x, "x > 0.5")[1]
    return {
        "values": x.map_compact(lambda v: v > 0.5),
        "masked": dask_compact.compact(x, x > 0.5),
        "partition": dask_compact.partition(x, "x > 0.5")[0][:k],
        "sort": dask_compact.sort(x),
        "records": dask_compact.compact_records({"v": x, "w": x * 2}, "v > 0.5")["w"],
    }


def _wanted(a: np.ndarray) -> dict:
    return {"values": a[a > 0.5], "masked": a[a > 0.5], "partition": a[a > 0.5],
            "sort": np.sort(a), "records": a[a > 0.5] * 2}


def _lazy_calls_in_a_task(x: da.Array) -> dict:
    """Run on a worker: the lazy calls and the sort, computed there."""
    return {"values": x.map_compact("x > 0.5", lazy=True).compute(),
            "records": dask_compact.compact_records({"a": x, "b": x * 2}, "a > 0.5",
                                                    lazy=True)["b"].compute(),
            "sort": dask_compact.sort(x).compute()}


def test_lazy_calls_and_the_sort_run_inside_tasks(client):
    """Inside a task (a probe: "'NoneType' object has no attribute 'wait'", where plain
    Dask's ``x[x > 0.5].compute()`` worked), lazy calls and the sort run on the worker's
    client, six tasks at once on workers of one thread included."""
    a = np.random.default_rng(30).random(30_000)
    x = da.from_array(a, chunks=3_000).persist()
    distributed.wait(x)
    futures = [client.submit(_lazy_calls_in_a_task, x, pure=False) for _ in range(6)]
    distributed.wait(futures, timeout=60)  # a hang fails here instead of holding CI
    for got in client.gather(futures):
        np.testing.assert_array_equal(got["values"], a[a > 0.5])
        np.testing.assert_array_equal(got["records"], a[a > 0.5] * 2)
        np.testing.assert_array_equal(got["sort"], np.sort(a))


def _in_task_data() -> np.ndarray:
    return np.random.default_rng(31).random(24_000)


def _eager_call_in_a_task(x: da.Array | None, call: str) -> tuple:
    """Run on a worker: one eager call over ``x`` (None: a graph made here, from
    :func:`_in_task_data`), its results computed there."""
    if x is None:
        x = da.from_array(_in_task_data(), chunks=3_000)
    if call == "map_compact":
        v, i = x.map_compact("x > 0.5", output="both")
        return v.compute(), i.compute()
    if call == "compact":
        return (dask_compact.compact(x, x > 0.5).compute(),
                dask_compact.flatnonzero(x > 0.5).compute())
    if call == "partition":
        y, k = dask_compact.partition(x, "x > 0.5")
        return y[:k].compute(), y[k:].compute()
    if call == "sort":
        return dask_compact.sort(x).compute(), dask_compact.argsort(x).compute()
    r = dask_compact.compact_records({"v": x, "w": x * 2}, "v > 0.5", indices=True)
    return r["w"].compute() / 2, r["indices"].compute()


@pytest.mark.parametrize("call", ["map_compact", "compact", "partition", "compact_records",
                                  "sort"])
def test_eager_calls_in_eight_tasks_at_once(client, call):
    """Eight tasks at once on 2 workers of one thread, each making an eager call, over a
    persisted input passed in (the direct path, its workers asked from inside a task) or a
    graph made in the task. The compactions were refused until 2026-11-30 (sixth session):
    several at once failed ("'NoneType' object has no attribute 'wait'") or hung, and sorts
    hung. The second task a worker started ran in the context of the first task's
    ``secede`` callback (a ContextVar of the first call, saying its client was settled), so
    it skipped the worker's client, its secede and the binding of its input's futures."""
    a = _in_task_data()
    m = a > 0.5
    wanted = {"map_compact": (a[m], np.flatnonzero(m)), "compact": (a[m], np.flatnonzero(m)),
              "partition": (a[m], a[~m]), "compact_records": (a[m], np.flatnonzero(m)),
              "sort": (np.sort(a), np.argsort(a, kind="stable"))}[call]
    x = da.from_array(a, chunks=3_000).persist()
    distributed.wait(x)
    futures = [client.submit(_eager_call_in_a_task, x if j % 2 else None, call, pure=False)
               for j in range(8)]
    distributed.wait(futures, timeout=60)  # a hang fails here instead of holding CI
    for got in client.gather(futures):
        for g, w in zip(got, wanted):
            np.testing.assert_array_equal(g, w)


def _eager_calls_then_wait_in_a_task(x: da.Array) -> tuple:
    """Run on a worker: eager calls whose results are still being made when they return
    (phase 1 as tasks, a rebalance), then waited for through the worker's client."""
    c = distributed.get_client()
    y = x.map_compact("x > 0.5", by_worker=False, chunks=2_500)
    w = dask_compact.compact_records({"v": x, "w": x + 1}, "v > 0.5", chunks=2_500)["w"]
    return (c.compute(y).result(timeout=60), c.compute(w).result(timeout=60),
            c.compute((x + 1).sum()).result(timeout=60))


def test_eager_calls_in_a_task_then_waited_for_from_it(client):
    """A task alone on workers of one thread: eager calls, then their results and another
    computation waited for through ``get_client()``, as after the sort (the task stays out
    of the worker's threads: a rejoin queued what it waited for behind it)."""
    a = np.random.default_rng(32).random(20_000)
    x = da.from_array(a, chunks=2_000).persist()
    distributed.wait(x)
    y, w, total = client.submit(_eager_calls_then_wait_in_a_task, x,
                                pure=False).result(timeout=120)
    np.testing.assert_array_equal(y, a[a > 0.5])
    np.testing.assert_array_equal(w, a[a > 0.5] + 1)
    assert total == pytest.approx((a + 1).sum())


_N_IN_TASK = 20_000


def _a_graph_input() -> da.Array:
    """A permutation of 0..n-1 computed from a graph (not persisted), the same in any process."""
    return (da.arange(_N_IN_TASK, chunks=2_000) * 7919) % _N_IN_TASK


def _sort_then_wait_in_a_task(how: str) -> tuple:
    """Run on a worker: sort and argsort of a graph input, then their results waited for as
    ``how`` says, each wait given 60 s (a hang fails the test instead of holding CI)."""
    x = _a_graph_input()
    y, i = dask_compact.sort(x), dask_compact.argsort(x)
    if how == "get_client":
        c = distributed.get_client()
        got = c.compute(y).result(timeout=60), c.compute(i).result(timeout=60)
        # and what the task waits for after them, as plain Dask would
        return (*got, c.compute((x + 1).sum()).result(timeout=60))
    if how == "worker_client":
        with distributed.worker_client() as c:
            return c.compute(y).result(timeout=60), c.compute(i).result(timeout=60), None
    return y.compute(), i.compute(), None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["get_client", "worker_client", "compute"])
def test_a_sort_in_a_task_then_waited_for_from_that_task(client, how):
    """Inside a task on workers of one thread, the sort's and argsort's results of a graph
    input waited for through ``get_client().compute(...).result()`` (a probe: hung, the
    input's chunks queued behind the waiting task on its own worker), ``worker_client()`` or
    ``compute()``."""
    a = (np.arange(_N_IN_TASK) * 7919) % _N_IN_TASK
    y, i, total = client.submit(_sort_then_wait_in_a_task, how, pure=False).result(timeout=240)
    np.testing.assert_array_equal(y, np.sort(a))
    np.testing.assert_array_equal(i, np.argsort(a, kind="stable"))
    assert total in (None, (a + 1).sum())


@contextlib.contextmanager
def _no_default_client(m: pytest.MonkeyPatch) -> Iterator[None]:
    """As in a program whose only client was made with ``set_as_default=False``: no default
    client registered, none current in this context (the module's client, entered as a
    context manager, is current in it) and no scheduler in dask's config."""
    m.setattr(distributed.client, "_global_clients", {})
    m.setitem(dask.config.config, "scheduler", None)
    token = distributed.client._current_client.set(None)
    try:
        yield
    finally:
        distributed.client._current_client.reset(token)


def test_calls_on_an_input_of_a_client_that_is_not_the_default_run_on_it(client, monkeypatch):
    """An input persisted by a client made with ``set_as_default=False``: the eager calls run
    on that client, as ``dask.persist(..., scheduler=that_client)`` would (a probe: "No
    clients found" from map_compact, "missing keys" from sort, "Missing dependency" from
    partition and compact, with no default client; with one, sort's result was the default
    client's). A graph over its futures runs where dask would run it: on the default
    client, or, with none, on the client of those futures."""
    a = np.random.default_rng(31).random(30_000)
    with distributed.Client(client.scheduler.address, set_as_default=False) as other:
        x = other.persist(da.from_array(a, chunks=3_000))
        for default in (True, False):
            with monkeypatch.context() as m, contextlib.ExitStack() as stack:
                if not default:
                    stack.enter_context(_no_default_client(m))
                got, wanted = _eager_calls(x), _wanted(a)
                if not default:
                    got["graph"] = (x + 1).map_compact("x > 1.5")
                    wanted["graph"] = a[a > 0.5] + 1
                for name, want in wanted.items():
                    assert {f.client for f in futures_of(got[name])} == {other}, name
                    np.testing.assert_array_equal(other.compute(got[name]).result(), want,
                                                  err_msg=name)


def _every_call(x: da.Array) -> dict:
    """Every public call over ``x``, eager and lazy, by worker and by chunk, unevaluated."""
    return {
        "map_compact": lambda: x.map_compact("x > 0.5"),
        "by chunk": lambda: x.map_compact("x > 0.5", by_worker=False),
        "lazy": lambda: x.map_compact("x > 0.5", lazy=True),
        "lazy by chunk": lambda: x.map_compact("x > 0.5", lazy=True, by_worker=False),
        "flatnonzero": lambda: dask_compact.flatnonzero(x),
        "compact": lambda: dask_compact.compact(x, x > 0.5),
        "compact lazy": lambda: dask_compact.compact(x, x > 0.5, lazy=True),
        "the mask only": lambda: dask_compact.compact(da.ones_like(x), x > 0.5),
        "records": lambda: dask_compact.compact_records({"v": x}, "v > 0.5"),
        "records lazy": lambda: dask_compact.compact_records({"v": x}, "v > 0.5", lazy=True),
        "partition": lambda: dask_compact.partition(x, "x > 0.5"),
        "cumsum": lambda: dask_compact.cumsum(x),
        "sort": lambda: dask_compact.sort(x),
        "argsort": lambda: dask_compact.argsort(x),
        "a graph over it": lambda: (x + 1).map_compact("x > 1.5"),
        "a graph over it, lazy": lambda: (x + 1).map_compact("x > 1.5", lazy=True),
    }


def test_an_input_of_a_closed_or_cancelled_client_is_refused_before_anything_runs(client):
    """An input persisted by a client since closed (``client.persist(x)`` or ``x.persist()``
    under it), with the module's client still open: every call, eager or lazy, says that its
    futures belong to a closed client, and submits nothing (a probe: map_compact said
    "Futures cancelled ... reason: unknown", sort "Client is closed", the lazy calls and
    cumsum built graphs that failed when computed). Futures cancelled by their client likewise
    (a sort of such an input returned an array that failed when computed)."""
    a = np.random.default_rng(33).random(20_000)
    with distributed.Client(client.scheduler.address, set_as_default=False) as other:
        held = other.persist(da.from_array(a, chunks=2_000))
        with other.as_current():
            persisted = da.from_array(a + 1, chunks=2_000).persist()
        distributed.wait([held, persisted])
        cancelled = client.persist(da.from_array(a + 2, chunks=2_000))
        distributed.wait(cancelled)
        client.cancel(cancelled)
    before = _scheduler_tasks(client)
    for x, match in ((held, "client that is closed"), (persisted, "client that is closed"),
                     (cancelled, "futures that were cancelled")):
        for name, call in _every_call(x).items():
            with pytest.raises(ValueError, match=match):
                call()
                pytest.fail(f"{name}: not refused")
    assert not _scheduler_tasks(client) - before
    ok = da.from_array(a, chunks=2_000).persist()  # the cluster still works, and right
    np.testing.assert_array_equal(ok.map_compact("x > 0.5").compute(), a[a > 0.5])


@pytest.mark.timeout(120)  # before the fix, a call could block the loop for good
def test_an_eager_call_on_an_asynchronous_clients_loop_says_to_run_it_in_a_thread(
        client, monkeypatch):
    """On the event loop of an asynchronous client (in a coroutine) an eager call, which waits
    for its chunk sizes, would block that loop: refused with what to do, and no coroutine
    left un-awaited (a probe, whose only client was asynchronous: "'coroutine' object is not
    subscriptable", and "coroutine '_exchange' was never awaited"). What the error says
    works: a thread, or lazy=True."""
    import asyncio
    import gc

    a = np.random.default_rng(32).random(20_000)

    async def main() -> None:
        async with distributed.Client(client.scheduler.address, asynchronous=True) as ac:
            x = ac.persist(da.from_array(a, chunks=2_000))
            for call in (lambda: x.map_compact("x > 0.5"), lambda: dask_compact.sort(x),
                         lambda: (x + 1).map_compact("x > 1.5")):
                with pytest.raises(RuntimeError, match=r"asyncio\.to_thread"):
                    call()
            y = await asyncio.to_thread(x.map_compact, "x > 0.5")
            np.testing.assert_array_equal(await ac.compute(y), a[a > 0.5])
            lazy = x.map_compact("x > 0.5", lazy=True)
            np.testing.assert_array_equal(await ac.compute(lazy), a[a > 0.5])

    with warnings.catch_warnings(record=True) as seen, _no_default_client(monkeypatch):
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert not [w for w in seen if "never awaited" in str(w.message)], seen


def _masked_if_odd(b: np.ndarray, k: int) -> np.ndarray:
    return np.ma.masked_greater(b, 0.5) if k % 2 else b


def _plain_then_masked(client, a: np.ndarray, chunk: int, workers: list[str]) -> da.Array:
    """``a`` persisted under a plain meta with chunk k masked (np.ma, > 0.5) where k is odd,
    and chunks 2j, 2j + 1 on ``workers[j % len(workers)]``: every worker's first chunk plain,
    its second masked."""
    from distributed import wait

    parts = [
        client.persist(da.from_array(a[s : s + chunk], chunks=chunk).map_blocks(
            _masked_if_odd, k, meta=np.empty(0)), workers=[workers[k // 2 % len(workers)]])
        for k, s in enumerate(range(0, len(a), chunk))
    ]
    x = da.concatenate(parts).persist()
    wait(x)
    return x


_MASKED_CALLS = {
    "values": lambda x: x.map_compact("x > 0.3"),
    "indices": lambda x: x.map_compact("x > 0.3", output="indices"),
    "both": lambda x: x.map_compact("x > 0.3", output="both")[0],
    "chunks=": lambda x: x.map_compact("x > 0.3", chunks=7),
    "mask path": lambda x: x.map_compact(lambda v: np.isin(v > 0.3, [True])),
    "flatnonzero": lambda x: dask_compact.flatnonzero(x),
}


def _each_call_refuses(x: da.Array) -> None:
    for direct in (True, False):
        with dask.config.set({"dask-compact.direct": direct}):
            for name, call in _MASKED_CALLS.items():
                with pytest.raises(TypeError, match="masked array, though the dask array's"):
                    call(x).compute()
                    pytest.fail(f"{name} (direct {direct}): no error")


def test_masked_chunks_after_a_plain_one_on_a_worker_are_refused(client):
    """A worker's run of chunks was compacted by one step dispatched on its first chunk's
    type: a masked chunk after a plain one under a plain meta came back as plain data, the
    mask dropped, asked directly or as tasks (a new-user probe: flatnonzero gave all 90
    indices). Refused, as a worker's first chunk masked was; on 2 worker processes here,
    on 1 in the next test."""
    a = np.random.default_rng(24).random(80)
    workers = sorted(client.nthreads())
    x = _plain_then_masked(client, a, 10, workers)
    blocks = [x.dask[k] for k in dask.core.flatten(x.__dask_keys__())]
    where = [set(client.who_has([f])[f.key]) for f in blocks]
    assert where == [{workers[k // 2 % 2]} for k in range(8)]  # runs of 2, plain first
    _each_call_refuses(x)


def test_masked_second_chunk_on_one_worker_is_refused():
    from conftest import local_process_cluster

    a = np.random.default_rng(25).random(20)
    with local_process_cluster(1) as c:
        _each_call_refuses(_plain_then_masked(c, a, 10, sorted(c.nthreads())))


def test_no_dispatch_object_is_sent_to_the_workers(client, monkeypatch):
    """Every public call on a cluster of processes pickles no ``dask.utils.Dispatch`` into what
    it sends: one in a task arrives as a copy, and the lazy CuPy registration on the worker
    fills in the module's object, not the copy (``cumsum`` of CuPy chunks failed on every
    worker with "No dispatch for <class 'cupy.ndarray'>"). The spy sees every pickling in this
    (the client's) process; the graphs of eager, lazy, direct (persisted input) and record
    calls, the sort, the partition and the scan all go through it."""
    from dask.utils import Dispatch

    pickled: list[str] = []
    real = Dispatch.__reduce_ex__

    def spy(self, protocol):
        pickled.append(self.__name__)
        return real(self, protocol)

    monkeypatch.setattr(Dispatch, "__reduce_ex__", spy, raising=False)
    rng = np.random.default_rng(5)
    a = rng.integers(0, 100, 3_000).astype(np.int32)
    x = da.from_array(a, chunks=1_000)
    m = a > 50
    calls = {
        "map_compact": lambda: x.map_compact("x > 50", output="both"),
        "map_compact lazy": lambda: x.map_compact("x > 50", lazy=True),
        "map_compact persisted": lambda: x.persist().map_compact("x > 50"),
        "compact": lambda: dask_compact.compact(x, x > 50),
        "flatnonzero": lambda: dask_compact.flatnonzero(x > 50),
        "compact_records": lambda: dask_compact.compact_records({"k": x, "v": x * 2}, "k > 50"),
        "partition": lambda: dask_compact.partition(x, "x > 50"),
        "sort": lambda: dask_compact.sort(x),
        "argsort": lambda: dask_compact.argsort(x),
        "cumsum": lambda: dask_compact.cumsum(x),
    }
    for what, call in calls.items():
        out = call()
        computed = dask.compute(out)  # the lazy parts too
        assert computed is not None, what
        assert pickled == [], f"{what} sent Dispatch objects {pickled} to the workers"
    np.testing.assert_array_equal(dask_compact.cumsum(x).compute(), np.cumsum(a))
    np.testing.assert_array_equal(x.map_compact("x > 50").compute(), a[m])
    pickle.dumps(Dispatch("seen"))  # the spy is not blind
    assert pickled == ["seen"]


def _calls_on_a_cluster(x: da.Array, a: np.ndarray) -> dict:
    """Each public call over the persisted ``x`` (declared dtype ``a.dtype``) and NumPy's
    answer on ``a``."""
    m = a > 3
    e = np.linspace(0, 1, a.size)
    ed = da.from_array(e, chunks=x.chunks)
    return {
        "map_compact": (lambda: [x.map_compact("x > 3")], [a[m]]),
        "both": (lambda: list(x.map_compact(lambda v: v > 3, output="both")),
                 [a[m], np.flatnonzero(m)]),
        "by_worker=False": (lambda: [x.map_compact("x > 3", by_worker=False)], [a[m]]),
        "lazy": (lambda: [x.map_compact("x > 3", lazy=True)], [a[m]]),
        "compact": (lambda: [dask_compact.compact(x, x > 3)], [a[m]]),
        "records": (lambda: list(dask_compact.compact_records({"a": x, "e": ed},
                                                              "e > 0.3").values()),
                    [a[e > 0.3], e[e > 0.3]]),
        "cumsum": (lambda: [dask_compact.cumsum(x)], [np.cumsum(a)]),
        "partition": (lambda: list(dask_compact.partition(x, "x > 3")[:1]),
                      [np.concatenate([a[m], a[~m]])]),
        "sort": (lambda: [dask_compact.sort(x, buckets=3)], [np.sort(a)]),
        "argsort": (lambda: [dask_compact.argsort(x, buckets=3)],
                    [np.argsort(a, kind="stable")]),
    }


@pytest.mark.parametrize("direct", [True, False])
def test_chunks_of_another_dtype_than_declared_on_a_cluster(client, direct):
    """On worker processes, asked directly or as tasks (grouped, by chunk): float32 chunks of
    an array declaring float64 are cast as they are taken (they came back float32 in a
    float64 result), float64 chunks holding 0.1 of one declaring float32 are refused (they
    came back float64), naming it, in every public call."""
    from conftest import chunk_dtypes, hidden_dtype
    from distributed import get_task_stream, wait

    a, x = hidden_dtype("float32", "float64", n=400, chunk=50)
    x = client.persist(x)
    wait(x)
    with dask.config.set({"dask-compact.direct": direct}):
        if direct:  # the cast is the workers' own, asked directly: no phase-1 task ran
            with get_task_stream(client) as stream:
                got = x.map_compact("x > 3")
            assert not [t for t in stream.data if "compact" in str(t["key"])]
            assert chunk_dtypes(got) == {a.dtype}
        for name, (call, want) in _calls_on_a_cluster(x, a).items():
            for g, w in zip(call(), want, strict=True):
                assert chunk_dtypes(g) == {w.dtype}, name
                np.testing.assert_array_equal(g.compute(), w, err_msg=name)
        b, y = hidden_dtype("float64", "float32", n=400, chunk=50, planted=0.1)
        y = client.persist(y)
        wait(y)
        for name, (call, _) in _calls_on_a_cluster(y, b).items():
            with pytest.raises(TypeError, match=r"chunk [13579] of (the input|field 'a') "
                                                "holds float64, but its dask array declares "
                                                r"float32, and its value 0.1 \(element 25 "):
                for g in call():
                    g.compute()
                pytest.fail(f"{name}: not refused")


def test_the_module_cluster_serves_only_the_tests_that_ask_for_it():
    """After the cluster tests in the file's order, no distributed client is the default
    and a computation runs in this process (conftest.client_as_default). Until 2026-12-01 the
    module's cluster stayed the default to the module's end (the tests that do not take it
    choose the threaded scheduler, or a cluster of their own made the default inside: none
    was seen to depend on it)."""
    from conftest import assert_no_client_is_the_default

    assert_no_client_is_the_default()


@pytest.mark.parametrize("how", ["direct", "tasks", "by chunk", "graph input", "lazy", "mask",
                                 "N-D"])
@pytest.mark.parametrize("actual, declared", [(5, 7), (9, 7)])
def test_a_chunk_of_another_length_than_declared_is_refused_on_the_workers(client, how,
                                                                          actual, declared):
    """A persisted input one of whose futures holds a chunk of 5 elements declared 7: the
    workers asked directly, the grouped tasks and the tasks per chunk took the declared
    starts, and every index after it was off by 2; refused now by the worker's job (the
    tasks the client falls back to raise it), naming the chunk and both lengths (until
    2026-12-01, the eleventh session). The other calls too, on the cluster."""
    from chunk_shape_helpers import misdeclared, refusal

    x = da.concatenate([misdeclared(actual, declared)] * 3)  # chunks 1, 4 and 7 misdeclared
    want = refusal(actual, declared, r"\d+")
    if how == "N-D":
        x = da.stack([x, x], axis=1).rechunk({1: -1})
        want = refusal((actual, 2), (declared, 2), r"\d+")
    held = x if how == "graph input" else x.persist()
    if held is not x:
        distributed.wait(held)
    calls = {
        "direct": lambda: held.map_compact("x % 2 == 0", output="both"),
        "tasks": lambda: held.map_compact("x % 2 == 0", output="indices"),
        "by chunk": lambda: held.map_compact("x % 2 == 0", by_worker=False),
        "graph input": lambda: held.map_compact("x % 2 == 0", output="indices"),
        "lazy": lambda: held.map_compact("x % 2 == 0", output="indices", lazy=True),
        "mask": lambda: dask_compact.compact(held, held % 2 == 0),
        "N-D": lambda: held.map_compact("x % 2 == 0", output="indices"),
    }
    with dask.config.set({"dask-compact.direct": how != "tasks"}), \
            pytest.raises(ValueError, match=want):
        dask.compute(calls[how]())
    if how not in ("direct", "N-D"):
        return
    flat = held if held.ndim == 1 else held[:, 0]  # (Dask's own ravel fails on such blocks)
    for other in (lambda: dask_compact.compact_records({"a": flat, "b": held}, "a >= 0"),
                  lambda: dask_compact.partition(held, "x > 3"),
                  lambda: dask_compact.cumsum(held), lambda: dask_compact.sort(flat)):
        with pytest.raises(ValueError, match=r"chunk \d+ of .* declares"):
            dask.compute(other())
