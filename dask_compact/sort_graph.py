"""Sample sort with known sizes, as Dask graphs (:func:`dask_compact.sort` and ``argsort``).

The order is (value, global index), NaNs last: a total order in which no two elements tie, so
buckets stay balanced when values repeat (all-equal input included), and equal values come
out by index. Inside a sorted chunk the element at sorted position r stands for the index
``start + r``: chunks cover disjoint, increasing index ranges and the local sort keeps equal
values in their input order, so this orders exactly as the true indices do, and sorting values
alone (no argsort) needs no indices at all.

1. Local sort (one task per input chunk, persisted where it ran): the sorted chunk, for argsort
   its global indices, and a regular sample of the sorted chunk (a few hundred values).
2. Splitters (client): the samples, weighted by the share of their chunk each stands for, give
   ``buckets - 1`` splitter pairs (value, index) at evenly spaced estimated ranks.
3. Histogram (one small task per chunk, on the persisted chunk): a binary search of every
   splitter, i.e. where each bucket starts in the chunk. The client scans the chunks x buckets
   counts: bucket totals are the output chunk sizes (known), and each piece's offset inside its
   output chunk is the sum of the same bucket's pieces in earlier chunks.
4. Exchange and merge: the buckets are cut into groups of consecutive buckets
   (:func:`exchange_groups`). On GPU workers of one host (the default where it can run),
   one pack task per worker and group puts the worker's slices for the group into shared
   device memory and each merge copies its pieces from the packs over CUDA IPC
   (:func:`_exchange_ipc`, :mod:`.backends.cuda_ipc`). Otherwise one slicing task per chunk
   and group (one group per worker over UCX, one per bucket over TCP; it runs where its chunk
   is held, so only the slice travels, once, to where the group is merged; the slice is a
   copy, so a chunk's memory is freed once it is cut, or once it is spilled) and one merge
   task per non-empty bucket, over its pieces of those slices in chunk order (on one worker
   or without a cluster the merges cut their pieces from the chunks themselves); the output
   is persisted, and the sorted chunks are released as soon as their slices are made (the
   client keeps no reference to them).

Two round trips to the client, each of small arrays (the sample, then the histogram), and on a
cluster one question to the scheduler (where the chunks are) and, for the IPC exchange, one to
the workers (:func:`ask_ahead`: both asked while the histogram runs); an array of one chunk
sorted into one bucket skips them all (its local sort is the whole sort: one task, persisted,
or under a local scheduler the sort itself in the caller's thread);
nothing gathers more than one group's share in one place. Every task is an ordinary getitem or
function task, so the graph runs under any scheduler (distributed's P2P shuffle would batch the
exchange into O(chunks + buckets) tasks, but only on a distributed cluster).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import operator
import sys
import uuid
import warnings
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from . import client_stream, remade, settings
from .backends.numpy_sort import half_keys
from .dispatch import sort_bounds, sort_chunk, sort_merge
from .graph import (
    _extend,
    _held_counts,
    _meta,
    _rows,
    _starts,
    computed_call,
    input_form,
    shifted,
)
from .imported import distributed_if_imported
from .joined_chunks import declared_chunks
from .placement import _held_where
from .sort_cluster import cluster_buckets, cluster_shape, one_bucket
from .validate import as_declared, check_shape, declared_shape

__all__ = ["build_sort", "resolve_buckets", "splitters", "sample_positions", "exchange_groups",
           "bucket_groups", "default_buckets", "empty_sorted", "EXCHANGES"]

# How the exchange is cut on a cluster (exchange_groups): "auto", "ipc", "worker" or "bucket".
EXCHANGES = ("auto", "ipc", "worker", "bucket")
# Its setting and the default number of buckets' (min-bucket, max-pieces): .settings


def default_buckets(n: int, nchunks: int) -> int:
    """How many buckets (output chunks) a sort of ``n`` elements in ``nchunks`` chunks aims
    for unless told: as many as the chunks, but no fewer than ``dask-compact.sort.min-bucket``
    elements a bucket and no more than ``dask-compact.sort.max-pieces`` pieces (chunks x
    buckets) in the exchange. Every chunk sends a piece to every bucket, so one bucket per
    chunk made the exchange grow as the square of the chunks: a probe's 200,000 float64 in
    1,000 chunks took 12.3 s (1,000,000 pieces) where 4 buckets took 0.95 s and np.sort of the
    computed array 0.01 s. A GPU sort's chunks of 2^28 are left one bucket each."""
    by_size = n // max(1, settings.get("sort.min-bucket"))
    by_pieces = settings.get("sort.max-pieces") // max(1, nchunks)
    return max(1, min(nchunks, by_size, by_pieces))


def resolve_buckets(asked: int | None, n: int, nchunks: int) -> int:
    """The buckets of a sort of ``n`` elements in ``nchunks`` chunks: :func:`default_buckets`
    unless ``asked``, and never more than the elements (more would only be empty ones, left
    out of the result, each still a sample slot and a histogram column: 10^8 of them took
    22 s on 1,000 elements)."""
    return default_buckets(n, nchunks) if asked is None else min(asked, max(1, n))


def join_small_chunks(x: da.Array, checked: bool = False) -> da.Array:
    """``x`` with chunks far below a bucket's minimum (on average under a quarter of
    ``dask-compact.sort.min-bucket``) joined into chunks of that minimum. Every chunk is a
    local sort, a sample and a piece for every bucket, each a task and a transfer: 200,000
    float64 in 800 chunks took 1.0 s through 3 buckets (2,400 pieces), np.sort 0.01 s.
    Chunks of 2^28 on GPUs are far above it and left alone. The joined chunks are in
    ``x``'s declared dtype (:func:`declared_chunks`, unless ``checked``: x's chunks are)."""
    if math.isnan(x.shape[0]):
        return x  # unknown sizes (x[x > t]): nothing says which chunks are small
    min_bucket = max(1, settings.get("sort.min-bucket"))
    n, nchunks = int(x.shape[0]), int(x.numblocks[0])
    if nchunks <= 1 or 4 * n >= nchunks * min_bucket:
        return x
    return declared_chunks(x, checked).rechunk({0: min_bucket})


# At most this many sample values in all (the client sorts them; 2^20 take ~0.2 s).
MAX_SAMPLE = 2**20
MIN_PER_CHUNK = 256


def sample_positions(size: int, per_chunk: int) -> np.ndarray:
    """Evenly spaced positions (the middles of ``s`` equal parts) of a sorted chunk."""
    s = min(size, per_chunk)
    if s == 0:
        return np.zeros(0, np.int64)
    return ((2 * np.arange(s, dtype=np.int64) + 1) * size) // (2 * s)


def per_chunk_sample(nchunks: int, buckets: int) -> int:
    """Sample values per chunk: 8 per bucket (a boundary estimated from regular samples is off
    by at most the chunk size over the sample size per chunk, summed over the chunks: n/s, an
    eighth of a bucket), at least 256, and at most MAX_SAMPLE in all."""
    return max(16, min(max(MIN_PER_CHUNK, 8 * buckets), MAX_SAMPLE // max(1, nchunks)))


def splitters(
    values: np.ndarray, sizes: tuple[int, ...], per_chunk: int, buckets: int
) -> tuple[np.ndarray, np.ndarray]:
    """``buckets - 1`` splitter pairs (values, global indices) from the chunks' samples.

    ``values``: the samples of every chunk concatenated, chunk c's at ``sample_positions``."""
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    index, weight = [], []
    for start, size in zip(starts, sizes):
        pos = sample_positions(size, per_chunk)
        index.append(start + pos)
        weight.append(np.full(pos.size, size / max(pos.size, 1)))
    idx = np.concatenate(index) if index else np.zeros(0, np.int64)
    w = np.concatenate(weight) if weight else np.zeros(0)
    if buckets <= 1 or values.size == 0:
        return values[:0], idx[:0]
    # NaNs last, as np.sort; float16 by its order keys (equal where the values are), which
    # lexsort sorts by NumPy's radix sort where it took float16 through a comparison sort:
    # 54 ms against 372 ms for a full sample of 2^20
    order = np.lexsort((idx, half_keys(values) if values.dtype.kind == "f"
                        and values.dtype.itemsize == 2 else values))  # fmt: skip
    w = w[order]
    rank = np.cumsum(w) - w / 2  # estimated global rank of each sample element
    targets = np.arange(1, buckets) * (float(sum(sizes)) / buckets)
    at = np.minimum(np.searchsorted(rank, targets), values.size - 1)
    return values[order[at]], idx[order[at]]


# Tasks call these module functions, never a Dispatch object: one pickled into a task would be
# a copy, and the lazy registration on the worker would fill in the module's, not the copy.
# each takes its chunk in x's declared dtype (validate.as_declared; ``c``: the chunk's index),
# unless ``declared`` is None: a step before took it so (build_sort's ``checked``); and of its
# declared ``shape`` whatever steps came before (an argsort's indices and the histogram's
# bounds are made of the declared sizes)
def _local_sort(a: Any, indices: bool, base: int, positions: np.ndarray, local: str,
                declared: np.dtype | None = None, c: int = 0,
                shape: tuple[int, ...] | None = None, defer: str = "") -> tuple:
    # the step is dispatched on the chunk's type: see validate.check_chunk
    if declared is not None:
        a = as_declared(a, declared, "sort", c, shape=shape)
    else:
        check_shape(a, shape, "sort", c)
    if defer and _held_unsorted(a, defer):
        return a, None, Unsorted(len(a))
    return sort_chunk(a, indices, base, positions, local)


def _local_sort_sized(a: Any, indices: bool, per: int, local: str,
                      declared: np.dtype | None = None, c: int = 0,
                      defer: str = "") -> tuple:
    """:func:`_local_sort` of chunk ``c`` of a size the graph does not know: its sample at
    the positions of its length, its indices counted from 0 (the client adds its start once
    every length is known: a start here would wait for every chunk's length, every input
    chunk held meanwhile), and ``(sample, length)`` in the sample's slot."""
    n = len(a)
    values, order, sample = _local_sort(a, indices, 0, sample_positions(n, per), local,
                                        declared, c, None, defer)
    return values, order, sample if isinstance(sample, Unsorted) else (sample, n)


def _held_unsorted(a: Any, defer: str) -> bool:
    """Whether a local sort asked to ``defer`` holds chunk ``a`` unsorted: a CuPy chunk
    (``"cupy"``: one device under a local scheduler), a NumPy chunk (``"numpy"``: a
    cluster's CPU workers, where a small array is then sorted as one bucket, see
    :mod:`.sort_cluster`)."""
    return _is_cupy(a) == (defer == "cupy")


class Unsorted:
    """What a local sort asked to ``defer`` returns in its sample's slot for a chunk it
    holds checked but unsorted (:func:`_held_unsorted`): the chunk's length. Under an
    in-process scheduler
    the chunks of a graph that declares NumPy ones (dask's ``x[m]`` of CuPy data) show their
    type only as they are made; on one GPU they are then joined and sorted once
    (:func:`build_sort`), as a persisted selection of CuPy data is, instead of sorted one by
    one and merged by a second sort of every element (on one H100, 2026-12-07, 2^28 float32
    in 8 chunks, x not persisted: 0.60x / 0.48x ``cupy.sort`` / ``cupy.argsort`` of
    ``x[x < 0.5].compute()`` that way)."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = int(n)


def _unsorted_sizes(drawn: list) -> tuple[int, ...] | None:
    """The chunks' lengths where every local sort deferred its chunk (:class:`Unsorted`),
    None where none did. Chunks of both kinds are chunks of both types (CuPy and NumPy) in
    one array, which no sort's merge or join can take together: a TypeError saying so."""
    held = [isinstance(d, Unsorted) for d in drawn]
    if not any(held):
        return None
    if not all(held):
        raise TypeError(
            "sort: the array's chunks are of different types (CuPy and NumPy); make them "
            "one type first, e.g. x.map_blocks(cupy.asarray) or x.map_blocks(cupy.asnumpy)")
    return tuple(d.n for d in drawn)


def _sort_whole(a: Any, indices: bool, local: str, declared: np.dtype | None = None,
                shape: tuple[int, ...] | None = None) -> Any:
    """One chunk sorted (or its argsort): the local sort with no sample."""
    if declared is not None:
        a = as_declared(a, declared, "sort", 0, shape=shape)
    else:
        check_shape(a, shape, "sort", 0)
    # an argsort's sorted values are not asked for: not gathered (a chunk's worth of random
    # reads, on the CPU as long again as the argsort's own packed sort)
    values, order, _ = sort_chunk(a, indices, 0, np.zeros(0, np.int64), local,
                                  values=not indices)
    return order if indices else values


def _sort_one_chunk(x: da.Array, indices: bool, local: str, graph_input: bool,
                    checked: bool = False) -> da.Array:
    """An array of one chunk, sorted into one output chunk: the local sort is the whole sort,
    so one task and one persist (no sample, splitters or merge: the general path's three
    round trips to the client cost ~6 ms on a GPU worker, as much as sorting 2^28 float32).
    Under the threaded or the synchronous scheduler not even that: see :func:`_here`.
    ``graph_input``: whether the caller's array is a graph (not persisted), which must have
    been read when the call returns. ``checked``: the chunk is in x's declared dtype
    already (see :func:`build_sort`)."""
    form = input_form(x)
    token = tokenize("dask-compact-sort-one", x.name, indices, local, form,
                     computed_call(False, form))
    out = f"sort-{'indices' if indices else 'values'}-out-{token}"
    dtype = np.dtype(np.int64) if indices else x.dtype
    declared = None if checked else x.dtype
    shape = declared_shape(x.chunks, 0)
    chunk = _here(x)
    if chunk is not None:
        with _beside_the_pool(chunk[0]):
            whole = _sort_whole(chunk[0], indices, local, declared, shape)
        del chunk  # freed once the sort is queued (see _beside_the_pool)
        return da.Array({(out, 0): whole}, out, chunks=x.chunks, meta=_meta(x, dtype))
    graph = _extend(x.dask, out, {(out, 0): (_sort_whole, (x.name, 0), indices, local,
                                             declared, shape)}, {x.name})
    result = da.Array(graph, out, chunks=x.chunks, meta=_meta(x, dtype))
    (result,) = client_stream.persist(result)
    if graph_input:
        # The chunk sizes are known without running anything, but a call over a graph input
        # returns only once that input has been read, as every other eager call does (they
        # wait for phase 1's counts): returned at once, its chunks were still being read or
        # held for the sort when the caller went on, and a store rewritten in place and read
        # again (da.from_zarr names its chunks by the path) got the old chunks under the
        # same keys (CI: an empty selection). The input's keys are released as the sort
        # ends. A persisted input's chunks are the caller's own futures: no wait for them.
        client_stream.wait(result)
    return result


# A one-chunk input whose optimised graph has at most this many entries is computed in the
# caller's thread; a bigger one (e.g. one chunk made from many) by the configured scheduler.
_INLINE_GRAPH = 8


def _here(x: da.Array) -> tuple[Any] | None:
    """``(chunk,)``: the only chunk of ``x``, computed in this process, where ``x`` runs under
    dask's threaded or synchronous scheduler (else None: a cluster's workers hold the data,
    and the sort goes to them as a task). The sort of that chunk then runs in the caller's
    thread and its result is held in the output's graph, as ``persist`` holds a local
    scheduler's results, without ``persist``'s graph work, ordering and hand-off to a pool
    thread: on the H100 host (2026-11-27) a persist of one task over a 2^28 float32 CuPy chunk
    cost 1.8-2.6 ms over the task itself, against 7.2 ms for ``cupy.sort`` of that chunk.
    The input's graph is optimised as ``persist`` would (a slice of a Zarr array is read as a
    slice), unless it is a ``from_array`` graph of data and one getter (nothing to fuse)."""
    get = _local_get(x)
    if get is None:
        return None
    key = (x.name, 0)
    held = x.dask
    if len(held.layers) == 1 and len(held) == 1:  # persisted here: the chunk itself
        value = held[key]
        if hasattr(value, "dtype") and hasattr(value, "shape") and not callable(value):
            return (value,)
    # the optimiser took 0.09 ms of the call on the H100 host
    dsk = held if len(held) <= 2 else x.__dask_optimize__(x.__dask_graph__(), [key])
    return ((get if len(dsk) > _INLINE_GRAPH else _run_inline)(dsk, key),)


def _beside_the_pool(chunk: Any) -> Any:
    """Where ``chunk`` (from :func:`_here`) is a CuPy array: the caller's stream ordered with
    the stream the scheduler's pool threads made it on (``cupy_device.beside_the_pool``), since
    the sort runs in the caller's thread, on its current stream; else nothing."""
    if not _is_cupy(chunk):
        return contextlib.nullcontext()
    from .backends.cupy_device import beside_the_pool

    return beside_the_pool()


def _run_inline(dsk: Any, key: Any) -> Any:
    """``key`` of the small graph ``dsk``, computed in this thread: by dask's own task executor
    where no local-scheduler callback listens, which spares ``get_sync``'s ordering and
    state machine (0.4 ms of a one-chunk sort's call on the H100 host); by ``get_sync``
    where one does (a ``ProgressBar`` or ``Profiler`` sees the run as usual), or where this
    dask has no such executor."""
    import dask.local
    from dask.callbacks import Callback

    if not Callback.active:
        try:
            from dask._task_spec import convert_legacy_graph, execute_graph
        except ImportError:
            pass
        else:
            return execute_graph(convert_legacy_graph(dict(dsk)), keys=[key])[key]
    return dask.local.get_sync(dsk, key)


def _piece(a: Any, lo: int, hi: int) -> Any:
    """A copy of ``a[lo:hi]``: a slice would keep its whole sorted chunk alive (on the device
    too) while it waits for its merge, so a chunk that the worker spills (to the host, or to
    disk) would free nothing, and an array larger than the workers' memory could not be
    sorted. The copy costs one more pass over the exchanged bytes."""
    return a[lo:hi].copy()


def _bounds(values: Any, split: tuple[np.ndarray, np.ndarray], base: int) -> Any:
    return sort_bounds(values, split[0], split[1], base).reshape(1, -1)


def _pack(call: str, part: int, values: list, orders: list | None, cuts: list) -> Any:
    """This worker's slices ``cuts[i]`` of its sorted chunks ``values[i]`` (and ``orders[i]``)
    for one group of buckets, packed one after the other into allocations of their own and
    kept on its GPU until the exchange ``call`` ends; returns the handles a merge on another
    worker copies them by."""
    from .backends import cuda_ipc

    return cuda_ipc.pack(call, part, [values] + ([orders] if orders else []), cuts)


def _merge_joined(sources: list, pieces: list, indices: bool, local: str) -> Any:
    """Bucket ``j``'s output over CUDA IPC: its piece of every chunk, in chunk order (``(k,
    lo, hi)``: elements ``lo:hi`` of the k-th source's pack), copied into one buffer on this
    worker's GPU, then sorted."""
    from .backends import cuda_ipc

    values = cuda_ipc.join(sources, pieces, 0)
    orders = cuda_ipc.join(sources, pieces, 1) if indices else None
    return sort_merge(values, [values], None if orders is None else [orders], local, joined=True)


def _merge(values: list, orders: list | None, cuts: list, local: str) -> Any:
    """Bucket ``j``'s output from its piece of every chunk: ``cuts[k]`` is where that piece lies
    in the k-th array (a chunk, or the chunk's slice for the bucket's group)."""
    values = [v[lo:hi] for v, (lo, hi) in zip(values, cuts)]
    if orders is not None:
        orders = [o[lo:hi] for o, (lo, hi) in zip(orders, cuts)]
    return sort_merge(values[0], values, orders, local)


def bucket_groups(totals: np.ndarray, groups: int) -> np.ndarray:
    """The group of each bucket: ``groups`` runs of consecutive buckets holding about equal
    numbers of elements (each bucket goes to the group its middle element falls in).

    >>> bucket_groups(np.array([5, 5, 5, 5]), 2).tolist()
    [0, 0, 1, 1]
    >>> bucket_groups(np.array([9, 0, 1, 1, 1]), 2).tolist()
    [0, 1, 1, 1, 1]
    """
    n = int(totals.sum())
    if groups <= 1 or n == 0:
        return np.zeros(totals.size, np.int64)
    middle = np.cumsum(totals) - totals / 2
    return np.minimum((middle * groups / n).astype(np.int64), groups - 1)


def _is_cupy(meta: Any) -> bool:
    return type(meta).__module__.split(".")[0] == "cupy"


def _futures(values: da.Array) -> list | None:
    """The chunks of ``values`` as distributed futures, or None (no cluster holds them)."""
    distributed = distributed_if_imported()
    blocks = [values.dask[k] for k in values.__dask_keys__()]
    if distributed is None or not all(isinstance(b, distributed.Future) for b in blocks):
        return None
    return blocks


def ask_ahead(values: da.Array) -> concurrent.futures.Future | None:
    """Where the sorted chunks ``values`` are held and, where the IPC exchange may run, every
    worker's :func:`.backends.cuda_ipc.probe`, asked in a thread while the client goes on
    (the splitters, the histogram): two round trips that the exchange otherwise waited for
    after the histogram. Call it once the chunks are in memory (the probe counts the free
    device memory). None without a cluster."""
    blocks = _futures(values)
    if blocks is None:
        return None
    client = blocks[0].client
    keys = [b.key for b in blocks]
    exchange = settings.get("sort.exchange")

    def ask() -> tuple[list, dict | None, Any]:
        holders, types = client.run_on_scheduler(_held_types, keys)
        like = _cupy_like(values, types)
        probe = exchange in ("auto", "ipc") and (_is_cupy(values._meta) or like is not None)
        if not probe or any(h is None for h in holders) or len(set(holders)) < 2:
            return holders, None, like
        from .backends import cuda_ipc

        return holders, _probes(client.run(cuda_ipc.probe, on_error="return")), like

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-compact-sort")
    try:
        return pool.submit(ask)
    finally:
        pool.shutdown(wait=False)


def _held_types(keys: list, dask_scheduler: Any = None) -> tuple[list, list]:
    """On the scheduler: the first worker holding each key (:func:`.placement._held_where`)
    and the name of its value's type (as the workers reported it), in one round trip."""
    holders = _held_where(keys, dask_scheduler)[0]
    return holders, [getattr(dask_scheduler.tasks.get(k), "type", None) for k in keys]


def _cupy_like(values: da.Array, types: list) -> Any:
    """An empty CuPy array where ``values`` declares NumPy chunks but every chunk the workers
    hold is CuPy (``types``: their type names), else None. Dask's ``x[m]`` declares NumPy
    chunks whatever x's are, so a sort of a selection of CuPy data took the chunks for NumPy
    ones: the CUDA IPC exchange was refused ("the chunks are not CuPy arrays") for a slower
    one, and the result declared NumPy chunks it did not hold. None also where this process
    cannot import CuPy (the declaration stays as it is)."""
    if _is_cupy(values._meta) or not types:
        return None
    if not all(isinstance(t, str) and t.split(".")[0] == "cupy" for t in types):
        return None
    try:
        import cupy
    except ImportError:
        return None
    return cupy.empty((0,), values.dtype)


def _declared_like(a: da.Array, like: Any) -> da.Array:
    """``a`` declared of ``like``'s array type (its chunks already are)."""
    return da.Array(a.dask, a.name, chunks=a.chunks,
                    meta=np.empty_like(like, shape=(0,), dtype=a.dtype))


def _probes(answers: dict) -> dict:
    return {w: a if isinstance(a, dict) else None for w, a in answers.items()}


def exchange_groups(values: da.Array, counts: np.ndarray, totals: np.ndarray,
                    item_bytes: int = 0, asked: concurrent.futures.Future | None = None,
                    ) -> tuple[np.ndarray, list, list | None]:  # fmt: skip
    """How the exchange is cut: the group of each bucket, the worker each group's merges run
    on (``[None]``: one group, no placement), and, where the merges copy their pieces over
    CUDA IPC, the worker holding each chunk (else None; ``item_bytes``: the bytes an element
    of the output and its sort need; ``asked``: :func:`ask_ahead`'s answer, else the
    scheduler and workers are asked now).

    Without a cluster, or on one worker: one group, the merges read their pieces from the
    chunks. On a cluster of several workers (the sorted chunks are futures), the config
    ``dask-compact.sort.exchange`` decides:

    * ``"ipc"``: one group per worker (placed as ``"worker"``); each worker packs its slices
      for each group into allocations of 256 MiB, kept on its GPU until the merges have run,
      and each
      merge copies its pieces straight from the other workers' GPUs (CUDA IPC,
      :mod:`.backends.cuda_ipc`): CuPy chunks, workers of one host whose GPUs reach each
      other peer to peer, memory that can be exported (not RMM's ``cudaMallocAsync`` pool),
      and room on each GPU for its packs and merges;
    * ``"worker"``: one group per worker holding chunks, each given to the worker that holds
      most of its elements; each chunk sends one slice per group (chunks x workers transfers);
    * ``"bucket"``: one group per bucket, placed by the scheduler; each chunk sends one piece
      per bucket (chunks x buckets transfers);
    * ``"auto"`` (default): ``"ipc"`` where it can run, else ``"worker"`` over UCX and
      ``"bucket"`` otherwise. Measured on H200s (dask-cuda, 2^32 float32 per GPU, 16 chunks per
      GPU, docs/design.md): over UCX, 2 GPUs sorted in 0.92-1.11 s by workers against 1.68 s
      by buckets; over TCP, which stages every transfer through host memory, the few large
      slices took 15.6 s against 3.0-8.6 s for the many pieces.
    """
    mode = settings.get("sort.exchange")
    one = (np.zeros(totals.size, np.int64), [None], None)
    blocks = _futures(values)
    if blocks is None:
        return one
    client = blocks[0].client
    if asked is not None:
        holders, probes, _ = asked.result()
    else:
        (holders, *_), probes = client.run_on_scheduler(_held_where, [b.key for b in blocks]), None
    workers = sorted({h for h in holders if h is not None})
    if len(workers) < 2:
        return one
    group, where = _by_worker(holders, workers, counts, totals)
    if mode in ("auto", "ipc"):
        why = _ipc_refusal(client, values, group, where, holders, counts, item_bytes, probes)
        if why is None:
            return group, where, holders
        if mode == "ipc":
            raise ValueError(f"dask-compact.sort.exchange is 'ipc', but CUDA IPC cannot run "
                             f"here: {why}; set it to 'auto'")  # fmt: skip
        mode = "worker" if workers[0].startswith(("ucx://", "ucxx://")) else "bucket"
    if mode == "bucket":
        return np.arange(totals.size, dtype=np.int64), [None] * totals.size, None
    return group, where, None


def _by_worker(holders: list, workers: list, counts: np.ndarray,
               totals: np.ndarray) -> tuple[np.ndarray, list]:  # fmt: skip
    """One group of consecutive buckets per worker, each given to the worker that holds most
    of its elements."""
    group = bucket_groups(totals, min(len(workers), int(np.count_nonzero(totals))))
    ngroups = int(group.max()) + 1
    held = np.zeros((ngroups, len(workers)))  # elements of each group on each worker
    col = {w: i for i, w in enumerate(workers)}
    for c, h in enumerate(holders):
        if h is not None:
            np.add.at(held[:, col[h]], group, counts[c])
    where: list = [None] * ngroups
    free = set(range(len(workers)))
    for g in np.argsort(-held.max(axis=1), kind="stable"):  # the most decided groups first
        w = max(free, key=lambda i: (held[g, i], -i))
        where[int(g)] = workers[w]
        free.discard(w)
    return group, where


def _ipc_refusal(client: Any, values: da.Array, group: np.ndarray, where: list, holders: list,
                 counts: np.ndarray, item_bytes: int,
                 probes: dict | None = None) -> str | None:  # fmt: skip
    """Why the merges cannot copy their pieces over CUDA IPC here (None: they can). Every
    worker is asked (a merge may move to any), in one round trip, unless ``probes`` holds
    their answers already."""
    if not _is_cupy(values._meta):
        return "the chunks are not CuPy arrays"
    if any(h is None for h in holders):
        return "a sorted chunk is held by no worker (lost, and being recomputed)"
    from .backends import cuda_ipc

    if probes is None:
        probes = _probes(client.run(cuda_ipc.probe, on_error="return"))
    totals = counts.sum(axis=0)
    need: dict[str, int] = {}
    for c, h in enumerate(holders):  # its packs (its sorted chunks are freed once packed)
        need[h] = need.get(h, 0) + int(counts[c].sum()) * item_bytes
    for g, w in enumerate(where):
        mine = totals[group == g]
        if mine.size:  # the outputs it keeps, and the largest merge's buffers while it sorts
            n = int(mine.sum()) + 3 * int(mine.max())
            need[w] = need.get(w, 0) + n * item_bytes
    return cuda_ipc.ipc_refusal(probes, need)


def _local_sorts(x: da.Array, indices: bool, per: int, local: str, checked: bool,
                 token: str, defer: str = "",
                 ) -> tuple[dict[str, da.Array], np.ndarray | None, tuple[int, ...]]:
    """Step 1 over chunks of known sizes: every chunk sorted (and its global indices) and
    persisted where it ran; returns them ("values", "indices"), the gathered sample and
    the sizes. ``defer``: chunks of the type it names are held unsorted (:func:`_held_unsorted`,
    :class:`Unsorted`); where every chunk was, the sample is None."""
    sizes = tuple(int(c) for c in x.chunks[0])
    starts = _starts(sizes)
    tasks = [(_local_sort, (x.name, c), indices, int(starts[c]), sample_positions(m, per),
              local, None if checked else x.dtype, c, (m,), defer)
             for c, m in enumerate(sizes)]
    sample_chunks = (tuple(min(m, per) for m in sizes),)
    held, drawn = _persisted_parts(x, indices, token, tasks, x.chunks, sample_chunks,
                                   np.empty(0, x.dtype))
    if _unsorted_sizes(drawn) is not None:
        return held, None, sizes
    return held, np.concatenate(drawn), sizes


def _local_sorts_sized(x: da.Array, indices: bool, per: int, local: str, checked: bool,
                       token: str, defer: str = "",
                       ) -> tuple[dict[str, da.Array], np.ndarray | None, tuple[int, ...]]:
    """Step 1 over chunks of unknown sizes (:func:`_local_sort_sized`): as
    :func:`_local_sorts`, each chunk's sample drawn with its length, the indices counted
    from 0 (no start is known yet), and the held chunks given the sizes found."""
    tasks = [(_local_sort_sized, (x.name, c), indices, per, local,
              None if checked else x.dtype, c, defer) for c in range(x.numblocks[0])]
    held, drawn = _persisted_parts(x, indices, token, tasks, x.chunks, x.chunks,
                                   np.empty(0, dtype=object))
    unsorted = _unsorted_sizes(drawn)
    sizes = unsorted if unsorted is not None else tuple(int(n) for _, n in drawn)
    for what, a in held.items():
        held[what] = da.Array(a.dask, a.name, chunks=(sizes,), meta=a._meta)
    if unsorted is not None:
        return held, None, sizes
    return held, np.concatenate([s for s, _ in drawn]), sizes


def _persisted_parts(x: da.Array, indices: bool, token: str, tasks: list, chunks: tuple,
                     sample_chunks: tuple, sample_meta: Any) -> tuple[dict[str, da.Array], list]:
    """The local sorts ``tasks`` (one per chunk of ``x``) persisted as their sorted values
    (and indices) and gathered as their slot 2 (what comes to the client: the sample),
    every chunk's."""
    p1 = f"sort-local-{token}"
    deps: list[Any] = [x]  # dask's typing does not count Array
    layer: dict[Any, Any] = {(p1, c): task for c, task in enumerate(tasks)}
    graph = HighLevelGraph.from_collections(p1, layer, dependencies=deps)
    nin = len(tasks)
    get = _local_get(x)
    if get is not None:
        return _computed_parts(graph, p1, nin, get, x, indices, token, chunks)
    parts = {}
    for slot, what, meta, parts_chunks in (
        (0, "values", _meta(x, x.dtype), chunks),
        (1, "indices", _meta(x, np.dtype(np.int64)), chunks),
        (2, "sample", sample_meta, sample_chunks),
    ):
        if what == "indices" and not indices:
            continue
        name = f"sort-{what}-{token}"
        g = _extend(graph, name, {(name, c): (operator.getitem, (p1, c), slot)
                                  for c in range(nin)}, {p1})  # fmt: skip
        parts[what] = da.Array(g, name, chunks=parts_chunks, meta=meta)
    held = dict(zip(parts, client_stream.persist(*parts.values())))
    drawn = _blocks(held.pop("sample"))  # no graph right behind the one just sent
    return held, drawn


def _computed_parts(graph: HighLevelGraph, p1: str, nin: int, get: Any, x: da.Array,
                    indices: bool, token: str, chunks: tuple) -> tuple[dict[str, da.Array], list]:
    """:func:`_persisted_parts` under dask's threaded or synchronous scheduler (``get``): the
    local sorts computed in one ``get`` and their parts held in the arrays' graphs, as a
    local persist holds its results, without persist's getitem task per chunk and part
    (a third of the tasks it ran over the local sorts) and its handling of three
    collections."""
    keys = [(p1, c) for c in range(nin)]
    out = get(da.Array.__dask_optimize__(graph, keys), keys)
    held = {}
    for slot, what, dtype in ((0, "values", x.dtype), (1, "indices", np.dtype(np.int64))):
        if what == "indices" and not indices:
            continue
        name = f"sort-{what}-{token}"
        held[what] = da.Array({(name, c): out[c][slot] for c in range(nin)}, name,
                              chunks=chunks, meta=_meta(x, dtype))
    return held, [part[2] for part in out]


def _blocks(persisted: da.Array) -> list:
    """The chunks of a persisted array: gathered from the workers, or where a local scheduler
    persisted it, the ones its graph holds."""
    drawn = client_stream.gather(persisted)
    if drawn is not None:
        return drawn
    return [persisted.dask[k] for k in persisted.__dask_keys__()]


def _sized(result: da.Array) -> da.Array:
    """A persisted 1-D result of unknown chunk sizes, given the ones its chunks have."""
    rows = _held_counts(result)
    if rows is None:
        lengths = da.map_blocks(lambda b: np.array([_rows(b)], np.int64), result,
                                chunks=((1,) * result.numblocks[0],), dtype=np.int64,
                                meta=np.empty(0, np.int64))
        sizes = tuple(int(n) for n in lengths.compute())
    else:
        sizes = tuple(int(n) for n in rows[:, 0])
    return da.Array(result.dask, result.name, chunks=(sizes,), meta=result._meta)


def one_device(x: da.Array) -> bool:
    """Whether the whole sort runs on one device: CuPy chunks (as ``x`` declares them) under
    dask's threaded or synchronous scheduler, one process and CuPy's current GPU. There the
    sample sort's buckets buy nothing that the library's one sort of the joined chunks does
    not: on one H100 (2026-12-07, ``sort-selection-2026-12-07-...-9685a56.md``)
    ``sort(x[x < 0.5])`` of 2^28 float32 in 8 chunks took 76 ms through 8 buckets, where
    ``cupy.sort(x[x < 0.5].compute())`` took 22 ms. Chunks declared NumPy count as CuPy
    where the graph holds CuPy chunks (:func:`_holds_cupy_chunks`: dask's boolean indexing
    declares NumPy chunks for CuPy ones). NumPy chunks keep the buckets: under the
    threaded scheduler their local sorts and merges run on every core."""
    return (_is_cupy(x._meta) or _holds_cupy_chunks(x)) and _local_get(x) is not None


def _holds_cupy_chunks(x: da.Array) -> bool:
    """Whether ``x``'s graph holds CuPy chunks in memory (a persisted input under an
    in-process scheduler), though ``x`` declares NumPy ones: dask's boolean indexing makes
    its result of a dtype alone (``slice_with_bool_dask_array``), so ``x[x < p]`` of CuPy
    data says NumPy. The one-device sort was then left to users who re-declared the meta by
    hand (as benchmarks/sort_selection.py did); as written, ``sort(x[x < 0.5])`` took the
    buckets (76 ms on one H100 against 15 ms). Only where CuPy is imported: nothing else can
    have made a CuPy chunk."""
    if "cupy" not in sys.modules:
        return False
    graph = x.__dask_graph__()
    for layer in getattr(graph, "layers", {}).values():
        if not isinstance(layer, MaterializedLayer):
            continue  # tasks (Blockwise and the like), not data
        for value in layer.mapping.values():
            value = getattr(value, "value", value) if _is_data_node(value) else value
            if _is_cupy(value):
                return True
    return False


def _is_data_node(value: Any) -> bool:
    """Whether ``value`` is dask's wrapper of a literal in a graph (``DataNode``)."""
    return type(value).__name__ == "DataNode" and type(value).__module__.startswith("dask")


def _local_get(x: da.Array) -> Any:
    """The scheduler ``x`` runs under where it is dask's threaded or synchronous one (one
    process: the caller's), else None (a cluster's, or processes)."""
    import dask.local
    import dask.threaded
    from dask.base import get_scheduler

    get = get_scheduler(collections=[x])
    return get if get is dask.threaded.get or get is dask.local.get_sync else None


def _joined(x: da.Array, checked: bool, one_task: bool = False) -> da.Array:
    """``x`` in one chunk, each chunk taken in x's declared dtype first unless ``checked``:
    dask's rechunk where the sizes are known (:func:`declared_chunks` checks each chunk
    before), else, or where asked (``one_task``: chunks of another type than x declares),
    one task joining them by their own type's concatenate (dask cannot rechunk sizes it
    does not know)."""
    if not (math.isnan(x.shape[0]) or one_task):
        return declared_chunks(x, checked).rechunk({0: -1})
    name = f"sort-joined-{tokenize(x.name, checked)}"
    layer = {(name, 0): (_concatenated, [(x.name, c) for c in range(x.numblocks[0])],
                         None if checked else x.dtype)}
    return da.Array(_extend(x.dask, name, layer, {x.name}), name, chunks=((x.shape[0],),),
                    meta=x._meta)


def _concatenated(blocks: list, declared: np.dtype | None) -> Any:
    """The chunks ``blocks`` joined (by dask's dispatch on their type), each taken in the
    ``declared`` dtype first (None: taken so before)."""
    from dask.array.dispatch import concatenate_lookup

    if declared is not None:
        blocks = [as_declared(b, declared, "sort", c) for c, b in enumerate(blocks)]
    return concatenate_lookup.dispatch(type(blocks[0]))(blocks)


def empty_sorted(x: da.Array, indices: bool) -> da.Array:
    """The sort (or argsort) of no elements: one chunk of length 0 of x's chunk type."""
    dtype = np.dtype(np.int64) if indices else x.dtype
    empty = np.empty_like(x._meta, shape=(0,), dtype=dtype)
    return da.from_array(empty, chunks=(0,), meta=empty)


def build_sort(x: da.Array, indices: bool, buckets: int | None, local: str = "auto",
               graph_input: bool = True, checked: bool = False) -> da.Array:  # fmt: skip
    """Sorted values (``indices=False``) or the stable argsort of 1-D ``x`` (at least one
    element where its chunk sizes are known): a persisted array with one chunk per non-empty
    bucket. ``buckets``: as asked (None: the default, :func:`resolve_buckets` once the sizes
    are known). ``local``: what sorts and merges within a chunk or bucket
    (``sorting.LOCAL_SORTS``); ``graph_input``: whether the caller's array (``x`` before it
    was joined, cast or keyed) is a graph, not persisted. Once this returns, nothing of such
    an input is held or still to run on the cluster: the general path's local sorts have
    run (their sample is gathered), the one-bucket path waits for its sort. ``checked``: x's
    chunks are in its declared dtype already (a step before took each through
    validate.as_declared: the cast to native byte order, a join of small chunks, the time
    keys), else the first step that reads a chunk takes it so: each chunk is checked once.

    Chunk sizes unknown at graph time (``x[x > t]``) are what the local sorts find: each
    reports its chunk's length with its sample, and the rest runs as for known sizes."""
    nin = x.numblocks[0]
    unknown = math.isnan(x.shape[0])
    default = buckets is None
    in_process = _local_get(x) is not None  # dask's threaded or synchronous scheduler
    shape = None  # a cluster of CPU workers, where the default is sort_cluster's
    if default and one_device(x):
        buckets = 1
    elif default and not in_process:
        shape = cluster_shape(x)
    if not unknown:
        buckets = resolve_buckets(buckets, int(x.shape[0]), nin)
        if shape is not None:
            buckets = cluster_buckets(buckets, int(x.shape[0]), x.dtype.itemsize, indices,
                                      shape)
    if buckets == 1 or (unknown and nin == 1):
        # one bucket is the whole array in one place whatever the path: its chunks joined
        # and sorted at once, not sorted, sampled, cut and merged into one (200,000 float64
        # in 1,000 chunks: 1.0 s that way); chunks to be joined are checked as they are
        whole = _sort_one_chunk(x if nin == 1 else _joined(x, checked), indices, local,
                                graph_input, checked or nin > 1)
        return _sized(whole) if unknown else whole
    # unknown sizes: a sample for the most buckets the sizes could give (more than needed
    # only sharpens the splitters)
    per = per_chunk_sample(nin, buckets or default_buckets(2**62, nin))
    form = input_form(x)
    token = tokenize("dask-compact-sort", x.name, indices, buckets, per, local, form,
                     computed_call(False, form))

    # 1. local sort + sample, persisted. Under an in-process scheduler with the buckets
    # left to us, a CuPy chunk is held unsorted (one device after all: a selection of CuPy
    # data not persisted, whose x[m] declares NumPy chunks), and such chunks are sorted
    # once, joined, as one_device's are. On a cluster of CPU workers a NumPy chunk of
    # unknown size is held unsorted too: the sizes then say whether one bucket takes the
    # whole array (sort_cluster), else the held chunks are sorted and sampled in a second
    # step (one more round trip).
    defer = ""
    if default and in_process:
        defer = "cupy"
    elif shape is not None and unknown:  # shape: asked only where the default applies
        defer = "numpy"
    held, sample, sizes = (_local_sorts_sized if unknown else _local_sorts)(
        x, indices, per, local, checked, token, defer)
    if sample is None:
        total = sum(sizes)
        if not total:
            return empty_sorted(x, indices)
        if shape is None or one_bucket(total, x.dtype.itemsize, indices, shape):
            joined = _joined(held["values"], True, one_task=True)
            return _sort_one_chunk(joined, indices, local, False, True)
        buckets = cluster_buckets(resolve_buckets(None, total, nin), total,
                                  x.dtype.itemsize, indices, shape)
        per = per_chunk_sample(nin, buckets)
        token = tokenize(token, "held", buckets, per)
        unsorted = held["values"]
        del held
        held, sample, sizes = _local_sorts(unsorted, indices, per, local, True, token)
        del unsorted
        unknown = False  # the held chunks' sizes are known: their indices are global
    starts = _starts(sizes)
    if unknown:
        if not sum(sizes):
            return empty_sorted(x, indices)
        buckets = resolve_buckets(buckets, sum(sizes), nin)
        if indices:  # the local sorts' indices counted from 0: their chunks' starts now
            held["indices"] = shifted(held["indices"], starts, f"sort-indices-at-{token}")
    asked = ask_ahead(held["values"])  # the sorted chunks are in memory now

    # 2. splitters, 3. histogram: where each bucket starts in each chunk
    assert buckets is not None and sample is not None  # resolved above, with the sizes
    split_v, split_i = splitters(sample, sizes, per, buckets)
    values = held["values"]
    if split_v.size:
        bname, sname = f"sort-bounds-{token}", f"sort-splitters-{token}"
        # once, not in every task; made by a builtin: a task of this module's could land on
        # a worker that has not imported it yet (no input ties it to one), which then
        # imported dask_compact first: ~1 s of every call until each worker had run one
        # (4 workers x 4 threads, 2^22 float32 in 2 chunks: 1.1-2.0 s where 0.1-0.2 s)
        blayer: dict[Any, Any] = {sname: (tuple, [split_v, split_i])}
        blayer.update({(bname, c, 0): (_bounds, (values.name, c), sname, int(starts[c]))
                       for c in range(nin)})
        # Last chunk first: the chunks sorted last are the ones still in memory where the
        # workers spilled (least recently used first), so a pass in the same order would
        # find every chunk spilled just before its turn.
        priority = {"priority": lambda k: k[1] if isinstance(k, tuple) else nin}
        bg = _extend(values.dask, bname, MaterializedLayer(blayer, annotations=priority),
                     {values.name})
        inner = da.Array(bg, bname, chunks=((1,) * nin, (split_v.size,)), dtype=np.int64)
        # persisted then gathered, as the sample: a graph sent at once (see .client_stream)
        (inner,) = client_stream.persist(inner, optimize_graph=False)  # keeps the priorities
        rows = client_stream.gather(inner)
        inner_np = np.asarray(np.concatenate(rows) if rows else inner.compute(),
                              dtype=np.int64).reshape(nin, split_v.size)
        del inner, bg, rows  # their graphs hold the sorted chunks' futures
    else:
        inner_np = np.zeros((nin, 0), np.int64)
    bounds = np.column_stack([np.zeros(nin, np.int64), inner_np, np.asarray(sizes, np.int64)])
    counts = np.diff(bounds, axis=1)  # chunks x buckets
    totals = counts.sum(axis=0)

    # 4. one slicing task per chunk and group of buckets, one merge per non-empty bucket
    like = None if asked is None else asked.result()[2]
    if like is not None:  # CuPy chunks declared NumPy (dask's x[m] of CuPy data): say so
        values = _declared_like(values, like)
        if indices:
            held["indices"] = _declared_like(held["indices"], like)
    sources = {"values": values, **({"indices": held["indices"]} if indices else {})}
    item_bytes = x.dtype.itemsize + (16 if indices else 0)  # output, keys + indices, argsort
    group, where, holders = exchange_groups(values, counts, totals, item_bytes, asked)
    # The exchange's keys name its cut too: the same input cut another way (another
    # exchange mode, or its chunks held by other workers) is another graph, which under the
    # same keys distributed warns of ("Detected different run_spec") and may mix with the
    # first one's pieces where both are alive. And its bounds: the merges' run specs check
    # them once remade (.remade.expect_sorted), so another call that cut the same input's
    # name elsewhere (a store rewritten in place, read again) must not take this one's keys.
    token = tokenize(token, group, where, holders, bounds)
    out = f"sort-{'indices' if indices else 'values'}-out-{token}"
    if holders is not None:
        result, finish = _exchange_ipc(list(sources.values()), bounds, group, where, holders,
                                       out, token, local,
                                       _meta(values, np.dtype(np.int64) if indices else x.dtype))
        # Hold no sorted chunk while the exchange runs: each is freed once it is packed
        del held, values, sources
        return finish(result)
    pieces: dict[str, dict] = {f"sort-piece-{k}-{token}": {} for k in sources}
    merges: dict[Any, Any] = {}
    merge_worker: dict[Any, str] = {}
    chunks: list[int] = []
    checks: dict[Any, tuple] = {}  # merge key -> how its pieces are cut (.remade.checked_sort)
    single = len(where) == 1  # one group: the merges read their pieces from the chunks
    for j in map(int, np.flatnonzero(totals)):
        grp = int(group[j])
        first = int(np.searchsorted(group, grp))  # the group's buckets: where its slices lie
        last = int(np.searchsorted(group, grp, side="right"))
        keys: dict[str, list] = {name: [] for name in pieces}
        cuts, based = [], []
        for c in map(int, np.flatnonzero(counts[:, j])):
            lo = 0 if single else int(bounds[c, first])
            cuts.append((int(bounds[c, j]) - lo, int(bounds[c, j + 1]) - lo))
            based.append((int(starts[c]) + lo, *cuts[-1]))
            for (name, tasks), arr in zip(pieces.items(), sources.values()):
                if single:
                    keys[name].append((arr.name, c))
                    continue
                tasks[(name, c, grp)] = (_piece, (arr.name, c), lo, int(bounds[c, last]))
                keys[name].append((name, c, grp))
        vkeys, *ikeys = keys.values()
        key = (out, len(chunks))
        merges[key] = (_merge, vkeys, ikeys[0] if ikeys else None, cuts, local)
        checks[key] = (vkeys, _edges(split_v, split_i, j), based)
        if where[grp] is not None:
            merge_worker[key] = where[grp]
        chunks.append(int(totals[j]))
    graph = HighLevelGraph.merge(*[a.dask for a in sources.values()])
    for (name, tasks), arr in zip(pieces.items(), sources.values()):
        if not single:
            # Chunk by chunk: every piece of chunk c before any of chunk c + 1. Left to
            # itself the scheduler went bucket by bucket, touching every chunk once per bucket:
            # where the chunks did not fit the workers' memory, each bucket brought every
            # spilled chunk back (2x H100, 1.5x one GPU's memory: over 400 s, unfinished).
            cut = MaterializedLayer(tasks, annotations={"priority": lambda k: nin - k[1]})
            graph = _extend(graph, name, cut, {arr.name})
    # A group's merges run on its worker (loosely: another may take them if it is gone), so
    # each chunk's slice for the group travels once and every merge finds its pieces there.
    annotations = ({"workers": lambda k: [merge_worker[k]], "allow_other_workers": True}
                   if merge_worker else None)
    on = {a.name for a in sources.values()} if single else set(pieces)
    graph = _extend(graph, out, MaterializedLayer(merges, annotations=annotations), on)
    dtype = np.dtype(np.int64) if indices else x.dtype
    result = da.Array(graph, out, chunks=(tuple(chunks),), meta=_meta(values, dtype))
    # Not optimized: dask.array's low-level optimization makes a plain dict of the graph, which
    # drops the merges' worker annotations (the graph holds only these layers over persisted
    # chunks, so there is nothing to cull or fuse).
    (result,) = client_stream.persist(result, optimize_graph=False)
    remade.expect_sorted_from(result, checks, "argsort" if indices else "sort")
    return result


def _edges(split_v: np.ndarray, split_i: np.ndarray, j: int) -> tuple:
    """The splitters bounding bucket ``j`` (values, global indices) and where each cuts its
    pieces (0: the bucket's start, 1: its end), for :func:`.remade.checked_sort`."""
    lo, hi = max(j - 1, 0), min(j + 1, split_v.size)
    at = ((0,) if j > 0 else ()) + ((1,) if j < split_v.size else ())
    return split_v[lo:hi], split_i[lo:hi], at


def _exchange_ipc(sources: list, bounds: np.ndarray, group: np.ndarray, where: list,
                  holders: list, out: str, token: str, local: str,
                  meta: Any) -> tuple[da.Array, Any]:  # fmt: skip
    """Step 4 over CUDA IPC: one pack task per worker and group of buckets (on the worker
    holding the chunks: their slices for the group in one array, kept on its GPU), one merge
    per non-empty bucket on its group's worker, copying its pieces from the packs. Returns the
    persisted output and ``finish``, which waits for the merges, then releases the packs (see
    :mod:`.backends.cuda_ipc` for why Dask's store cannot hold them) and returns the output."""
    import distributed

    from .backends import cuda_ipc

    # Each call exports under its own name: two calls that sort the same array (same keys
    # otherwise) must not release each other's packs.
    call = f"{token}-{uuid.uuid4().hex[:12]}"
    pname = f"sort-pack-{call}"
    # The output's keys are the call's too: its graph names this call's packs, and a result
    # of an earlier call on the same array may still be held under the token's keys (the
    # scheduler keeps the old task and warns of a changed run_spec).
    out = f"{out}-{call[len(token) + 1:]}"
    workers = sorted(set(holders))
    windex = {w: i for i, w in enumerate(workers)}
    ngroups = len(where)
    first = np.searchsorted(group, np.arange(ngroups))  # each group's buckets: first..last-1
    last = np.searchsorted(group, np.arange(ngroups), side="right")
    packs: dict[Any, Any] = {}
    pack_worker: dict[Any, str] = {}
    at: dict[tuple[int, int], int] = {}  # (chunk, group) -> where its slice starts in its pack
    for wi, w in enumerate(workers):
        mine = [c for c, h in enumerate(holders) if h == w]
        for g in range(ngroups):
            cuts, n = [], 0
            for c in mine:
                lo, hi = int(bounds[c, first[g]]), int(bounds[c, last[g]])
                if hi > lo:
                    at[c, g] = n
                    cuts.append((c, lo, hi))
                    n += hi - lo
            if not cuts:
                continue
            key = (pname, wi, g)
            packs[key] = (_pack, call, wi * ngroups + g,
                          [(sources[0].name, c) for c, _, _ in cuts],
                          [(sources[1].name, c) for c, _, _ in cuts] if len(sources) > 1
                          else None, [(lo, hi) for _, lo, hi in cuts])  # fmt: skip
            pack_worker[key] = w
    merges: dict[Any, Any] = {}
    placed: dict[Any, str] = {}
    chunks: list[int] = []
    for j in _nonempty(bounds):
        g = int(group[j])
        keys: dict = {}  # the packs this merge reads -> their position in its argument list
        pieces = []
        for c in map(int, np.flatnonzero(bounds[:, j + 1] > bounds[:, j])):
            k = keys.setdefault((pname, windex[holders[c]], g), len(keys))
            start = at[c, g] + int(bounds[c, j] - bounds[c, first[g]])
            pieces.append((k, start, start + int(bounds[c, j + 1] - bounds[c, j])))
        mkey = (out, len(chunks))
        merges[mkey] = (_merge_joined, list(keys), pieces, len(sources) == 2, local)
        placed[mkey] = where[g]
        chunks.append(int(bounds[:, j + 1].sum() - bounds[:, j].sum()))
    graph = HighLevelGraph.merge(*[a.dask for a in sources])
    # Packs before merges on every worker: a group's merges wait for every worker's pack of
    # that group, so a worker that ran its own merges as soon as they were ready (Dask's
    # order put them first) kept the others waiting for its remaining packs (4 H100s, one
    # call under the task stream: packs spread over 0.25 s, merges over 0.42 s).
    on_holder = {"workers": lambda k: [pack_worker[k]], "allow_other_workers": True,
                 "priority": 1}
    graph = _extend(graph, pname, MaterializedLayer(packs, annotations=on_holder),
                    {a.name for a in sources})  # fmt: skip
    on_group = {"workers": lambda k: [placed[k]], "allow_other_workers": True}
    graph = _extend(graph, out, MaterializedLayer(merges, annotations=on_group), {pname})
    result = da.Array(graph, out, chunks=(tuple(chunks),), meta=meta)
    client = distributed.futures_of(sources[0])[0].client
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            answers = client.run(cuda_ipc.release, call, on_error="return")
            failed = {w: a for w, a in answers.items() if isinstance(a, BaseException)}
            if failed:  # the result stands; what failed to free leaks device memory
                warnings.warn(f"sort: releasing the exchange's packs failed on {failed}",
                              RuntimeWarning, stacklevel=3)  # fmt: skip

    try:
        (result,) = client_stream.persist(result, optimize_graph=False)  # see build_sort
    except BaseException:
        release()
        raise

    def finish(result: da.Array) -> da.Array:
        try:
            distributed.wait(distributed.futures_of(result))
        finally:
            # Every merge has finished (or failed, or this call was interrupted: then nobody
            # keeps its output): no copy reads the packs any more.
            release()
        return result

    return result, finish


def _nonempty(bounds: np.ndarray) -> list[int]:
    """The buckets holding at least one element."""
    return [int(j) for j in np.flatnonzero((bounds[:, 1:] - bounds[:, :-1]).sum(axis=0))]
