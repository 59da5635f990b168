"""Trace a Python predicate into an expression tree by calling it once on a symbolic array.

The symbolic array (:class:`Sym`) records every operation as a :class:`~.expr.Call` node:
Python operators, NumPy ufuncs (``__array_ufunc__``) and ``np.where``/``np.real``/``np.imag``
(``__array_function__``). Literal numbers become :class:`~.expr.Param` leaves, numbered in the
order they are met, so ``lambda v: v > 0.3`` and ``lambda v: v > 0.7`` give the same tree and
share one compiled loop or kernel.

What the tracer meets decides the path (docs/design.md, Predicates):

* elementwise operations it knows -> a fused tree;
* reductions (``v.mean()``, ``np.median(v)``, ``np.linalg.norm(v)``), other non-elementwise
  operations (``v[1:]``, ``np.sort(v)``, ``len(v)``), anything that turns the chunk into data
  (``np.asarray(v)``, ``float(v)``, ``v.size``, ``v.shape``, the truth value ``if v > 0:``) and
  trees past :data:`MAX_TREE_DEPTH` / :data:`MAX_TREE_NODES` -> a ValueError
  (:class:`NotElementwise`, :class:`TooLarge`): inside a predicate they would see one chunk,
  not the array, so the result would silently depend on the chunking;
* anything else that may well be elementwise but cannot be recorded (``np.isin``,
  ``np.arctan2``, ``v.astype(...)``, an exception from the function) -> the mask path: the
  callable is run on each chunk and its boolean result compacted. The reason is kept for the
  repr/log, and every mask evaluation is checked on slices of the chunk
  (:meth:`.core.Predicate.mask`), so a chunk-dependent callable that slipped through raises.

:mod:`.parse` evaluates a whitelisted string expression over the same :class:`Sym`, so a string
and the equivalent lambda give identical trees.
"""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np

from .core import NotElementwise, Predicate
from .expr import REDUCTIONS, UFUNCS, Call, Node, Param, Var, param_kind, variables
from .memo import code_names

__all__ = [
    "MAX_TREE_DEPTH", "MAX_TREE_NODES", "NotElementwise", "Stand", "Sym", "TooLarge", "Tracer",
    "Untraceable", "trace",
]  # fmt: skip

# Bounds on the traced tree. Node hashing, printing and the reference evaluator recurse on the
# depth, and evaluation and typing walk every path, so a shared subtree counts once per use
# (``y = v + v`` repeated 40 times is 2**40 paths). Real filters are far below both: a chain of
# 100 ``(v == c) |`` terms has depth 101 and 301 nodes.
MAX_TREE_DEPTH = 200
MAX_TREE_NODES = 4000

# Reductions that NumPy spells outside the ndarray methods (np.linalg.norm is "norm").
_MORE_REDUCTIONS: frozenset[str] = frozenset(
    {
        "norm", "vector_norm", "matrix_norm", "det", "slogdet", "cond", "matrix_rank",
        "nanargmin", "nanargmax", "nancumsum", "nancumprod", "cov", "corrcoef",
        "histogram_bin_edges", "histogram2d", "histogramdd", "polyfit", "allclose",
        "array_equal", "array_equiv",
    }
)
# Attributes that read the chunk's size or layout: per chunk, not per element.
_CHUNK_ATTRIBUTES: frozenset[str] = frozenset(
    {"size", "shape", "ndim", "nbytes", "strides", "data", "base", "ctypes", "flags"}
)

# ufunc object -> the name the tree uses (np.divide is np.true_divide, np.abs is np.absolute...).
_UFUNC_NAMES: dict[np.ufunc, str] = {getattr(np, name): name for name in sorted(UFUNCS)}

# Cumulative and reordering operations: not reductions, but just as chunk-dependent.
_NOT_ELEMENTWISE: frozenset[str] = frozenset(
    {
        "sort",
        "argsort",
        "partition",
        "argpartition",
        "lexsort",
        "diff",
        "ediff1d",
        "gradient",
        "roll",
        "rollaxis",
        "cumsum",
        "cumprod",
        "nancumsum",
        "nancumprod",
        "convolve",
        "correlate",
        "reshape",
        "ravel",
        "flatten",
        "transpose",
        "swapaxes",
        "moveaxis",
        "flip",
        "fliplr",
        "flipud",
        "rot90",
        "squeeze",
        "expand_dims",
        "broadcast_to",
        "tile",
        "repeat",
        "pad",
        "take",
        "take_along_axis",
        "compress",
        "extract",
        "choose",
        "nonzero",
        "flatnonzero",
        "argwhere",
        "unique",
        "concatenate",
        "stack",
        "hstack",
        "vstack",
        "dstack",
        "append",
        "insert",
        "delete",
        "resize",
        "trim_zeros",
        "histogram",
        "bincount",
        "trapezoid",
        "trapz",
        "dot",
        "vdot",
        "matmul",
        "inner",
        "outer",
        "tensordot",
        "einsum",
        "kron",
        "cross",
        "diagonal",
        "trace",
        "T",
        "mT",
        "flat",
        "item",
        "tolist",
        "fill",
    }
)

_CUMULATIVE = frozenset({"cumsum", "cumprod", "nancumsum", "nancumprod"})


class TooLarge(NotElementwise):
    """The traced tree is deeper or larger than :data:`MAX_TREE_DEPTH` / :data:`MAX_TREE_NODES`."""


class Untraceable(Exception):
    """Raised inside the traced function when it does something the tracer cannot record.

    Not a ValueError/TypeError on purpose, so that ``except ValueError`` in user code does not
    swallow it; the tracer also remembers it, so swallowing it does not hide it either.
    """


def _reduction_error(name: str, tracer: Tracer | None = None, *operands: Any
                     ) -> NotElementwise:  # fmt: skip
    """The refusal of reduction ``name`` (or a cumulative one), in the words of a record
    predicate where ``tracer`` traces one (:func:`_record_reduction_error`)."""
    if tracer is not None and tracer.fields is not None:
        return _record_reduction_error(name, tracer.fields, operands)
    if name in _CUMULATIVE or name.endswith(".accumulate"):
        return NotElementwise(
            f"`{name}` is not elementwise: inside a predicate it would run over each chunk "
            "separately, not over the array. Compute the condition on the dask array first "
            "(e.g. m = da.cumsum(x) > 0) and filter with dask_compact.compact(x, m) instead."
        )
    return NotElementwise(
        f"`{name}` is a reduction: inside a predicate it would reduce each chunk separately, "
        "not the array, so every chunk would be filtered against its own statistic. Compute the "
        "statistic first, e.g. `m = float(x.mean().compute())` then `lambda v: v > m`."
    )


def _record_reduction_error(name: str, fields: tuple[str, ...], operands: tuple
                            ) -> NotElementwise:  # fmt: skip
    """A reduction in a record predicate, naming the field(s) it reduces (those its operands
    read; every field the predicate takes where none is symbolic). Until 2026-12-01 it was
    refused in the one-array wording, `x.mean()` and `lambda v: v > m` (the eleventh
    session's record probe). A reduction per row of a field with trailing axes
    (``np.sum(v, axis=1)``) is refused the same way, since a predicate's fields are cut
    differently on the paths it runs on; since 2026-12-01 (thirteenth session, a review) its
    way out, a field of its own, is said too: the whole-field statistic alone misled there."""
    read = sorted({v for o in operands if isinstance(o, Sym) for v in variables(o._node)})
    read = read or sorted(fields)
    which = (f"the field {read[0]!r}" if len(read) == 1
             else f"the fields {', '.join(map(repr, read))}")
    f = read[0]
    if name in _CUMULATIVE or name.endswith(".accumulate"):
        return NotElementwise(
            f"`{name}` of {which} is not elementwise: inside a record predicate it would run "
            "over each chunk of rows separately, not over the whole field. Compute the "
            f"condition first as a field of its own (e.g. fields['keep'] = da.cumsum({f}) > 0) "
            "and select by it, compact_records(fields, 'keep')."
        )
    return NotElementwise(
        f"`{name}` of {which} is a reduction: inside a record predicate it would reduce each "
        "chunk of rows separately, not the whole field, so every chunk would be filtered "
        f"against its own statistic. Compute the statistic first, e.g. `m = float({f}.mean())` "
        f"(`float({f}.mean().compute())` for a dask field) then `lambda {f}: {f} > m`. A value "
        f"per row of a field with trailing axes (a row's sum, `{f}.sum(axis=1)`) goes in as a "
        f"field of its own: `compact_records({{**fields, 'row_sum': {f}.sum(axis=1)}}, "
        "lambda row_sum: row_sum > t)`."
    )


def _not_elementwise(what: str) -> NotElementwise:
    return NotElementwise(
        f"{what} is not elementwise: a predicate gets one chunk at a time and must give one "
        "boolean per element from that element alone (comparisons, &, |, ~, np.isnan, ...)."
    )


def _where_arguments(n: int, keywords: bool) -> NotElementwise:
    """np.where called with other than three arguments: one gives indices (not elementwise);
    two is NumPy's own error ("either both or neither of x and y"), said with the fix."""
    if keywords:  # NumPy's own x and y are positional-only
        return NotElementwise("`np.where` takes its arguments by position: where(cond, a, b)")
    if n == 1:
        return _not_elementwise("`np.where(cond)` (one argument: indices)")
    return NotElementwise(
        f"`np.where` with {n} arguments is not allowed: it takes three, where(cond, a, b) (a "
        "where cond is true, else b; NumPy: either both or neither of a and b are given); to "
        "select the elements where cond holds, write cond itself"
    )


def _per_chunk(what: str) -> NotElementwise:
    return NotElementwise(
        f"{what} is refused: a predicate gets one chunk at a time, so whatever is computed from "
        "the chunk as a whole (its size, shape, a statistic of its values) would differ from "
        "chunk to chunk and silently change the result. Use only elementwise operations on the "
        "argument; compute statistics on the dask array first (`m = float(x.mean().compute())`)."
    )


class Tracer:
    """The state of one trace: the parameter values met so far and what stopped the trace."""

    def __init__(self) -> None:
        self.params: list[Any] = []
        # per parameter, the ``at`` of the Stand it came from (None for a literal): how a
        # function's kept shape (function_shape.py) learns which of its values fill which slot
        self.sources: list[int | None] = []
        # the record fields traced (run_traced's names), None for one array: the wording of
        # a refusal (_reduction_error)
        self.fields: tuple[str, ...] | None = None
        self.untraceable: str | None = None
        self.refused: NotElementwise | None = None
        # A refusal of ``__index__`` not yet final, and where it was asked for: NumPy's
        # indexing of an array by the argument (``lut[v]``) asks for an integer first, then
        # converts it with ``__array__`` in the same instruction (see Sym.__array__).
        self.index_refused: tuple[NotElementwise, Any] | None = None
        # (depth, nodes counted per path) of every Call made here, by id; the node is kept
        # beside its numbers so its id stays unique for the tracer's life.
        self._extent: dict[int, tuple[Node, int, int]] = {}

    def param(self, value: Any) -> Param:
        """A new parameter leaf for a literal (one per occurrence: each fills one typed slot)."""
        kind = param_kind(value)  # TypeError for non-numbers, handled by the caller
        if isinstance(value, np.ndarray):
            value = value[()]  # a 0-d array (NumPy passes scalars to __array_ufunc__ this way)
        p = Param(len(self.params), kind)
        self.params.append(value)
        self.sources.append(None)
        return p

    def stop(self, reason: str) -> Untraceable:
        """Record why the trace cannot be fused and return the exception to raise."""
        if self.untraceable is None:
            self.untraceable = reason
        return Untraceable(reason)

    def refuse(self, err: NotElementwise) -> NotElementwise:
        if self.refused is None:
            self.refused = err
        return err

    def operand(self, value: Any, where: str) -> Node:
        """The tree node for an operand: a symbolic value's node or a new parameter."""
        if type(value) is Stand:  # first: isinstance would read its __class__, a use
            number, at = stand_fields(value)
            p = self.param(number)
            self.sources[-1] = at
            return p
        if isinstance(value, Sym):
            if value._tracer is not self:
                raise self.stop(f"{where}: a symbolic value from another trace")
            return value._node
        _refuse_dask(self, value)
        if isinstance(value, np.ndarray) and value.ndim > 0:
            raise self.stop(
                f"{where}: an operand is an array of shape {value.shape}; only scalar constants "
                "can be compiled into the predicate"
            )
        try:
            return self.param(value)
        except TypeError as e:
            raise self.stop(f"{where}: {e}") from None

    def call(self, fn: str, *args: Any) -> Sym:
        nodes = tuple(self.operand(a, fn) for a in args)
        depth, size = 1, 1
        for n in nodes:
            _, d, k = self._extent.get(id(n), (n, 1, 1))
            depth, size = max(depth, d + 1), size + k
        if depth > MAX_TREE_DEPTH or size > MAX_TREE_NODES:
            raise self.refuse(
                TooLarge(
                    f"the predicate's expression is too large to compile (nested over "
                    f"{MAX_TREE_DEPTH} deep, or over {MAX_TREE_NODES} operations counted along "
                    "every path); write it with fewer operations, e.g. a boolean dask array "
                    "passed to dask_compact.compact(x, mask)"
                )
            )
        node = Call(fn, nodes)
        self._extent[id(node)] = (node, depth, size)
        return Sym(node, self)


def _refuse_dask(tracer: Tracer, value: Any) -> None:
    if type(value).__module__.startswith("dask."):
        from dask.base import is_dask_collection

        if is_dask_collection(value):
            raise tracer.refuse(
                NotElementwise(
                    "a dask collection is used inside the predicate; each chunk task would "
                    "compute or embed it. Compute a scalar first (e.g. `m = float(m.compute())`), "
                    "or filter by a boolean dask array of the same chunks, m, with "
                    "dask_compact.compact(x, m)."
                )
            )


def _binary(fn: str, reflected: bool = False) -> Callable[[Any, Any], Any]:
    def op(self: Sym, other: Any) -> Any:
        if reflected:
            return self._tracer.call(fn, other, self)
        return self._tracer.call(fn, self, other)

    op.__name__ = f"__{'r' if reflected else ''}{fn}__"
    return op


def _unary(fn: str) -> Callable[[Any], Any]:
    def op(self: Sym) -> Any:
        return self._tracer.call(fn, self)

    op.__name__ = f"__{fn}__"
    return op


def _in_place(symbol: str) -> Callable[[Any, Any], Any]:
    """``v <symbol>= other``: refused where ``v`` is the argument (or its ``.real`` or
    ``.imag``, views of it), as the mask path refuses it (NumPy's read-only error, made clear
    by ``core.refuse_writes``). Without these Python fell back to ``v = v <symbol> other``, so
    a traced ``v += 1`` selected by the new values the elements it never changed, where NumPy
    changes the caller's array, and where the same line with anything untraceable was refused
    (a probe, 2026-12-06). On an array the function made (``w = v * 2; w += 1``) Python's
    fallback is what NumPy does to a new array: NotImplemented lets it run."""

    def op(self: Sym, other: Any) -> Any:
        node = self._node
        while type(node) is Call and node.fn in ("real", "imag"):
            node = node.args[0]
        if type(node) is Var:
            which = "its argument" if node.name == "x" else f"its argument `{node.name}`"
            raise self._tracer.refuse(
                NotElementwise(
                    f"the predicate writes into {which} (`{symbol}=`): it is called on the "
                    "data itself (a chunk, its parts for the checks), which it must leave as "
                    "it is; compute new arrays instead (v * 2, not v *= 2)"
                )
            )
        return NotImplemented

    op.__name__ = "__i" + _IN_PLACE[symbol] + "__"
    return op


# The augmented assignments' operators, by the dunder name each has after ``__i``.
_IN_PLACE = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv",
             "%": "mod", "**": "pow", "&": "and", "|": "or", "^": "xor", "<<": "lshift",
             ">>": "rshift", "@": "matmul"}  # fmt: skip


def _called_by_vectorize() -> bool:
    """Whether the conversion under way is np.vectorize's, of a function applied per element
    (no ``signature``: a core signature makes it act on whole sub-arrays, not elementwise)."""
    frame = inspect.currentframe()
    for _ in range(8):  # vectorize's __call__ -> _call_as_normal -> _vectorize_call -> asanyarray
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return False
        obj = frame.f_locals.get("self")
        if isinstance(obj, np.vectorize):
            return obj.signature is None
    return False


class StandUsed(TypeError):
    """A :class:`Stand` was used as a number by the function's own code."""


# The operators a float or an int has that a Stand answers for: each records the use and
# raises, whoever asks (a Sym operand aside). Not those a number lacks (__call__, __iter__,
# __len__, __getitem__): a Stand having one would answer callable(t), iter(t) otherwise than
# the number it stands for.
_STAND_OPERATORS = (
    "lt", "le", "gt", "ge", "add", "radd", "sub", "rsub", "mul", "rmul", "truediv",
    "rtruediv", "floordiv", "rfloordiv", "mod", "rmod", "divmod", "rdivmod", "pow", "rpow",
    "and", "rand", "or", "ror", "xor", "rxor", "lshift", "rlshift", "rshift", "rrshift",
)


class Stand:
    """A number a function reads (a closure cell's, a default's or a global's int or float)
    standing in as a symbol while ``function_shape`` learns which of the tree's parameters it
    fills. It is only an operand of the traced array: anything the function's own code does
    with it (arithmetic with another number, a comparison, ``bool``, ``float``, ``hash``,
    formatting, an attribute) raises, so that no value of it can steer the trace unseen; such
    functions have no kept shape and are traced per value as before. Operators it is asked
    for with the array as the other operand give way to the array's (``t < v`` is
    ``v > t``).

    Each use is also noted in ``uses`` (shared by the Stands of one learning trace), and a
    learning trace that noted one learns nothing: the function's own code may catch the
    error (``try: c = float(t) except TypeError: c = 1.0``), and until 2026-12-02
    (eighteenth session, a review) such a function learned its fallback as a literal where
    the value learned from equalled it, and every later value ran with the fallback. An
    attribute read is a use too, ``__class__`` among them (``t.__class__ is float``,
    ``isinstance`` by another name and ``match t: case float():`` ask it), since a Stand's
    answer is not the number's; the tracer reads a Stand's own fields with
    :func:`stand_fields`."""

    __slots__ = ("_value", "_at", "_uses")

    def __init__(self, value: int | float, at: int, uses: list[str]) -> None:
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_at", at)
        object.__setattr__(self, "_uses", uses)

    def _used(self, what: str) -> Any:
        object.__getattribute__(self, "_uses").append(what)
        raise StandUsed(f"a number the function reads is used by its own code ({what})")

    def __getattribute__(self, name: str) -> Any:
        return Stand._used(self, f"the attribute {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        Stand._used(self, f"setting the attribute {name}")

    def __delattr__(self, name: str) -> None:
        Stand._used(self, f"deleting the attribute {name}")

    def __eq__(self, other: object) -> Any:
        if type(other) is Sym:
            return NotImplemented
        return Stand._used(self, "==")

    def __ne__(self, other: object) -> Any:
        if type(other) is Sym:
            return NotImplemented
        return Stand._used(self, "!=")

    def __hash__(self) -> int:
        return Stand._used(self, "hash")

    def __bool__(self) -> bool:
        return Stand._used(self, "its truth value")

    def __repr__(self) -> str:
        return Stand._used(self, "repr")

    def __str__(self) -> str:
        return Stand._used(self, "str")

    def __format__(self, spec: str) -> str:
        return Stand._used(self, "format")

    def __float__(self) -> float:
        return Stand._used(self, "float")

    def __int__(self) -> int:
        return Stand._used(self, "int")

    def __index__(self) -> int:
        return Stand._used(self, "index")

    def __complex__(self) -> complex:
        return Stand._used(self, "complex")

    def __round__(self, *args: Any) -> Any:
        return Stand._used(self, "round")

    def __trunc__(self) -> Any:
        return Stand._used(self, "trunc")

    def __floor__(self) -> Any:
        return Stand._used(self, "floor")

    def __ceil__(self) -> Any:
        return Stand._used(self, "ceil")

    def __neg__(self) -> Any:
        return Stand._used(self, "-")

    def __pos__(self) -> Any:
        return Stand._used(self, "+")

    def __abs__(self) -> Any:
        return Stand._used(self, "abs")

    def __invert__(self) -> Any:
        return Stand._used(self, "~")

    def __reduce_ex__(self, protocol: Any) -> Any:
        return Stand._used(self, "pickle")

    def __sizeof__(self) -> int:
        return Stand._used(self, "sizeof")


def _stand_operator(name: str) -> Callable[[Stand, Any], Any]:
    def op(self: Stand, other: Any) -> Any:
        if type(other) is Sym:
            return NotImplemented  # the array's own operator (reflected) records the operand
        return Stand._used(self, name)

    op.__name__ = f"__{name}__"
    return op


for _name in _STAND_OPERATORS:
    setattr(Stand, f"__{_name}__", _stand_operator(_name))
del _name


def stand_fields(stand: Stand) -> tuple[int | float, int]:
    """A Stand's ``(value, at)``: the number it stands for and its place among the
    function's numbers, read without noting a use."""
    get = object.__getattribute__
    return get(stand, "_value"), get(stand, "_at")


class Sym:
    """A symbolic array: every operation on it builds a node of the expression tree."""

    __slots__ = ("_node", "_tracer")
    __hash__ = None  # type: ignore[assignment]  # == is elementwise, as for ndarray

    def __init__(self, node: Node, tracer: Tracer) -> None:
        self._node = node
        self._tracer = tracer

    def __repr__(self) -> str:
        from .expr import to_source

        return f"<symbolic array {to_source(self._node)}>"

    # comparisons (Python reflects them itself: 0.2 < v calls v.__gt__(0.2))
    __lt__ = _binary("less")
    __le__ = _binary("less_equal")
    __gt__ = _binary("greater")
    __ge__ = _binary("greater_equal")
    __eq__ = _binary("equal")
    __ne__ = _binary("not_equal")

    # arithmetic and bits, as ndarray maps them to ufuncs
    __add__, __radd__ = _binary("add"), _binary("add", True)
    __sub__, __rsub__ = _binary("subtract"), _binary("subtract", True)
    __mul__, __rmul__ = _binary("multiply"), _binary("multiply", True)
    __truediv__, __rtruediv__ = _binary("true_divide"), _binary("true_divide", True)
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _binary("floor_divide", True)
    __mod__, __rmod__ = _binary("remainder"), _binary("remainder", True)
    __rpow__ = _binary("power", True)
    __and__, __rand__ = _binary("bitwise_and"), _binary("bitwise_and", True)
    __or__, __ror__ = _binary("bitwise_or"), _binary("bitwise_or", True)
    __xor__, __rxor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True)
    __lshift__, __rlshift__ = _binary("left_shift"), _binary("left_shift", True)
    __rshift__, __rrshift__ = _binary("right_shift"), _binary("right_shift", True)
    __neg__ = _unary("negative")
    __pos__ = _unary("positive")
    __abs__ = _unary("absolute")
    __invert__ = _unary("invert")

    # augmented assignments (``v += 1``): refused on the argument, see _in_place
    __iadd__, __isub__, __imul__ = _in_place("+"), _in_place("-"), _in_place("*")
    __itruediv__, __ifloordiv__, __imod__ = _in_place("/"), _in_place("//"), _in_place("%")
    __ipow__, __iand__, __ior__ = _in_place("**"), _in_place("&"), _in_place("|")
    __ixor__, __ilshift__, __irshift__ = _in_place("^"), _in_place("<<"), _in_place(">>")
    __imatmul__ = _in_place("@")

    def __pow__(self, other: Any) -> Any:
        # ndarray.__pow__ takes shortcuts for some exact Python scalars (numpy's
        # fast_scalar_power): ``** 2`` is np.square for every dtype; ``** 0.5`` and ``** -1``
        # are sqrt/reciprocal for float arrays but np.power for integer ones, which differ
        # (sqrt(-inf) is nan, -inf ** 0.5 is inf); the dtype is unknown while tracing, so
        # typing chooses (expr.SCALAR_POWER). A Stand's value may be any of those.
        if type(other) is Stand:
            raise self._tracer.stop("a power by a value the function reads")
        if type(other) is int and other == 2:
            return self._tracer.call("square", self)
        if (type(other) is float and other == 0.5) or (type(other) is int and other == -1):
            return self._tracer.call("scalar_power", self, other)  # typing picks (expr.py)
        return self._tracer.call("power", self, other)

    # .real / .imag are elementwise; everything else on the object is looked at here
    @property
    def real(self) -> Sym:
        return self._tracer.call("real", self)

    @property
    def imag(self) -> Sym:
        return self._tracer.call("imag", self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # protocol probes (__array__, __len__, ...) stay normal
        tracer = object.__getattribute__(self, "_tracer")
        if name in REDUCTIONS or name in ("nanmin", "nanmax", "ptp"):
            raise tracer.refuse(_reduction_error(name, tracer, self))
        if name in _NOT_ELEMENTWISE:
            raise tracer.refuse(_not_elementwise(f"`v.{name}`"))
        if name in _CHUNK_ATTRIBUTES:
            raise tracer.refuse(_per_chunk(f"`v.{name}`"))
        raise tracer.stop(f"the attribute `v.{name}` cannot be traced")

    def __getitem__(self, key: Any) -> Any:
        raise self._tracer.refuse(_not_elementwise("indexing (`v[...]`)"))

    def __setitem__(self, key: Any, value: Any) -> None:
        raise self._tracer.refuse(_not_elementwise("assigning into the chunk (`v[...] = ...`)"))

    def __len__(self) -> int:
        raise self._tracer.refuse(_not_elementwise("`len(v)`"))

    def __iter__(self) -> Any:
        raise self._tracer.refuse(_not_elementwise("iterating over the chunk"))

    def __contains__(self, item: Any) -> bool:
        raise self._tracer.refuse(_not_elementwise("`... in v`"))

    def __bool__(self) -> bool:
        # On a real chunk NumPy refuses the truth value of more than one element, so the mask
        # path could only fail in every task: refuse now, with the way to write it.
        raise self._tracer.refuse(
            NotElementwise(
                "the truth value of the data is asked for (Python `if`, `and`, `or`, `not`, or "
                "a chained comparison `a < v < b`): a chunk has many values. Write it "
                "elementwise with `&`, `|`, `~` and np.where, e.g. `(a < v) & (v < b)`"
            )
        )

    def _scalar_conversion(self, kind: str) -> Any:
        raise self._tracer.refuse(_per_chunk(f"converting the data to a Python {kind}"))

    def __float__(self) -> float:
        return self._scalar_conversion("float")

    def __int__(self) -> int:
        return self._scalar_conversion("int")

    def __index__(self) -> int:
        # Not final yet: NumPy's indexing of an array by the argument asks for an integer
        # first (refused here, which NumPy ignores), then converts the argument to an array of
        # indices (a lookup, Sym.__array__). Anything else (``range(v)``, ``[1, 2][v]``,
        # ``operator.index(v)``) stays refused, also where the user's code catches it.
        err = _per_chunk("converting the data to a Python int")
        if self._tracer.index_refused is not None:
            # an earlier one the user's code caught (``operator.index(v)`` in a try) and never
            # used as indices: final, before this one takes its place (a review found it lost
            # to a later lut[v], and the predicate on the mask path with a per-chunk value)
            self._tracer.refuse(self._tracer.index_refused[0])
        self._tracer.index_refused = (err, _instruction(sys._getframe(1)))
        raise err

    def __complex__(self) -> complex:
        return self._scalar_conversion("complex")

    def __divmod__(self, other: Any) -> Any:
        raise self._tracer.stop("divmod() gives two arrays")

    def __matmul__(self, other: Any) -> Any:
        raise self._tracer.refuse(_not_elementwise("matrix multiplication (`@`)"))

    __rmatmul__ = __matmul__

    def __array__(self, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _called_by_vectorize():
            # np.vectorize converts its argument, then calls a Python function per element:
            # elementwise, but nothing to fuse (it was refused as if the chunk were used whole)
            raise self._tracer.stop("np.vectorize calls a Python function per element")
        if _converting_indices(self._tracer, dtype, sys._getframe(1)):
            # A lookup (lut[v], np.take(lut, v), lut.take(v)): elementwise, but nothing to
            # fuse; the mask path's sample and slice checks refuse a callable that goes on to
            # use the chunk as a whole (a new-user probe found lookups refused as reductions)
            raise self._tracer.stop(
                "it uses the argument as indices into an array (a lookup such as lut[v] or "
                "np.take(lut, v))"
            )
        if dtype is not None:
            # np.float32(v), np.asarray(v, dtype=...): meant as an elementwise cast, which
            # NumPy's scalar types do through __array__ and nothing of ours can record; the
            # refusal's advice (a statistic) did not fit it (a new-user probe, 2026-12-03)
            to = np.dtype(dtype)
            raise self._tracer.refuse(NotElementwise(
                f"converting the argument to an array of {to} (`np.{to.type.__name__}(v)`, "
                f"`np.asarray(v, dtype={str(to)!r})`) is refused: a predicate gets one chunk "
                "at a time, and what is computed from the chunk made an array would differ "
                f"from chunk to chunk. For an elementwise cast write `v.astype({str(to)!r})`."
            ))
        raise self._tracer.refuse(
            _per_chunk("converting the argument to an array (np.asarray, np.array, __array__)")
        )

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        tracer = self._tracer
        name = ufunc.__name__
        if method == "reduce":
            raise tracer.refuse(_reduction_error(f"np.{name}.reduce", tracer, *inputs))
        if method == "accumulate":
            raise tracer.refuse(_reduction_error(
                "cumsum" if name == "add" else "cumprod" if name == "multiply"
                else f"np.{name}.accumulate", tracer, *inputs))
        if method != "__call__":
            raise tracer.refuse(_not_elementwise(f"`np.{name}.{method}`"))
        if ufunc.signature is not None:  # a gufunc (np.matmul, np.vecdot): works on rows
            raise tracer.refuse(_not_elementwise(f"`np.{name}`"))
        if kwargs:
            raise tracer.stop(f"np.{name} is called with {', '.join(sorted(kwargs))}=")
        tree_name = _UFUNC_NAMES.get(ufunc)
        if tree_name is None:
            raise tracer.stop(f"np.{name} is not among the ufuncs dask_compact compiles")
        return tracer.call(tree_name, *inputs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        tracer = self._tracer
        name = func.__name__
        if name in REDUCTIONS or name in _MORE_REDUCTIONS or name in ("nanmin", "nanmax", "ptp"):
            raise tracer.refuse(_reduction_error(name, tracer, *args, *kwargs.values()))
        if name in _NOT_ELEMENTWISE:
            raise tracer.refuse(_not_elementwise(f"`np.{name}`"))
        if name in ("shape", "size", "ndim"):
            raise tracer.refuse(_per_chunk(f"`np.{name}`"))
        if name == "where":
            if len(args) + len(kwargs) != 3 or kwargs:
                raise tracer.refuse(_where_arguments(len(args), bool(kwargs)))
            return tracer.call("where", *args)
        if name in ("real", "imag") and len(args) == 1 and not kwargs:
            return tracer.call(name, *args)
        raise tracer.stop(f"np.{name} is not among the functions dask_compact compiles")


def _instruction(frame: Any) -> tuple[int, int] | None:
    """Where a Python frame is (the frame's id while it runs, and its instruction)."""
    return None if frame is None else (id(frame), frame.f_lasti)


def _converting_indices(tracer: Tracer, dtype: Any, caller: Any) -> bool:
    """Whether ``__array__`` converts the argument to indices into another array: NumPy's
    take (np.take, ndarray.take) asks for intp; ``lut[v]`` asks for an integer (``__index__``)
    first, from the same instruction of the same frame, and the refusal of that ends here.
    ``np.asarray(v)`` is neither and stays refused."""
    pending, tracer.index_refused = tracer.index_refused, None
    if pending is not None and pending[1] == _instruction(caller):
        return True
    if pending is not None:  # an earlier int(...) of its own: refused as it was
        tracer.refuse(pending[0])
    if caller is not None and _is_subscript(caller.f_code, caller.f_lasti):
        # CuPy's indexing converts the index with __array__ without asking __index__ first
        # (GPU run of 2026-11-30: lut_d[v] refused); the argument indexed is the tracer's
        # own __getitem__, so __array__ within a subscript converts it as the index
        return True
    return dtype is not None and np.dtype(dtype) == np.intp


@functools.lru_cache(maxsize=256)
def _is_subscript(code: Any, offset: int) -> bool:
    """Whether the instruction at ``offset`` of ``code`` is a subscript (``a[b]``): the
    opcode BINARY_SUBSCR, or BINARY_OP ``[]`` where Python 3.14 folded it in."""
    import dis

    for ins in dis.get_instructions(code):
        if ins.offset == offset:
            return ins.opname == "BINARY_SUBSCR" or (
                ins.opname == "BINARY_OP" and ins.argrepr == "[]")
    return False


def _describe(func: Callable[..., Any]) -> str:
    """A readable name for the predicate: the lambda's own text when it can be found."""
    code = getattr(func, "__code__", None)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if code is not None:
        # Reading and parsing the source costs far more than tracing: do it once per code object
        # (a predicate is often a fresh lambda at the same place in a loop).
        described = _describe_code(code, getattr(func, "__name__", None) == "<lambda>")
        if described:
            return described
    if name and name != "<lambda>":
        return name
    return repr(func)


@functools.lru_cache(maxsize=512)
def _describe_code(code: Any, is_lambda: bool) -> str | None:
    try:
        src = textwrap.dedent(inspect.getsource(code)).strip()
    except (OSError, TypeError):
        return None
    if not is_lambda:
        return None
    try:
        tree = ast.parse(src)
    except SyntaxError:  # a lambda in the middle of a multi-line expression
        try:
            src = "(\n" + src.rstrip(",") + "\n)"
            tree = ast.parse(src)
        except SyntaxError:
            return None
    lambdas = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda)]
    if len(lambdas) == 1:
        seg = ast.get_source_segment(src, lambdas[0])
        if seg:
            return " ".join(seg.split())
    return None


def run_traced(
    fn: Callable[..., Any], tracer: Tracer, names: tuple[str, ...] | None = None
) -> tuple[Node | None, str | None]:
    """Run ``fn`` on the symbolic variable (or, given ``names``, on one symbolic variable per
    field, passed by keyword): (tree, None), or (None, reason) for the mask path.

    Raises :class:`NotElementwise` if anything refused the trace, even if ``fn`` caught it.
    """
    try:
        if names is None:
            out = fn(Sym(Var(), tracer))
        else:
            tracer.fields = tuple(names)
            out = fn(**{name: Sym(Var(name), tracer) for name in names})
    except NotElementwise:
        if tracer.index_refused is None or tracer.refused is not None:
            raise
        out = None  # the refusal of __index__ ending the trace: kept below
    except Untraceable:
        out = None
    except RecursionError:
        raise
    except Exception as e:  # noqa: BLE001 - the function failed on a symbolic array: let NumPy run it
        if tracer.refused is None and tracer.untraceable is None:
            tracer.untraceable = f"calling it on a symbolic array raised {type(e).__name__}: {e}"
        out = None
    if tracer.index_refused is not None:  # asked for an integer, never used as indices
        tracer.refuse(tracer.index_refused[0])
    if tracer.refused is not None:
        raise tracer.refused
    if tracer.untraceable is not None:
        return None, tracer.untraceable
    if isinstance(out, Sym):
        return out._node, None
    try:
        _refuse_dask(tracer, out)
        if isinstance(out, np.ndarray) and out.ndim > 0:
            raise TypeError("an array")
        return tracer.param(out), None  # a constant: every element or none
    except TypeError:
        return None, f"it returned {type(out).__name__}, not an expression of its argument"
    except NotElementwise:
        raise


def trace(func: Callable[..., Any], names: tuple[str, ...] | None = None) -> Predicate:
    """Trace ``func`` into a fused :class:`Predicate`, or a mask-path one saying why not.

    ``names``: the record fields ``func`` takes by keyword (see :mod:`.fields`); None for the
    one-array predicate ``func(x)``.

    Raises :class:`NotElementwise` (a ValueError) for reductions and other operations that
    would make the result depend on how the array is chunked.
    """
    source = _describe(func)
    code = getattr(func, "__code__", None)
    if code is not None and not _TYPE_TESTS.isdisjoint(code_names(code)):
        # the stand-in the tracer passes is no array, so a test of the argument's type took
        # the branch for other types and baked it in (a probe: isinstance(v, np.ndarray) was
        # False, and the predicate selected the other half); on the mask path it is run on
        # the chunks themselves
        return Predicate(expr=None, params=(), func=func, source=source,
                         reason="it tests its argument's type (isinstance, type), which a "
                                "trace cannot answer as an array would")
    tracer = Tracer()
    node, reason = run_traced(func, tracer, names)
    if node is None:
        return Predicate(expr=None, params=(), func=func, source=source, reason=reason)
    return Predicate(expr=node, params=tuple(tracer.params), func=func, source=source)


# Names through which code tests its argument's type (see trace)
_TYPE_TESTS = frozenset({"isinstance", "issubclass", "type"})


# Operators the string parser maps its AST nodes to: the same objects Python applies to a Sym.
BINARY_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
COMPARE_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
