"""The repeated public records calls: :func:`dask_compact.compact_records` and
:func:`dask_compact.compact_records_into` on CuPy fields, called again with an equal
predicate on the same kind of arguments, run the ready call they ran the last time
(``cupy_records_ready``) without the public checks and the dispatch, as compact_array's
repeated call does (``cupy_calls.repeated_call``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.core import Predicate
from . import cupy_tuning as tuning
from .cupy_device import capturing
from .cupy_launch import thread_key
from .cupy_records_ready import ready_into_call, ready_records_call

__all__ = ["repeated_records_call", "remember_records_call", "repeated_into", "remember_into"]


# compact_records' repeated call, as compact_array's (cupy_calls.repeated_call): (thread,
# the caller's predicate as a key, indices, stream, every field's (name, type, dtype, shape,
# device)) -> (device, its RecordsCall, the caller's predicate). A hit skips the public
# checks (18-38 us on the 2-core CI machine for four fields) and the dispatch: everything
# they examined is in the key, and an equal key passed them.
_repeats: BoundedCache[tuple, tuple] = BoundedCache("repeated record calls")


def _repeat_key(fields: dict[str, Any], pred_like: Any, indices: bool,
                pred: Predicate | None = None) -> tuple | None:
    """``pred``: the predicate a call ran, when keeping it (``repeat_keys.kept_key``)."""
    import cupy

    from ..repeat_keys import caller_key, kept_key

    pk = caller_key(pred_like) if pred is None else kept_key(pred_like, pred)
    if pk is None:
        return None
    layout = tuple((name, type(a), a.dtype, a.shape, a.data.device_id)
                   for name, a in fields.items())
    return (thread_key(), pk, indices, cupy.cuda.get_current_stream().ptr, layout)


def repeated_records_call(fields: dict[str, Any], pred_like: Any, indices: bool) -> Any:
    """The ready call :func:`remember_records_call` kept for this thread, predicate, layout
    and stream, if every field is C-contiguous and the current device is theirs; else None
    (the public call checks and dispatches as usual)."""
    if not tuning.FAST_SMALL_CALLS:
        return None
    try:
        key = _repeat_key(fields, pred_like, indices)
        hit = None if key is None else _repeats.get(key)
    except (TypeError, AttributeError):  # not arrays, unhashable: the checks say what
        return None
    if hit is None:
        return None
    import cupy

    if cupy.cuda.runtime.getDevice() != hit[0]:
        return None
    for a in fields.values():
        if not a.flags.c_contiguous:
            return None
    return hit[1]


def remember_records_call(fields: dict[str, Any], pred_like: Any, pred: Predicate,
                          indices: bool) -> None:
    """After a public call on ``fields`` (checked, every array the caller's) that ran a
    ready call: keep it under ``pred_like``, the predicate the caller passed."""
    if not tuning.FAST_SMALL_CALLS:
        return
    import cupy

    key = _repeat_key(fields, pred_like, indices, pred)
    if key is None:
        return
    call = ready_records_call(fields, pred, indices)
    if call is not None:
        dev = next(iter(fields.values())).data.device_id
        if dev == cupy.cuda.runtime.getDevice():
            _repeats.put(key, (dev, call, pred_like))


# compact_records_into's repeated call: (thread, the caller's predicate as a key, the stream,
# every field's and buffer's (name, type, dtype, shape, strides, pointer, device), the count's
# (type, dtype, shape, pointer) or None) -> (device, the RecordsCall, the caller's predicate,
# the written fields, the indices buffer's name or None). With the pointers and strides in the
# key an equal key is the same memory in the same layout, whose checks (contiguity, room,
# overlaps) passed the last time.
_into_repeats: BoundedCache[tuple, tuple] = BoundedCache("repeated record into calls")


def _desc(a: Any) -> tuple:
    return (type(a), a.dtype, a.shape, a.strides, a.data.ptr, a.data.device_id)


def _into_key(fields: dict[str, Any], pred_like: Any, out: Any, count: Any, stream: Any,
              pred: Predicate | None = None) -> tuple | None:  # fmt: skip
    import cupy

    from ..repeat_keys import caller_key, kept_key

    pk = caller_key(pred_like) if pred is None else kept_key(pred_like, pred)
    if pk is None or type(out) is not dict:
        return None
    sp = (cupy.cuda.get_current_stream() if stream is None else stream).ptr
    return (thread_key(), pk, sp,
            tuple((name, _desc(a)) for name, a in fields.items()),
            tuple((name, _desc(b)) for name, b in out.items()),
            None if count is None else (type(count), count.dtype, count.shape, count.data.ptr))


def repeated_into(fields: dict[str, Any], pred_like: Any, out: Any, count: Any,
                  stream: Any) -> Any:
    """Run the ready call :func:`remember_into` kept for these arguments and return the count
    array, or None where none is kept (or the stream is being captured): the public call then
    checks and dispatches as usual."""
    if not tuning.FAST_SMALL_CALLS:
        return None
    try:
        key = _into_key(fields, pred_like, out, count, stream)
        hit = None if key is None else _into_repeats.get(key)
    except (TypeError, AttributeError):  # not arrays, unhashable: the checks say what
        return None
    if hit is None:
        return None
    import cupy

    dev, call, _, written, idx_name = hit
    if cupy.cuda.runtime.getDevice() != dev or capturing(call.stream):
        return None
    if count is None:
        with call.stream:  # allocated in the stream's order, as the general call does
            count = cupy.empty(1, dtype=np.int64)
    call.into(fields, {name: out[name] for name in written},
              None if idx_name is None else out[idx_name], count)
    return count


def remember_into(fields: dict[str, Any], pred_like: Any, pred: Predicate, out: Any,
                  count: Any, stream: Any) -> None:
    """After a public compact_records_into on these (checked) arguments: keep its ready call
    under the caller's predicate and the arguments' memory for :func:`repeated_into`."""
    if not tuning.FAST_SMALL_CALLS:
        return
    import cupy

    key = _into_key(fields, pred_like, out, count, stream, pred)
    if key is None:
        return
    dev = next(iter(fields.values())).data.device_id
    target = cupy.cuda.get_current_stream() if stream is None else stream
    with cupy.cuda.Device(dev), target:
        call = ready_into_call(fields, pred)
    if call is not None:
        written = tuple(name for name in out if name in fields)
        idx_name = "indices" if "indices" in out and "indices" not in fields else None
        _into_repeats.put(key, (dev, call, pred_like, written, idx_name))
