"""``compact_array``'s repeated call on NumPy arrays: the compiled loop and its bound
constants kept under the predicate the caller passed, so that an equal call on the same dtype
and arguments skips the public checks, the dispatch, the predicate's lookup, its typing and
the loop's lookup, which the first call passed.

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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.numba_loop import CompiledLoop, UnsupportedPredicate, fused_loop, holds_loops
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..repeat_keys import caller_key, kept_key
from .numpy_backend import loop_call, one_call

__all__ = ["LoopCall", "repeated_call", "remember_call"]


class LoopCall:
    """A kept call: ``call(a, index_base)`` is ``compact(a, pred, output, ...)`` for a plain,
    C-contiguous, native ``a`` of the kept dtype that fits one loop call. Holds the caller's
    predicate (a Predicate's key is its identity). Immutable: any thread may run it."""

    __slots__ = ("loop", "params", "output", "pred_like")

    def __init__(self, loop: CompiledLoop, params: tuple, output: str, pred_like: Any) -> None:
        self.loop, self.params, self.output, self.pred_like = loop, params, output, pred_like

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
    return hit if hit is not None and one_call(a.size, a.dtype, output) else None


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
                      LoopCall(loop, params, output, pred_like))
