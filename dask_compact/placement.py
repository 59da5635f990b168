"""Where a persisted input's chunks are held, and the phase-1 groups built over them.

On a distributed cluster, :func:`dask_compact.graph.build` gives each worker thread one
phase-1 task over the chunks its worker holds (:func:`group_tasks`), asked of the scheduler
once per persisted input (:func:`placement`). Where a task holds several runs of chunks, the
result's output chunks are pieces of its tuple, taken when the result is used; the
:func:`anchors` keep those pieces where their tuple is (see the function).
"""

from __future__ import annotations

import functools
import math
import uuid
import weakref
from collections import Counter
from typing import Any

from .cache import BoundedCache


def _held_where(keys: list, dask_scheduler: Any = None) -> tuple[list, dict, int, dict]:
    """On the scheduler: the first worker holding each key (None if none), every worker's
    thread count (``client.who_has`` and ``client.nthreads`` in one round trip), the
    number of dependency tasks under which it takes a large layer for root tasks, and every
    worker's memory limit in bytes (0: none)."""
    holders = []
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        held = ts is not None and ts.who_has
        ws = min((w.address for w in ts.who_has), default=None) if held else None
        holders.append(ws)
    workers = dask_scheduler.workers.values()
    nthreads = {w.address: w.nthreads for w in workers}
    limits = {w.address: int(w.memory_limit or 0) for w in workers}
    return (holders, nthreads, int(getattr(dask_scheduler, "rootish_tg_dependencies_threshold", 5)),
            limits)


# The placement of a persisted input already seen: (id(client), its keys) -> (a weak reference
# to its first chunk's future, the holders, the workers' threads, the root-ish threshold, the
# workers' memory limits). A
# later call on the same persisted array (the same future objects, all finished) skips the
# scheduler round trip (3 ms of a 12-18 ms call on the 2-core CI machine's LocalCluster).
# Re-persisting makes new futures, so a new placement; a placement gone stale since (a worker
# lost or retired and its chunks recomputed or moved elsewhere) costs transfers into the
# group's task, never a wrong result: the task reads its chunks wherever they are. The direct
# path, which asks the holders themselves, drops it (:func:`forget`) when a holder fails it.
# An entry goes when its first chunk's future does (:func:`_drop_placement`).
_placements: BoundedCache[tuple, tuple] = BoundedCache("input placements")


def _drop_placement(cache_key: tuple, ref: weakref.ref) -> None:
    """The weak reference ``ref`` of ``cache_key``'s entry died with its future: the entry
    can never be hit again (re-persisting makes new futures) and it held a key and a holder
    per chunk. Until 2026-11-30 such entries stayed until 64 newer inputs evicted them (a
    probe: ~100 B per chunk, 7.7 MB after 8 inputs of 10,000 chunks were freed). Only the
    entry that ``ref`` belongs to: the same keys persisted again have an entry of their own."""
    _placements.pop_if(cache_key, lambda entry: entry[0] is ref)


def placement(client: Any, keys: list, blocks: list) -> tuple[list, dict, int, dict]:
    """(holders, threads per worker, root-ish threshold, memory limit per worker) of the
    persisted ``blocks`` (futures of ``keys``): asked of the scheduler once they are
    computed, or from the cache."""
    import distributed

    cache_key = (id(client), tuple(keys))
    hit = _placements.get(cache_key)
    if (hit is not None and hit[0]() is blocks[0]
            and all(b.status == "finished" for b in blocks)):
        return hit[1], hit[2], hit[3], hit[4]
    distributed.wait(blocks)  # where a chunk lives is known once it is computed
    holders, nthreads, rootish, limits = client.run_on_scheduler(_held_where, keys)  # one trip
    if all(h is not None for h in holders):
        # Not one with a chunk held nowhere: after a worker's loss the futures can read
        # "finished" before the client hears the chunks were lost, and a placement cached
        # then kept every later call off the direct path for good (CI, 2026-11-30)
        first = weakref.ref(blocks[0], functools.partial(_drop_placement, cache_key))
        _placements.put(cache_key, (first, holders, nthreads, rootish, limits))
    warn_if_uneven(holders, nthreads)  # once per persisted input: later calls hit the cache
    return holders, nthreads, rootish, limits


def forget(client: Any, keys: list) -> None:
    """Drop the cached placement of the input ``keys`` (:func:`placement`): the next call
    asks the scheduler again. Called where the placement proved stale (a worker it names
    did not answer, or no longer held a chunk): kept, it sent every later direct call to a
    worker that was gone (2026-11-30, a probe: each call then waited out the connect
    timeout, 30 s, before falling back to tasks)."""
    _placements.pop((id(client), tuple(keys)))


def warn_if_uneven(holders: list, nthreads: dict) -> None:
    """A PerformanceWarning where one worker holds at least twice its share of the chunks
    (its share: the chunks times its threads over the cluster's; only for inputs of at least
    two chunks per worker). Each chunk is compacted where it is held, so such a call runs at
    that worker's pace: 4x H200, 64 chunks of 2^28 float32 generated as a new cluster's
    first work landed 56/3/3/2, and the call took 45.3 ms against 15.8 ms for the same
    data spread evenly (moving the chunks would cost more than compacting them there).

    >>> warn_if_uneven(["a", "a", "b", "b"], {"a": 1, "b": 1})  # even: nothing
    """
    total = sum(nthreads.values())
    held = [h for h in holders if h is not None]
    if len(nthreads) < 2 or not total or len(held) < 2 * len(nthreads):
        return
    counts = Counter(held)
    worker, most = max(counts.items(), key=lambda kv: kv[1] / nthreads.get(kv[0], 1))
    share = len(held) * nthreads.get(worker, 1) / total
    if most < 2 * share:
        return
    import warnings

    from dask.array.core import PerformanceWarning

    warnings.warn(
        f"dask_compact: {most} of the input's {len(held)} chunks are held by one of "
        f"{len(nthreads)} workers ({worker}), where an even spread would give it {share:.0f}; "
        "each chunk is compacted on the worker that holds it, so the call runs at that "
        "worker's pace. client.has_what() shows where a persisted array's chunks are (data "
        "persisted as a new cluster's first work can land on the worker that started first).",
        PerformanceWarning, stacklevel=2)


def group_budget(limit: int, nthreads: int) -> int | None:
    """The most input bytes one phase-1 group (a task, or a job of the direct path) of a
    worker with memory limit ``limit`` (0: none, then None) and ``nthreads`` threads reads at
    once.

    The fraction: a worker spills held data to keep its process memory under
    ``distributed.worker.memory.spill`` (0.7) of its limit and is restarted at ``terminate``
    (0.95), so what its running tasks add on top must fit in between (a quarter of the
    limit), shared by its threads; a quarter of that for a group's input (its output can be
    as large, ``output="values"`` all selected, and temporaries and the held data's overshoot
    between spills take the rest). Measured on the 2-core
    machine, 2 workers of 400 MiB (some 210 MiB of it the interpreter and libraries, numba's
    LLVM among them), a persisted 1 GiB input of 32 MiB chunks: groups of 3 chunks (a budget
    of the target memory over 2) were still killed with 95% of the items selected; one chunk
    a group (a budget of half the room, 50 MiB) was not; and with 600 MiB workers, groups of
    two chunks (75 MiB) restarted a worker in one CI run of 2026-11-30: now a quarter.

    Why a bound: a group reads all its chunks at once, so a worker's chunks in one group
    unspilled every chunk of an input larger than its memory (the worker was killed), and the
    scheduler refuses outright a task whose inputs exceed the worker's memory limit
    (MemoryError); Dask's own tasks, one per chunk, stay below both (a probe).
    """
    if not limit:
        return None
    import dask

    def fraction(name: str, default: float) -> float:
        return float(dask.config.get(f"distributed.worker.memory.{name}", default) or default)

    room = max(0.05, fraction("terminate", 0.95) - fraction("spill", 0.7))
    # a quarter of it, not half: in CI (2 workers of 600 MiB, 1.5 GiB, 80% selected) groups
    # of two 32 MiB chunks (half: 75 MiB) restarted a worker; a task's temporaries and the
    # held data's overshoot between spills need room too
    return int(limit * room / max(1, nthreads) / 4)


def group_tasks(holders: list, nthreads: dict, nbytes: list | None = None,
                limits: dict | None = None) -> list[list[list[int]]]:
    """Chunk positions grouped for phase 1: one group (task) per worker thread, each a list
    of runs (consecutive chunks, one output chunk each).

    A worker's chunks, in order, are cut into at most ``nthreads[worker]`` groups of equal
    length (so a CPU worker still compacts in parallel, and a dask-cuda worker, one thread
    per GPU, gets one task); a group's chunks are cut into runs where they stop being
    consecutive. A chunk of unknown holder (None) is a group and a run of its own. Groups are
    ordered by their first chunk.

    Given each chunk's bytes (``nbytes``) and the workers' memory limits (``limits``), a
    group over its worker's :func:`group_budget` is cut, in order, into groups within it (a
    chunk larger than the budget alone): an input larger than the workers' memory is then
    read a few chunks a task, as Dask's own tasks read it, not all at once. Within the
    budget (the common case) the groups are the ones above.

    >>> group_tasks(["a", "a", "a", "a", "b", "b", "a"], {"a": 2, "b": 1})
    [[[0, 1, 2]], [[3], [6]], [[4, 5]]]
    >>> group_tasks(["a", "b", "a", "b", "a", "b"], {"a": 1, "b": 1})
    [[[0], [2], [4]], [[1], [3], [5]]]
    >>> group_tasks(["a"] * 4, {"a": 1}, [30] * 4, {"a": 1000})  # budget 62: 2 + 2 chunks
    [[[0, 1]], [[2, 3]]]
    """
    held: dict[Any, list[int]] = {}
    for i, h in enumerate(holders):
        held.setdefault(h, []).append(i)
    groups: list[list[list[int]]] = []
    for h, chunks in held.items():
        if h is None:
            groups.extend([[i]] for i in chunks)
            continue
        threads = max(1, nthreads.get(h, 1))
        cap = math.ceil(len(chunks) / threads)
        budget = group_budget(limits.get(h, 0), threads) if nbytes and limits else None
        for j in range(0, len(chunks), cap):
            for part in _within(chunks[j:j + cap], nbytes, budget):
                groups.append(_runs(part))
    return sorted(groups, key=lambda g: g[0][0])


def _within(chunks: list[int], nbytes: list | None, budget: int | None) -> list[list[int]]:
    """``chunks`` cut, in order, into parts of at most ``budget`` bytes each (a chunk over
    it alone); one part where there is no budget or all of them fit."""
    if budget is None or nbytes is None or sum(nbytes[i] for i in chunks) <= budget:
        return [chunks]
    parts: list[list[int]] = [[]]
    size = 0
    for i in chunks:
        if parts[-1] and size + nbytes[i] > budget:
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += nbytes[i]
    return parts


def over_budget(holders: list, nthreads: dict, nbytes: list | None, limits: dict) -> bool:
    """Whether a worker holds more of an input (``nbytes`` per chunk) than all its threads'
    :func:`group_budget` together: the direct path, which holds a call's every input and
    output on a worker at once, declines such a call.

    >>> over_budget(["a", "a"], {"a": 1}, [60, 70], {"a": 1000})  # 130 > 62
    True
    >>> over_budget(["a", "a"], {"a": 1}, [60, 70], {"a": 0})  # no limit
    False
    """
    if nbytes is None:
        return False
    held: Counter = Counter()
    for h, n in zip(holders, nbytes):
        held[h] += n
    for h, n in held.items():
        threads = max(1, nthreads.get(h, 1))
        budget = group_budget(limits.get(h, 0), threads)
        if budget is not None and n > budget * threads:
            return True
    return False


def _runs(chunks: list[int]) -> list[list[int]]:
    """``chunks`` (in order) cut where they stop being consecutive."""
    runs: list[list[int]] = []
    for i in chunks:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _anchor(i: int) -> int:
    return i


def _take(pieces: tuple, k: int, anchor: Any) -> Any:
    """Piece ``k`` of a group task's tuple; ``anchor`` is only a dependency (see anchors)."""
    return pieces[k]


# id(client) -> {worker address: [weak references to the anchor futures held there]}, all of
# one anchor group. Weak: the results that use them hold them (their graphs), and the anchors
# go when the last of those goes; a call while one lives reuses them (no tasks, no round trip
# on its path). Held strongly, they stayed on the scheduler for the client's whole life
# (2026-11-30, a probe).
_anchor_sets: BoundedCache[int, dict] = BoundedCache("placement anchors")


def _unpin(keys: list, dask_scheduler: Any = None) -> None:
    """On the scheduler: the anchors ``keys`` lose their worker restrictions once held.

    The restriction places an anchor once; a lost anchor is remade anywhere, which
    ``allow_other_workers`` meant, but distributed (2026.7) does not do where every worker
    was lost at once: the anchor waits in ``no-worker`` for its gone worker, and no new
    worker takes it (``bulk_schedule_unrunnable_after_adding_worker`` checks the
    restriction, not its looseness), so a grouped result whose workers all died never
    computed again (2026-11-30, a probe)."""
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        if ts is not None:
            ts.worker_restrictions = None
            ts.host_restrictions = None
            ts.loose_restrictions = False


def anchors(client: Any, workers: list, count: int) -> dict:
    """Tiny finished futures, at least ``count`` of them and at least one held by each of
    ``workers``: ``{worker: [anchors there]}``, made once and reused by later calls while a
    result that uses them lives (:data:`_anchor_sets`). Each output piece of a grouped phase 1
    depends, besides its group's tuple, on an anchor held where that tuple is.

    Why: the scheduler takes a task group larger than twice the cluster's threads whose
    dependencies number fewer than ``distributed.scheduler.rootish-taskgroup-dependencies``
    tasks (5) for root tasks, and places those for balance, not where their data is. The
    pieces of 2 group tasks (2 GPUs) are such a group, and so is whatever they are fused into
    when the result is used: they ran on any worker and moved whole groups (4x H200, TCP, a
    rebalanced result: 3.7 / 8.9 s at 2 / 4 GPUs against 0.20 / 1.10 s). With ``count`` =
    that threshold more dependency tasks they are placed by their data, and with both
    dependencies on one worker that worker is the only candidate, as with the tuple alone.
    Before, phase 1 was padded to that many tasks, which cost a task's time per extra task on
    a worker (2 GPUs, 2^32 each: 32.0 ms a call with 5 tasks against 20.6 ms with 2). An
    anchor replicated on every worker was tried: every worker was then a candidate, the
    pieces moved to where the rechunk ran, and a rebalanced result fell 9-43% further behind
    its peer run beside it (4x H200).

    The anchors are ordinary tasks, restricted to their worker only until they are held
    (:func:`_unpin`): what places the pieces is where an anchor is held, not its
    restriction. A lost one is recomputed anywhere, as a plain task, and a piece whose tuple
    and anchor are then apart moves the anchor's few bytes.
    """
    from distributed import wait

    hit = _anchor_sets.get(id(client))
    if (hit is not None and all(w in hit for w in workers)
            and sum(len(v) for v in hit.values()) >= count):
        held = {w: [r() for r in refs] for w, refs in hit.items()}
        every = [f for v in held.values() for f in v]
        if all(f is not None and f.client is client and f.status == "finished"
               for f in every):
            return held
    order = sorted(set(workers))
    if not order:  # a group of several runs always has a known holder
        raise ValueError("anchors need the address of at least one worker")
    name = f"dask-compact-anchor-{uuid.uuid4().hex}"
    where = [order[i % len(order)] for i in range(max(count, len(order)))]
    futures = [client.submit(_anchor, i, key=(name, i), pure=False, workers=[w],
                             allow_other_workers=True) for i, w in enumerate(where)]
    wait(futures)
    client.run_on_scheduler(_unpin, [f.key for f in futures])
    made: dict = {}
    for w, f in zip(where, futures):
        made.setdefault(w, []).append(f)
    _anchor_sets.put(id(client), {w: [weakref.ref(f) for f in fs] for w, fs in made.items()})
    return made
