"""Distributed sort of 1-D dask arrays: :func:`sort` and :func:`argsort` (sample sort with
known output chunk sizes; the graphs are in :mod:`.sort_graph`).

The module is not called ``sort``: importing a submodule binds its name on the package, and
``dask_compact.sort`` must stay the function.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from . import call_client, client_stream, settings
from .api import _native
from .backends.split_radix import order_key
from .graph import input_form, without_empty_chunks
from .sort_graph import EXCHANGES, build_sort, empty_sorted, join_small_chunks
from .validate import (
    as_declared_block,
    check_chunk_type,
    check_dask_input,
    native,
    xarray_object,
)

__all__ = ["sort", "argsort", "LOCAL_SORTS", "SORT_DTYPES"]

# What sorts each chunk and merges each bucket (``local=``): "auto" is NumPy's sort on NumPy
# chunks (its stable argsort, or a sort of packed keys where that measured faster) and CuPy's
# on CuPy chunks; "radix" the seed's LSD radix sort built from our stable split
# (backends/split_radix.py), on either.
LOCAL_SORTS = ("auto", "radix")
SORT_DTYPES = tuple(
    np.dtype(t)
    for t in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64",
    )
)  # fmt: skip


def sort(x: da.Array, *, local: str = "auto", buckets: int | None = None) -> da.Array:
    """Sort a 1-D dask array across the cluster; the result has **known chunk sizes**.

    A sample sort: each chunk is sorted where it lives and persisted there; a small sample of
    every sorted chunk comes to the client, which picks splitters; one small task per chunk
    counts its elements per bucket; the client scans those counts (the output chunk sizes),
    and each output chunk is merged from its piece of every chunk. No step gathers more than
    one worker's share in one place. The result is persisted (nothing is recomputed from ``x``).

    On a cluster the pieces travel between workers. GPU workers of one host (dask-cuda's
    ``LocalCUDACluster``, CuPy's memory pool) copy them GPU to GPU over CUDA IPC whatever the
    protocol, and ``sort`` then returns once its merges are done (the shared memory is freed
    then): on 4 H100s, 2^34 float32 in 0.91 s over TCP, 0.95 s over UCX. Elsewhere they go
    through Dask's comm: start dask-cuda with ``protocol="ucx"`` (the ``ucx`` extra) so they
    go GPU to GPU; over TCP they are staged through host memory and sockets (16 s for the
    same sort). The config ``dask-compact.sort.exchange`` (``"auto"``, ``"ipc"``,
    ``"worker"``, ``"bucket"``) sets how the exchange is cut; ``"auto"`` takes ``"ipc"`` where
    it can run, else chooses by the protocol (see ``docs/design.md``).

    Arrays larger than the workers' memory sort where the workers spill: the cluster holds
    about one copy of the data at a time (each chunk is released once cut into its pieces).
    On GPUs that is dask-cuda's ``device_memory_limit``, with CuPy allocating from the same
    RMM pool the workers use to bring spilled chunks back
    (``LocalCUDACluster(device_memory_limit=..., rmm_async=True,
    rmm_allocator_external_lib_list=["cupy"])``): 119 GiB, 1.5x one H100's memory, sorted on
    two H100s in 157 s over TCP.

    Parameters
    ----------
    x : dask.array.Array
        1-D, NumPy or CuPy chunks of bool, (u)int8..64 or float16/32/64, or NumPy chunks of
        datetime64 / timedelta64 (any unit). Its chunk sizes may be unknown (``x[x > t]``,
        a lazy compaction's): each local sort finds its chunk's length, and the result's
        sizes are known all the same; small chunks are then not joined first.
    local : {"auto", "radix"}
        The sort of each chunk and bucket: ``"auto"``, ``np.sort`` for NumPy chunks,
        ``cupy.sort`` for CuPy chunks; ``"radix"``, the LSD radix sort built from
        :func:`dask_compact.partition_array` (one stable split per key bit: the textbook
        construction, slower than either, kept for comparison).
    buckets : int, optional
        How many output chunks to aim for. Default: as many as ``x`` has chunks, but no
        fewer than 65,536 elements a bucket on average and no more than 16,384 pieces
        (chunks x buckets) in the exchange (the config ``dask-compact.sort.min-bucket`` and
        ``max-pieces``), since every chunk sends a piece to every bucket; chunks under a
        quarter of ``min-bucket`` on average are joined into chunks of ``min-bucket`` first,
        and one bucket is the whole array sorted as one chunk. CuPy chunks under the
        threaded or synchronous scheduler (one process, one GPU) default to one bucket:
        there the library's one sort of the joined chunks is faster than any exchange
        (2^28 float32 on one H100: 22 ms against 76 ms for 8 buckets). That holds too for
        CuPy chunks that ``x`` declares NumPy (dask's ``x[x > t]`` of CuPy data): found as
        they are made, and sorted once, joined. Splitting is by (value,
        index), so repeated values do not unbalance the buckets; empty buckets are left out
        (and more buckets than elements are as many as the elements).

    Returns
    -------
    dask.array.Array
        ``np.sort(np.asarray(x))``: NaNs (and NaTs) last, same dtype (in native byte order,
        as ``map_compact``'s values) and chunk type.

    Raises
    ------
    TypeError
        ``x`` is not a dask array, or its dtype or chunk type is not supported, or its
        chunks are of two types (CuPy and NumPy) in one array.
    ValueError
        ``x`` is not 1-D, or ``local``/``buckets`` is invalid.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import dask_compact
    >>> x = da.from_array(np.array([5., np.nan, -1., 3., 3., 0.]), chunks=2)
    >>> y = dask_compact.sort(x)
    >>> y.compute()
    array([-1.,  0.,  3.,  3.,  5., nan])
    >>> sum(y.chunks[0])
    6
    """
    settings.warn_unknown()
    return _sorted(x, local, buckets, indices=False, fn="sort")


def argsort(x: da.Array, *, local: str = "auto", buckets: int | None = None) -> da.Array:
    """Global int64 indices that sort a 1-D dask array, stably; **known chunk sizes**.

    Equals ``np.argsort(np.asarray(x), kind="stable")``: equal values (all NaNs are equal, and
    -0.0 equals 0.0) come out in index order. Same algorithm and arguments as :func:`sort`.

    Examples
    --------
    >>> import dask.array as da
    >>> import dask_compact
    >>> x = da.from_array([3, 1, 2, 1, 3], chunks=2)
    >>> dask_compact.argsort(x).compute()
    array([1, 3, 2, 0, 4])
    """
    settings.warn_unknown()
    return _sorted(x, local, buckets, indices=True, fn="argsort")


@call_client.on_inputs_client(lambda x, *_, **__: (x,))
@client_stream.released_on_error()
def _sorted(x: Any, local: Any, buckets: Any, indices: bool, fn: str) -> da.Array:
    return without_empty_chunks(_sorted_chunks(x, local, buckets, indices, fn))


def _sorted_chunks(x: Any, local: Any, buckets: Any, indices: bool, fn: str) -> da.Array:
    native_x = _check(x, local, fn)
    graph_input = input_form(x) == "graph"  # the caller's array, before it is joined or cast
    joined = join_small_chunks(native_x, checked=native_x is not x)
    # each chunk is taken in the declared dtype once (validate.as_declared), by the first
    # step that reads it: the cast to native byte order, the join, the time keys, or the sort
    checked = joined is not x
    x = joined
    asked = _check_buckets(buckets)
    if x.shape[0] == 0:  # nan (unknown sizes) is not 0: the local sorts find out
        return empty_sorted(x, indices)
    if x.dtype.kind in ("m", "M"):
        # datetime64 / timedelta64 sorted as uint64 keys in the same order, NaT last
        keys = da.map_blocks(_time_keys, x, declared=None if checked else x.dtype,
                             dtype=np.uint64)  # x's chunk indices
        out = build_sort(keys, indices, asked, local, graph_input, checked=True)
        return out if indices else da.map_blocks(_from_time_keys, out, like=x.dtype,
                                                 dtype=x.dtype)
    return build_sort(x, indices, asked, local, graph_input, checked)


_SIGN = np.uint64(1 << 63)


def _time_keys(block: np.ndarray, declared: np.dtype | None,
               block_id: tuple[int, ...] | None = None) -> np.ndarray:  # fmt: skip
    """uint64 keys that order datetime64/timedelta64 values as NumPy sorts them: by their
    int64 value, NaT (the smallest int64) last. The int64s' order keys (v ^ sign: NaT is 0),
    less 1 modulo 2^64, which moves NaT alone to the top.

    ``declared``: the dask array's (native) dtype, which the chunk (``block_id``, as Dask's
    map_blocks passes it) is taken in first (validate.as_declared_block): a chunk of another
    unit or byte order than its array declares would be read as the wrong times
    (api._view_block says more). None: a step before took it so (the cast to native byte
    order, or the join of small chunks)."""
    if declared is not None:
        block = as_declared_block(block, declared, "sort", block_id)
    return order_key(block.view(np.int64)) - np.uint64(1)


def _from_time_keys(keys: np.ndarray, like: np.dtype) -> np.ndarray:
    """The values of :func:`_time_keys`'s keys, in ``like`` (their datetime/timedelta dtype)."""
    return ((keys + np.uint64(1)) ^ _SIGN).view(np.int64).view(like)


def _check(x: Any, local: Any, fn: str) -> da.Array:
    """Everything that can be refused, refused before anything runs."""
    if not isinstance(x, da.Array):
        xarray = xarray_object(x, selects=False)
        if xarray is not None:
            raise TypeError(f"{fn} needs a dask array, not {xarray}")
        raise TypeError(
            f"{fn} needs a dask array, not {type(x).__name__}; wrap it with "
            "dask.array.from_array(...), or sort an in-memory array with NumPy or CuPy"
        )
    check_dask_input(x, "x")
    check_chunk_type(x._meta, fn)
    if x.ndim != 1:
        raise ValueError(f"{fn} sorts 1-D arrays; x has shape {x.shape}: pass x.ravel() to sort "
                         "every element, or sort each row with map_blocks")
    dtype = native(x.dtype)
    if dtype not in SORT_DTYPES and dtype.kind not in ("m", "M"):
        raise TypeError(
            f"{fn} sorts {', '.join(d.name for d in SORT_DTYPES)}, datetime64 and "
            f"timedelta64; not {x.dtype}"
        )
    if local not in LOCAL_SORTS:
        raise ValueError(f"local must be one of {LOCAL_SORTS}, not {local!r}")
    exchange = settings.get("sort.exchange")
    if exchange not in EXCHANGES:
        raise ValueError(f"the config dask-compact.sort.exchange must be one of {EXCHANGES}, "
                         f"not {exchange!r}")
    return _native(x)


def _check_buckets(buckets: Any) -> int | None:
    """``buckets`` as asked (None: the default, :func:`.sort_graph.resolve_buckets` decides
    once the sizes are known), refused here where it is not a positive int."""
    if buckets is None:
        return None
    if isinstance(buckets, (int, np.integer)) and not isinstance(buckets, (bool, np.bool_)) \
            and buckets >= 1:  # fmt: skip
        return int(buckets)
    raise ValueError(f"buckets must be a positive int or None, not {buckets!r}")
