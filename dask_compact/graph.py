"""The three phases of compaction at cluster scale, as Dask graphs.

Phase 1 (count): one task per input chunk compacts it where it lives (:mod:`dask_compact.chunk`);
its result is the output chunk itself (one output, known input chunk sizes) or
``(values, indices, n_in)``. Each chunk's count is then the length of the persisted output
chunk, from the size its worker reported to the scheduler (one question to the scheduler, no
task per chunk), or a tiny count task per chunk where the input length is needed too (input of
unknown chunk sizes) or the size cannot be read. Phase 2 (scan): an exclusive scan of the
counts gives every chunk's global output offset (the output's chunk boundaries) and, for input
of unknown chunk sizes, every chunk's global input offset. Phase 3 (scatter): chunk
boundaries of the result, global indices, and on request rebalancing into uniform output
chunks.

Over an input persisted on a distributed cluster, phase 1 is first asked of the workers that
hold it, with no task (:mod:`dask_compact.direct`); these graphs are its fallback.

Eager mode (the default) persists the phase-1 outputs where they were computed and brings back
only the counts, so the result has known chunk sizes and nothing is ever recomputed from the
source graph. Lazy mode keeps phase 2 inside the graph (one small task over all counts).
"""

from __future__ import annotations

import itertools
import math
import operator
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

from . import call_client, client_stream, direct, workers_installed
from .chunk import (
    compact_block,
    compact_block_masked,
    compact_blocks,
    compact_group,
    run_counts,
)
from .imported import distributed_if_imported
from .placement import _take, anchors, group_tasks, placement
from .remade import expect
from .task_report import reported
from .validate import block_shapes


@dataclass(frozen=True)
class Plan:
    """What one map_compact call builds; shared by the eager and the lazy mode."""

    x: da.Array  # 1-D input (the raveled original)
    mask: da.Array | None  # 1-D boolean mask aligned with x, or None
    pred: Any  # Predicate, or None when mask is given
    output: str
    stable: bool
    algorithm: str
    token: str
    by_worker: bool = True  # one phase-1 task per worker thread over the chunks it holds
    # N-D input whose trailing axes are whole chunks: x is its ravel, and chunk i of x is its
    # block (i, 0, ..., 0) flattened, so tasks over several chunks read those blocks directly
    # (persisted, they are held somewhere; x's raveled chunks would be new tasks)
    source: da.Array | None = None

    @property
    def held(self) -> da.Array:
        """The array whose blocks phase-1 tasks over several chunks read."""
        return self.source if self.source is not None else self.x

    def block_keys(self) -> list:
        """The key of chunk i's block in :attr:`held`, for every i."""
        if self.source is None:
            return [(self.x.name, i) for i in range(self.nblocks)]
        tail = (0,) * (self.source.ndim - 1)
        return [(self.source.name, i, *tail) for i in range(self.nblocks)]

    def block_shapes(self) -> list[tuple[int, ...] | None]:
        """The shape chunk i's block in :attr:`held` declares, for every i (None where a size
        is unknown): what each phase-1 task checks its chunk against
        (:func:`.validate.as_declared`), since the global indices and offsets are made of
        the declared sizes."""
        return block_shapes((self.source if self.source is not None else self.x).chunks)

    @property
    def path(self) -> str:
        return "masked" if self.mask is not None else self.pred.path

    @property
    def known_input(self) -> bool:
        return not any(np.isnan(c) for c in self.x.chunks[0])

    @property
    def nblocks(self) -> int:
        return self.x.numblocks[0]

    @property
    def starts(self) -> np.ndarray:
        """The global input start of every chunk (known input only)."""
        return np.concatenate([[0], np.cumsum(self.x.chunks[0])[:-1]]).astype(np.int64)

    @property
    def host_nbytes(self) -> list[int] | None:
        """The bytes of every input chunk (known input), where its chunks are host (NumPy)
        arrays, else None: what bounds a phase-1 group by the worker's memory limit
        (:func:`.placement.group_tasks`), a limit of host memory. Device chunks are bounded by
        their GPU's memory (and dask-cuda's spilling), and keep their groups whatever their
        size."""
        if not self.known_input or not isinstance(self.x._meta, np.ndarray):
            return None
        return [int(c) * self.x.dtype.itemsize for c in self.x.chunks[0]]

    @property
    def direct(self) -> bool:
        """Phase 1 yields the output chunk itself (one output, input chunk starts known)."""
        return self.output != "both" and self.known_input

    def name(self, what: str) -> str:
        return f"compact-{what}-{self.token}"


def _phase1_layer(plan: Plan, runs: list[list[int]] | None) -> tuple[HighLevelGraph, str, int]:
    """Phase 1 tasks: one per input chunk, or one per run of chunks (``runs``); also returns
    the task count, which is the output's block count.

    With one output and known input chunks (the common case) the task's result IS the output
    chunk, so no task per chunk is spent taking it out of a tuple; otherwise the result is
    ``(values | None, indices | None, n_in)``.
    """
    direct = plan.direct
    name = plan.name(f"{plan.output}-{plan.path}" if direct else plan.path)
    starts = None
    if plan.known_input:
        starts = plan.starts
    layer: dict[Any, Any] = {}
    # the shape of x's chunk i (x is the 1-D input or its ravel), which the task checks
    shapes = block_shapes(plan.x.chunks)
    if runs is not None:
        assert starts is not None and plan.mask is None
        keys, shapes = plan.block_keys(), plan.block_shapes()  # of the held blocks
        for j, run in enumerate(runs):
            layer[(name, j)] = (
                compact_blocks, [keys[i] for i in run], plan.pred, plan.output,
                plan.stable, plan.algorithm, [int(starts[i]) for i in run], direct,
                plan.x.dtype, run[0], [shapes[i] for i in run],
            )
        deps: list[Any] = [plan.held]  # dask's typing does not count its Array as a DaskCollection
        return HighLevelGraph.from_collections(name, layer, dependencies=deps), name, len(runs)
    mask_shapes = block_shapes(plan.mask.chunks) if plan.mask is not None else shapes
    for i in range(plan.nblocks):
        # Known input: indices come out global from the chunk task (no later pass over them).
        base = int(starts[i]) if starts is not None else 0
        shape = shapes[i]
        if plan.mask is not None:
            layer[(name, i)] = (
                compact_block_masked, (plan.x.name, i), (plan.mask.name, i), plan.output, base,
                direct, plan.x.dtype, i, shape, mask_shapes[i],
            )
        else:
            layer[(name, i)] = (
                compact_block, (plan.x.name, i), plan.pred, plan.output, plan.stable,
                plan.algorithm, base, direct, plan.x.dtype, i, shape,
            )
    deps = [plan.x] if plan.mask is None else [plan.x, plan.mask]
    return HighLevelGraph.from_collections(name, layer, dependencies=deps), name, plan.nblocks


def _groups_by_worker(plan: Plan, blocks: list | None
                      ) -> tuple[list[list[list[int]]], list, int] | None:
    """Phase-1 tasks over the chunks each worker holds: groups (one task each) of runs
    (consecutive chunks, one output chunk each), see :func:`.placement.group_tasks`, the
    worker holding each group's chunks (None: unknown), and the scheduler's root-ish
    dependency threshold (how many :func:`.placement.anchors` a grouped result needs).

    Only for a persisted input on a distributed cluster (its chunks are futures, so where each
    lives is known). Why: Dask costs about a millisecond per task, while a GPU compacts a 1 GiB
    chunk in under one, so per-chunk tasks would make the scheduler, not the GPUs, the limit;
    and Dask's own placement of a generated or loaded array scatters a worker's chunks, so
    grouping only consecutive chunks left about one task per chunk there. None where this
    does not apply or gains nothing.
    """
    if blocks is None or not plan.by_worker or not plan.known_input or plan.nblocks < 2:
        return None
    keys = plan.block_keys()
    holders, nthreads, rootish, limits = placement(blocks[0].client, keys, blocks)
    groups = group_tasks(holders, nthreads, plan.host_nbytes, limits)
    if len(groups) == len(keys):
        return None
    return groups, [holders[g[0][0]] for g in groups], rootish


def input_form(x: da.Array) -> str:
    """``"held"`` where every block of ``x`` is a distributed Future (persisted on a
    cluster), else ``"graph"``: part of every output name's token. The two build different
    tasks under the same output keys (a task over the futures; a task that dask's persist
    fuses with the input's and leaves an alias under our key), and distributed warns of such
    keys ("different run_spec ... can cause failures and deadlocks") when one form follows
    the other while the first result lives."""
    return "graph" if _futures(x, list(flatten(x.__dask_keys__()))) is None else "held"


def computed_call(lazy: bool, *forms: str) -> str:
    """A new name for each eager call whose input is computed from a graph (any of ``forms``,
    the inputs' :func:`input_form`, is ``"graph"``), else ``""``: part of every eager
    builder's output token.

    An eager result is persisted under its keys, and the cluster gives back what it holds
    under a key asked for again: a later call on an input of the same name but other data
    (a Zarr store rewritten in place, which ``da.from_zarr`` names by its path) built the
    same keys and got the old selection while the first result lived (found by a probe; plain
    Dask's ``compute()`` recomputes). Held input (futures) cannot change under its keys, and a
    lazy call is a graph whose keys Dask's own rules name."""
    if lazy or all(form == "held" for form in forms):
        return ""
    return uuid.uuid4().hex


def _futures(x: da.Array, keys: list) -> list | None:
    """The futures of ``x``'s blocks ``keys``, None unless every block is one."""
    distributed = distributed_if_imported()
    if distributed is None:
        return None
    blocks = [x.dask.get(k) for k in keys]
    if not blocks or not all(isinstance(b, distributed.Future) for b in blocks):
        return None
    return blocks


def _held_futures(plan: Plan) -> list | None:
    """The futures of the held input's blocks (``plan.block_keys()``), None unless every block
    is one (an input persisted on a distributed cluster)."""
    if plan.mask is not None or distributed_if_imported() is None:  # no keys listed then
        return None
    return _futures(plan.held, plan.block_keys())


def _submitted(client: Any, func: Callable[..., Any], calls: list[tuple], keys: list,
               name: str, meta: Any) -> da.Array:
    """``func(*call)`` for every call, submitted by ``client`` under ``keys`` as futures in one
    message (``client.map``; a call's arguments hold the input blocks' futures), as a 1-D
    array of unknown chunk sizes named ``name``.

    What a persist of the same layer costs more: dask.array's graph of a persisted input and
    one layer over it, made into an expression, optimized, sent and materialized by the
    scheduler. Measured on one H100 host (``benchmarks/call_timeline.py``, one worker, 4
    trivial tasks over 4 persisted chunks): 19.7-21.2 ms persisted and waited against
    10.6-12.5 ms by ``client.map`` (12.1-13.0 against 8.8-9.3 with ``low_latency``)."""
    futures = client.map(func, *zip(*calls), key=keys, pure=False)
    client_stream.send_now(futures)
    client_stream.made(futures)
    return da.Array(dict(zip(keys, futures)), name, chunks=((np.nan,) * len(keys),), meta=meta)


def _phase1_submitted(plan: Plan, runs: list[list[int]] | None, blocks: list | None
                      ) -> da.Array | None:
    """Phase 1 of a direct plan (one output, known input) over a persisted input, submitted as
    futures (:func:`_submitted`): the output chunks, the keys and tasks of
    :func:`_phase1_layer`'s; ``blocks`` are the input's futures (:func:`_held_futures`). None
    where the input is not persisted on a distributed cluster."""
    if blocks is None or not plan.direct:
        return None
    name = plan.name(f"{plan.output}-{plan.path}")
    starts, shapes = plan.starts, plan.block_shapes()
    common = (plan.pred, plan.output, plan.stable, plan.algorithm)
    calls: list[tuple]
    if runs is None:
        if plan.source is not None:  # N-D blocks: the raveled chunks are the tasks' input
            return None
        calls = [(blocks[i], *common, int(starts[i]), True, plan.x.dtype, i, shapes[i])
                 for i in range(plan.nblocks)]
        func: Callable[..., Any] = compact_block
    else:
        calls = [([blocks[i] for i in run], *common, [int(starts[i]) for i in run], True,
                  plan.x.dtype, run[0], [shapes[i] for i in run]) for run in runs]
        func = compact_blocks
    dtype = plan.x.dtype if plan.output == "values" else np.dtype(np.int64)
    return _submitted(blocks[0].client, func, calls, [(name, j) for j in range(len(calls))],
                      name, _meta(plan.x, dtype))


def _meta(x: da.Array, dtype: np.dtype, tail: tuple = ()) -> Any:
    """An empty array of x's chunk type (NumPy, CuPy, ...) and ``dtype``: 1-D, or with the
    trailing shape ``tail`` (a record's field)."""
    return np.empty_like(x._meta, shape=(0, *tail), dtype=dtype)


def _count(part: Any) -> np.ndarray:
    """(n_out, n_in) of one chunk; n_in is only carried where the input sizes were unknown."""
    if isinstance(part, tuple):
        values, indices, n_in = part
        out = values if values is not None else indices
    else:
        out, n_in = part, 0
    return np.array([[len(out), n_in]], dtype=np.int64)


def _rows(block: Any) -> int:
    """A chunk's rows along axis 0 (a 1-D chunk's size): the task over each chunk of input
    of unknown chunk sizes (the sort's lengths)."""
    return int(block.shape[0])


def _starts(sizes: Any) -> np.ndarray:
    """Each chunk's global start, from the sizes of the chunks (a task's where they are
    unknown at graph time: over each chunk's rows)."""
    return np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]]).astype(np.int64)


def shifted(parts: da.Array, starts: np.ndarray, name: str) -> da.Array:
    """The persisted 1-D ``parts`` (indices counted from 0 in each input chunk), chunk ``c``
    plus ``starts[c]``, persisted as array ``name``: the indices of input of unknown chunk
    sizes, whose tasks counted locally so that no input chunk waited for the others' sizes
    (the argsort's local sorts, partition's splits)."""
    layer = {(name, c): (operator.add, (parts.name, c), np.int64(starts[c]))
             for c in range(parts.numblocks[0])}  # fmt: skip
    (out,) = client_stream.persist(da.Array(_extend(parts.dask, name, layer, {parts.name}),
                                            name, chunks=parts.chunks, meta=parts._meta))
    return out


def _exclusive_scan(counts: np.ndarray) -> np.ndarray:
    """Phase 2: global offsets (rows: chunks; columns: output, input) of every chunk."""
    return np.concatenate([np.zeros((1, 2), np.int64), np.cumsum(counts, axis=0)[:-1]])


def _offsets_of(*counts: np.ndarray) -> np.ndarray:
    return _exclusive_scan(np.concatenate(counts) if counts else np.zeros((0, 2), np.int64))


def _add_offset(indices: Any, offsets: np.ndarray, i: int) -> Any:
    return indices + offsets[i, 1]


def _extend(graph: HighLevelGraph, name: str, layer: Mapping, on: set[str]) -> HighLevelGraph:
    """``graph`` plus one layer ``name`` that depends on the layers ``on``."""
    layers: dict[str, Any] = dict(graph.layers)
    layers[name] = layer
    deps = dict(graph.dependencies)
    deps[name] = set(on)
    return HighLevelGraph(layers, deps)


def _collections(
    plan: Plan, graph: HighLevelGraph, p1: str, n: int, lazy: bool
) -> dict[str, da.Array]:
    """The arrays of one plan (``n`` phase-1 tasks): 'values'/'indices' (nan chunks), 'counts'."""
    out: dict[str, da.Array] = {}

    cname = plan.name("count")
    cgraph = _extend(graph, cname, {(cname, i, 0): (_count, (p1, i)) for i in range(n)}, {p1})
    counts = da.Array(cgraph, cname, chunks=((1,) * n, (2,)), dtype=np.int64)

    wants = ("values", "indices") if plan.output == "both" else (plan.output,)
    for slot, what in ((0, "values"), (1, "indices")):
        if what not in wants:
            continue
        dtype = plan.x.dtype if what == "values" else np.dtype(np.int64)
        if plan.direct:
            name, g = p1, graph
        else:
            name = plan.name(f"{what}-{plan.path}")
            layer = {(name, i): (operator.getitem, (p1, i), slot) for i in range(n)}
            g = _extend(graph, name, layer, {p1})
        arr = da.Array(g, name, chunks=((np.nan,) * n,), meta=_meta(plan.x, dtype))
        if what == "indices" and not plan.known_input and lazy:
            arr = _lazy_global_indices(plan, arr, counts)
        out[what] = arr
    out["counts"] = counts
    return out


def _lazy_global_indices(plan: Plan, local: da.Array, counts: da.Array) -> da.Array:
    """Lazy phases 2 and 3 for input of unknown chunk sizes: the offsets are one graph task
    over all counts, and each chunk's indices are shifted by its chunk's input offset."""
    n = plan.nblocks
    graph = HighLevelGraph.merge(local.dask, counts.dask)
    oname = plan.name("offsets")
    offsets = {oname: (_offsets_of, *[(counts.name, i, 0) for i in range(n)])}
    graph = _extend(graph, oname, offsets, {counts.name})
    name = plan.name("indices-global")
    layer = {(name, i): (_add_offset, (local.name, i), oname, i) for i in range(n)}
    graph = _extend(graph, name, layer, {local.name, oname})
    return da.Array(graph, name, chunks=local.chunks, meta=local._meta)


def without_empty_chunks(arr: Any) -> Any:
    """``arr`` with no empty chunk along axis 0 (the compacted one) unless the whole result
    is empty, then one chunk of length 0; and every other axis of length 1 in one chunk. Its
    blocks are aliases of ``arr``'s non-empty ones, under a name that keeps ``arr``'s (which
    says the path that ran): no task, no copy, and only such results change.

    A compaction leaves empty chunks where a chunk selected nothing: chunks ``(5, 0, 1)``.
    Dask (2026.7.1) mishandles such arrays in ordinary next steps (a probe, 2026-11-30):
    ``y[::-1]`` computed ``[]``, ``y.std()`` nan, ``y[[0, 3]]`` and ``y.argmax()`` raised,
    and ``dd.concat`` of two such arrays' DataFrames dropped a row. An axis of length 1 in
    chunks ``(0, 1, 0)`` is taken as broadcastable: ``y + 1`` computed three elements, and
    ``x[i]`` on such indices lost a dependency. Plain Dask's ``x[x > t]`` after
    ``compute_chunk_sizes()`` does the same; an eager result is meant to be usable at once.

    Unknown chunk sizes along axis 0 (a lazy result) are left as they are. Outputs that belong
    together (values and indices, a record's fields) have the same chunks along axis 0 going
    in, so they have the same coming out."""
    if not isinstance(arr, da.Array) or arr.ndim == 0:
        return arr
    pick = [_kept_blocks(ax, c) for ax, c in enumerate(arr.chunks)]
    if all(len(p) == len(c) for p, c in zip(pick, arr.chunks)):
        return arr
    name = f"{arr.name}-{KEPT_SUFFIX}"
    layer: dict[Any, Any] = {
        (name, *idx): (arr.name, *[p[i] for p, i in zip(pick, idx)])
        for idx in itertools.product(*(range(len(p)) for p in pick))
    }
    chunks = tuple(tuple(c[i] for i in p) for p, c in zip(pick, arr.chunks))
    deps: list[Any] = [arr]  # dask's typing does not count Array
    return da.Array(HighLevelGraph.from_collections(name, layer, dependencies=deps), name,
                    chunks=chunks, meta=arr._meta)


# the suffix of a result's name whose blocks alias the non-empty ones of the array it names
KEPT_SUFFIX = "skipempty"


def _kept_blocks(axis: int, chunks: tuple) -> list[int]:
    """The blocks of ``chunks`` (along ``axis``) that :func:`without_empty_chunks` keeps:
    along axis 0 the non-empty ones (the first, if all are empty); along another axis of
    length 1 its one non-empty block; else all. Unknown sizes keep all."""
    every = list(range(len(chunks)))
    if any(math.isnan(c) for c in chunks):
        return every
    if axis == 0:
        return [i for i, c in enumerate(chunks) if c] or [0]
    if sum(chunks) == 1:
        return [chunks.index(1)]
    return every


def _with_chunks(arr: da.Array, chunks: tuple[int, ...]) -> da.Array:
    """The same persisted blocks, with the chunk sizes that phase 2 found."""
    return da.Array(arr.dask, arr.name, chunks=(chunks,), meta=arr._meta)


def _shift(arr: da.Array, starts: np.ndarray, name: str) -> da.Array:
    """Phase 3 for indices of input whose chunk starts were unknown until phase 2."""
    layer = {(name, i): (operator.add, (arr.name, i), np.int64(s)) for i, s in enumerate(starts)}
    graph = _extend(arr.dask, name, layer, {arr.name})
    return da.Array(graph, name, chunks=arr.chunks, meta=arr._meta)


def _fetch_counts(counts: da.Array) -> np.ndarray:
    """The persisted (n_out, n_in) rows, fetched with as little as possible in between.

    On a distributed cluster the persisted blocks are futures: gather them directly (16 bytes
    each) instead of submitting a graph that concatenates them on a worker first.
    """
    rows = client_stream.gather(counts)
    if rows is None:  # an in-process scheduler: the blocks are the rows themselves
        rows = [counts.compute()]
    if not rows:
        return np.zeros((0, 2), np.int64)
    return np.concatenate([np.asarray(r, dtype=np.int64).reshape(-1, 2) for r in rows])


def _held_nbytes(keys: list, itemsize: int = 0, dask_scheduler: Any = None) -> list:
    """On the scheduler: the size in bytes its workers reported for each of ``keys`` when the
    task ended (``sizeof`` of the result: a NumPy or CuPy array's ``nbytes``), None for a key
    not in memory or of unknown size. Where every size is a whole number of ``itemsize``
    items, those are the lengths the client takes: each key's run spec then checks that a
    piece remade after a loss has its length (:func:`.remade.expect`)."""
    out = []
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        ok = ts is not None and ts.state == "memory" and ts.nbytes >= 0
        out.append(ts.nbytes if ok else None)
    lengths = [b // itemsize for b in out if b is not None and itemsize and b % itemsize == 0]
    if len(lengths) == len(keys):
        expect(dict(zip(keys, lengths)), dask_scheduler=dask_scheduler)
    return out


def _held_counts(arr: da.Array) -> np.ndarray | None:
    """(n_out, 0) rows of a persisted 1-D array, read without running a task per chunk.

    In-process schedulers hand back the chunks themselves; on a distributed cluster the
    scheduler is asked once for the sizes the workers reported as each chunk's task ended
    (``sizeof``: ``nbytes`` for the NumPy and CuPy chunks phase 1 makes; 1.7-4.1 ms on the
    2-core machine's LocalCluster, where asking every worker with ``client.run`` took 4.7-5.8
    ms, and a chunk spilled to disk is not read back). None when some chunk's size is not
    known that way (e.g. its worker died meanwhile) or is not a whole number of items: the
    caller counts with tasks.
    """
    keys = list(flatten(arr.__dask_keys__()))
    blocks = [arr.dask[k] for k in keys]
    if all(hasattr(b, "shape") for b in blocks):
        lengths = [int(b.shape[0]) for b in blocks]
    else:
        client = getattr(blocks[0], "client", None)
        if client is None or not hasattr(client, "run_on_scheduler") or not arr.dtype.itemsize:
            # rows of no bytes (a record's field of a structured dtype without fields): its
            # sizes say nothing of its lengths (until 2026-12-01, ZeroDivisionError below;
            # a record probe). The caller counts with tasks.
            return None
        from distributed import wait

        wait(blocks)  # raises here if a chunk's task failed, as gathering it would
        try:
            sizes = client.run_on_scheduler(_held_nbytes, keys, arr.dtype.itemsize)
        except Exception:  # noqa: BLE001 -- the scheduler could not say: count with tasks
            return None
        item = arr.dtype.itemsize
        if any(b is None or b % item for b in sizes):
            return None
        lengths = [int(b) // item for b in sizes]
    rows = np.zeros((len(keys), 2), np.int64)
    rows[:, 0] = lengths
    return rows


def _counts_of(arr: da.Array, plan: Plan) -> da.Array:
    """Count tasks over the chunks of a persisted output (the fallback of _held_counts)."""
    n = arr.numblocks[0]
    cname = plan.name("count")
    layer = {(cname, i, 0): (_count, (arr.name, i)) for i in range(n)}
    graph = _extend(arr.dask, cname, layer, {arr.name})
    return da.Array(graph, cname, chunks=((1,) * n, (2,)), dtype=np.int64)


def _group_counts(pieces: tuple, output: str) -> np.ndarray:
    """(n_out, 0) rows of one group task's runs."""
    rows = np.zeros((len(pieces), 2), np.int64)
    rows[:, 0] = run_counts(pieces, output)
    return rows


def _reported_and_expected(keys: list, dask_scheduler: Any = None) -> list:
    """On the scheduler: the group tasks' reported counts (:func:`.task_report.reported`);
    each task's run spec then checks that its tuple, remade after a loss, has those counts
    (:func:`.remade.expect`)."""
    got = reported(keys, dask_scheduler=dask_scheduler)
    expect({k: [int(n) for n in c] for k, c in zip(keys, got) if c is not None},
           dask_scheduler=dask_scheduler)
    return got


def _reported_counts(tasks: da.Array, groups: list[list[list[int]]]) -> np.ndarray | None:
    """(n_out, 0) rows of the group tasks' runs, from what each task reported as it ended
    (:mod:`.task_report`): one question to the scheduler once they are done, no task."""
    blocks = [tasks.dask[k] for k in flatten(tasks.__dask_keys__())]
    client = getattr(blocks[0], "client", None)
    if client is None or not hasattr(client, "run_on_scheduler"):
        return None
    from distributed import wait

    wait(blocks)  # raises here if a group's task failed, as gathering it would
    try:
        got = client.run_on_scheduler(_reported_and_expected, [b.key for b in blocks])
    except Exception:  # noqa: BLE001 -- the scheduler could not say: count with tasks
        return None
    if any(c is None or len(c) != len(g) for c, g in zip(got, groups)):
        return None
    rows = np.zeros((sum(len(g) for g in groups), 2), np.int64)
    rows[:, 0] = [int(n) for c in got for n in c]
    return rows


def _run_grouped(
    plan: Plan, groups: list[list[list[int]]], where: list, rootish: int, blocks: list
) -> dict[str, da.Array]:
    """Eager phase 1 with one task per group of runs: the result arrays, with one output chunk
    per run in the input's order, of known sizes.

    A group task returns a tuple of its runs' outputs; each output chunk of the result is a
    piece of it, taken when the result is used rather than now: it costs no time where the
    data lives (dask fuses it into the consuming task), where a task per output chunk now
    would cost what the grouping saves (a Dask task is ~1 ms of scheduler and worker time;
    measured on the 2-core machine's LocalCluster, 32 chunks on 2 workers: 29 ms a call with
    getitem tasks, 17 ms without). Each piece also depends on an anchor held by its group's
    worker (``where``; :func:`.placement.anchors`, ``rootish`` of them in all), so the
    scheduler places the pieces, and what they are fused into, where their tuple is. Each
    group task reports its runs' counts as it ends, and one question to the scheduler reads
    them (:mod:`.task_report`): the sizes the workers report are of the whole tuple. Count
    tasks over the groups are the fallback.
    """
    starts, shapes = plan.starts, plan.block_shapes()
    gname, cname = plan.name(f"group-{plan.path}"), plan.name("group-count")
    ng = len(groups)
    calls = [([[blocks[i] for i in run] for run in runs], plan.pred, plan.output, plan.stable,
              plan.algorithm, [[int(starts[i]) for i in run] for run in runs], plan.x.dtype,
              [run[0] for run in runs], [[shapes[i] for i in run] for run in runs])
             for runs in groups]
    tasks = _submitted(blocks[0].client, compact_group, calls, [(gname, g) for g in range(ng)],
                       gname, _meta(plan.x, plan.x.dtype))
    rows = _reported_counts(tasks, groups)
    if rows is None:  # counts not reported (e.g. a task re-run elsewhere): count with tasks
        clayer = {(cname, g, 0): (_group_counts, (gname, g), plan.output) for g in range(ng)}
        counts = da.Array(_extend(tasks.dask, cname, clayer, {gname}), cname,
                          chunks=(tuple(len(r) for r in groups), (2,)), dtype=np.int64)
        rows = _fetch_counts(client_stream.persist(counts)[0])  # raises a group task's error
    # Rows come group by group; output chunk j is run j in the input's order.
    count = dict(zip(((g, k) for g, runs in enumerate(groups) for k in range(len(runs))),
                     (int(c) for c in rows[:, 0])))
    order = sorted((run[0], g, k) for g, runs in enumerate(groups) for k, run in enumerate(runs))
    sizes = tuple(count[(g, k)] for _, g, k in order)
    known = [w for w in where if w is not None]
    held = anchors(tasks.dask[(gname, 0)].client, known, rootish)
    every = [f for fs in held.values() for f in fs]
    aname = every[0].key[0]
    graph = _extend(tasks.dask, aname, {f.key: f for f in every}, set())
    wants = ("values", "indices") if plan.output == "both" else (plan.output,)
    out = {}
    for slot, what in enumerate(wants):
        name = plan.name(f"{what}-grouped-{plan.path}")
        olayer: dict[Any, Any] = {}
        for j, (_, g, k) in enumerate(order):
            near = held.get(where[g]) or every  # an anchor where the group is, if known
            piece = (_take, (gname, g), k, near[j % len(near)].key)
            olayer[(name, j)] = (operator.getitem, piece, slot) if plan.output == "both" else piece
        dtype = plan.x.dtype if what == "values" else np.dtype(np.int64)
        out[what] = da.Array(_extend(graph, name, olayer, {gname, aname}), name,
                             chunks=(sizes,), meta=_meta(plan.x, dtype))
    return out


@call_client.on_inputs_client(lambda plan, lazy, *_: () if lazy else (plan.held, plan.mask))
@client_stream.released_on_error()
def build(plan: Plan, lazy: bool, out_chunks: Any) -> dict[str, da.Array]:
    """Run (eager) or describe (lazy) the three phases; return {'values'|'indices': Array}."""
    blocks = None if lazy else _held_futures(plan)  # the input's futures, where persisted
    if blocks is not None:  # asked of the workers that hold the chunks, where that works
        metas = {w: _meta(plan.x, plan.x.dtype if w == "values" else np.dtype(np.int64))
                 for w in ("values", "indices")}
        asked = direct.run(plan, blocks, metas)
        if asked is not None:
            return _rebalanced(asked, out_chunks)
    # tasks from here (the anchors, phase 1; a lazy graph, computed later): they would stop
    # a worker without dask_compact (see workers_installed), which the direct path names
    workers_installed.check(plan.held, plan.mask)
    grouped = _groups_by_worker(plan, blocks)
    runs = None
    if grouped is not None:  # keys that say which groups, so another placement never shares them
        groups, where, rootish = grouped
        plan = replace(plan, token=tokenize(plan.token, groups))
        if any(len(g) > 1 for g in groups):
            assert blocks is not None  # groups are only made over an input of futures
            return _rebalanced(_run_grouped(plan, groups, where, rootish, blocks), out_chunks)
        runs = [g[0] for g in groups]
    submitted = _phase1_submitted(plan, runs, blocks)
    if submitted is not None:
        cols = {plan.output: submitted}
        counts = None
    else:
        graph, p1, n = _phase1_layer(plan, runs)
        cols = _collections(plan, graph, p1, n, lazy)
        counts = cols.pop("counts")
    if lazy:
        return cols

    names = list(cols)
    if submitted is not None:
        arrays = cols
        count_rows = _held_counts(submitted)
        if count_rows is None:
            count_rows = _fetch_counts(client_stream.persist(_counts_of(submitted, plan))[0])
    elif plan.known_input:
        # Phase 1 persists the output chunks only; their lengths are read where they are held
        # (no task per chunk), with count tasks over the persisted chunks as the fallback.
        # (Input of unknown chunk sizes also needs each chunk's input length: count tasks.)
        arrays = dict(zip(names, client_stream.persist(*[cols[k] for k in names])))
        count_rows = _held_counts(arrays[names[0]])
        if count_rows is None:
            count_rows = _fetch_counts(client_stream.persist(_counts_of(arrays[names[0]], plan))[0])
    else:
        # Outputs and per-chunk counts persisted in ONE execution, then only the counts fetched.
        persisted = client_stream.persist(*[cols[k] for k in names], counts)
        arrays = dict(zip(names, persisted[:-1]))
        count_rows = _fetch_counts(persisted[-1])

    # Phase 2 on the client: the exclusive scan gives every chunk's global offsets.
    offsets = _exclusive_scan(count_rows)
    sizes = tuple(int(c) for c in count_rows[:, 0])
    result = {k: _with_chunks(a, sizes) for k, a in arrays.items()}

    # Phase 3: output boundaries are `sizes`; indices get their chunk's input start if it was
    # unknown before; on request the output is rebalanced into uniform chunks.
    if "indices" in result and not plan.known_input:
        shifted = _shift(result["indices"], offsets[:, 1], plan.name("indices-global"))
        (result["indices"],) = client_stream.persist(shifted, check=False)  # operator.add
    return _rebalanced(result, out_chunks)


def _rebalanced(result: dict[str, da.Array], out_chunks: Any) -> dict[str, da.Array]:
    """The result, rechunked into ``out_chunks`` and persisted when asked."""
    if out_chunks is None:
        return result
    names = list(result)
    rows = row_chunks(result, out_chunks)
    # dask's own tasks over held results: no question of the workers (a direct path's
    # result would be refused for a worker holding none of it; the task paths asked in build)
    rebalanced = client_stream.persist(*[rechunk_rows(result[k], rows) for k in names],
                                       check=False)
    return dict(zip(names, rebalanced))


def rechunk_rows(a: da.Array, rows: tuple[int, ...]) -> da.Array:
    """``a`` with axis 0 chunked as ``rows``. Also where ``a`` is empty, which dask's
    ``rechunk`` returns unchanged when every axis is 0 long (then one empty chunk, the
    first of ``a``'s, all of whose chunks are empty)."""
    if a.shape[0] or a.ndim > 1 and all(a.shape[1:]):
        return a.rechunk({0: rows})
    name = "compact-empty-" + tokenize(a)
    dsk: dict[Any, Any] = {(name, 0, *rest): (a.name, 0, *rest)
                           for rest in itertools.product(*(range(len(c))
                                                           for c in a.chunks[1:]))}
    return da.Array(_extend(a.dask, name, dsk, {a.name}), name,
                    chunks=((0,), *a.chunks[1:]), meta=a._meta)


def row_chunks(arrays: Mapping[str, da.Array], out_chunks: int | str) -> tuple[int, ...]:
    """One chunking of axis 0 for every output (rows of ``out_chunks``, all of them for -1,
    or for ``"auto"`` or a byte size what dask picks for the output of the widest rows, so
    that every output's chunks stay within that size): outputs of one call share their
    chunks. Rechunked on its own, each output got dask's own answer: "auto" sized by each
    dtype (float32 values and int64 indices apart by 2x), and nothing selected kept a 1-D
    output's empty chunks where an N-D one merged them."""
    first = next(iter(arrays.values()))
    total = int(first.shape[0])
    if total == 0:
        return (0,)
    if isinstance(out_chunks, str):  # "auto" or a byte size: dask's answer for the widest
        widest = max(arrays.values(),
                     key=lambda a: a.dtype.itemsize * math.prod(a.shape[1:]))
        return da.core.normalize_chunks((out_chunks, *widest.shape[1:]), widest.shape,
                                        dtype=widest.dtype)[0]
    n = total if out_chunks == -1 else int(out_chunks)
    return tuple(min(n, total - lo) for lo in range(0, total, n))
