"""Which kernel a public call on a CuPy array runs, and the calls kept ready for it.

* ``call_algorithm`` / ``exact_algorithm``: ``algorithm="auto"`` and ``stable`` resolved per
  call (the single-pass kernel for unstable calls where it is faster, see
  ``cupy_tuning.UNSTABLE_SINGLE_PASS_MAX_N``).
* Ready calls (``ready_call``): a :class:`.cupy_ready.OneReadCall` or ``IntoCall`` per
  (thread, predicate, dtype, output, algorithm, n, device, stream): a packed launch with no
  plan, for calls that read once (``one_read_call``) and for ``compact_into``.
* Repeated calls (``repeated_call`` / ``remember_call``): ``compact_array``'s call kept under
  the predicate the caller passed, so that an equal call skips the public checks and the
  dispatch too.

``forget_ready_calls`` drops them all (a benchmark that changes a tuning between calls).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.core import Predicate
from ..repeat_keys import caller_key, kept_key
from . import cupy_tuning as tuning
from .cupy_exact import make_plan, reads_once
from .cupy_launch import thread_key
from .cupy_ready import OneReadCall, learned
from .cupy_shaped import forget as forget_shaped
from .cupy_shaped import has_shape, remember_shaped, shape_serves, shaped_call
from .cupy_tuning import resolve_algorithm

__all__ = ["call_algorithm", "exact_algorithm", "ready_call", "one_read_call",
           "selected_before", "forget_ready_calls", "repeated_call",
           "remember_call"]


def call_algorithm(algorithm: str, stable: bool, n: int) -> str:
    """The kernel a public call runs (see UNSTABLE_SINGLE_PASS_MAX_N)."""
    if algorithm == "auto" and not stable and n <= tuning.UNSTABLE_SINGLE_PASS_MAX_N:
        return "single-pass"
    return resolve_algorithm(algorithm, stable)


def exact_algorithm(algorithm: str, stable: bool, a: Any, pred: Predicate,
                     output: str) -> str:
    """The kernel an exact-size call (compact_array's) runs: :func:`call_algorithm`'s, but
    stable=False past tuning.UNSTABLE_SINGLE_PASS_MAX_N takes the single-pass kernel once the
    predicate has selected: its speculative call (one read, no copy; OneReadCall._speculate)
    beats the hybrid's count first or scratch and copy (one H200, 2^28 float32, p = .5 /
    .95: 561-564 / 691-693 us against 831-941 / 956-980 us; at p = .05 level), and keeps the
    order too. The same choice for the call and for the repeated call kept after it."""
    alg = call_algorithm(algorithm, stable, a.size)
    if (alg == "hybrid" and algorithm == "auto" and tuning.FAST_SMALL_CALLS
            and selected_before(pred, np.dtype(a.dtype), output)):
        return "single-pass"
    return alg


# (kind, thread (cupy_launch.thread_key), id(predicate), dtype, output, algorithm, n, device,
# stream) -> (predicate, its OneReadCall or IntoCall, or None where the general path runs)
_ready_calls: BoundedCache[tuple, tuple] = BoundedCache("ready calls")


def ready_call(kind: type, a: Any, pred: Predicate, output: str, algorithm: str,
                stream_ptr: int, stream: Any = None) -> Any:
    """The ready call of ``kind`` for ``a`` (C-contiguous, on the current device, not empty)
    and a fused predicate, or None where the general path runs. ``stream``: the stream the
    call will run on where it is not the current one (``compact_into``'s ``stream=``)."""
    import cupy

    if a.size == 0 or algorithm == "three-pass" or pred.path != "fused":
        return None
    if not a.flags.c_contiguous:
        return None
    dev = a.data.device_id
    if dev != cupy.cuda.runtime.getDevice():
        return None
    key = (kind, thread_key(), id(pred), a.dtype, output, algorithm, a.size, dev,
           stream_ptr)
    hit = _ready_calls.get(key)
    if hit is not None and hit[0] is pred:
        return hit[1]
    plan = make_plan(a, pred, None, output, algorithm)
    call = None
    if plan.memo is not None and plan.mask is None and not plan.checked:
        try:
            # its words made in the order of the stream it runs on: freed when the entry is
            # evicted, they go back to that stream's share of CuPy's pool. Made on the current
            # stream (until 2026-12-01, a poisoned-pool probe), they went back to that one's,
            # whose next allocation could be handed them while the call's last launch on
            # `stream` still used them
            with contextlib.nullcontext() if stream is None else stream:
                call = kind(plan, output)
        except AttributeError:  # a CuPy without RawKernel.kernel or the driver's launch
            call = None
    # the predicate held: its id is not reused while the entry lives; None: the general path
    _ready_calls.put(key, (pred, call))
    return call


def forget_ready_calls() -> None:
    """Drop the ready and repeated calls kept in this process: a kept call runs the module it
    was made with, so a benchmark that changes a tuning between calls
    (``cupy_tuning.override_tuning``, ``override_lookback_sleeps``) drops them, and the next
    call plans with the new one."""
    from .cupy_into_repeat import forget as forget_into

    _ready_calls.clear()
    _repeat_calls.clear()
    forget_shaped()
    forget_into()


def selected_before(pred: Predicate, dtype: np.dtype, output: str) -> bool:
    """Whether ``pred`` has run on ``dtype`` for ``output`` before: its single-pass ready call
    then writes into outputs sized from that call's fraction (OneReadCall._speculate), at any
    fraction."""
    return learned(getattr(pred, "memo", None), dtype, output) is not None


def _speculates(algorithm: str, pred: Predicate, dtype: np.dtype, output: str) -> bool:
    """Whether a call of ``algorithm`` writes into outputs sized from the fraction its
    predicate selected before on ``dtype`` and ``output`` (OneReadCall._speculate): it then
    takes its ready call at any size."""
    return algorithm == "single-pass" and selected_before(pred, dtype, output)


def one_read_call(a: Any, pred: Predicate, output: str, algorithm: str) -> Any:
    """The ready one-read call for ``a`` where this call reads once (see reads_once: small,
    or after a call that selected little; or, with the single-pass kernel, after any call of
    the predicate on this dtype and output: OneReadCall's speculative outputs), or None (the
    general path). A larger call gains
    as much from it as a small one: the general path's plan and launches cost ~85 us of host
    time at 2^24 on the H100 (154 us a call against 69 us for compact_into's ready call)."""
    import cupy

    # up to ONE_READ_ALWAYS_BYTES / 32 elements every dtype and output reads once (2o - s is
    # at most 32 bytes: complex128 "both"): a small call skips the test
    if a.size > tuning.ONE_READ_ALWAYS_BYTES >> 5:
        dtype = np.dtype(a.dtype)
        if not _speculates(algorithm, pred, dtype, output) and not reads_once(
                getattr(pred, "memo", None), dtype, output, a.size):
            return None
    return ready_call(OneReadCall, a, pred, output, algorithm,
                       cupy.cuda.get_current_stream().ptr)


# compact_array's repeated call: (thread, the caller's predicate as a key, dtype, n, output,
# stable, algorithm, stream) -> (the device, its OneReadCall, the predicate object). A hit
# skips the public checks, the dispatch and the ready-call lookup (5-6 us of a 30 us call on
# the H100 host), which an equal predicate already passed on that dtype. The predicate's key:
# repeat_keys.caller_key.
_repeat_calls: BoundedCache[tuple, tuple] = BoundedCache("repeated calls")


def _repeat_key(a: Any, pred_like: Any, output: str, stable: bool, algorithm: str,
                pred: Predicate | None = None) -> tuple | None:
    import cupy

    pk = caller_key(pred_like) if pred is None else kept_key(pred_like, pred)
    if pk is None:
        return None
    return (thread_key(), pk, a.dtype, a.size, output, stable, algorithm,
            cupy.cuda.get_current_stream().ptr)


def repeated_call(a: Any, pred_like: Any, output: str, stable: bool, algorithm: str) -> Any:
    """The one-read call that :func:`remember_call` kept for this thread, predicate, dtype,
    size, stream and arguments, if ``a`` is C-contiguous on that call's device, the current
    one; else None (the public call checks and dispatches as usual)."""
    if not tuning.FAST_SMALL_CALLS:
        return None
    try:
        key = _repeat_key(a, pred_like, output, stable, algorithm)
        hit = None if key is None else _repeat_calls.get(key)
    except TypeError:  # an unhashable argument: the checks say what is wrong with it
        return None
    if not a.flags.c_contiguous:
        return None
    import cupy

    if hit is None:
        # a string or function whose numbers alone differ from a kept one's: its shape's
        # call, rebound
        if key is None or a.data.device_id != cupy.cuda.runtime.getDevice():
            return None
        if not shape_serves(pred_like, key):
            return None  # no shape, or a function's value again: the checked call keeps its own
        return shaped_call(a, pred_like, key)
    dev = hit[0]
    if a.data.device_id != dev or cupy.cuda.runtime.getDevice() != dev:
        return None
    return hit[1]


def remember_call(a: Any, pred_like: Any, pred: Predicate, output: str, stable: bool,
                  algorithm: str) -> None:
    """After a public call on ``a`` (checked, native byte order) that ran its ready one-read
    call: keep that call under ``pred_like``, the predicate the caller passed, for
    :func:`repeated_call`. For sizes that read once whatever the previous call selected (the
    choice needs no memo), and for larger ones where the single-pass kernel runs and the
    predicate has selected on this dtype and output: the checked call then always takes the
    ready call too, which writes into outputs sized from the last fraction
    (OneReadCall._speculate). Without it a 2^24 float32 call paid the checks and dispatch
    each time: one H200, two rounds, p = .05 / .5 / .95, 84-126 us a call, 0.57-0.70x CUB
    into a preallocated buffer; kept, 56-98 us, 0.81-1.01x (2^28: 1.08-1.25x -> 1.18-1.44x;
    2026-12-04_h200_repeated_large_calls_ab.md)."""
    if not tuning.FAST_SMALL_CALLS or algorithm == "scan" or not a.dtype.isnative:
        return
    key = _repeat_key(a, pred_like, output, stable, algorithm, pred)
    if key is None:
        return
    import cupy

    alg = exact_algorithm(algorithm, stable, a, pred, output)
    small = a.size <= tuning.ONE_READ_ALWAYS_BYTES >> 5
    if not small and not _speculates(alg, pred, np.dtype(a.dtype), output):
        return
    call = ready_call(OneReadCall, a, pred, output, alg, cupy.cuda.get_current_stream().ptr)
    if call is not None:
        _repeat_calls.put(key, (a.data.device_id, call, pred_like))
        # a shape's call serves texts of other numbers from this text's fraction: only where
        # a call reads once whatever it selects (a larger one would size a new threshold's
        # outputs from another's fraction, where its checked first call counts first)
        if has_shape(pred_like) and small:
            remember_shaped(a, pred_like, pred, key, output, alg)
