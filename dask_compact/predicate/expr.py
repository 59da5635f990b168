"""The expression tree of a traced predicate, its NumPy typing and parameter binding.

A predicate is a tree of :class:`Call` nodes (NumPy ufunc names, plus ``where``, ``real`` and
``imag``) over one :class:`Var` (the array element) and :class:`Param` leaves (the literal
constants, numbered in the order they were met). Values of the parameters are kept apart from
the tree, so the tree's :func:`structure_key` names one compiled kernel or loop whatever the
thresholds are.

Typing follows NumPy exactly (NEP 50): Python ``int``/``float``/``complex`` literals are *weak*
and take the dtype of the array operand, NumPy scalars are *strong*. Each call is typed with
``ufunc.resolve_dtypes``, which gives the dtypes NumPy casts the inputs to (the loop dtypes) and
the output dtype; code generators cast every argument to its loop dtype and every result to its
output dtype, so compiled code computes what ``pred(numpy_array)`` computes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Node",
    "Var",
    "FieldDtypes",
    "var_dtype",
    "variables",
    "Param",
    "Call",
    "Typed",
    "UFUNCS",
    "SPECIAL",
    "REDUCTIONS",
    "param_kind",
    "walk",
    "params_of",
    "evaluate",
    "infer_types",
    "bind_params",
    "structure_key",
    "to_source",
    "ParamOverflow",
    "numpy_constants",
    "NEGATIVE_POWER",
    "refuse_negative_exponent",
    "signed_power_exponents",
    "check_power_exponents",
]

# Elementwise NumPy ufuncs a predicate may use and that both code generators implement.
# Cheap ones only: each is one or a few instructions in C, CUDA and numba.
UFUNCS: frozenset[str] = frozenset(
    {
        # comparisons
        "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
        # logic and bits
        "logical_and", "logical_or", "logical_xor", "logical_not",
        "bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift",
        # arithmetic
        "add", "subtract", "multiply", "true_divide", "floor_divide", "remainder",
        "negative", "positive", "absolute", "square", "power",
        "minimum", "maximum", "fmin", "fmax",
        # floating point
        "sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan",
        "floor", "ceil", "trunc", "rint", "sign",
        "isnan", "isfinite", "isinf", "signbit",
    }
)
# Elementwise functions that are not ufuncs: np.where(cond, a, b), the .real / .imag attributes;
# and two the tracer and typing make: ``scalar_power`` (below) and the ``reciprocal`` it
# becomes on float arrays (np.reciprocal, which a predicate cannot call itself: its integer
# loop is integer division, not compiled).
SPECIAL: frozenset[str] = frozenset({"where", "real", "imag", "scalar_power", "reciprocal"})
# ``v ** -1`` and ``v ** 0.5`` (exactly those Python scalars): ndarray.__pow__ computes them as
# np.reciprocal and np.sqrt on float and complex arrays but as np.power on the others (NumPy's
# fast_scalar_power), and the tracer does not know the dtype. It records
# ``scalar_power(v, -1 or 0.5)``; typing for a dtype (resolve_scalar_powers) makes it the call
# that dtype gets, so the compiled code is exact for both (and integers raise, as NumPy does).
SCALAR_POWER = "scalar_power"


def scalar_power_fn(base: Any, int_exponent: bool) -> str:
    """The function NumPy's ``v ** c`` calls for ``scalar_power(v, c)``: ``"reciprocal"``
    (c = -1, ``int_exponent``) or ``"sqrt"`` (c = 0.5) where ``base``, the dtype of ``v`` (or
    a weak Python type), is float or complex, else ``"power"``."""
    if isinstance(base, np.dtype) and base.kind in ("f", "c"):
        return "reciprocal" if int_exponent else "sqrt"
    return "power"

# Reductions: inside a predicate they would reduce one *chunk*, not the array, which is almost
# never what the user meant (``v > v.mean()`` would compare each chunk with its own mean).
REDUCTIONS: frozenset[str] = frozenset(
    {
        "sum", "mean", "std", "var", "min", "max", "amin", "amax", "median", "percentile",
        "quantile", "any", "all", "prod", "argmin", "argmax", "ptp", "average", "count_nonzero",
        "nansum", "nanmean", "nanstd", "nanvar", "nanmin", "nanmax", "nanmedian",
        "nanpercentile", "nanquantile", "nanprod", "nanargmin", "nanargmax", "cumsum", "cumprod",
    }
)


class Node:
    """Base class of expression nodes. Nodes are immutable and hashable (structural equality)."""

    __slots__ = ()


@dataclass(frozen=True, repr=False)
class Var(Node):
    """The array element the predicate is evaluated on: ``x`` for one array, or one field of a
    record (``Var("energy")``) for :func:`dask_compact.compact_records`."""

    name: str = "x"

    def __repr__(self) -> str:
        # `Var()` for the one-array variable, as before fields existed: structure keys (and so
        # compiled-kernel and loop caches) of one-array predicates do not change.
        return "Var()" if self.name == "x" else f"Var({self.name!r})"


# The dtype argument of typing: one dtype (one array), or the dtypes of a record's fields as
# sorted (name, dtype) pairs (hashable, so typed trees are cached per field dtypes too).
FieldDtypes = tuple[tuple[str, np.dtype], ...]


def var_dtype(node: Var, dtype: Any) -> np.dtype:
    """The dtype of a variable: ``dtype`` itself, or its field's entry in a FieldDtypes."""
    if isinstance(dtype, tuple):
        for name, dt in dtype:
            if name == node.name:
                return dt
        raise KeyError(f"no dtype for the field {node.name!r}")
    return dtype


def variables(node: Node) -> tuple[str, ...]:
    """The names of the variables a tree reads, sorted."""
    return tuple(sorted({n.name for n in walk(node) if isinstance(n, Var)}))


@dataclass(frozen=True)
class Param(Node):
    """A literal constant, passed to the compiled code as an argument.

    ``kind`` is ``"int"``, ``"float"`` or ``"complex"`` for a weak Python scalar (NEP 50), or
    a NumPy dtype name (``"float32"``, ``"bool"``, ...) for a strong NumPy scalar or a Python bool.
    """

    index: int
    kind: str


@dataclass(frozen=True)
class Call(Node):
    """``fn(*args)`` with ``fn`` a name in :data:`UFUNCS` or :data:`SPECIAL`."""

    fn: str
    args: tuple[Node, ...]

    def __post_init__(self) -> None:
        if self.fn not in UFUNCS and self.fn not in SPECIAL:
            raise ValueError(f"{self.fn!r} is not an elementwise function dask_compact compiles")


@dataclass(frozen=True)
class Typed:
    """NumPy's typing of one call: the dtypes its arguments are cast to, and its result dtype."""

    loop: tuple[np.dtype, ...]
    out: np.dtype


class ParamOverflow(ValueError):
    """A literal does not fit the dtype NumPy computes in (e.g. ``int8_array + 1000``).

    The compiled path cannot reproduce NumPy's value-dependent behaviour there, so the caller
    falls back to evaluating the predicate with NumPy (which may itself raise, as NumPy does).
    """


class ConstantOverflowError(ValueError, OverflowError):
    """A constant that NumPy refuses for the data's dtype with OverflowError (``uint8_array +
    256`` under NumPy 2's rules), raised before anything runs: an OverflowError as NumPy's
    is, and the ValueError every refused predicate is."""


_WEAK_TYPES = {"int": int, "float": float, "complex": complex}


def param_kind(value: Any) -> str:
    """The :attr:`Param.kind` of a literal, or raise TypeError if it is not a scalar number."""
    if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0:
        dt = np.asarray(value).dtype
        if dt.kind not in "biufc":
            raise TypeError(f"unsupported constant {constant_text(value)} of dtype {dt}")
        return dt.name
    # bool before int (bool is an int); Python bool is not weak under NEP 50.
    for t, kind in ((bool, "bool"), (int, "int"), (float, "float"), (complex, "complex")):
        if isinstance(value, t):
            return kind
    raise TypeError(f"unsupported constant {constant_text(value)} of type {type(value).__name__}")


def walk(node: Node):
    """Yield the nodes of a tree, children before parents."""
    if isinstance(node, Call):
        for a in node.args:
            yield from walk(a)
    yield node


def params_of(node: Node) -> list[Param]:
    """The tree's parameters sorted by index."""
    return sorted({n for n in walk(node) if isinstance(n, Param)}, key=lambda p: p.index)


def _scalar(kind: str, value: Any) -> Any:
    """A literal as NumPy should see it: weak Python scalars stay Python scalars."""
    if kind in _WEAK_TYPES:
        return _WEAK_TYPES[kind](value)
    return np.dtype(kind).type(value)


def evaluate(node: Node, x: Any, params: tuple, xp: Any = np) -> Any:
    """Evaluate the tree on array ``x`` (or a dict of field arrays) with ``xp`` (numpy or cupy).

    This is the reference semantics every compiled path must match, and the fallback for
    dtypes a compiled path does not handle.
    """
    if isinstance(node, Var):
        return x[node.name] if isinstance(x, dict) else x
    if isinstance(node, Param):
        return _scalar(node.kind, params[node.index])
    assert isinstance(node, Call)
    args = [evaluate(a, x, params, xp) for a in node.args]
    if node.fn == "real":
        return xp.real(args[0])
    if node.fn == "imag":
        return xp.imag(args[0])
    if node.fn == "where":
        return xp.where(*(args if xp is np else numpy_constants("where", args)))
    if node.fn == SCALAR_POWER:
        base, c = args
        fn = scalar_power_fn(np.dtype(getattr(base, "dtype", np.float64)), isinstance(c, int))
        if fn != "power":
            return getattr(xp, fn)(base)
        node = Call("power", node.args)  # NumPy's np.power, checked below as any
    if node.fn in _OUTSIDE:
        known = _compare_outside(node.fn, args[0], args[1], xp)
        if known is not None:
            return known
    if xp is not np:  # after the comparisons above, which NumPy answers for any int
        args = numpy_constants(node.fn, args)
    out = getattr(xp, node.fn)(*args)
    if node.fn == "power" and xp is not np and getattr(out, "dtype", np.dtype(float)).kind in "iu":
        # NumPy raises where an integer power's exponent is negative; CuPy gives 0.
        refuse_negative_exponent(args[1], int(getattr(out, "size", 1)), xp)
    return out


def _beyond_int64(a: Any) -> bool:
    return type(a) is int and not -(2**63) <= a < 2**63


_WEAK = (int, float, complex)


def _dtype_of(a: Any) -> np.dtype:
    """An argument's dtype (a CuPy array's too, which NumPy cannot take itself)."""
    dt = getattr(a, "dtype", None)
    return np.dtype(dt) if dt is not None else np.asarray(a).dtype


def _loop_dtypes(fn: str, args: list) -> list:
    """The dtypes NumPy converts ``fn``'s arguments to, a weak Python scalar (NEP 50) taken
    as one: the ufunc loop's inputs, or for ``where`` the result type of the two choices
    (the condition is left as it is)."""
    if fn == "where":
        choice = np.result_type(*(a if type(a) in _WEAK else _dtype_of(a) for a in args[1:]))
        return [None, choice, choice]
    ufunc = getattr(np, fn)
    given = tuple(type(a) if type(a) in _WEAK else _dtype_of(a) for a in args)
    given += (None,) * ufunc.nout
    return list(ufunc.resolve_dtypes(given)[: ufunc.nin])


def numpy_constants(fn: str, args: list) -> list:
    """``fn``'s arguments for an array module other than NumPy (CuPy), with each Python int
    beyond int64 as NumPy uses it (NEP 50): converted to the dtype of NumPy's loop in its
    slot (``2**64 * complex64_x``: a complex64 constant; ``where(c, 2**70, -inf)``: float64).
    CuPy refuses such an int (OverflowError: Python int too large to convert to C long) where
    NumPy answers (the GPU probe of 2026-11-30, fifth session); where NumPy raises (the int
    in an integer loop), the conversion raises NumPy's OverflowError. Other arguments, and
    calls with no such int, are returned as they are."""
    if not any(_beyond_int64(a) for a in args):
        return args
    if fn != "where" and not isinstance(getattr(np, fn, None), np.ufunc):
        return args
    loop = _loop_dtypes(fn, args)
    with np.errstate(over="ignore"):  # 2**70 -> float16 is inf, as NumPy computes it
        return [dt.type(a) if _beyond_int64(a) else a for a, dt in zip(args, loop)]


NEGATIVE_POWER = "Integers to negative integer powers are not allowed."


def refuse_negative_exponent(b: Any, size: int, xp: Any) -> None:
    """Raise NumPy's ValueError if the exponent ``b`` (array or scalar) of an integer power
    over ``size`` elements is negative anywhere; one host sync for a device array."""
    if size == 0 or getattr(b, "dtype", np.dtype(np.int64)).kind != "i":
        return  # NumPy raises only where an element is computed; unsigned is never negative
    neg = b < 0  # a device array, a NumPy scalar (a constant np.int64) or a Python bool
    if bool(neg.any() if hasattr(neg, "any") else neg):
        raise ValueError(NEGATIVE_POWER)


def signed_power_exponents(root: Node, types: dict[Node, Typed]) -> tuple[Node, ...]:
    """The exponents of the tree's integer powers that may be negative (a signed loop).

    NumPy raises where one is, the CPU loop raises with it, but a GPU kernel has no way to
    raise (it gives 0, as CuPy does): the GPU paths evaluate these subtrees first and refuse
    (:func:`check_power_exponents`), one host sync, for the predicates that have them only.
    """
    return tuple(dict.fromkeys(
        n.args[1] for n in walk(root)
        if isinstance(n, Call) and n.fn == "power" and types[n].loop[1].kind == "i"
    ))


def check_power_exponents(exponents: tuple[Node, ...], x: Any, params: tuple, xp: Any) -> None:
    """Raise NumPy's ValueError where one of ``exponents`` (see
    :func:`signed_power_exponents`) is negative for an element of ``x`` (array or fields)."""
    size = int(next(iter(x.values())).shape[0]) if isinstance(x, dict) else int(x.size)
    for e in exponents:
        refuse_negative_exponent(evaluate(e, x, params, xp), size, xp)


# comparison -> (its value where the Python int is above the array's range, below it), the
# int on the right; on the left the same with the comparison mirrored
_OUTSIDE = {"less": (True, False), "less_equal": (True, False), "greater": (False, True),
            "greater_equal": (False, True), "equal": (False, False), "not_equal": (True, True)}
_MIRROR = {"less": "greater", "less_equal": "greater_equal", "greater": "less",
           "greater_equal": "less_equal", "equal": "equal", "not_equal": "not_equal"}


def _compare_outside(fn: str, a: Any, b: Any, xp: Any) -> Any:
    """``fn(a, b)`` where one side is an integer array and the other a Python int outside
    its dtype's range: every element compares the same way, as NumPy 2 answers it (CuPy
    refuses such an int: OverflowError, met by the GPU review probe of 2026-11-28 on
    ``x < 2**64``). None for any other pair."""
    if isinstance(a, int) and not isinstance(a, bool):
        a, b, fn = b, a, _MIRROR[fn]
    if not isinstance(b, int) or isinstance(b, bool):
        return None
    kind = getattr(getattr(a, "dtype", None), "kind", None)
    if kind not in ("i", "u"):
        return None
    value = _outside_value(fn, b, a.dtype)
    return None if value is None else xp.full(a.shape, value, dtype=bool)


def _outside_value(fn: str, c: int, dtype: np.dtype) -> bool | None:
    """``fn(array, c)`` for every element of an integer array of ``dtype`` where the int
    ``c`` is outside its range (NumPy 2 compares such an int by value), else None."""
    info = np.iinfo(dtype)
    if info.min <= c <= info.max:
        return None
    above, below = _OUTSIDE[fn]
    return above if c > info.max else below


def resolve_scalar_powers(root: Node, dtype: Any) -> Node:
    """``root`` with each ``scalar_power(v, c)`` made the call ``dtype`` gets from NumPy's
    ``v ** c``: ``reciprocal(v)`` (c = -1) or ``sqrt(v)`` (c = 0.5) where ``v`` is float or
    complex, else ``power(v, c)``; ``root`` itself where it has none."""
    if not any(isinstance(n, Call) and n.fn == SCALAR_POWER for n in walk(root)):
        return root
    done: dict[Node, Node] = {}

    def go(node: Node) -> Node:
        if not isinstance(node, Call):
            return node
        if node not in done:
            args = tuple(go(a) for a in node.args)
            if node.fn != SCALAR_POWER:
                done[node] = node if args == node.args else Call(node.fn, args)
            else:
                base, c = args
                t = _operand_type(base, infer_types(base, dtype), dtype)
                assert isinstance(c, Param)
                fn = scalar_power_fn(t, c.kind == "int")
                done[node] = Call(fn, args if fn == "power" else (base,))
        return done[node]

    return go(root)


__all__.append("resolve_scalar_powers")


def _operand_type(node: Node, types: dict[Node, Typed], dtype: np.dtype) -> Any:
    """What ``resolve_dtypes`` takes for an operand: a dtype, or a weak Python type."""
    if isinstance(node, Var):
        return var_dtype(node, dtype)
    if isinstance(node, Param):
        return _WEAK_TYPES.get(node.kind) or np.dtype(node.kind)
    return types[node].out


def _strong(t: Any) -> np.dtype:
    """The dtype a weak operand takes when nothing else fixes it (NumPy's defaults)."""
    if isinstance(t, np.dtype):
        return t
    return np.result_type(t(0))


def _operand_names(ops: list[Any]) -> str:
    """Operand types for a message: dtypes as NumPy names them, weak Python scalars so named."""
    return ", ".join(str(o) if isinstance(o, np.dtype) else f"Python {o.__name__}" for o in ops)


# NumPy's bitwise ufuncs, by the operator a predicate writes for each
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^", "invert": "~",
            "left_shift": "<<", "right_shift": ">>"}


def _bitwise_refusal(fn: str, ops: list[Any], e: Exception) -> TypeError:
    """The refusal of a bitwise operator on float or complex numbers, with the form that
    works: NumPy's own ("ufunc 'invert' not supported for the input types, and the inputs
    could not be safely coerced ...") named neither the operator nor a way out, and ``~x``
    or ``x & 1`` on a float array is a habit from integer data or from conditions (a
    new-user probe, 2026-12-01, fourteenth session)."""
    names = _operand_names(ops)
    op = _BITWISE[fn]
    if op in ("&", "|", "^", "~"):
        how = (f"'{op}' joins or negates conditions (booleans), e.g. '(x > 0) & (x < 1)' or "
               "'~(x > 0.5)'; on integers it works bit by bit")
    else:
        how = f"'{op}' shifts integers; on floats multiply instead (x * 2)"
    return TypeError(f"np.{fn} ('{op}') is not defined for ({names}): {how}. NumPy: {e}")


def infer_types(root: Node, dtype: Any) -> dict[Node, Typed]:
    """Type every call of the tree for input dtype ``dtype`` (or the FieldDtypes of a record),
    exactly as NumPy would.

    Raises TypeError (with the function and dtypes named) where NumPy has no loop, e.g.
    ``bitwise_and`` on floats.
    """
    if not isinstance(dtype, tuple):
        dtype = np.dtype(dtype)
    types: dict[Node, Typed] = {}
    for node in walk(root):
        if not isinstance(node, Call) or node in types:
            continue
        ops = [_operand_type(a, types, dtype) for a in node.args]
        try:
            if node.fn in ("real", "imag"):
                t = _strong(ops[0])
                out = getattr(np, node.fn)(np.empty(0, t)).dtype
                types[node] = Typed((t,), out)
            elif node.fn == "where":
                # NumPy reads the condition as its truth (non-zero, NaN included, is true): the
                # loop casts it to bool, which both backends do as NumPy's astype(bool)
                cond = np.dtype(bool)
                # np.result_type applies NEP 50 to Python scalars it is given as values.
                out = np.result_type(*[o(0) if not isinstance(o, np.dtype) else o for o in ops[1:]])
                types[node] = Typed((cond, out, out), out)
            else:
                ufunc = getattr(np, node.fn)
                resolved = ufunc.resolve_dtypes(tuple(ops) + (None,) * ufunc.nout)
                types[node] = Typed(tuple(resolved[: ufunc.nin]), resolved[ufunc.nin])
        except TypeError as e:
            if node.fn in _BITWISE and any(_strong(o).kind in "fc" for o in ops):
                raise _bitwise_refusal(str(node.fn), ops, e) from None
            raise
        except Exception as e:  # NumPy raises its own _UFuncNoLoopError etc.
            raise TypeError(
                f"np.{node.fn} is not defined for ({_operand_names(ops)}): {e}") from None
    return types


def result_dtype(root: Node, types: dict[Node, Typed], dtype: Any) -> np.dtype:
    """The dtype of the whole predicate's value (must be bool for a usable predicate)."""
    if isinstance(root, Var):
        return np.dtype(var_dtype(root, dtype))
    if isinstance(root, Param):
        return _strong(_WEAK_TYPES.get(root.kind) or np.dtype(root.kind))
    return types[root].out


__all__.append("result_dtype")


def param_dtypes(root: Node, types: dict[Node, Typed]) -> list[np.dtype]:
    """The dtype each parameter is converted to before the compiled code sees it.

    A parameter takes the loop dtype of the argument slot it fills (each literal fills one slot).
    A parameter that is the whole predicate takes its own dtype.
    """
    out: dict[int, np.dtype] = {}
    for node in walk(root):
        if isinstance(node, Call):
            for slot, a in enumerate(node.args):
                if isinstance(a, Param):
                    out[a.index] = types[node].loop[slot]
    for p in params_of(root):
        out.setdefault(p.index, _strong(_WEAK_TYPES.get(p.kind) or np.dtype(p.kind)))
    return [out[p.index] for p in params_of(root)]


__all__.append("param_dtypes")


def bind_params(
    root: Node, types: dict[Node, Typed], params: tuple, dtypes: list[np.dtype] | None = None,
    nodes: tuple[Param, ...] | None = None,
) -> tuple:
    """Convert the parameter values to NumPy scalars of their loop dtypes.

    ``dtypes`` are :func:`param_dtypes` and ``nodes`` :func:`params_of`, when the caller has
    them already (a typed predicate keeps both: the walk of the tree was a third of a bind's
    host time, which a small GPU call with a new constant pays at every call).
    Raises :class:`ParamOverflow` when a value cannot be represented in its dtype the way NumPy
    would convert it (an integer out of range, a float literal in an integer loop), so the caller
    can fall back to NumPy's own, value-dependent, semantics.
    """
    bound = []
    if dtypes is None:
        dtypes = param_dtypes(root, types)
    if nodes is None:
        nodes = tuple(params_of(root))
    with np.errstate(over="ignore"):  # 1e300 -> float16 is inf, as NumPy computes it
        for p, dt in zip(nodes, dtypes):
            v = params[p.index]
            try:
                s = dt.type(_scalar(p.kind, v))
            except (OverflowError, ValueError, TypeError) as e:
                raise ParamOverflow(
                    f"constant {constant_text(v)} does not fit {dt}: {e}") from None
            if dt.kind in "iub" and p.kind in ("int", "bool") and int(s) != int(v):
                raise ParamOverflow(f"constant {constant_text(v)} does not fit {dt}")
            bound.append(s)
    return tuple(bound)


def constant_text(v: Any) -> str:
    """A constant for an error message: its repr, shortened, or for an integer too long for
    Python to print (over 4,300 digits: ``repr`` raises ValueError, which had replaced the
    message; a probe's ``v < 2**16384``) its size in bits."""
    if isinstance(v, int) and v.bit_length() > 4096:
        return f"(an integer of {v.bit_length()} bits)"
    return shorten(repr(v))


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters for an error message (a constant may be long)."""
    return text if len(text) <= limit else f"{text[: limit - 25]}...({len(text)} characters)"


def to_source(node: Node) -> str:
    """A readable NumPy-like rendering of the tree, with parameters as ``p0, p1, ...``."""
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Param):
        return f"p{node.index}"
    assert isinstance(node, Call)
    return f"{node.fn}({', '.join(to_source(a) for a in node.args)})"


def structure_key(node: Node) -> str:
    """A short stable hash of the tree's structure and parameter kinds (not their values).

    Compiled kernels and loops are cached under (structure_key, dtype, output, algorithm).
    """
    text = repr(node)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fold:
    """A comparison of an integer with a Python int outside its dtype, made a constant.

    NumPy 2 compares such an int by value (NEP 50: ``uint8_array != -1`` is all True,
    ``int8_array > 200`` all False, for every integer dtype and any size of int), so the
    comparison's value is the same for every element and depends on the constant alone:
    :func:`fold_outside` puts the boolean parameter ``index`` in its place and
    :meth:`value` gives that parameter's value from the constants (``params[constant]``).
    ``fn`` is the comparison with the constant on the right, ``dtype`` the other side's.
    """

    index: int
    fn: str
    constant: int
    dtype: np.dtype

    def value(self, params: tuple) -> bool:
        """The comparison's value for every element, or ParamOverflow where the constant
        is inside the dtype after all (a typed tree used with other constants than it was
        folded for: the caller then takes the path such a constant takes)."""
        c = params[self.constant]
        value = _outside_value(self.fn, c, self.dtype) if type(c) is int else None
        if value is None:
            raise ParamOverflow(f"constant {constant_text(c)} is not outside {self.dtype}")
        return value


__all__ += ["Fold", "fold_outside"]


def _outside_slot(node: Call, types: dict[Node, Typed], dtype: Any,
                  params: tuple) -> tuple[str, int, np.dtype] | None:
    """(the comparison with the constant on the right, the constant's index, the other
    side's dtype) where ``node`` compares an integer operand with a weak Python int outside
    that operand's dtype, else None. Only an integer operand of its own loop dtype: a bool
    operand is compared in int64 (NEP 50's default int), where NumPy raises OverflowError
    for an int outside int64 (``bool_array == 2**63``), and that refusal is kept."""
    if node.fn not in _OUTSIDE or len(node.args) != 2:
        return None
    for slot, other, fn in ((1, 0, node.fn), (0, 1, _MIRROR[node.fn])):
        p, o = node.args[slot], node.args[other]
        if not isinstance(p, Param) or p.kind != "int":
            continue
        if isinstance(o, Param) and o.kind in _WEAK_TYPES:
            return None  # two weak constants: no array dtype decides
        loop, c = types[node].loop[other], params[p.index]
        if loop.kind not in "iu" or type(c) is not int or _outside_value(fn, c, loop) is None:
            return None
        # then, for the few constants outside: the operand's type, a walk and a bind of it
        given = _operand_type(o, types, dtype)
        if not isinstance(given, np.dtype) or given != loop:
            return None
        return (fn, p.index, loop) if _computes_without_error(o, types, params) else None
    return None


def _computes_without_error(operand: Node, types: dict[Node, Typed], params: tuple) -> bool:
    """Whether NumPy computes ``operand`` (the other side of a comparison to fold, which the
    fold drops from the tree) without raising: its constants bind to their loop dtypes
    (``uint8 + 300`` is NumPy's OverflowError) and it holds no power (an integer one raises
    ValueError for a negative exponent, found only in the data). Folded regardless, such a
    comparison answered where NumPy raises (`(x + 300) != -1` on uint8 selected everything,
    `(v ** (v + 1)) > 200` on int8 nothing: a regression probe, 2026-12-01); not folded,
    the refusal of the check or of the power check stays."""
    if any(isinstance(n, Call) and n.fn in ("power", "float_power") for n in walk(operand)):
        return False
    try:
        bind_params(operand, types, params)
    except ParamOverflow:
        return False
    return True


def fold_outside(root: Node, types: dict[Node, Typed], dtype: Any,
                 params: tuple) -> tuple[Node, tuple[Fold, ...]]:
    """``root`` with every comparison of an integer operand with a Python int outside its
    dtype (see :class:`Fold`) replaced by a boolean parameter, numbered from
    ``len(params)`` on, and the folds that give those parameters' values; ``(root, ())``
    where there is none.

    Binding such a constant raises ParamOverflow (it does not fit the loop dtype), which
    sent the chunks to NumPy-style evaluation: on CPUs the mask path, on GPUs CuPy's own
    ufuncs, which flush float32 subnormals (``-ftz=true``) in the rest of the predicate
    (``(id != -1) & (e > 0)`` dropped ``e = 1e-40``). Folded, the compiled code runs."""
    if not any(type(v) is int for v in params):
        return root, ()  # no Python int to fold (most predicates): no walk
    found: dict[Call, tuple[str, int, np.dtype]] = {}
    for node in walk(root):
        if isinstance(node, Call) and node not in found:
            slot = _outside_slot(node, types, dtype, params)
            if slot is not None:
                found[node] = slot
    if not found:
        return root, ()
    folds: dict[Call, Fold] = {}
    for j, (node, (fn, constant, dt)) in enumerate(found.items()):
        folds[node] = Fold(len(params) + j, fn, constant, dt)
    done: dict[Node, Node] = {}

    def go(node: Node) -> Node:
        if node in folds:
            return Param(folds[node].index, "bool")
        if not isinstance(node, Call):
            return node
        if node not in done:
            args = tuple(go(a) for a in node.args)
            done[node] = node if args == node.args else Call(node.fn, args)
        return done[node]

    return go(root), tuple(folds.values())
