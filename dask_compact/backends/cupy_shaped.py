"""``compact_array``'s repeated GPU call for a string predicate whose numbers alone changed.

A threshold new at each call (``compact_array(a, f"x < {t}")``) is a new text each time, so
the repeated call kept per text (``cupy_calls.repeated_call``) never hits, and every call
paid the checks, a plan, a new ready call (its packed kernel, zeroed words and pinned count
word) and a first call's scratch and copy: 200-300 us at 2^20 on one H200 against ~30 us for
the same threshold again, 2.6-3.8x ``torch.masked_select``'s time. Texts of one kept shape
(``predicate/template.py``: numbers compared directly with ``x``, the first text's parse
showing them to be its parameters in order) share one tree, so they share its module too;
only the kernel's constant arguments differ. So per (thread, shape, dtype, size, output,
stable, algorithm, stream) one ready call of its own is kept (:func:`remember_shaped`), and a
later text of the shape rewrites its constants' argument slots with its own numbers, bound by
the tree's typing as the plan binds them (:func:`shaped_call`), and runs it: what the
repeated call of one text does, with a rebinding.

Where the constants would type otherwise (an int outside the compared integer's dtype, which
the typing turns into a boolean parameter of another tree: ``expr.fold_outside``), or cannot
be bound (``ParamOverflow``), there is no shaped call: the public call's checks, parse and
plan run and say what they say. The call's own memo (the selected fraction its outputs are
sized from) is the first text's predicate's: a later threshold that selects more than the
outputs hold runs again into exact ones, as any speculative call does.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.expr import ParamOverflow
from ..predicate.function_shape import forget as forget_shapes
from ..predicate.function_shape import learn, numbers_for
from ..predicate.memo import value_key
from ..predicate.template import kept_shape, shape_of

__all__ = ["shaped_call", "remember_shaped", "shaped_key", "bound_numbers", "shape_typing",
           "ShapedRun", "find_run", "runs_evicted", "forget", "has_shape", "kept",
           "served_before", "shape_serves"]

# The repeated call's key of a text the shaped call served (its numbers) -> its ShapedRun: the
# same text again skips finding its shape and binding (a dict; emptied past RUNS_MAX)
_runs: dict[tuple, ShapedRun] = {}
RUNS_MAX = 1024


def runs_evicted(runs: dict[tuple, ShapedRun]) -> Callable[[tuple, list], None]:
    """The eviction hook of a cache of shaped calls whose runs ``runs`` keeps: the runs of
    an evicted call go with it. Until 2026-12-02 (seventeenth session, a regression review)
    they held it (its module, scratch up to 8 MiB, pinned word) until the runs filled: up to
    RUNS_MAX calls against ``cache.memory-entries``, and past ``clear_cache()``. A scan of at
    most RUNS_MAX runs, at an eviction only."""

    def evicted(key: tuple, entry: list) -> None:
        for k, run in list(runs.items()):
            if run.entry is entry:
                runs.pop(k, None)

    return evicted


# (thread, ("shape", shape), dtype, n, output, stable, algorithm, stream) -> [device, its
# OneReadCall, the typed tree, the value keys of the numbers its slots hold now]
shaped_calls: BoundedCache[tuple, list] = BoundedCache(
    "shaped calls", on_evict=runs_evicted(_runs), on_clear=_runs.clear)


class ShapedRun:
    """The shape's kept call with one text's constants: rebound to them where another text of
    the shape ran it since."""

    def __init__(self, entry: list, keys: tuple, bound: tuple) -> None:
        self.entry, self.keys, self.bound = entry, keys, bound

    def __call__(self, *args: Any) -> Any:
        entry = self.entry
        keys = entry[3]
        # by equality too: a function's run is made per call (find_run), so its keys are a
        # new tuple each time; the same numbers again need no rebinding
        if keys is not self.keys and keys != self.keys:
            # no text's until the slots hold these: a Ctrl-C in the rebinding left the note
            # of the text before over slots partly rewritten, and its next call ran with the
            # other's constants (until 2026-12-02, seventeenth session, a regression review)
            entry[3] = None
            entry[1].kernel.rebind(self.bound)
            entry[3] = self.keys
        return entry[1](*args)


# Repeated calls' keys of functions whose call a shape served once (served_before)
_served: dict[tuple, bool] = {}


def served_before(key: tuple) -> bool:
    """Whether a shape served the function call of repeated key ``key`` before (then
    forgotten: the call goes the checked way, whose repeated call is then kept for the ones
    after); else noted. A function's shaped run is made per call (see :func:`find_run`): a
    value called again and again ran that way 15-18 us slower than by a repeated call of its
    own on one H200 (2^20 float32, public_calls.py at 9e43dac: 57.8 against 41.0 us), so a
    shape serves a value's first call, and its second costs one checked call."""
    if _served.pop(key, None) is not None:
        return True
    if len(_served) >= RUNS_MAX:
        _served.clear()
    _served[key] = True
    return False


def shape_serves(pred_like: Any, key: tuple | None) -> bool:
    """Whether a call with no kept call of its own (repeated key ``key``, None where its
    arguments make none) goes its shape's kept call: a string whose numbers alone differ from
    a kept one's, always; a function, on its value's first call only (:func:`served_before`).
    ``compact_array``'s and ``compact_into``'s repeated calls ask the same."""
    if not has_shape(pred_like):
        return False
    return isinstance(pred_like, str) or key is None or not served_before(key)


def bound_numbers(tp: Any, numbers: tuple, dtype: np.dtype, text: str) -> tuple | None:
    """``numbers`` bound as the typed tree ``tp``'s constants (what its kernel's slots take),
    or None where they type otherwise (an int outside an integer dtype folds into another
    tree: no comparison of it is the kernel's) or do not bind."""
    if dtype.kind in "iub":
        from ..predicate.core import _folded

        if _folded(tp, numbers, text) is not tp:
            return None
    try:
        return tp.bind(numbers)
    except (ParamOverflow, OverflowError, ValueError, TypeError):
        return None


def forget() -> None:
    """Drop the shaped calls kept (``cupy_calls.forget_ready_calls``)."""
    shaped_calls.clear()
    _runs.clear()
    _served.clear()
    forget_shapes()


def shaped_key(pred_like: Any, key: tuple) -> tuple[tuple, tuple] | None:
    """``(key, numbers)``: the shaped call's key for ``pred_like`` given the repeated call's
    ``key`` (its predicate part ``pred_like``'s), and its numbers in the order of its tree's
    parameters; None where it has no shape (a text without numbers or with quotes; a
    function whose shape was not learned, ``predicate/function_shape.py``)."""
    if isinstance(pred_like, str):
        found = shape_of(pred_like)
        if found is None:
            return None
        shape, numbers = found
        return (key[0], ("shape", shape), *key[2:]), numbers
    found = numbers_for(pred_like)
    if found is None:
        return None
    fshape, numbers = found
    return (key[0], fshape, *key[2:]), numbers


def has_shape(pred_like: Any) -> bool:
    """Whether ``pred_like`` is of a kind whose calls a shape may serve: a string, or a plain
    Python function (whose shape may be learned)."""
    return isinstance(pred_like, str) or type(pred_like) is types.FunctionType


def shaped_call(a: Any, text: Any, key: tuple) -> Any:
    """The kept call of ``text``'s shape (a string's or a function's) with its numbers as
    its constants (a :class:`ShapedRun`), or None (no call kept for the shape; numbers that
    type otherwise or do not bind). ``key``: the repeated call's key of ``text``."""
    return find_run(_runs, shaped_calls, a, text, key)


def find_run(runs: dict[tuple, ShapedRun], calls: BoundedCache[tuple, list], a: Any,
             text: Any, key: tuple) -> ShapedRun | None:
    """``text``'s run of the call its shape keeps in ``calls`` (entries ``[device, call,
    typed tree, numbers' keys, ...]``), made at its first use and, for a string, kept in
    ``runs`` under the repeated call's ``key``; None where no call is kept for the shape on
    ``a``'s device, or the numbers type otherwise or do not bind. A function's run is not
    kept: its numbers are read from it once per call, here, and a run kept under ``key``
    (taken from an earlier reading) would bind what a thread rebinding one wrote in
    between to the other value's key."""
    is_text = isinstance(text, str)
    run = runs.get(key) if is_text else None
    if run is not None and a.data.device_id == run.entry[0]:
        return run
    found = shaped_key(text, key)
    if found is None:
        return None
    skey, numbers = found
    entry = calls.get(skey)
    if entry is None or a.data.device_id != entry[0]:
        return None
    bound = bound_numbers(entry[2], numbers, np.dtype(a.dtype), text if is_text else "")
    if bound is None:
        return None
    run = ShapedRun(entry, tuple(value_key(v) for v in numbers), bound)
    if is_text:
        if len(runs) >= RUNS_MAX:
            runs.clear()
        runs[key] = run
    return run


def remember_shaped(a: Any, text: Any, pred: Any, key: tuple, output: str, alg: str) -> None:
    """After a public call of ``text`` (checked; its ready call kept under ``key``): keep a
    ready call of its own for the shape of ``text`` (a string or a function), planned as that
    call (``alg``), where the shape is kept (:func:`kept`) and its typing has no folds nor
    powers."""
    from .cupy_exact import make_plan
    from .cupy_ready import OneReadCall

    found = kept(text, pred, key)
    if found is None or shaped_calls.get(found[0]) is not None:
        return
    plan = make_plan(a, pred, None, output, alg)
    tp = shape_typing(pred, a, plan)
    if tp is not None:
        shaped_calls.put(found[0], [a.data.device_id, OneReadCall(plan, output), tp, None])


def kept(text: Any, pred: Any, key: tuple) -> tuple[tuple, tuple] | None:
    """:func:`shaped_key` of ``text`` after a call traced or parsed it into ``pred``, where
    its shape is one to keep a call for: a string's as ``template.kept_shape`` says, a
    function's once its slots are learned (``function_shape.learn``)."""
    if isinstance(text, str):
        return shaped_key(text, key) if kept_shape(text) else None
    learn(text, pred)
    return shaped_key(text, key)


def shape_typing(pred: Any, a: Any, plan: Any) -> Any:
    """The typed tree a shape's kept call runs (``pred``'s for ``a``), or None where the call
    is not kept: folds or powers in it (their values are checked per predicate), a plan that
    takes no ready call."""
    tp = pred.typed(np.dtype(a.dtype))
    if tp.folds or tp.powers or plan.memo is None or plan.mask is not None or plan.checked:
        return None
    return tp
