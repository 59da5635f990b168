"""Functions whose numbers change from call to call: one trace per shape.

A threshold chosen per call and read by a function (``compact_array(a, lambda v: v < t)``, a
new ``t`` per batch) makes a new trace key each time (``memo.trace_key`` holds the values
the code reads), so until 2026-12-02 every such call traced the function, typed and planned
its tree and made a new ready call: 270-400 us at 2^20 float32 on one H200 against ~30 us
for the same ``t`` again, 3.8x ``torch.masked_select``'s time, where a string of new numbers
(``f"x < {t}"``, ``template.py``) took ~75 us.

Two functions of one code whose values differ only in the exact ``int`` and ``float`` values
they read (closure cells, defaults, globals the code names) have one *shape*
(:func:`numbers_for`): their key with those values as their types alone. Once a trace of one
of them (:func:`learn`) has shown how its tree's parameters come from them, another of the
shape has the same tree, its parameters being its own values where the learning trace met
them and the same literals elsewhere, without being traced. The learning trace calls the
function with each such value replaced by a :class:`~.trace.Stand`, a symbol the tracer takes
as an operand of the array (a parameter whose source it notes) and that raises on anything
else the function's own code does with it (``t * 2``, ``if t > 0``, ``float(t)``,
``f"{t}"``): so a value that steers the trace any other way than as an operand leaves the
shape unkept, and such functions are traced per value as before; so does a use the
function's own code catches (the Stand notes each), and code that could observe a value
without asking it (``is``, ``type`` by another name, an exception handler, a dunder name:
:func:`_unasked`). The learning trace must also give the very tree the function's own
trace gave (the typing of a power by a Python scalar depends on its value, so a Stand as an
exponent stops it).

The shape is what the GPU's kept calls per shape use (``backends/cupy_shaped.py``), as a
string's is.
"""

from __future__ import annotations

import dis
import functools
import itertools
import operator
import types
from typing import Any

from .memo import (
    _MISSING,
    _RECENT_TYPES,
    _fixed_builtin,
    _snapshot,
    _trace_key,
    _values,
    code_names,
    frozen,
    rebuilt,
    value_key,
)

__all__ = ["numbers_for", "learn", "like_traced", "forget"]

_NUMBERS = (int, float)  # exact types: bool is an int, and its kind is another (expr.param_kind)
_PLACEHOLDER = {int: 0, float: 0.0}

# fshape -> the slots learned for it: per parameter of the tree, the place of the function's
# value in its shape's numbers (an int), or a 1-tuple holding a literal; None where learning
# failed (a value used otherwise than as an operand, another tree). Emptied past _MAX.
_SLOTS: dict[tuple, tuple | None] = {}
# id(code) -> (code, globals, builtins, names, the values held, per value its id or, at a
# number's place, its type, the places, the fshape, its slots): a function of that code and
# globals whose other values are the very objects held gets its shape for ~1 us. Only where
# those values are of memo._RECENT_TYPES (nothing changes them in place) or fixed builtins,
# as for memo's recent keys.
_RECENT: dict[int, tuple] = {}
# fshape -> (the tree, the source) of the trace its slots were learned from: a function of
# the shape is given that tree with its own numbers by like_traced. Emptied with _SLOTS.
_TREES: dict[tuple, tuple[Any, str]] = {}
_MAX = 256


def _layout(func: types.FunctionType) -> tuple[tuple[str, ...], list[Any], tuple[int, ...]] | None:
    """``(names, values, places)``: the names the code reads, what its key is made of
    (memo._values' order: cells, defaults, globals, builtins) and the places of the exact
    ints and floats among the cells, defaults and globals; None where there is none or the
    values cannot be read."""
    names = code_names(func.__code__)
    values = _values(func, func.__globals__, names)
    if values is None:
        return None
    end = len(values) - len(names) if names else len(values)  # the builtins are not numbers
    places = tuple(i for i in range(end) if type(values[i]) in _NUMBERS)
    return (names, values, places) if places else None


def _fshape(func: types.FunctionType, names: tuple[str, ...], values: list[Any],
            places: tuple[int, ...], reads: dict | None = None) -> tuple | None:
    """The shape's key: the trace key of ``func`` with its numbers at ``places`` replaced by
    one value of their type, and those types; None where the function has no trace key."""
    held = list(values)
    for i in places:
        held[i] = _PLACEHOLDER[type(values[i])]
    key = _trace_key(rebuilt(func, names, held), reads)
    if key is None:
        return None
    return ("fshape", key, places, tuple(type(values[i]).__name__ for i in places))


def numbers_for(func: Any) -> tuple[tuple, tuple] | None:
    """``(fshape, numbers)``: the shape of ``func`` and its tree's parameters in order, from
    one reading of its values; None where it has no learned shape."""
    if type(func) is not types.FunctionType:
        return None
    code = func.__code__
    hit = _RECENT.get(id(code))
    if (hit is not None and hit[0] is code and hit[1] is func.__globals__
            and hit[2] is getattr(func, "__builtins__", None)):
        values = _values(func, hit[1], hit[3])
        check = hit[5]
        if values is not None and len(values) == len(check) and all(
                type(v) is c if type(c) is type else id(v) == c
                for v, c in zip(values, check)):
            return hit[7], _numbers(hit[8], values, hit[6])
    found = _layout(func)
    if found is None:
        return None
    names, values, places = found
    try:
        fshape = _fshape(func, names, values, places)
    except Exception:  # as memo.trace_key: reading an attribute ran code
        return None
    slots = None if fshape is None else _SLOTS.get(fshape)
    if fshape is None or slots is None:
        return None
    kept = set(places)
    if all(v is _MISSING or type(v) in _RECENT_TYPES or _fixed_builtin(v)
           for i, v in enumerate(values) if i not in kept):
        if len(_RECENT) >= _MAX:
            _RECENT.clear()
        check = [type(v) if i in kept else id(v) for i, v in enumerate(values)]
        _RECENT[id(code)] = (code, func.__globals__, getattr(func, "__builtins__", None),
                             names, tuple(values), check, places, fshape, slots)
    return fshape, _numbers(slots, values, places)


def _numbers(slots: tuple, values: list[Any], places: tuple[int, ...]) -> tuple:
    return tuple(values[places[s]] if type(s) is int else s[0] for s in slots)


def learn(func: Any, pred: Any) -> None:
    """After ``pred`` was traced from ``func`` (its current values): learn the slots of
    ``func``'s shape (see the module docstring), once per shape."""
    from .trace import Stand, Tracer, run_traced

    if type(func) is not types.FunctionType or pred.expr is None or pred.fields:
        return
    fixed = frozen(func)  # its values read once: the key, the trace and the check agree
    if fixed is None:
        return
    found = _layout(fixed)
    if found is None:
        return
    names, values, places = found
    reads: dict[int, tuple[Any, dict[str, Any]]] = {}
    try:
        fshape = _fshape(fixed, names, values, places, reads)
    except Exception:
        return
    if fshape is None or fshape in _SLOTS:
        return
    slots: tuple | None = None
    node = None
    tracer = Tracer()
    live: list[str] = []
    uses: list[str] = []  # what the function's own code did with a Stand (Stand's docstring)
    if not _unasked(fixed.__code__, values, reads):
        stood = list(values)
        for j, i in enumerate(places):
            stood[i] = Stand(values[i], j, uses)
        try:
            node, _ = run_traced(_snapshot(rebuilt(fixed, names, stood), reads, live), tracer)
        except Exception:  # a refusal: the function's own trace said so, or another thing
            node = None
    if node is not None and not live and not uses and node == pred.expr:
        if len(tracer.params) != len(pred.params) or any(
                value_key(a) != value_key(b) for a, b in zip(tracer.params, pred.params)):
            return  # traced under other values (a thread rebinding one): learn another time
        slots = tuple((v,) if s is None else s for v, s in zip(tracer.params, tracer.sources))
        if not _retraced(fixed, names, values, places, reads, slots, node):
            slots = None
    if len(_SLOTS) >= _MAX:
        _SLOTS.clear()
        _TREES.clear()
    _SLOTS[fshape] = slots
    if slots is not None:
        _TREES[fshape] = (pred.expr, pred.source)


def like_traced(func: Any) -> tuple[Any, tuple] | None:
    """``(predicate, key)``: ``func``'s predicate, the tree of its learned shape with its own
    numbers, untraced, and its trace key; None where it has no learned shape, or reads a
    module or class (whose attributes the key reads live: a second reading, beside the
    numbers', that a thread setting one in between could make disagree with them).

    The key and the numbers come from one copy of the function's values (``memo.frozen``),
    so the key the predicate is kept under is the one its numbers were read under
    (``memo.TRACED_UNDER``: a repeated call is kept only under it)."""
    from .core import Predicate

    fixed = frozen(func)
    if fixed is None:
        return None
    found = _layout(fixed)
    if found is None:
        return None
    names, values, places = found
    kept = set(places)
    if not all(v is _MISSING or type(v) in _RECENT_TYPES or _fixed_builtin(v)
               for i, v in enumerate(values) if i not in kept):
        return None
    try:
        fshape = _fshape(fixed, names, values, places)
        key = None if fshape is None else _trace_key(fixed)
    except Exception:  # as memo.trace_key
        return None
    slots = None if fshape is None else _SLOTS.get(fshape)
    tree = None if fshape is None else _TREES.get(fshape)
    if key is None or slots is None or tree is None:
        return None
    return (Predicate(expr=tree[0], params=_numbers(slots, values, places), func=func,
                      source=tree[1]), key)


def _retraced(fixed: types.FunctionType, names: tuple[str, ...], values: list[Any],
              places: tuple[int, ...], reads: dict[int, tuple[Any, dict[str, Any]]],
              slots: tuple, node: Any) -> bool:
    """Whether a trace of ``fixed`` with other numbers at ``places`` (each new, none equal to
    another, to a value learned from or to a literal of ``slots``) gives ``node`` and the
    numbers ``slots`` take from them. A second witness beside the Stand's notes and
    :func:`_unasked`: a way of observing a number that neither sees (the Stand's type
    told from a float's by some means of C's) took another branch than the number's, and
    where the two branches' trees and numbers agreed by coincidence at the value learned
    from (the number 1.0 there, the literal 1.0 here) they do not agree at another value.
    It cannot see identity (new numbers are other objects than any), which
    :func:`_unasked` refuses; once per shape, a trace's time."""
    from .trace import Tracer, run_traced

    taken = [values[i] for i in places] + [s[0] for s in slots if type(s) is tuple]
    other = list(values)
    k = 0
    for i in places:
        while True:
            new = _OTHER[type(values[i])](k)
            k += 1
            if not any(_equal(new, x) for x in taken):
                break
        other[i] = new
        taken.append(new)
    tracer = Tracer()
    live: list[str] = []
    try:
        again, _ = run_traced(_snapshot(rebuilt(fixed, names, other), reads, live), tracer)
    except Exception:  # the number steered it into a refusal
        return False
    return (not live and again == node and len(tracer.params) == len(slots)
            and [value_key(v) for v in tracer.params]
            == [value_key(v) for v in _numbers(slots, other, places)])


# The k-th number of its type a retrace (:func:`_retraced`) tries: none a round number a
# predicate's code would hold as a literal
_OTHER = {int: lambda k: 7919 + 104729 * k, float: lambda k: 0.6180339887 + 1.7 * k}


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # a literal that compares oddly: taken as equal, and passed over
        return True


# What observes a value without asking it anything, so that a Stand cannot note it: its
# identity (``t is D``, ``operator.is_not(t, D)``: a number learned from as another object
# than D took the other branch of one that is D) and its type (``type`` by another name,
# ``float.__class__(t)``, ``object.__repr__(t)``: a Stand's is Stand's, not the number's).
# Until 2026-12-02 (eighteenth session, a review) each of these learned a shape that served
# a later value the numbers of a branch its own trace did not take.
_OBSERVERS = (type, id, operator.is_, operator.is_not)
# ``is`` / ``is not``, and the handlers of ``try`` and ``with``: an error raised where a
# number would not raise, and caught (``float.hex(t)`` raises TypeError for a Stand without
# asking it, which a Stand's own notes do not see), takes the handler's way. (Python 3.11+:
# comprehensions and generators hold no PUSH_EXC_INFO; ``if x is None`` is a jump of its own,
# harmless here, a number being no None.)
_UNASKED_OPS = frozenset({"IS_OP", "PUSH_EXC_INFO", "CHECK_EXC_MATCH", "CHECK_EG_MATCH"})


@functools.lru_cache(maxsize=1024)
def _unasked_code(code: types.CodeType) -> bool:
    """Whether ``code`` (or code nested in it) may observe a number without asking it: an
    identity test, an exception handler, or a dunder name (``__class__``, ``__repr__``: a
    type's own slots called on the value, or its type read)."""
    if any(n.startswith("__") and n.endswith("__") for n in code.co_names):
        return True
    if any(ins.opname in _UNASKED_OPS for ins in dis.get_instructions(code)):
        return True
    return any(isinstance(c, types.CodeType) and _unasked_code(c) for c in code.co_consts)


def _unasked(code: types.CodeType, values: list[Any],
             reads: dict[int, tuple[Any, dict[str, Any]]]) -> bool:
    """Whether a learning trace of ``code`` reading ``values`` (and the attributes
    ``reads``) could take another way than its trace did with nothing noted by a Stand
    (see :data:`_OBSERVERS`): then its shape keeps no slots."""
    if _unasked_code(code):
        return True
    held = itertools.chain(values, *(got.values() for _, got in reads.values()))
    return any(v is o for v in held for o in _OBSERVERS)


def forget() -> None:
    """Drop the shapes learned (``clear_cache``)."""
    _SLOTS.clear()
    _TREES.clear()
    _RECENT.clear()
