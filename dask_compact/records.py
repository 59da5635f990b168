"""The public call for records: :func:`compact_records`, several aligned arrays (the fields
of a record: rays, particles, events) compacted by one predicate, on dask arrays or in memory.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import settings
from .dispatch import (
    remember_records_call,
    remember_records_into,
    repeated_records_call,
    repeated_records_into,
)
from .records_check import INDICES, check_into, check_record_predicate, checked_fields
from .validate import (
    check_flag,
    counted,
    in_memory,
    other_order_view,
    swap_written,
    to_native,
)

__all__ = ["compact_records", "compact_records_into"]


def compact_records(
    fields: Mapping[str, Any],
    pred: Any,
    *,
    indices: bool = False,
    lazy: bool = False,
    stable: bool = True,
    chunks: None | int | str = None,
) -> dict[str, Any]:
    """Select the rows of several aligned arrays where one predicate over some of them holds.

    One pass per chunk: the predicate is evaluated on the fields it reads, and every field's
    selected rows are written out; fields the predicate does not read are only gathered. On
    dask arrays the result is a dict of dask arrays with identical, **known** chunk sizes
    (like :func:`dask_compact.map_compact`: each chunk is compacted where it lives, only the
    counts come back); on NumPy or CuPy arrays it is a dict of arrays of that type.

    Parameters
    ----------
    fields : mapping of str -> array
        The record's fields: dask arrays, or all NumPy, or all CuPy arrays (one device), with
        the same number of rows (axis 0). Fields may have trailing axes (positions of shape
        ``(n, 3)``) and any non-object dtype; the fields the predicate reads are 1-D of a
        dtype :func:`map_compact` supports. Dask fields of known chunk sizes are aligned by
        rechunking every field along axis 0 to the chunks of the first field (in the
        mapping's order) the predicate reads; trailing axes go to one chunk. Where some
        field's row chunk sizes are unknown (``x[m]``, a Dask DataFrame column's
        ``to_dask_array()``), no field is rechunked along axis 0: the fields are paired
        chunk by chunk, so every field needs the same number of row chunks, and each chunk
        the same rows in every field (as ``x[m]`` and ``y[m]`` of one mask ``m`` have); the
        result's chunk sizes are known all the same (with ``indices=True`` and no field of
        known sizes, each chunk's indices are counted from its start and the starts added
        once every chunk's rows are known, so no input chunk waits for the others).
    pred : str or callable
        A string over the field names, ``"(energy > 5) & (abs(eta) < 2.5)"`` (the same safe
        parser as map_compact's strings, with the field names as the variables), or a callable
        taking the fields it reads by name, ``lambda energy, eta: (energy > 5) & (abs(eta) <
        2.5)``, traced once and compiled (or, if it cannot be traced, evaluated per chunk).
    indices : bool
        Also return the selected rows' global int64 indices under ``"indices"``.
    lazy : bool
        Dask fields only: compute nothing now; the result's chunk sizes are unknown (nan).
    stable : bool
        Keep the row order (the CPU always does; so does the GPU, whose record kernel knows
        every tile's place before it writes, so ``False`` gains nothing there and is accepted).
    chunks : int, "auto" or str, optional
        Dask fields only: rebalance every result field into uniform chunks of this many rows
        (as :func:`dask_compact.map_compact`'s: -1, ``"auto"`` or a byte size too).

    Returns
    -------
    dict
        name -> the field's selected rows, in the mapping's order, plus ``"indices"``.

    Raises
    ------
    TypeError
        ``fields`` is not a mapping of arrays, mixes dask and in-memory arrays or NumPy and
        CuPy, a field has an object dtype, the predicate reads a field of an unsupported dtype
        or does not give booleans.
    ValueError
        No fields, rows of different lengths, a predicate naming a field that does not
        exist, reading a field with trailing axes, or not elementwise; ``lazy``/``chunks``
        with in-memory fields; dask fields some of whose row chunk sizes are unknown beside
        fields of another number of row chunks, or of unknown sizes along a trailing axis.
        When computed (eager: in this call), a row chunk whose fields hold different numbers
        of rows (fields paired chunk by chunk, some of unknown sizes), naming the chunk and
        each field's rows.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> import dask_compact
    >>> energy = da.from_array(np.array([1.0, 7.0, 9.0, 3.0, 6.0]), chunks=2)
    >>> eta = da.from_array(np.array([0.1, 3.0, -1.0, 0.0, 2.0]), chunks=2)
    >>> run = da.arange(5, chunks=2)
    >>> out = dask_compact.compact_records(
    ...     {"energy": energy, "eta": eta, "run": run}, "(energy > 5) & (abs(eta) < 2.5)")
    >>> out["energy"].chunks
    ((1, 1),)
    >>> out["run"].compute()
    array([2, 4])
    >>> pos = np.arange(12.0).reshape(4, 3)
    >>> r = dask_compact.compact_records(
    ...     {"mass": np.array([1, 9, 9, 1]), "pos": pos}, lambda mass: mass > 5, indices=True)
    >>> r["pos"], r["indices"]
    (array([[3., 4., 5.],
           [6., 7., 8.]]), array([1, 2]))
    """
    settings.warn_unknown()
    indices = check_flag(indices, "indices", "compact_records")
    lazy = check_flag(lazy, "lazy", "compact_records")
    stable = check_flag(stable, "stable", "compact_records")
    if type(fields) is dict and fields and not lazy and chunks is None:
        # The same predicate on fields of the same layout again (a loop over GPU batches):
        # the call kept the last time, without the checks and the dispatch it passed then.
        call = repeated_records_call(next(iter(fields.values())), fields, pred, indices)
        if call is not None:
            return call(fields, 0)
    return records_call(fields, pred, indices, lazy, stable, chunks)


def records_call(fields: Mapping[str, Any], pred: Any, indices: bool, lazy: bool,
                 stable: bool, chunks: None | int | str, call: str = "compact_records",
                 labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """:func:`compact_records` past its repeated-call path, its flags checked; ``call`` and
    ``labels`` name the call and the fields in the refusals as the caller gave them (the
    xarray accessor: ``ds.compact.where``, its variables and ``cond``; until 2026-12-01 a
    chunk of another shape than declared was refused as "compact_records: chunk 0 of field
    'cond'", a call and a name the caller never gave, a chunk-shape probe)."""
    fs, on_dask = checked_fields(fields, indices, call, labels)
    if not on_dask and (lazy or chunks is not None):
        raise ValueError(
            "lazy= and chunks= apply to dask fields; in-memory fields are compacted at once"
        )
    try:
        p = check_record_predicate(pred, fs, call)
    except (ValueError, TypeError) as e:
        if labels is None:
            raise
        from .xarray_accessor import in_accessor_words  # the one caller that names fields

        raise in_accessor_words(e, call, tuple(k for k, v in labels.items()
                                               if v == "the DataArray")) from None
    if on_dask:
        from .graph import without_empty_chunks
        from .records_graph import build_records

        built = build_records(fs, p, indices, lazy, stable, chunks, call, labels)
        return {k: without_empty_chunks(a) for k, a in built.items()}
    out = compact_records_in_memory(fs, p, indices, stable)
    if type(fields) is dict:
        remember_records_call(next(iter(fs.values())), fs, pred, p, indices)
    return out


def compact_records_in_memory(
    fields: dict[str, Any], p: Any, indices: bool, stable: bool, index_base: int = 0
) -> dict[str, Any]:
    """The in-memory call: the backend of the fields' array type (dispatch.compact_records),
    using the machine's cores on the CPU."""
    from .dispatch import compact_records as backend

    first = next(iter(fields.values()))
    out = backend(first, fields, p, indices, stable, index_base, cpu_threads())
    assert not indices or INDICES in out
    for name, a in fields.items():
        if type(a) is np.recarray and a.dtype.names:
            # as NumPy's rec[mask] gives it (fields also attributes): a plain ndarray of
            # numpy.record until 2026-12-01 (a record probe). A recarray of a plain dtype
            # comes back plain, as its rec[mask] does, and a memmap's rows as mm[mask] does.
            out[name] = out[name].view(np.recarray)
    return out


@functools.cache
def cpu_threads() -> int:
    """The in-memory CPU call's gather threads (os.cpu_count() costs ~10 us a call)."""
    return min(4, os.cpu_count() or 1)


def compact_records_into(
    fields: Mapping[str, Any],
    pred: Any,
    out: Mapping[str, Any],
    *,
    count: Any = None,
    stream: Any = None,
) -> Any:
    """Compact a record into buffers you own; return the selected count as a 1-element array.

    The record form of :func:`dask_compact.compact_into`: no allocation of the results and no
    host synchronisation. On the GPU the three kernels are queued on ``stream`` and the count
    stays on the device until you read it, so calls can be queued back to back or captured
    into a CUDA graph and replayed on new data in the same buffers.

    Parameters
    ----------
    fields : mapping of str -> array
        In-memory NumPy or CuPy arrays (one device), as for :func:`compact_records`.
    pred : str or callable
        The record predicate, as for :func:`compact_records`.
    out : mapping of str -> array
        A buffer for each field to write (fields not named here are not written; a field
        the predicate reads need not be written), and optionally ``"indices"`` (int64, 1-D)
        for the selected rows' numbers: arrays of the fields' type and device, C-contiguous,
        with room for every row (``shape[0] >= n``), the field's dtype and trailing shape.
        The first ``count`` rows receive the selection; the rows after it are unspecified.
    count : array, optional
        A 1-element int64 or uint64 array of the fields' type (and device) receiving the
        count; by default a new int64 one.
    stream : cupy.cuda.Stream, optional
        The stream the GPU work is queued on (default: the current one). NumPy takes none.

    Returns
    -------
    count : array
        On the GPU its value is ready once the stream has reached this call.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import compact_records_into
    >>> f = {"mass": np.array([1.0, 9.0, 7.0, 2.0]), "id": np.array([10, 11, 12, 13])}
    >>> out = {"id": np.empty(4, np.int64), "indices": np.empty(4, np.int64)}
    >>> k = compact_records_into(f, "mass > 5", out)
    >>> out["id"][: k[0]], out["indices"][: k[0]]
    (array([11, 12]), array([1, 2]))
    """
    settings.warn_unknown()
    from .dispatch import compact_records_into as backend

    if type(fields) is dict and fields:
        # the same call on the same fields, buffers and count again (a loop over batches in
        # place): the call kept the last time, without the checks it passed then
        done = repeated_records_into(next(iter(fields.values())), fields, pred, out, count,
                                     stream)
        if done is not None:
            return done
    fs, on_dask = checked_fields(fields, False, "compact_records_into")
    if on_dask:
        raise TypeError(
            "compact_records_into takes in-memory NumPy or CuPy fields; for dask arrays use "
            "compact_records"
        )
    count = in_memory(count)
    # NumPy buffers of the other byte order (a native np.empty(n) for a big-endian field):
    # written through views of the field's dtype, then swapped (validate.other_order_view)
    given_count = count
    count, swap_count = other_order_view(count, counted(count))
    views, swapped = _other_order_views(fs, out)
    buffers = check_into(fs, views, count, stream)
    p = check_record_predicate(pred, fs, "compact_records_into")
    copied = _native_copies(fs, buffers, stream)
    first = next(iter(fs.values()))
    got = backend(first, copied, p, buffers, count, stream)
    if swapped or swap_count:
        swap_written([buffers[name] for name in swapped], int(got[0]),
                     got if swap_count else None)
        got = got if given_count is None else given_count
    if type(fields) is dict and copied is fs:  # a call on copies is not one to repeat
        remember_records_into(first, fs, pred, p, out, count, stream)
    return got


def _native_copies(fields: dict[str, Any], buffers: dict[str, Any], stream: Any
                   ) -> dict[str, Any]:  # fmt: skip
    """``fields`` with each CuPy field of the other byte order whose buffer is native
    (records_check.check_into takes one) as a native copy, queued on ``stream``
    (``validate.to_native``): the copy writes its rows into the buffer as they are. Until
    2026-12-01 (fifteenth session; left by the fourteenth) such a buffer was refused, where
    the one-array ``compact_into`` takes one; a buffer of the field's own order (a view)
    still receives the field's bytes as they are. ``fields`` itself where there is none."""
    names = [name for name, buf in buffers.items()
             if name in fields and buf.dtype != fields[name].dtype]
    if not names:
        return fields
    return {name: to_native(a, stream) if name in names else a for name, a in fields.items()}


def _other_order_views(fields: dict[str, Any], out: Any) -> tuple[Any, list[str]]:
    """``out`` with each NumPy buffer of its field's dtype (int64 for the indices) in the
    other byte order viewed as that dtype (validate.other_order_view), and the names of
    those; ``out`` itself where there are none (or it is no mapping, for the checks)."""
    if not isinstance(out, Mapping):
        return out, []
    views, swapped = dict(out), []
    for name, buf in out.items():
        dtype = (fields[name].dtype if name in fields
                 else np.dtype(np.int64) if name == INDICES else None)
        views[name], swap = other_order_view(in_memory(buf), dtype)
        if swap:
            swapped.append(name)
    return (views, swapped) if swapped else (out, [])
