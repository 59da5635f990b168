"""The three phases for records (:func:`dask_compact.compact_records` on dask arrays).

The same phases as :mod:`.graph`, with a record in place of one array: phase 1 is one task per
row chunk that compacts every field of that chunk (:func:`records_block`, a dict of arrays),
and one cheap getitem task per field and chunk exposes each field's piece as a dask array
chunk. Eager mode persists them and reads each chunk's count from the size its worker reported
(:func:`.graph._held_counts`), so every field of the result has the same known chunks;
nothing is recomputed. Lazy mode leaves the sizes unknown. Where the input's row chunk sizes
are known, the global indices' chunk starts are known at graph time; where some field's are
unknown (``x[m]``), the fields are paired chunk by chunk, each chunk's indices count from its
start and its task returns its rows, and the indices output adds the starts of a task over
every chunk's rows (:func:`.graph._starts`), as the argsort of unknown sizes does: no input
chunk waits for the others.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

from . import call_client, client_stream, workers_installed
from .dispatch import compact_records as compact_records_chunk
from .graph import (
    _count,
    _extend,
    _fetch_counts,
    _held_counts,
    _meta,
    _starts,
    computed_call,
    input_form,
    rechunk_rows,
    row_chunks,
)
from .joined_chunks import rechunked
from .predicate.core import Predicate
from .records_check import INDICES, field_label, field_source
from .remade import expect_from
from .validate import (
    _module_of,
    as_declared,
    as_declared_block,
    block_shapes,
    chunk_shape_refusal,
    native,
    other_order,
)

__all__ = ["build_records", "records_block", "aligned"]

# The key of a phase-1 part that holds its chunk's rows, where its indices count from the
# chunk's start (_records_counted): not a string, so no field's name can be it
ROWS = ("rows",)

# Outputs (fields and indices) up to which an eager call on a cluster persists one graph of
# phase 1 and the outputs; more are persisted in two (build_records)
ONE_GRAPH_OUTPUTS = 8


def records_block(
    names: tuple[str, ...], blocks: list[Any], pred: Predicate, indices: bool, stable: bool,
    index_base: int, declared: dict[str, np.dtype] | None = None, index: int = 0,
    shapes: dict[str, tuple[float, ...] | None] | None = None, call: str = "compact_records",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Phase 1 for one row chunk (chunk ``index``) of a record: every field's selected rows
    (+ indices).

    ``shapes``: each field's chunk shape as its dask array declares it (nan rows where its
    row chunk sizes are unknown: the other axes are checked; None: unchecked). A
    chunk of another shape (a ``map_blocks`` that drops a column or rows) is refused: its
    rows were copied as they came, a result declaring ``(k, 2)`` computing to ``(k, 1)``,
    and the indices are the declared row starts (until 2026-12-01; a record probe).

    ``declared``: each field's declared dtype, which its chunk is taken in
    (:func:`.validate.as_declared`: cast where that is exact, else refused; nothing where
    they agree): the rows are copied as bits, so a chunk of another dtype than declared came
    back as such (``M8[ms]`` values in a result that says ``M8[s]``, float64 rows in a
    float32 result).

    ``call`` and ``labels`` (a field's name in the messages, by default ``field 'name'``):
    the public call and the names its caller gave, as the refusals say them (the xarray
    accessor's variables and ``cond``, :func:`field_label`)."""
    fields = dict(zip(names, blocks))
    shapes = shapes or {}
    for name, b in fields.items():  # before the rows' check: a field's own fault first
        shape = shapes.get(name)
        if shape is not None and not _of_shape(tuple(b.shape), shape):
            raise chunk_shape_refusal(call, field_label(name, labels), index,
                                      tuple(b.shape), shape)
    _check_paired_rows(fields, index, call, labels)
    # the backend is dispatched on the first field's chunk alone: a masked chunk of another
    # field (gathered, or read after the first) would be copied without its mask
    declared = declared or {}
    for name, b in fields.items():
        fields[name] = as_declared(b, declared.get(name), call, index,
                                   field_label(name, labels), source=field_source(name))
    return compact_records_chunk(blocks[0], fields, pred, indices, stable, index_base, 1)


def _of_shape(shape: tuple[int, ...], declared: tuple[float, ...]) -> bool:
    """Whether a chunk of ``shape`` is of the ``declared`` one, whose nan sizes (rows of
    unknown sizes) any size matches."""
    return len(shape) == len(declared) and all(d != d or s == d for s, d in zip(shape, declared))


def _check_paired_rows(fields: dict[str, Any], index: int, call: str,
                       labels: dict[str, str] | None) -> None:  # fmt: skip
    """ValueError unless chunk ``index`` of every field holds the same number of rows. Fields
    of known sizes were rechunked alike (``aligned``) and each chunk's shape checked before,
    so only fields paired chunk by chunk, some of unknown sizes, can differ here: two
    selections by different masks (``x[m1]``, ``y[m2]``), or a DataFrame's columns beside an
    array chunked otherwise. Until 2026-12-07 such fields were refused before anything ran,
    and this guard said only "record chunk with rows of different lengths"."""
    rows = {name: int(b.shape[0]) for name, b in fields.items()}
    if len(set(rows.values())) < 2:
        return
    listed = ", ".join(f"{field_label(name, labels)}: {n}" for name, n in rows.items())
    raise ValueError(
        f"{call}: chunk {index} of the fields holds different numbers of rows ({listed}). "
        "Fields of unknown chunk sizes are paired chunk by chunk, so each chunk must hold the "
        "same rows in every field: make the fields from one selection of arrays chunked alike "
        "(x[m] and y[m] with one mask m), or call compute_chunk_sizes() on each field first "
        "(fields of known sizes are aligned by a rechunk and their lengths checked at once)"
    )


def _unknown_rows(a: da.Array) -> bool:
    """Whether some of ``a``'s row chunk sizes are unknown (nan: a boolean selection's)."""
    return math.isnan(a.shape[0])


def aligned(fields: dict[str, da.Array], pred: Predicate, call: str = "compact_records",
            labels: dict[str, str] | None = None) -> dict[str, da.Array]:  # fmt: skip
    """Every field chunked like the first field the predicate reads (mapping order; the first
    field if it reads none) along axis 0, and in one chunk along its trailing axes.

    Where some field's row chunk sizes are unknown, no field is rechunked along axis 0: rows
    whose counts are unknown cannot be moved (Dask refuses), so the fields are paired chunk
    by chunk as they are (``records_check._check_rows`` checked their numbers of chunks;
    ``_check_paired_rows`` checks each chunk's rows). Their trailing axes still go to one
    chunk, which Dask does over rows of unknown sizes."""
    lead = next((n for n in fields if n in pred.fields), next(iter(fields)))
    paired = any(_unknown_rows(a) for a in fields.values())
    out = {}
    for name, a in fields.items():
        rows = a.chunks[0] if paired else fields[lead].chunks[0]
        want = (rows, *[(s,) for s in a.shape[1:]])
        out[name] = a if a.chunks == want else rechunked(a, want, call,
                                                         field_label(name, labels))
    return out


def _native_cupy(a: da.Array, call: str, labels: dict[str, str] | None, name: str) -> da.Array:
    """A field of CuPy chunks of the other byte order (views of a swapped dtype) taken in
    native order as its chunks are read (each chunk's bytes reversed by ``as_declared``,
    ``validate.to_native``), as the one-array calls take such input (``api._native``): its
    result is native. Until 2026-12-01 (fourteenth session) it was taken as it was and its
    result declared in its dtype, which CuPy refuses to make (the result's meta, and each
    chunk's sized call). NumPy fields keep their order, as NumPy's ``a[m]`` keeps it; ``a``
    itself where it is native."""
    if not other_order(a) or _module_of(a._meta) != "cupy":
        return a
    dt = native(a.dtype)
    return da.map_blocks(as_declared_block, a, declared=dt, fn=call,
                         what=field_label(name, labels), dtype=dt,
                         meta=meta_from_array(a._meta, dtype=dt))


@call_client.on_inputs_client(
    lambda fields, pred, indices, lazy, *_: () if lazy else tuple(fields.values()))
@client_stream.released_on_error()
def build_records(
    fields: dict[str, da.Array], pred: Predicate, indices: bool, lazy: bool, stable: bool,
    out_chunks: Any, call: str = "compact_records", labels: dict[str, str] | None = None,
) -> dict[str, da.Array]:  # fmt: skip
    from .api import _check_chunks

    out_chunks = _check_chunks(out_chunks, lazy)
    fields = {name: _native_cupy(a, call, labels, name) for name, a in fields.items()}
    fields = aligned(fields, pred, call, labels)
    names = tuple(fields)
    first = fields[names[0]]
    nb = first.numblocks[0]
    forms = [input_form(fields[n]) for n in names]
    token = tokenize("compact_records", [fields[n].name for n in names], names, pred, indices,
                     stable, lazy, forms, computed_call(lazy, *forms))
    p1 = f"compact-records-{token}"
    layer, local = _phase1_layer(fields, p1, pred, indices, stable, call, labels)
    deps: list[Any] = list(fields.values())  # dask's typing does not count Array
    graph = HighLevelGraph.from_collections(p1, layer, dependencies=deps)

    outs = list(names) + ([INDICES] if indices else [])
    onames = {name: f"compact-records-{j}-{token}" for j, name in enumerate(outs)}
    metas = {name: _out_meta(first, fields.get(name)) for name in outs}
    if lazy:
        workers_installed.check(*fields.values())  # computed later (see workers_installed)
        return _one_graph(graph, p1, nb, onames, metas, local, token)

    if len(outs) <= ONE_GRAPH_OUTPUTS and workers_installed._client_of(tuple(fields.values())):
        # on a cluster, few outputs: one graph, one submission (the two below cost a small
        # call ~1 ms more on the 2-core machine's LocalCluster), and few pairs to order
        one = _one_graph(graph, p1, nb, onames, metas, local, token)
        persisted = dict(zip(outs, client_stream.persist(*one.values())))
    else:
        # Phase 1 persisted alone, then every output taken from its pieces (_taken). Until
        # 2026-12-02 one graph held phase 1 and a getitem layer per output, persisted as one
        # array per output, whatever their number: dask ordered it in time quadratic in the
        # fields (every input chunk reaches every output chunk through its phase-1 task:
        # dask.order pairs roots and leaves), culled it layer by layer over every key, and
        # it was copied per output (the accessor on 300 variables of 20,000 rows in 4
        # chunks: 1.4-5 s; 1000: 17 s; sixteenth session, issue 11).
        phase1 = da.Array(graph, p1, chunks=((math.nan,) * nb,),
                          meta=np.empty(0, dtype=object))
        persisted = _taken(client_stream.persist(phase1)[0], outs, onames, metas, local,
                           token)
    # counts: from a 1-D output's held sizes (a whole item per row; not one of rows of no
    # bytes, whose sizes say nothing), else count tasks
    one_d = next((k for k in outs if persisted[k].ndim == 1 and persisted[k].dtype.itemsize),
                 None)
    rows_out = _held_counts(persisted[one_d]) if one_d is not None else None
    if rows_out is None:
        a = persisted[outs[0]]
        cname = f"compact-records-count-{token}"
        keys = [(a.name, i, *([0] * (a.ndim - 1))) for i in range(nb)]
        cg = _extend(a.dask, cname, {(cname, i, 0): (_count, k) for i, k in enumerate(keys)},
                     {a.name})
        counts = da.Array(cg, cname, chunks=((1,) * nb, (2,)), dtype=np.int64)
        rows_out = _fetch_counts(client_stream.persist(counts)[0])
    sizes = tuple(int(c) for c in rows_out[:, 0])
    expect_from(list(persisted.values()), [sizes] * len(persisted))  # every field's pieces
    result = {
        k: da.Array(a.dask, a.name, chunks=(sizes, *a.chunks[1:]), meta=a._meta)
        for k, a in persisted.items()
    }
    if out_chunks is not None:
        rows = row_chunks({k: result[k] for k in outs}, out_chunks)
        rebalanced = client_stream.persist(*[rechunk_rows(result[k], rows) for k in outs])
        result = dict(zip(outs, rebalanced))
    return result


def _phase1_layer(fields: dict[str, da.Array], p1: str, pred: Predicate, indices: bool,
                  stable: bool, call: str, labels: dict[str, str] | None
                  ) -> tuple[dict[Any, Any], bool]:  # fmt: skip
    """Phase 1's tasks ``(p1, i)``, one :func:`records_block` per row chunk of the aligned
    ``fields``, and whether their indices count from each chunk's start rather than the
    array's. A chunk's global start is passed where graph time knows it
    (:func:`_known_starts`); else (indices asked of fields all of unknown row chunk sizes)
    each task counts from 0 and returns its chunk's rows (:func:`_records_counted`), and
    the indices output adds the starts (:func:`_output_tasks`), as the unknown sizes'
    argsort does: each input chunk is released once its task has run."""
    names = tuple(fields)
    nb = fields[names[0]].numblocks[0]
    declared = {n: fields[n].dtype for n in names}
    every = {n: _declared_shapes(fields[n]) for n in names}  # each row chunk's, each field
    keys = [[(fields[n].name, i, *([0] * (fields[n].ndim - 1))) for n in names]
            for i in range(nb)]
    rest = [(declared, i, {n: every[n][i] for n in names}, call, labels) for i in range(nb)]
    starts = _known_starts(fields, indices)
    if starts is not None:
        return {(p1, i): (records_block, names, keys[i], pred, indices, stable, int(starts[i]),
                          *rest[i]) for i in range(nb)}, False
    return {(p1, i): (_records_counted, names, keys[i], pred, indices, stable, *rest[i])
            for i in range(nb)}, True


def _known_starts(fields: dict[str, da.Array], indices: bool) -> np.ndarray | None:
    """Each row chunk's global start where graph time knows it: from a field of known row
    chunk sizes (each chunk's task checks that every field's chunk holds as many rows as
    its, which its declared shape says), or zeros without indices (nothing reads them).
    None where only the chunks can tell (indices of fields all of unknown sizes)."""
    known = next((a for a in fields.values() if not _unknown_rows(a)), None)
    if known is not None:
        return _starts(known.chunks[0])
    return None if indices else np.zeros(next(iter(fields.values())).numblocks[0], np.int64)


def _records_counted(names: tuple[str, ...], blocks: list[Any], pred: Predicate,
                     indices: bool, stable: bool, declared: dict[str, np.dtype], index: int,
                     shapes: dict[str, tuple[float, ...] | None], call: str,
                     labels: dict[str, str] | None) -> dict[Any, Any]:  # fmt: skip
    """:func:`records_block` of row chunk ``index``, its indices counted from the chunk's
    start, and the chunk's rows under :data:`ROWS` (every field's: ``records_block`` checked
    that they agree)."""
    part: dict[Any, Any] = records_block(names, blocks, pred, indices, stable, 0, declared,
                                         index, shapes, call, labels)
    part[ROWS] = int(blocks[0].shape[0])
    return part


def _at_start(local: Any, starts: np.ndarray, index: int) -> Any:
    """A chunk's indices counted from its start, counted from the array's."""
    return local + starts[index]


def _output_tasks(name: str, oname: str, parts: list[Any], zeros: tuple[int, ...],
                  local: bool, token: str) -> dict[Any, Any]:  # fmt: skip
    """The tasks of output ``name`` (array ``oname``) over phase 1's ``parts`` (keys: a
    graph's or futures'): a getitem per chunk, and for indices counted from each chunk's
    start (``local``) a task over every chunk's rows (:func:`.graph._starts`) whose starts
    are added to each chunk's indices once taken out of its part, so that no part is held
    for them."""
    if not (local and name == INDICES):
        return {(oname, i, *zeros): (operator.getitem, k, name) for i, k in enumerate(parts)}
    rname, tname = f"compact-records-size-{token}", f"compact-records-starts-{token}"
    lname = f"compact-records-local-{token}"
    layer: dict[Any, Any] = {(tname, 0): (_starts, [(rname, i) for i in range(len(parts))])}
    for i, k in enumerate(parts):
        layer[(rname, i)] = (operator.getitem, k, ROWS)
        layer[(lname, i)] = (operator.getitem, k, name)
        layer[(oname, i, *zeros)] = (_at_start, (lname, i), (tname, 0), i)
    return layer


def _declared_shapes(a: da.Array) -> list[tuple[float, ...] | None]:
    """The shape ``a`` declares for each of its blocks ``(i, 0, ...)`` (its trailing axes in
    one chunk, ``aligned``), with nan rows where its row chunk sizes are unknown: the
    chunk's other axes are checked still (:func:`_of_shape`), where ``block_shapes`` checks
    none for such a chunk."""
    tail = tuple(int(s) for s in a.shape[1:])
    return [s if s is not None else (math.nan, *tail) for s in block_shapes(a.chunks)]


def _one_graph(graph: HighLevelGraph, p1: str, nb: int, onames: dict[str, str],
               metas: dict[str, Any], local: bool, token: str
               ) -> dict[str, da.Array]:  # fmt: skip
    """Every output as a layer of :func:`_output_tasks` over phase 1 ``p1`` in ``graph`` (its
    ``nb`` tasks): the lazy result, and the eager one of few outputs on a cluster."""
    arrays: dict[str, da.Array] = {}
    for name, oname in onames.items():
        meta = metas[name]
        zeros = (0,) * (meta.ndim - 1)
        parts = [(p1, i) for i in range(nb)]
        g = _extend(graph, oname, _output_tasks(name, oname, parts, zeros, local, token), {p1})
        arrays[name] = da.Array(g, oname, chunks=((math.nan,) * nb,
                                                  *[(s,) for s in meta.shape[1:]]), meta=meta)
    return arrays


def _out_meta(first: da.Array, src: da.Array | None) -> Any:
    """The meta of an output: ``src``'s rows (a field), or int64 positions (the indices)."""
    if src is None:
        return _meta(first, np.dtype(np.int64))
    return _meta(first, src.dtype, src.shape[1:])


def _taken(parts: da.Array, outs: list[str], onames: dict[str, str], metas: dict[str, Any],
           local: bool, token: str) -> dict[str, da.Array]:  # fmt: skip
    """Every output of the persisted phase 1 ``parts`` (one dict of pieces per row chunk) as
    a persisted array of its own, chunks unknown along the rows. In-process (the pieces at
    hand) each is an array of its pieces, no task run; on a cluster (futures) one graph of
    :func:`_output_tasks` per output over the phase-1 futures, persisted as it is: no
    culling (it holds nothing else) and, phase 1 held, no input chunk reaches an output in
    it. The outputs keep the keys and tasks they had in the one graph before."""
    keys = list(flatten(parts.__dask_keys__()))
    held = [parts.dask[k] for k in keys]
    nb = len(keys)
    arrays: dict[str, da.Array] = {}
    in_hand = all(isinstance(h, dict) for h in held)
    base = None if in_hand else HighLevelGraph.from_collections(parts.name, dict(parts.dask))
    for name in outs:
        oname, meta = onames[name], metas[name]
        zeros = (0,) * (meta.ndim - 1)
        chunks = ((math.nan,) * nb, *[(s,) for s in meta.shape[1:]])
        if in_hand:
            got = [h[name] for h in held]
            if local and name == INDICES:  # what _output_tasks' tasks would do
                starts = _starts([h[ROWS] for h in held])
                got = [_at_start(g, starts, i) for i, g in enumerate(got)]
            pieces = {(oname, i, *zeros): g for i, g in enumerate(got)}
            arrays[name] = da.Array(pieces, oname, chunks=chunks, meta=meta)
            continue
        assert base is not None
        layer = _output_tasks(name, oname, keys, zeros, local, token)
        g = HighLevelGraph({parts.name: base.layers[parts.name], oname: layer},
                           {parts.name: set(), oname: {parts.name}})
        arrays[name] = da.Array(g, oname, chunks=chunks, meta=meta)
    if in_hand:
        return arrays
    return dict(zip(outs, client_stream.persist(*arrays.values(), optimize_graph=False)))
