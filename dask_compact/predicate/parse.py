"""Parse a predicate written as a string in the variable ``x``, e.g. ``"(x > 0.2) & (x < 0.3)"``.

The text is parsed with :mod:`ast` and checked against a whitelist before anything is computed:
the only name is ``x`` (plus the constants ``True``, ``False``, ``nan``, ``inf``, ``pi``, and
NumPy's constants as ``np.e``, ``numpy.pi``...), calls go only to bare names of the elementwise
functions dask_compact compiles, and there is no other attribute access, no subscript, keyword,
starred argument, lambda, comprehension or string. Nothing is ever ``eval``'d: the checked tree
is interpreted node by node over the tracer's symbolic array (:class:`~.trace.Sym`), so
``"x > 0.2"`` gives exactly the tree ``lambda v: v > 0.2`` gives.

Beyond Python operator semantics, ``and``/``or``/``not`` mean ``np.logical_and``/``logical_or``/
``logical_not`` and a chained comparison ``a < x < b`` means ``(a < x) & (x < b)``, as a user
writing a filter expects (in a traced lambda they would ask for the truth value of the data).
"""

from __future__ import annotations

import ast
import functools
import math
import numbers
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import numpy as np

from .core import Predicate
from .expr import UFUNCS
from .trace import BINARY_OPERATORS, COMPARE_OPERATORS, NotElementwise, Sym, Tracer, run_traced

__all__ = ["CONSTANTS", "FUNCTIONS", "MAX_DEPTH", "MAX_LENGTH", "parse"]

MAX_LENGTH = 2000  # characters: a filter expression, not a program
MAX_DEPTH = 250  # nesting of the syntax tree (the parser and the interpreter below recurse on it)
_MAX_INT_BITS = 4096  # constant integer arithmetic beyond this is refused (2 ** 10 ** 9 ...)

# Callable names: every compiled ufunc by its NumPy name, some common aliases, and the
# non-ufunc elementwise functions. Values are the NumPy functions applied to a Sym or constants.
FUNCTIONS: dict[str, Callable[..., Any]] = {name: getattr(np, name) for name in sorted(UFUNCS)}
FUNCTIONS.update(
    {
        "abs": np.absolute,
        "divide": np.true_divide,
        "mod": np.remainder,
        "pow": np.power,
        "bitwise_not": np.invert,
        "where": np.where,
        "real": np.real,
        "imag": np.imag,
    }
)
CONSTANTS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "pi": math.pi}
_VARIABLE = "x"
# NumPy's constants as NumPy users write them, `np.e`, `numpy.pi`, `math.tau` (the modules'
# own floats, so the answer is NumPy's for `a < np.e`): literals, an attribute of a module
# name taken from this table and nothing else (no other attribute, nothing looked up). Until
# 2026-12-02 (sixteenth session, the fifteenth's probes) `"x < np.e"` was refused with the
# general bare-name hint; `e` itself has no bare name (_check refuses it, told np.e).
# NumPy 2 prints its bools `np.True_` and `np.False_` (what f"x == {t!r}" writes of one):
# constants of NumPy's bool (until 2026-12-02, seventeenth session, a regression review,
# refused as attribute access).
_MODULE_CONSTANTS: dict[str, dict[str, float | np.bool_]] = {
    **dict.fromkeys(("np", "numpy", "cp", "cupy"), {
        "e": math.e, "pi": math.pi, "inf": math.inf, "nan": math.nan,
        "euler_gamma": float(np.euler_gamma), "True_": np.True_, "False_": np.False_}),
    **dict.fromkeys(("math", "cmath"), {
        "e": math.e, "pi": math.pi, "inf": math.inf, "nan": math.nan, "tau": math.tau}),
}  # fmt: skip

_UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: lambda v: -v,
    ast.UAdd: lambda v: +v,
    ast.Invert: lambda v: ~v,
    ast.Not: np.logical_not,
}
_BOOL: dict[type, Callable[[Any, Any], Any]] = {ast.And: np.logical_and, ast.Or: np.logical_or}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Name,
    ast.Constant, ast.Load,
    *BINARY_OPERATORS, *COMPARE_OPERATORS, *_UNARY, *_BOOL,
)  # fmt: skip


# NumPy's scalar types as NumPy 2 prints its scalars, `np.float64(0.5)`, `np.int64(3)`: a call
# of one of these on a constant is a constant of that type (`f"x < {t!r}"` of a NumPy scalar
# writes it so). Until 2026-12-02 (sixteenth session) it was refused as attribute access.
_SCALAR_TYPES: dict[str, type] = {
    name: getattr(np, name) for name in (
        "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
        "uint16", "uint32", "uint64", "complex64", "complex128", "bool_", "bool")
}


def _scalar_call(node: ast.AST) -> type | None:
    """The NumPy scalar type ``node`` calls, where it is ``np.float64(<one argument>)`` or
    the like (:data:`_SCALAR_TYPES`, on ``np`` or ``numpy``, no keyword)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("np", "numpy") and len(node.args) == 1
            and not node.keywords):
        return _SCALAR_TYPES.get(node.func.attr)
    return None


def _module_constant(node: ast.AST) -> float | np.bool_ | None:
    """The value of ``node`` where it is one of :data:`_MODULE_CONSTANTS` (``np.e``)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return _MODULE_CONSTANTS.get(node.value.id, {}).get(node.attr)
    return None


_NAMES_OF_NODES = {
    ast.Attribute: "attribute access", ast.Subscript: "subscripting", ast.Lambda: "a lambda",
    ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression",
    ast.JoinedStr: "an f-string", ast.Starred: "a starred argument",
    ast.IfExp: "a conditional expression (use where(cond, a, b))", ast.NamedExpr: "assignment",
    ast.List: "a list", ast.Tuple: "a tuple", ast.Dict: "a dict", ast.Set: "a set",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "a slice",
    ast.keyword: "a keyword argument", ast.MatMult: "the @ operator",
    ast.Is: "`is` (use ==)", ast.IsNot: "`is not` (use !=)", ast.In: "`in`", ast.NotIn: "`not in`",
}  # fmt: skip


# What a NumPy user writes in a string and the form that is taken (until 2026-12-01,
# fourteenth session, refused with no form given: "attribute access is not allowed",
# "`in` is not allowed", "invalid syntax"; a new-user probe).
_MODULES = ("np", "numpy", "math", "cmath", "cp", "cupy")


def _attribute_hint(node: ast.Attribute, call: ast.Call | None = None) -> str:
    """The bare-name form of ``np.isnan(x)``, ``np.pi`` or ``x.real`` (``call``: the call
    whose function ``node`` is), for the refusal of attribute access."""
    if isinstance(node.value, ast.Name) and node.value.id in _MODULES:
        if call is not None and node.attr in FUNCTIONS:
            args = ", ".join(ast.unparse(a) for a in call.args)
            return f" (functions are called by bare name: write {node.attr}({args}))"
        # NumPy 2's print of a NumPy scalar not taken as a constant, f"x > {t!r}": told
        # "methods are not available" until 2026-12-02 (seventeenth session, a regression
        # review)
        f, kind = ast.unparse(node), getattr(np, node.attr, None)
        numpy_call = call is not None and node.value.id in ("np", "numpy")
        if numpy_call and call is not None and node.attr in ("datetime64", "timedelta64"):
            return (f" (a string predicate compares numbers, not times: compare times in a "
                    f"callable, lambda v: v > {ast.unparse(call)})")
        if numpy_call and node.attr in _SCALAR_TYPES:  # two numbers
            return f" ({f}(...) takes one number here, as NumPy prints its scalars: {f}(0.5))"
        if numpy_call and isinstance(kind, type) and issubclass(kind, np.generic):
            return (f" ({f} is not a type dask_compact computes in; a NumPy scalar of one is "
                    f"a constant, as NumPy prints it, e.g. np.float64(0.5): "
                    f"{', '.join(f'np.{t}' for t in _SCALAR_TYPES)})")
    elif call is None and node.attr in FUNCTIONS:  # x.real, x.imag
        return (f" (functions are called by bare name: write "
                f"{node.attr}({ast.unparse(node.value)}))")
    return " (functions are called by bare name, e.g. isnan(x); methods are not available)"


def _in_hint(node: ast.Compare) -> str:
    """``x in (1, 2)`` written as the comparisons it means, for its refusal."""
    op, values = node.ops[0], node.comparators[0]
    if len(node.ops) != 1 or not isinstance(values, (ast.Tuple, ast.List, ast.Set)) or \
            not values.elts:  # fmt: skip
        return " (compare with each value and join the results with | or &)"
    left = ast.unparse(node.left)
    cmp, join = ("==", " | ") if isinstance(op, ast.In) else ("!=", " & ")
    return f" (write {join.join(f'({left} {cmp} {ast.unparse(v)})' for v in values.elts)})"


def _syntax_hint(text: str) -> str:
    """The comparison meant where a string is not valid syntax by one of NumPy users' slips."""
    if "=>" in text:
        return " (write >=)"
    if "=<" in text:
        return " (write <=)"
    if re.search(r"(?<![=!<>])=(?!=)", text):
        return " (a comparison is written ==)"
    return ""


def _refuse(text: str, what: str, hint: str = "") -> ValueError:
    shown = text if len(text) <= 80 else text[:77] + "..."
    return ValueError(f"predicate expression {shown!r}: {what} is not allowed{hint}")


_BITWISE = {ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^"}
_COMPARE_TEXT = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
                 ast.GtE: ">="}


def _in_parentheses(text: str, o: ast.expr) -> bool:
    """Whether the source shows ``o`` inside its own pair of parentheses (``ast`` drops them).
    Offsets are UTF-8 bytes of the stripped text, as :func:`parse` gave it to ``ast``. A
    comment or a line continuation anywhere answers False (a ``(`` in a comment is not one):
    refused, conservatively."""
    if o.end_lineno is None or o.end_col_offset is None:
        return False
    lines = text.strip().encode().splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    src = b"".join(lines)
    begin = starts[o.lineno - 1] + o.col_offset
    end = starts[o.end_lineno - 1] + o.end_col_offset
    before = src[:begin].rstrip()
    after = src[end:].lstrip()
    inner = src[begin:end]
    if b"#" in src or b"\\" in src or not (before.endswith(b"(") and after.startswith(b")")):
        return False
    depth = 0  # the two must be one pair: the operand's own parentheses balance
    for c in inner:
        depth += {40: 1, 41: -1}.get(c, 0)
        if depth < 0:
            return False
    return depth == 0


def _check_chain(text: str, node: ast.Compare) -> None:
    """Refuse a chained comparison with a bare bitwise operand: ``x == 1 | x == 2`` is Python's
    ``x == (1 | x) == 2`` (``|`` binds tighter than ``==``), i.e. ``(x == (1 | x)) & ((1 | x)
    == 2)``, never what was meant (pandas' ``query`` reads it as ``(x == 1) | (x == 2)``), and
    on integers it runs and selects other rows. A chain of plain operands (``0 < x < 1``) is
    kept, and so is one whose bitwise operand is written in parentheses (``0 < (x & 3) < 2``):
    that reading is the one shown."""
    if len(node.ops) < 2:
        return
    operands = [node.left, *node.comparators]
    bitwise = [o for o in operands if isinstance(o, ast.BinOp) and type(o.op) in _BITWISE]
    bare = [o for o in bitwise if not _in_parentheses(text, o)]
    if not bare:
        return

    def shown(o: ast.expr) -> str:
        return f"({ast.unparse(o)})" if o in bitwise else ast.unparse(o)

    ops = [_COMPARE_TEXT.get(type(op), "?") for op in node.ops]
    read = " ".join([shown(operands[0]), *(f"{op} {shown(o)}" for op, o in zip(ops, operands[1:]))])
    mid = operands[1]
    sym = _BITWISE[type(bare[0].op)]
    if len(ops) == 2 and isinstance(mid, ast.BinOp) and mid in bare:  # a < b | c > d
        # pandas' reading, the likely intent -- a different expression, offered as one
        meant = repr(f"({ast.unparse(operands[0])} {ops[0]} {ast.unparse(mid.left)}) {sym} "
                     f"({ast.unparse(mid.right)} {ops[1]} {ast.unparse(operands[2])})")
    else:
        meant = f"e.g. '(x == 1) {sym} (x == 2)'"
    where = text if len(text) <= 80 else text[:77] + "..."
    raise ValueError(
        f"predicate expression {where!r}: `{sym}` binds tighter than comparisons, so this reads "
        f"as the chained comparison {read!r}; to compare each side and join the results with "
        f"`{sym}`, put each comparison in parentheses: {meant}; to mean that chain, write it "
        f"as shown, with the `{sym}` operand in parentheses"
    )


def _check(text: str, tree: ast.AST, names: tuple[str, ...] = (_VARIABLE,)) -> None:
    """Reject every node outside the whitelist before anything is computed. ``names``: the
    variables (``x``, or a record's field names)."""
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _refuse(text, f"nesting deeper than {MAX_DEPTH}")
        if _module_constant(node) is not None:
            continue  # a literal, its module's name not a variable
        if _scalar_call(node) is not None:
            assert isinstance(node, ast.Call)
            # a variable (a field named like a constant too), not a module's constant's
            # module (np.float32(np.pi): refused as a variable until 2026-12-02, seventeenth
            # session, a regression review)
            modules = {id(n.value) for n in ast.walk(node.args[0])
                       if isinstance(n, ast.Attribute) and _module_constant(n) is not None}
            used = [n.id for n in ast.walk(node.args[0])
                    if isinstance(n, ast.Name) and id(n) not in modules
                    and (n.id in names or n.id not in CONSTANTS)]
            if used:
                f = ast.unparse(node.func)
                raise _refuse(text, f"{f}({ast.unparse(node.args[0])})",
                              f" ({f}(...) takes a number here, as NumPy prints its scalars: "
                              f"{f}(0.5); a variable is compared as it is)")
            stack.append((node.args[0], depth + 1))
            continue
        if not isinstance(node, _ALLOWED):
            what = _NAMES_OF_NODES.get(type(node), f"{type(node).__name__} syntax")
            hint = _attribute_hint(node) if isinstance(node, ast.Attribute) else ""
            raise _refuse(text, what, hint)
        if isinstance(node, ast.Name):
            if node.id not in names and node.id not in CONSTANTS:
                which = (
                    "the variable is `x`" if names == (_VARIABLE,)
                    else f"the fields are {', '.join(names)}"
                )
                # the example on a field (a record's said `isnan(x)`, the name refused, until
                # 2026-12-01, fourteenth session: a new-user probe)
                on = next((n for n in names if n.isidentifier()), _VARIABLE)
                # NumPy's `e` has no bare name: a misspelt variable or field would compare
                # with 2.718... and select all or nothing without a word
                known = (f"write np.{node.id}: NumPy's constant {node.id} has no bare name; "
                         if node.id in _MODULE_CONSTANTS["np"] else "")
                raise _refuse(
                    text,
                    f"the name {node.id!r}",
                    f" ({known}{which}; constants: {', '.join(CONSTANTS)}, np.e and NumPy's "
                    f"others; functions are called by bare name, e.g. `isnan({on})`)",
                )
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (bool, int, float, complex)):
                raise _refuse(text, f"the non-numeric constant {node.value!r}")
            if isinstance(node.value, bool) and str(node.value) in names:
                # Python reads `True` as the constant: a field of that name selected all or
                # nothing, silently (a probe's "True > 2")
                raise _refuse(text, f"`{node.value}`",
                              f" here: it is Python's constant, never the field named "
                              f"{str(node.value)!r}; rename that field to use it in a "
                              "predicate")
        elif isinstance(node, ast.Compare):
            for op in node.ops:  # before the operands, so `x in (1, 2)` names `in`
                if not isinstance(op, _ALLOWED):
                    hint = _in_hint(node) if isinstance(op, (ast.In, ast.NotIn)) else ""
                    raise _refuse(text, _NAMES_OF_NODES.get(type(op), type(op).__name__), hint)
            _check_chain(text, node)
        elif isinstance(node, ast.Call):
            if node.keywords:
                raise _refuse(text, "a keyword argument")
            if isinstance(node.func, ast.Attribute):
                raise _refuse(text, "attribute access", _attribute_hint(node.func, node))
            if not isinstance(node.func, ast.Name):
                raise _refuse(text, "calling anything but a function name")
            if node.func.id not in FUNCTIONS:
                called = node.func.id
                raise _refuse(
                    text, f"calling {called!r}", f" (functions: {', '.join(sorted(FUNCTIONS))})"
                )
            # the function's Name is checked here, not as a value
            stack.extend((a, depth + 1) for a in node.args)
            continue
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _is_constant(v: Any) -> bool:
    return not isinstance(v, Sym)


def _guard_constant_op(text: str, op: type, a: Any, b: Any) -> None:
    """Refuse constant integer arithmetic that would take unbounded time or memory."""
    if not (isinstance(a, numbers.Integral) and isinstance(b, numbers.Integral)):
        return
    if isinstance(a, np.integer) or isinstance(b, np.integer):
        return  # fixed-width NumPy arithmetic is bounded
    a, b = int(a), int(b)
    if op is ast.Pow and b > 0 and abs(a) > 1:
        # |a| ** b has at least (bit_length - 1) * b + 1 bits: past the limit, refuse without
        # computing it; under it, b <= _MAX_INT_BITS, so computing it exactly is cheap.
        if (abs(a).bit_length() - 1) * b + 1 > _MAX_INT_BITS or (a**b).bit_length() > _MAX_INT_BITS:
            raise _refuse(text, f"the constant {a} ** {b} (over {_MAX_INT_BITS} bits)")
    if op is ast.LShift and b > _MAX_INT_BITS:
        raise _refuse(text, f"the constant {a} << {b} (over {_MAX_INT_BITS} bits)")


class _Interpreter:
    """Evaluate a checked tree over a Sym, with Python's operator semantics."""

    def __init__(self, text: str, tree: ast.Expression) -> None:
        self.text = text
        self.tree = tree
        self.refused: ValueError | None = None  # kept even if the tracer swallows it

    def __call__(self, *args: Sym, **fields: Sym) -> Any:
        # one variable `x` (positional), or a record's fields by name, which shadow the
        # constants' names (a field may itself be named `x`)
        self.vars = {_VARIABLE: args[0]} if args else fields
        with np.errstate(all="ignore"):
            return self.eval(self.tree.body)

    def eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            hit = self.vars.get(node.id)
            return hit if hit is not None else CONSTANTS[node.id]
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute):  # _check let only a module's constant by
            value = _module_constant(node)
            assert value is not None
            return value
        if isinstance(node, ast.UnaryOp):
            return self.bounded(_UNARY[type(node.op)](self.eval(node.operand)))
        if isinstance(node, ast.BinOp):
            a, b = self.eval(node.left), self.eval(node.right)
            if _is_constant(a) and _is_constant(b):
                try:
                    _guard_constant_op(self.text, type(node.op), a, b)
                except ValueError as e:
                    self.refused = e
                    raise
            return self.bounded(BINARY_OPERATORS[type(node.op)](a, b))
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v) for v in node.values]
            return functools.reduce(_BOOL[type(node.op)], values)
        if isinstance(node, ast.Compare):
            operands = [self.eval(node.left)] + [self.eval(c) for c in node.comparators]
            parts = [
                COMPARE_OPERATORS[type(op)](operands[i], operands[i + 1])
                for i, op in enumerate(node.ops)
            ]
            return functools.reduce(np.logical_and, parts)
        scalar = _scalar_call(node)
        if scalar is not None:
            assert isinstance(node, ast.Call)
            value = self.eval(node.args[0])
            try:
                return scalar(value)
            except (OverflowError, ValueError, TypeError) as e:  # np.int8(300), np.uint8(-1)
                self.refused = _refuse(self.text, f"the constant {ast.unparse(node)}", f" ({e})")
                raise self.refused from None
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return self.bounded(FUNCTIONS[node.func.id](*[self.eval(a) for a in node.args]))
        raise _refuse(self.text, type(node).__name__)  # _check let nothing else by

    def bounded(self, v: Any) -> Any:
        """``v``, refused where it is a Python integer over ``_MAX_INT_BITS`` bits.

        NumPy computes a function of an integer too large for int64 (``square(2**64)``) in
        Python's integers, unbounded: each level of ``square(square(...(2**64)))`` doubled the
        digits, and a probe's 241 characters would have needed 27 GB. Checked after every
        operation, so no constant ever grows past twice the limit."""
        if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > _MAX_INT_BITS:
            self.refused = _refuse(self.text, f"a constant of {v.bit_length()} bits (over "
                                              f"{_MAX_INT_BITS})")
            raise self.refused
        return v


def _spell_names_as_the_fields(source: str, tree: ast.AST, names: tuple[str, ...]) -> None:
    """Python reads every name in its NFKC form (``\ufb01eld``, with the "fi" ligature, is
    read as ``field``), so a field whose name is in another form was not found, or, beside a
    field named in that form, the other field was read without a word: a records probe's
    ``"\ufb01eld > -3"`` selected by ``field`` (2026-12-06). A name is read as typed
    (``source``: the text parsed) where that is a field's name; typed in another form than
    Python's and naming no field so, it is the one field whose name reads as Python reads
    it (refused where two do); typed in Python's form it is what Python reads (a field
    ``\uff49\uff4e\uff46``, full-width, does not take the place of ``inf``)."""
    spelt: dict[str, list[str]] = {}
    for n in names:
        spelt.setdefault(unicodedata.normalize("NFKC", n), []).append(n)
    if all(len(v) == 1 and v[0] == k for k, v in spelt.items()):
        return  # every field's name in Python's form (the common case)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name):
            continue
        typed = ast.get_source_segment(source, node)
        if typed in names:
            node.id = typed
        elif typed != node.id and node.id not in names and node.id in spelt:
            fields = spelt[node.id]
            if len(fields) > 1:
                raise _refuse(source, f"the name {typed!r}",
                              f": Python reads it as {node.id!r}, as it reads the fields "
                              f"{', '.join(map(repr, fields))} (names are read in Unicode's "
                              f"NFKC form); write one of them as it is named")
            node.id = fields[0]


def parse(text: str, names: tuple[str, ...] | None = None) -> Predicate:
    """Parse a predicate string in ``x`` (or in the record fields ``names``) into a fused
    :class:`Predicate`.

    Raises ValueError naming what is not allowed, for anything outside the whitelist, for
    operations that are not elementwise, and for constants that cannot be computed.
    """
    if not isinstance(text, str):
        raise TypeError(f"a predicate expression must be a str, not {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ValueError(
            f"predicate expression of {len(text)} characters: over {MAX_LENGTH} is not allowed"
        )
    if "\x00" in text:
        raise _refuse(text, "a NUL character")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"predicate expression {text!r} is not valid syntax: "
                         f"{e.msg}{_syntax_hint(text)}") from None
    except (RecursionError, MemoryError):
        raise _refuse(text, "nesting this deep") from None
    if names is not None:
        _spell_names_as_the_fields(text.strip(), tree, names)
    _check(text, tree, (_VARIABLE,) if names is None else names)
    tracer = Tracer()
    try:
        interpreter = _Interpreter(text, tree)
        node, reason = run_traced(interpreter, tracer, names)
    except NotElementwise:
        raise
    except RecursionError:
        raise _refuse(text, "nesting this deep") from None
    if interpreter.refused is not None:
        raise interpreter.refused
    if node is None:
        raise ValueError(f"predicate expression {text!r} cannot be compiled: {reason}")
    # A constant expression ("True") selects all or nothing, like a lambda returning True.
    return Predicate(expr=node, params=tuple(tracer.params), func=None, source=text.strip())
