"""The repeated public :func:`dask_compact.compact_into` call on CuPy input: called again with
an equal predicate, the same kind of input and the same buffers, count and stream, it runs the
ready call it ran the last time (``cupy_ready.IntoCall``) without the public checks and the
dispatch, as compact_array's repeated call does (``cupy_calls.repeated_call``) and
compact_records_into's (``cupy_records_repeat.repeated_into``).

Why: a loop of small sync-free calls into the same buffers (a path tracer's ray batches) paid
the checks on every call, and ``compact_into`` at 2^20 took 45-70 us on one H200 against
37-51 us for ``compact_array``, which allocates its result and waits for the count
(``benchmarks/results/public-calls-2026-12-02-NVIDIA_H200-45dfb55.md``).

Unlike the records' key, the input's pointer is not in the key: a loop compacts a new batch
into the same buffers each time. What the checks examined of the input (its type, dtype,
size, contiguity, device) is in the key or checked per call, and its overlap with the buffers
is compared per call (one C-contiguous span against the buffers' spans kept with the entry).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.core import Predicate
from ..validate import _span
from . import cupy_tuning as tuning
from .cupy_device import capturing
from .cupy_launch import thread_key
from .cupy_shaped import (
    ShapedRun,
    find_run,
    has_shape,
    kept,
    runs_evicted,
    shape_serves,
    shape_typing,
)

__all__ = ["repeated_into", "remember_into", "forget"]

# (thread, the caller's predicate as a key, input type, dtype and size, output, stable,
# algorithm, stream pointer, each buffer's and the count's (type, dtype, shape, strides,
# pointer, device) or None) -> (device, the IntoCall, the caller's predicate, the stream, the
# byte spans of the buffers and the count). With the buffers' pointers and strides in the key,
# an equal key is the same memory in the same layout, whose checks (type, device, contiguity,
# dtype, room, overlap of one buffer with another) passed the last time.
_repeats: BoundedCache[tuple, tuple] = BoundedCache("repeated into calls")


def _desc(b: Any) -> tuple | None:
    if b is None:
        return None
    return (type(b), b.dtype, b.shape, b.strides, b.data.ptr, b.data.device_id)


def _buffers(out: Any, output: str) -> tuple[Any, Any] | None:
    """``(values, indices)`` as compact_into reads ``out`` for ``output``, or None where it
    is not a form the checks accept (they then say what is wrong)."""
    if output == "both":
        if type(out) not in (tuple, list) or len(out) != 2:
            return None
        return out[0], out[1]
    if output == "values":
        return out, None
    if output == "indices":
        return None, out
    return None


def _key(a: Any, pred_like: Any, out: Any, output: str, count: Any, stream: Any,
         stable: bool, algorithm: str, pred: Predicate | None = None) -> tuple | None:
    import cupy

    from ..repeat_keys import caller_key, kept_key

    bufs = _buffers(out, output)
    if bufs is None:
        return None
    pk = caller_key(pred_like) if pred is None else kept_key(pred_like, pred)
    if pk is None:
        return None
    sp = (cupy.cuda.get_current_stream() if stream is None else stream).ptr
    return (thread_key(), pk, type(a), a.dtype, a.size, output, stable, algorithm, sp,
            _desc(bufs[0]), _desc(bufs[1]), _desc(count))


def repeated_into(a: Any, pred_like: Any, out: Any, output: str, count: Any, stream: Any,
                  stable: bool, algorithm: str) -> Any:
    """Run the ready call :func:`remember_into` kept for these arguments and return the count
    array, or None where none is kept, ``a`` is not C-contiguous on the entry's device (the
    current one), the stream is capturing a graph, or ``a`` overlaps a buffer: the public
    call then checks and dispatches as usual (and says what is wrong)."""
    if not tuning.FAST_SMALL_CALLS:
        return None
    try:
        key = _key(a, pred_like, out, output, count, stream, stable, algorithm)
        hit = None if key is None else _repeats.get(key)
    except (TypeError, AttributeError):  # not arrays, unhashable: the checks say what
        return None
    if not a.flags.c_contiguous:
        return None
    if hit is None:
        # a string or function whose numbers alone differ from a kept one's: its shape's
        # call, rebound
        hit = _shaped_hit(a, pred_like, key) if shape_serves(pred_like, key) else None
        if hit is None:
            return None
    import cupy

    dev, call, _, s, spans = hit
    if a.data.device_id != dev or cupy.cuda.runtime.getDevice() != dev:
        return None
    if capturing(s):  # a captured call takes words of its own
        return None
    lo = int(a.data.ptr)
    hi = lo + int(a.nbytes)
    for b0, b1 in spans:
        if lo < b1 and b0 < hi:
            return None  # the general call refuses it, saying which buffer
    values, indices = _buffers(out, output)  # type: ignore[misc]
    if count is None:
        # in the order of the stream that writes it (see cupy_backend.compact_into_public)
        with s:
            count = cupy.empty(1, dtype=np.int64)
    return call(a, values, indices, count, s.ptr)


def remember_into(a: Any, pred_like: Any, pred: Predicate, out: Any, output: str, count: Any,
                  stream: Any, stable: bool, algorithm: str) -> None:
    """After a public compact_into on these (checked) arguments, ``a`` the caller's own array:
    keep the ready call it ran under the caller's predicate and the buffers' memory for
    :func:`repeated_into`. Nothing is kept where the call took the general path (a graph
    being captured, a mask-path or three-pass call, a non-contiguous input)."""
    from .cupy_calls import call_algorithm, ready_call
    from .cupy_ready import IntoCall

    if not tuning.FAST_SMALL_CALLS or a.size == 0:
        return
    import cupy

    s = cupy.cuda.get_current_stream() if stream is None else stream
    if capturing(s):
        return
    key = _key(a, pred_like, out, output, count, stream, stable, algorithm, pred)
    if key is None:
        return
    alg = call_algorithm(algorithm, stable, a.size)
    call = ready_call(IntoCall, a, pred, output, alg, s.ptr, stream)
    if call is None:
        return
    spans = tuple(_span(b) for b in (*_buffers(out, output), count)  # type: ignore[misc]
                  if b is not None)
    _repeats.put(key, (a.data.device_id, call, pred_like, s, spans))
    if has_shape(pred_like):
        _remember_shaped(a, pred_like, pred, key, output, alg, s, stream, spans)


# A string predicate whose numbers alone change at each call (f"x < {t}"): its shape's kept
# IntoCall with its constants rebound (as cupy_shaped does for compact_array; the kernels
# queued before keep the constants they were launched with, so no wait is needed).
# (thread, ("shape", shape), the rest of the repeated key) -> [device, its IntoCall, the typed
# tree, the value keys of the numbers its slots hold now, the stream, the buffers' spans]
# Runs of the texts served, by their repeated key (cupy_shaped.find_run), going with their
# calls at eviction and clear_cache()
_runs: dict[tuple, ShapedRun] = {}
_shaped: BoundedCache[tuple, list] = BoundedCache(
    "shaped into calls", on_evict=runs_evicted(_runs), on_clear=_runs.clear)


def _shaped_hit(a: Any, text: Any, key: tuple | None) -> tuple | None:
    """``(device, call, None, stream, spans)`` for ``text`` from its shape's entry, the call
    bound to ``text``'s numbers, or None."""
    run = None if key is None else find_run(_runs, _shaped, a, text, key)
    if run is None:
        return None
    entry = run.entry
    return entry[0], run, None, entry[4], entry[5]


def _remember_shaped(a: Any, text: Any, pred: Predicate, key: tuple, output: str, alg: str,
                     s: Any, stream: Any, spans: tuple) -> None:
    """Keep an IntoCall of its own for ``text``'s shape (see :data:`_shaped`)."""
    from .cupy_exact import make_plan
    from .cupy_ready import IntoCall

    found = kept(text, pred, key)
    if found is None or _shaped.get(found[0]) is not None:
        return
    plan = make_plan(a, pred, None, output, alg)
    tp = shape_typing(pred, a, plan)
    if tp is None:
        return
    # its words made in the order of the stream it runs on (as cupy_calls.ready_call)
    with contextlib.nullcontext() if stream is None else stream:
        call = IntoCall(plan, output)
    _shaped.put(found[0], [a.data.device_id, call, tp, None, s, spans])


def forget() -> None:
    """Drop the calls kept here (``cupy_calls.forget_ready_calls``)."""
    _repeats.clear()
    _shaped.clear()
    _runs.clear()
