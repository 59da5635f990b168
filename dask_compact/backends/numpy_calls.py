"""The repeated public calls on NumPy arrays: ``compact_array``'s compiled loop and its
bound constants, and ``compact_records``' checked predicate, kept under the predicate the
caller passed, so that an equal call on the same dtype (fields' layout) and arguments skips
the public checks, the dispatch and the lookups that the first call passed.

Why: on the 2-core machine a 1,000-element float32 call took about 25 us, of which the loop
itself is under 2 us, against 5-7 us for ``a[a < p]``: NumPy was faster below a few thousand
elements. A user filtering many small arrays in a loop (events of one detector frame, rays of
one tile) pays that per call.

What a hit runs is what the checked call runs for such an array: one loop call over the
array's elements into full-length buffers, then the same trim (:mod:`.numpy_backend`). So a
hit is only taken where the checked call would take that path: a plain ``np.ndarray``
(not a subclass: a masked array is refused by the checks), C-contiguous, in native byte
order, small enough for one loop call (``numpy_backend.one_call``). Anything else takes the
checked call, as does a predicate that ran on the mask path or whose loop could not be built.

``compact_records``: the kept call is the backend's call (``numpy_records.compact_records``)
with the predicate the first call checked, for fields of the same names, dtypes, dimensions
and rows' shapes, each a plain ``np.ndarray``, all of one length; where the fields are
native it also keeps the compiled predicate pass and each field's gather, and runs them
itself on C-contiguous fields that the backend would compact on one thread
(:class:`RecordsCall`). A 1,024-row call of four float32 fields took 108-137 us on the 2-core
machine, 58-62 us kept through the backend, 26 us kept and run directly (2026-12-06), where
NumPy's recipe (a mask, then each field indexed by it) takes 17 us; from a few thousand rows
on the kept call is the faster (1.87x at 4,096).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.numba_loop import CompiledLoop, UnsupportedPredicate, fused_loop, holds_loops
from ..codegen.numba_records import record_bits_loop
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..records import cpu_threads
from ..repeat_keys import caller_key, kept_key
from ..validate import native
from . import numpy_records
from .numpy_backend import loop_call, one_call_limit
from .numpy_records import compact_records as records_backend

__all__ = ["LoopCall", "RecordsCall", "repeated_call", "remember_call", "repeated_records_call",
           "remember_records_call"]


class LoopCall:
    """A kept call: ``call(a, index_base)`` is ``compact(a, pred, output, ...)`` for a plain,
    C-contiguous, native ``a`` of the kept dtype that fits one loop call. Holds the caller's
    predicate (a Predicate's key is its identity). Immutable: any thread may run it."""

    __slots__ = ("loop", "params", "output", "pred_like", "limit")

    def __init__(self, loop: CompiledLoop, params: tuple, output: str, pred_like: Any,
                 limit: int) -> None:
        self.loop, self.params, self.output, self.pred_like = loop, params, output, pred_like
        self.limit = limit  # the most elements one loop call takes (numpy_backend.one_call)

    def __call__(self, a: np.ndarray, base: int) -> Any:
        return loop_call(self.loop, a.reshape(-1), self.output, base, self.params)


# (the caller's predicate as a key, dtype, output, stable, algorithm) -> its LoopCall. No
# thread in the key: a LoopCall holds no state a call changes.
_repeat_calls: BoundedCache[tuple, LoopCall] = BoundedCache("repeated NumPy calls")
holds_loops(_repeat_calls.clear)  # the loops' own clear (numba_loop.clear_cache) empties it


def _key(a: np.ndarray, pk: Any, output: str, stable: bool, algorithm: str) -> tuple:
    return (pk, a.dtype, output, stable, algorithm)


def repeated_call(a: np.ndarray, pred_like: Any, output: str, stable: bool,
                  algorithm: str) -> LoopCall | None:
    """The call :func:`remember_call` kept for this predicate, dtype and arguments, if ``a``
    is an array it serves (see the module's docstring); else None (the public call checks and
    dispatches as usual)."""
    if type(a) is not np.ndarray or not a.flags.c_contiguous or not a.dtype.isnative:
        return None
    try:
        pk = caller_key(pred_like)
        hit = None if pk is None else _repeat_calls.get(_key(a, pk, output, stable, algorithm))
    except TypeError:  # an unhashable argument: the checks say what is wrong with it
        return None
    # the output is one a checked call took (it is in the key): its bytes can be counted
    return hit if hit is not None and a.size <= hit.limit else None


def remember_call(a: np.ndarray, pred_like: Any, pred: Predicate, output: str, stable: bool,
                  algorithm: str) -> None:
    """After a public call on ``a`` (checked, native byte order) that ran the compiled loop:
    keep the loop and its bound constants under ``pred_like``, the predicate the caller
    passed, for :func:`repeated_call`."""
    if type(a) is not np.ndarray or algorithm == "scan" or pred.path != "fused":
        return
    pk = kept_key(pred_like, pred)
    if pk is None:
        return
    try:
        tp = pred.typed(a.dtype)
        loop = fused_loop(tp, output)  # the call just built or found it: a lookup
        params = tp.bind(pred.params)
    except (UnsupportedPredicate, ParamOverflow, TypeError):
        return  # the call took the mask path, which the checked call takes again
    _repeat_calls.put(_key(a, pk, output, stable, algorithm),
                      LoopCall(loop, params, output, pred_like, one_call_limit(a.dtype, output)))


class RecordsCall:
    """A kept ``compact_records`` call: ``call(fields, index_base)`` is the backend's call with
    the predicate the first call checked. Holds the caller's predicate. Immutable: any thread
    may run it.

    Where the first call ran the compiled predicate pass on native fields, it also holds that
    pass (its loop, the bound constants, the order of the fields it reads) and the fields'
    gather plan (``numpy_gather.column_plan``): for fields all C-contiguous and under
    ``numpy_records.THREADED_BYTES`` in all (where the backend would use one thread) the
    lookup returns :meth:`direct`, which runs the pass itself, without the backend's lookups
    of it (10 us of a 256-row call on the 2-core machine), then the backend's own gather
    step (``numpy_records.gather_new``) with the kept plan."""

    __slots__ = ("pred", "indices", "pred_like", "loop", "params", "reads", "columns", "g")

    def __init__(self, pred: Predicate, indices: bool, pred_like: Any, loop: Any = None,
                 params: tuple = (), reads: tuple = (), columns: tuple = (),
                 g: Any = None) -> None:
        self.pred, self.indices, self.pred_like = pred, indices, pred_like
        self.loop, self.params, self.reads, self.columns = loop, params, reads, columns
        self.g = g  # numpy_gather (numba's), where the pass and gathers are kept

    def __call__(self, fields: dict[str, np.ndarray], base: int) -> dict[str, np.ndarray]:
        return records_backend(fields, self.pred, self.indices, True, base, cpu_threads())

    def direct(self, fields: dict[str, np.ndarray], base: int) -> dict[str, np.ndarray]:
        """The backend's one-thread call, run from the kept pass and gather plan: only for
        fields :func:`repeated_records_call` found C-contiguous and under ``THREADED_BYTES``
        in all, where the backend would do the same."""
        n = next(iter(fields.values())).shape[0]
        bits = np.empty((n + 63) // 64, np.uint64)
        count = int(self.loop(np.int64(n), *[fields[r] for r in self.reads], bits,
                              *self.params))
        return numpy_records.gather_new(self.g, bits, n, count, fields, self.columns,
                                        self.indices, base)


# (the caller's predicate as a key, indices, every field's (name, dtype, row shape)) -> its
# RecordsCall. The row shape says the dimensions: a 0-d field has no row to key.
_records_calls: BoundedCache[tuple, RecordsCall] = BoundedCache("repeated NumPy record calls")
holds_loops(_records_calls.clear)  # its calls hold compiled loops too


def _layout(like: Any, fields: dict[str, Any]) -> tuple[tuple, int, bool] | None:
    """The fields' layout key (each field's name, dtype and row shape), their bytes in all
    and whether every one is C-contiguous; None where a field is not a plain ``np.ndarray``
    of ``like``'s length. One walk over the fields: the lookup's key, its checks and what
    decides the direct call cost 1-2 us more in three walks, of a 64-row call of four fields
    of about 21 (2-core machine). Raises TypeError, AttributeError or IndexError where
    ``like`` or a field is not an array or is 0-d."""
    total = 0
    contiguous = True
    layout = []
    n = like.shape[0]
    for name, a in fields.items():
        if type(a) is not np.ndarray:
            return None
        shape = a.shape
        if shape[0] != n:
            return None
        layout.append((name, a.dtype, shape[1:]))
        total += a.nbytes
        contiguous = contiguous and a.flags.c_contiguous
    return tuple(layout), total, contiguous


def repeated_records_call(like: np.ndarray, fields: dict[str, Any], pred_like: Any,
                          indices: bool) -> Callable[[dict[str, np.ndarray], int], dict] | None:
    """The call :func:`remember_records_call` kept for this predicate, ``indices`` and the
    fields' layout, if every field is a plain ``np.ndarray`` and all have ``like``'s length;
    else None (the public call checks and dispatches as usual). Its :meth:`RecordsCall.direct`
    where the fields allow it."""
    try:
        seen = _layout(like, fields)
        if seen is None:
            return None
        layout, total, contiguous = seen
        pk = caller_key(pred_like)
        hit = None if pk is None else _records_calls.get((pk, indices, layout))
    except (TypeError, AttributeError, IndexError):  # unhashable, 0-d: the checks say what
        return None
    if hit is None:
        return None
    # THREADED_BYTES read now: tests lower it
    if hit.loop is not None and contiguous and total < numpy_records.THREADED_BYTES:
        return hit.direct
    return hit


def remember_records_call(like: np.ndarray, fields: dict[str, Any], pred_like: Any,
                          pred: Predicate, indices: bool) -> None:
    """After a public call on ``fields`` (checked, every array the caller's) whose predicate
    ran the compiled predicate pass: keep it under ``pred_like``, the predicate the caller
    passed."""
    seen = _layout(like, fields)
    if pred.expr is None or seen is None:
        return
    pk = kept_key(pred_like, pred)
    if pk is None:
        return
    try:
        tp = pred.typed({name: native(fields[name].dtype) for name in pred.fields})
        loop = record_bits_loop(tp)  # the call just built or found it: a lookup
        params = tuple(tp.bind(pred.params))
    except (UnsupportedPredicate, ParamOverflow, TypeError):
        return  # NumPy's mask (or no room for numba here): the checked call again
    call = RecordsCall(pred, indices, pred_like)
    g = numpy_records.gathers()
    if g is not None and all(a.dtype.isnative for a in fields.values()):
        # the kept pass and gathers (fields of the other byte order: the backend's copies)
        call = RecordsCall(pred, indices, pred_like, loop, params,
                           tuple(name for name, _ in tp.dtype), g.column_plan(fields), g)
    _records_calls.put((pk, indices, seen[0]), call)
