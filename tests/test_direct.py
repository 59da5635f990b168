"""Phase 1 over a persisted input asked of the workers directly (dask_compact/direct.py), on a
real LocalCluster of worker processes: exact results for every layout, output and dtype, no
phase-1 task run, the pieces held where their chunks are, recomputed after a worker's loss,
and every failure falling back to the tasks with nothing left behind."""

from __future__ import annotations

import os
import signal
import time
import types

import dask
import dask.array as da
import numpy as np
import pytest
from cluster_helpers import (
    cluster_for_kills,
    kill_a_worker_then_check,
    persist_placed,
    rechunk_placed_by_data,
    until_replaced,
)
from dask.core import flatten
from distributed import futures_of, get_task_stream, wait
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_compact  # noqa: F401  (registers Array.map_compact)
from dask_compact import direct


@pytest.fixture(scope="module")
def _cluster():
    with cluster_for_kills(n_workers=2, threads_per_worker=2, set_as_default=False) as c:
        yield c



def _layout(client, a: np.ndarray, chunk: int, how: str) -> da.Array:
    """``a`` persisted in chunks of ``chunk``: as Dask places them, one slab per worker, or
    chunk i on worker i mod 2."""
    if how == "dask":
        x = client.persist(da.from_array(a, chunks=chunk))
    else:
        workers = sorted(client.nthreads())
        if how == "slabs":
            cut = -(-len(a) // len(workers))
            spans = [(k * cut, (k + 1) * cut, w) for k, w in enumerate(workers)]
        else:
            spans = [(s, s + chunk, workers[k % 2])
                     for k, s in enumerate(range(0, len(a), chunk))]
        x = persist_placed(client, a, chunk, spans)
    wait(x)
    return x


def _blocks(arr: da.Array) -> list:
    """The futures of a persisted array's blocks, in block order."""
    return [arr.dask[k] for k in flatten(arr.__dask_keys__())]


def _ran(stream) -> list:
    return [str(t["key"]) for t in stream.data]


def _direct_stories(dask_worker=None) -> list:
    """The worker's own record (its state machine's story) of each direct piece it holds."""
    keys = [k for k in dask_worker.data if "-direct-" in str(k)]
    return [(str(k), [str(e)[:300] for e in dask_worker.state.story(k)]) for k in keys]


def _scheduler_stories(keys: list, dask_scheduler=None) -> list:
    known = {str(k): k for k in dask_scheduler.tasks}
    return [(k, [str(e)[:300] for e in dask_scheduler.story(known[k])] if k in known else None)
            for k in keys]


def _assert_no_direct_piece(client, within: float = 0.0) -> None:
    """No worker holds a piece of a direct call (``within``: seconds to wait for releases
    still on their way); where one does, the assertion says how it came and went by the
    worker's and the scheduler's records (a leftover seen once in CI, 2026-12-06, after a
    worker was killed during a call, not reproduced since)."""
    deadline = time.monotonic() + within
    while True:
        stories = client.run(_direct_stories)
        left = [k for held in stories.values() for k, _ in held]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if left:
        known = client.run_on_scheduler(_scheduler_stories, left)
        raise AssertionError(f"direct pieces left on the workers: {left}\n"
                             f"workers' stories: {stories}\nscheduler's: {known}")


def _fell_back_and_left_nothing(client, got, want) -> None:
    """The call ran as tasks, exact, and nothing of its direct attempt is left on any
    worker or the scheduler."""
    assert "-direct-" not in got.name
    np.testing.assert_array_equal(got.compute(), want)
    _assert_no_direct_piece(client)
    known = client.run_on_scheduler(
        lambda dask_scheduler=None: [str(k) for k in dask_scheduler.tasks])
    assert not [k for k in known if "-direct-" in k]


@pytest.mark.parametrize("how", ["dask", "slabs", "round-robin"])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_asked_directly_runs_no_task_and_is_exact(client, how, output):
    a = np.random.default_rng(1).random(40_009)
    x = _layout(client, a, 1_013, how)
    with get_task_stream(client) as stream:
        got = x.map_compact("(x < 0.2) | (x > 0.85)", output=output)
    assert not [k for k in _ran(stream) if "compact" in k], _ran(stream)  # no phase-1 task
    got = got if isinstance(got, tuple) else (got,)
    m = (a < 0.2) | (a > 0.85)
    want = {"values": [a[m]], "indices": [np.flatnonzero(m)],
            "both": [a[m], np.flatnonzero(m)]}[output]
    holders = [client.who_has([f])[f.key] for f in _blocks(x)]
    for g, w in zip(got, want):
        assert "-direct-" in g.name and g.chunks == got[0].chunks
        assert sum(g.chunks[0]) == len(w)
        # each output chunk is a run of chunks one worker thread held, kept by that worker
        where = [client.who_has([f])[f.key] for f in _blocks(g)]
        assert all(len(h) == 1 for h in where)
        if how == "round-robin":  # runs of one chunk
            assert where == holders
        if how == "slabs":  # each worker's slab in two runs (one per thread) of two parts
            assert g.numblocks == (8,) and where == [holders[0]] * 4 + [holders[-1]] * 4
        np.testing.assert_array_equal(g.compute(), w)
        np.testing.assert_array_equal(g[17:-17].compute(), w[17:-17])
    with get_task_stream(client) as stream:
        got[0].compute()
    assert not [s for t in stream.data for s in t["startstops"] if s["action"] == "transfer"
                and "-direct-" in str(t["key"])]


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "float32", "float64",
                                   "bool", ">f8"])
def test_asked_directly_every_dtype_and_odd_size(client, dtype):
    rng = np.random.default_rng(2)
    for n, chunk in ((1, 1), (31, 7), (33, 8), (1023, 100), (1025, 1024), (7919, 613)):
        a = (rng.random(n) * 200 - 100).astype(dtype)
        x = _layout(client, a, chunk, "round-robin")
        for pred, m in (("x > 0", a > 0), ("x == x", np.ones(n, bool)),
                        ("x != x", np.zeros(n, bool))):
            v, i = x.map_compact(pred, output="both")
            assert "-direct-" in v.name
            assert v.chunks == i.chunks and sum(v.chunks[0]) == int(m.sum())
            np.testing.assert_array_equal(v.compute(), a[m])
            np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))


def test_asked_directly_with_the_other_options(client):
    """Rebalanced output, stable=False, N-D input whose trailing axes are whole chunks, and
    the switch back to tasks."""
    a = np.random.default_rng(3).random(25_013)
    x = _layout(client, a, 1_000, "round-robin")
    v, i = x.map_compact("x < 0.4", output="both", chunks=3_001)
    m = a < 0.4
    assert v.chunks == i.chunks and set(v.chunks[0][:-1]) == {3_001}
    np.testing.assert_array_equal(v.compute(), a[m])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    np.testing.assert_array_equal(x.map_compact("x > 0.5", stable=False).compute(), a[a > 0.5])
    # both outputs unordered: tasks (a pair remade after a loss would not match)
    v, i = x.map_compact("x > 0.5", output="both", stable=False)
    assert "-direct-" not in v.name
    np.testing.assert_array_equal(np.sort(v.compute()), np.sort(a[a > 0.5]))
    np.testing.assert_array_equal(a[np.asarray(i.compute())], np.asarray(v.compute()))
    rows = client.persist(da.from_array(a.reshape(-1, 1), chunks=(999, 1)))
    got = rows.map_compact("x < 0.5", output="indices")
    assert "-direct-" in got.name
    np.testing.assert_array_equal(got.compute(), np.flatnonzero(a < 0.5))
    with dask.config.set({"dask-compact.direct": False}):
        tasks = x.map_compact("x < 0.4")
    assert "-direct-" not in tasks.name
    np.testing.assert_array_equal(tasks.compute(), a[m])


@pytest.mark.parametrize("output", ["values", "both"])
def test_a_later_use_of_few_pieces_runs_where_they_are(client, monkeypatch, output):
    """Fewer runs than the scheduler's root-ish threshold (one slab per worker thread, 4
    runs): each run's output is cut into parts, 8 chunks in all, so a rechunk right after is
    placed by its data (not taken for root tasks, which the scheduler spreads for balance,
    moving whole pieces) and moves only merged pieces. Exact."""
    a = np.random.default_rng(9).random(30_011)
    x = _layout(client, a, 997, "slabs")
    got = x.map_compact("x < 0.45", output=output)
    got = got if isinstance(got, tuple) else (got,)
    assert got[0].numblocks == (8,) and got[0].chunks == got[-1].chunks
    r = rechunk_placed_by_data(client, monkeypatch, got[0], "-direct-")
    m = a < 0.45
    np.testing.assert_array_equal(r.compute(), a[m])
    for g, w in zip(got, (a[m], np.flatnonzero(m))):
        np.testing.assert_array_equal(g.compute(), w)


def _run_specs(keys, dask_scheduler=None) -> dict:
    """On the scheduler: each key's state, its run spec's function name and dependencies,
    and the length a remade piece must have (None until the worker's sizes came:
    remade.expect wraps the run spec then)."""
    out = {}
    for k in keys:
        ts = dask_scheduler.tasks[k]
        spec, expected = ts.run_spec, None
        if getattr(spec, "func", None).__name__ == "checked":
            expected, spec = spec.args[0], spec.args[2]
        out[k] = (ts.state, getattr(getattr(spec, "func", None), "__name__", None),
                  sorted(str(d.key) for d in ts.dependencies), ts.priority is not None,
                  expected)
    return out


@pytest.mark.parametrize("output", ["values", "both"])
def test_the_pieces_are_registered_with_their_run_specs_and_no_graph(client, monkeypatch,
                                                                     output):
    """One question to the scheduler holds where the pieces are and how to remake them: no
    graph goes to the scheduler (whose answer would report every held key it touches),
    and each piece's run spec depends on exactly the input chunks of its run."""
    a = np.random.default_rng(3).random(12_007)
    x = _layout(client, a, 1_000, "round-robin")
    sent = []
    real = client._graph_to_futures
    monkeypatch.setattr(client, "_graph_to_futures",
                        lambda *args, **kw: sent.append(1) or real(*args, **kw))
    got = x.map_compact("x > 0.35", output=output)
    assert not sent
    got = got if isinstance(got, tuple) else (got,)
    inputs = [str(f.key) for f in _blocks(x)]
    for g in got:
        assert "-direct-" in g.name and g.numblocks[0] == len(inputs)  # one run per chunk
        keys = [f.key for f in _blocks(g)]
        specs = client.run_on_scheduler(_run_specs, keys)
        for j, k in enumerate(keys):
            assert specs[k][:4] == ("memory", "_recompute", [inputs[j]], True)
        deadline = time.monotonic() + 30  # the sizes follow on the workers' streams
        while (any(s[4] is None for s in specs.values())
               and time.monotonic() < deadline):
            time.sleep(0.1)
            specs = client.run_on_scheduler(_run_specs, keys)
        assert [specs[k][4] for k in keys] == list(g.chunks[0])  # checked when remade
    m = a > 0.35
    for g, w in zip(got, (a[m], np.flatnonzero(m))):
        np.testing.assert_array_equal(g.compute(), w)


def test_the_workers_plugin_is_registered_once_per_client(client, monkeypatch):
    a = np.random.default_rng(4).random(5_000)
    x = _layout(client, a, 500, "dask")
    x.map_compact("x < 0.1")
    registered = []
    real = client.register_plugin
    monkeypatch.setattr(client, "register_plugin",
                        lambda *args, **kw: registered.append(1) or real(*args, **kw))
    for t in (0.2, 0.3):
        np.testing.assert_array_equal(x.map_compact(f"x < {t}").compute(), a[a < t])
    assert not registered


@pytest.mark.parametrize("how", ["round-robin", "slabs"])
def test_a_direct_result_is_recomputed_after_its_worker_is_lost(client, how):
    """The pieces are held as data with the tasks that make them: a worker killed after the
    call loses pieces (and input chunks) that Dask then remakes, parts of a cut run
    included. Exact."""
    a = np.random.default_rng(5).random(24_001)
    x = _layout(client, a, 1_000, how)
    v, i = x.map_compact("x < 0.3", output="both")
    assert "-direct-" in v.name and v.numblocks[0] >= 5
    kill_a_worker_then_check(client, a, a < 0.3, v, i)
    # Released, the pieces (those remade after the loss too) leave their workers. Checked
    # here as well as after the next test's fallback: the CI leftover of 2026-12-06 (outputs
    # 19 and 23 of "both" over a round-robin layout of 24,001 in chunks of 1,000) fits this
    # test's round-robin case as well as the next one's, which found it.
    del v, i, x
    _assert_no_direct_piece(client, within=10.0)


def test_a_worker_lost_during_the_call_falls_back_to_tasks(client, monkeypatch):
    _assert_no_direct_piece(client)  # what is left after this test is this test's
    a = np.random.default_rng(6).random(24_001)
    x = _layout(client, a, 1_000, "round-robin")
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    real = direct._ask

    async def kill_then_ask(c, requests):
        os.kill(pids[victim], signal.SIGKILL)
        return await real(c, requests)

    monkeypatch.setattr(direct, "_ask", kill_then_ask)
    try:
        v, i = x.map_compact("x > 0.5", output="both")
        assert "-direct-" not in v.name
        m = a > 0.5
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    finally:
        until_replaced(client, [pids[victim]], 2)  # not wait_for_workers: see until_replaced
    _assert_no_direct_piece(client)


def test_a_call_that_cannot_finish_directly_leaves_no_piece(client, monkeypatch):
    """One worker asked for a chunk it does not hold answers so; the other's pieces are
    dropped, the call runs as tasks (exact), and no worker or scheduler keeps a piece."""
    a = np.random.default_rng(7).random(20_011)
    x = _layout(client, a, 1_000, "slabs")
    real = direct.placement

    def wrong(c, keys, blocks):
        holders, nthreads, rootish, limits = real(c, keys, blocks)
        first = holders[0]
        other = next(h for h in holders if h != first)
        return [other, *holders[1:]], nthreads, rootish, limits  # chunk 0 said to be elsewhere

    monkeypatch.setattr(direct, "placement", wrong)
    got = x.map_compact("x < 0.6")
    _fell_back_and_left_nothing(client, got, a[a < 0.6])


def _fail_compaction(dask_worker=None):
    """On a worker: its direct compaction raises (the tasks' path is untouched)."""
    def broken(*args, **kwargs):
        raise RuntimeError("a compaction that fails")

    direct._saved_compact, direct.compact_held_runs = direct.compact_held_runs, broken


def _mend_compaction(dask_worker=None):
    direct.compact_held_runs = direct._saved_compact


def test_a_job_that_fails_after_its_pieces_were_registered_leaves_no_piece(client):
    """A worker registers its pieces while it computes them; where its compaction then
    fails, the call runs as tasks (exact) and the registered pieces are released: nothing
    of the call is left on any worker or the scheduler."""
    a = np.random.default_rng(12).random(20_011)
    x = _layout(client, a, 1_000, "round-robin")
    assert "-direct-" in x.map_compact("x < 0.2").name
    victim = sorted(client.nthreads())[0]
    client.run(_fail_compaction, workers=[victim])
    try:
        got = x.map_compact("x < 0.65")
    finally:
        client.run(_mend_compaction, workers=[victim])
    _fell_back_and_left_nothing(client, got, a[a < 0.65])


def _sizes(keys, dask_scheduler=None) -> tuple:
    """On the scheduler: the keys' sizes, and each worker's total."""
    return ({k: dask_scheduler.tasks[k].nbytes for k in keys},
            {w: ws.nbytes for w, ws in dask_scheduler.workers.items()})


def _held_sizes(keys, dask_worker=None) -> dict:
    from dask.sizeof import sizeof

    return {k: sizeof(dask_worker.data[k]) for k in keys if k in dask_worker.data}


def test_the_scheduler_learns_the_pieces_sizes_and_its_totals_come_back(client):
    """The pieces are registered before their sizes are known (as 0 bytes) and the sizes
    follow on each worker's stream: the scheduler ends up with each piece's size as its
    worker holds it, and once the result is released, its per-worker totals are what they
    were before the call (nothing counted twice or left over)."""
    import time

    a = np.random.default_rng(13).random(40_009)
    x = _layout(client, a, 1_000, "dask")  # no intermediate arrays released meanwhile
    _, before = client.run_on_scheduler(_sizes, [])
    for output in ("values", "both"):
        got = x.map_compact("x < 0.7", output=output)
        got = got if isinstance(got, tuple) else (got,)
        keys = [f.key for g in got for f in _blocks(g)]
        assert all("-direct-" in str(k) for k in keys)
        held: dict = {}
        for part in client.run(_held_sizes, keys).values():
            held.update(part)
        assert set(held) == set(keys) and all(n > 0 for n in held.values())
        deadline = time.monotonic() + 10
        while client.run_on_scheduler(_sizes, keys)[0] != held:
            assert time.monotonic() < deadline, "the sizes never reached the scheduler"
            time.sleep(0.05)
        del got
        deadline = time.monotonic() + 10
        while client.run_on_scheduler(_sizes, [])[1] != before:
            assert time.monotonic() < deadline, "the per-worker totals did not come back"
            time.sleep(0.05)


def test_a_registration_refused_to_one_worker_falls_back_and_leaves_no_piece(client,
                                                                            monkeypatch):
    """Each worker registers its own pieces; where the scheduler refuses one worker's, the
    pieces it took from the other are forgotten (and freed on that worker), the call runs
    as tasks, exact, and nothing of it is left on any worker or the scheduler. (The
    scheduler of this LocalCluster runs in the test's process.)"""
    a = np.random.default_rng(10).random(20_011)
    x = _layout(client, a, 1_000, "round-robin")
    assert "-direct-" in x.map_compact("x < 0.1").name  # the scheduler's handler is there
    handlers, calls = client.cluster.scheduler.handlers, []
    real = handlers[direct.REGISTER]

    def second_refused(**msg):
        calls.append(1)
        return len(calls) != 2 and real(**msg)

    monkeypatch.setitem(handlers, direct.REGISTER, second_refused)
    got = x.map_compact("x < 0.55")
    assert len(calls) == 2
    _fell_back_and_left_nothing(client, got, a[a < 0.55])


def test_a_registration_that_fails_halfway_is_undone(client, monkeypatch):
    """Where a scheduler internal the registration uses raises (another distributed
    release), what it did is undone: the call runs as tasks, exact, and nothing of it is
    left on any worker or the scheduler."""
    a = np.random.default_rng(11).random(10_007)
    x = _layout(client, a, 1_000, "round-robin")

    def broken(*args, **kwargs):
        raise AttributeError("no such internal in this release")

    # raises halfway through the registration, after update_data, and nowhere else (the
    # scheduler of this LocalCluster runs in the test's process)
    monkeypatch.setattr(direct, "time", types.SimpleNamespace(time=broken))
    got = x.map_compact("x < 0.45")
    _fell_back_and_left_nothing(client, got, a[a < 0.45])


def test_registration_refused_unless_all_of_it_can_be_taken(client):
    """The scheduler takes the pieces all or none: nothing where a worker has left, a
    dependency of a run spec is unknown, or a key is held already."""
    from dask._task_spec import Task, TaskRef

    a = np.random.default_rng(8).random(100)
    x = _layout(client, a, 50, "dask")
    held = futures_of(x)[0].key
    alive = sorted(client.nthreads())[0]
    key = ("dask-compact-test-direct", 0)

    def spec(dep):
        return {key: Task(key, len, TaskRef(dep))}

    for where, deps, k in ((["tcp://127.0.0.1:1"], held, key), ([alive], "no-such-key", key),
                           ([alive], held, held)):
        assert not client.run_on_scheduler(direct._register, {k: where}, {k: 8},
                                           {k: spec(deps)[key]}, client.id)
    known = client.run_on_scheduler(lambda dask_scheduler=None: list(dask_scheduler.tasks))
    assert key not in known and held in known


# hypothesis compares the global `random` state around each draw; the distributed client's
# IO-loop thread uses `random` meanwhile (tornado's jittered periodic callbacks), which it
# reports as a strategy using `random`. Nothing here does: the data comes from NumPy's seed.
@pytest.mark.filterwarnings(
    "ignore:Do not use the `random` module inside strategies:"
    "hypothesis.errors.HypothesisDeprecationWarning")
# `client` is function-scoped, entered once for all the examples: it only makes the module's
# client the default (conftest.client_as_default), which holds for every example alike.
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(0, 3_000), chunk=st.integers(1, 700), t=st.floats(-0.1, 1.1),
       output=st.sampled_from(["values", "indices", "both"]),
       how=st.sampled_from(["dask", "round-robin"]), seed=st.integers(0, 2**16))
def test_asked_directly_matches_numpy(client, n, chunk, t, output, how, seed):
    # At most 64 chunks: thousands of 1-element chunks made this one test take 9-97 s of CI's
    # time by the draw, and a run of many chunks is no different to the direct call than 64.
    chunk = max(chunk, -(-n // 64))
    a = np.random.default_rng(seed).random(n).astype(np.float32)
    x = _layout(client, a, chunk, how) if n else client.persist(da.from_array(a, chunks=chunk))
    got = x.map_compact(f"x < {t!r}", output=output)
    got = got if isinstance(got, tuple) else (got,)
    m = a < np.float32(t)
    want = {"values": [a[m]], "indices": [np.flatnonzero(m)],
            "both": [a[m], np.flatnonzero(m)]}[output]
    for g, w in zip(got, want):
        assert sum(g.chunks[0]) == len(w)
        np.testing.assert_array_equal(g.compute(), w)


def test_a_placement_with_a_chunk_held_nowhere_is_asked_again(client, monkeypatch):
    """After a worker's loss a persisted input's futures can read "finished" before the
    client hears that chunks were lost, and the scheduler then names no holder for them: a
    placement cached at that moment kept every later call on the tasks (CI, 2026-11-30: 20
    calls over 10 s, none direct). Such a placement is not kept: the next call asks again
    and goes direct."""
    from dask_compact import placement

    a = np.random.default_rng(12).random(20_011)
    x = _layout(client, a, 1_000, "slabs")
    placement.forget(client, list(flatten(x.__dask_keys__())))  # another test's may be kept
    asked = []
    real = client.run_on_scheduler

    def lost_then_found(fn, *args, **kwargs):
        out = real(fn, *args, **kwargs)
        if fn is placement._held_where:
            asked.append(1)
            if len(asked) == 1:  # the first answer: chunk 3 held nowhere, as after a loss
                holders = list(out[0])
                holders[3] = None
                out = (holders, *out[1:])
        return out

    monkeypatch.setattr(client, "run_on_scheduler", lost_then_found)
    first = x.map_compact("x < 0.6")
    assert "direct" not in first.name  # fell back to the tasks
    second = x.map_compact("x < 0.6")
    assert len(asked) == 2 and "direct" in second.name, (asked, second.name)
    for got in (first, second):
        np.testing.assert_array_equal(got.compute(), a[a < 0.6])


def _unreachable_from_here(client, monkeypatch, victims: set) -> list:
    """The client's connects to ``victims`` fail as from behind an SSH tunnel or a gateway
    (the scheduler reachable, the workers' addresses not): each waits out the connect timeout
    (2 s here) and raises, while the scheduler still has the worker. Returns the addresses
    tried, one entry a connect."""
    import asyncio
    import weakref

    monkeypatch.setattr(direct, "_reach", weakref.WeakKeyDictionary())  # this test's own
    monkeypatch.setattr(direct, "CONNECT_TIMEOUT", 2.0)
    pool = client.rpc
    real = pool.connect
    tried: list = []

    async def connect(addr, timeout=None):
        if addr in victims:
            tried.append(addr)
            await asyncio.sleep(timeout)
            raise OSError(f"Timed out trying to connect to {addr} after {timeout} s")
        return await real(addr, timeout=timeout)

    monkeypatch.setattr(pool, "connect", connect)
    return tried


def test_a_worker_the_client_cannot_reach_costs_the_connect_timeout_once(client, monkeypatch):
    """A client that reaches only the scheduler waited the whole connect timeout (5 s) on
    every call, plain Dask 0.1 s (a probe, 2026-11-30): the scheduler said the worker was
    alive, and nothing remembered the failure. Now the first call pays it and falls back to
    the tasks; the next ones take the tasks at once, without a connect to that worker; after
    ``UNREACHABLE_RETRY`` it is asked again (direct, once reachable). Exact throughout."""
    a = np.random.default_rng(13).random(20_011)
    x = _layout(client, a, 1_000, "round-robin")
    victim = sorted(client.nthreads())[0]
    tried = _unreachable_from_here(client, monkeypatch, {victim})
    for t in (0.4, 0.5, 0.6):
        start = time.perf_counter()
        got = x.map_compact(f"x < {t}")
        took = time.perf_counter() - start
        assert "-direct-" not in got.name
        np.testing.assert_array_equal(got.compute(), a[a < t])
        if t == 0.4:
            assert took >= 1.9, took  # the first pays the timeout
        else:
            assert took < 1.5, f"the call took {took:.2f} s"
    assert tried == [victim]
    monkeypatch.setattr(client.rpc, "connect", type(client.rpc).connect.__get__(client.rpc))
    monkeypatch.setattr(direct, "UNREACHABLE_RETRY", 0.0)
    got = x.map_compact("x < 0.7")
    assert "-direct-" in got.name
    np.testing.assert_array_equal(got.compute(), a[a < 0.7])


def test_a_client_that_reached_no_worker_sends_every_call_to_the_tasks():
    """Where no direct connect of a client ever succeeded, a failure stands for every
    worker (a worker that joins later behind the same tunnel is no more reachable); where
    one did, only the address that failed is left to the tasks, for ``UNREACHABLE_RETRY``."""
    reach = direct._Reach()
    assert not reach.blocks({"tcp://a:1"}, 100.0)
    reach.failed["tcp://a:1"] = 100.0
    assert reach.blocks({"tcp://b:1"}, 101.0)
    reach.reached = True
    assert not reach.blocks({"tcp://b:1"}, 101.0)
    assert reach.blocks({"tcp://a:1", "tcp://b:1"}, 101.0)
    assert not reach.blocks({"tcp://a:1"}, 100.0 + direct.UNREACHABLE_RETRY)


def test_a_client_made_with_direct_to_workers_false_takes_the_tasks(client, monkeypatch):
    """``Client(direct_to_workers=False)`` (distributed's setting for a client that cannot
    connect to the workers) was ignored: the call connected to them anyway. Now it runs as
    tasks, without asking any worker; exact."""
    from distributed import Client

    asked = []
    real = direct._ask

    async def ask(c, requests):
        asked.append(sorted(requests))
        return await real(c, requests)

    monkeypatch.setattr(direct, "_ask", ask)
    a = np.random.default_rng(14).random(10_007)
    with Client(client.scheduler.address, direct_to_workers=False,
                set_as_default=False) as tunnelled:
        x = tunnelled.persist(da.from_array(a, chunks=1_000))
        wait(x)
        v, i = x.map_compact("x > 0.25", output="both")
        assert "-direct-" not in v.name and not asked
        got_v, got_i = tunnelled.compute([v, i], sync=True)
    m = a > 0.25
    np.testing.assert_array_equal(got_v, a[m])
    np.testing.assert_array_equal(got_i, np.flatnonzero(m))


def test_workers_without_dask_compact_keep_working_and_a_call_needing_one_names_it(tmp_path):
    """The workers' plugin was unpickled by reference to dask_compact: a worker without the
    package failed the registration (the calls ran as tasks; a probe saw that worker removed,
    its data lost) and, the scheduler keeping the plugin, a worker without it that joined
    later failed to start. Now both take it and keep their data; calls over input held
    elsewhere are direct and exact; one over input such a worker holds raises naming it and
    what to install (the tasks would stop that worker, see test_workers_installed.py)."""
    from cluster_helpers import worker_named, worker_process
    from conftest import local_process_cluster

    a = np.random.default_rng(15).random(8_009)
    with local_process_cluster(1) as c:
        good = next(iter(c.nthreads()))
        address = c.scheduler.address
        with worker_process(address, tmp_path, "bare-1", without_dask_compact=True):
            first = worker_named(c, "bare-1")
            data = c.scatter(np.arange(10), workers=[first])
            x = c.persist(da.from_array(a, chunks=1_000), workers=[good])
            wait(x)
            got = x.map_compact("x < 0.3")  # the plugin's first registration
            assert "-direct-" in got.name
            np.testing.assert_array_equal(got.compute(), a[a < 0.3])
            with worker_process(address, tmp_path, "bare-2", without_dask_compact=True):
                later = worker_named(c, "bare-2")  # joins with the plugin on the scheduler
                got = x.map_compact("x < 0.4")
                assert "-direct-" in got.name
                np.testing.assert_array_equal(got.compute(), a[a < 0.4])
                assert {first, later} <= set(c.nthreads())
                np.testing.assert_array_equal(data.result(timeout=10), np.arange(10))
                y = c.persist(da.from_array(a, chunks=999), workers=[later])  # not x's keys
                wait(y)
                with pytest.raises(direct.WorkerWithoutDaskCompact,
                                   match=f"worker {later} cannot import dask_compact .*"
                                         "install dask-compact.* on every worker"):
                    y.map_compact("x < 0.5")


def test_the_module_cluster_serves_only_the_tests_that_ask_for_it():
    """After the cluster tests in the file's order, no distributed client is the default
    and a computation runs in this process (conftest.client_as_default). Until 2026-12-01 the
    module's cluster stayed the default to the module's end (the tests that do not take it
    compute nothing, or on a cluster of their own made the default inside: none was seen
    to depend on it)."""
    from conftest import assert_no_client_is_the_default

    assert_no_client_is_the_default()
