"""String predicates whose numbers change from call to call: one parse per shape.

A threshold chosen per call (``f"x < {t}"``, a new ``t`` per batch) makes a new string each
time, and parsing it (Python's ``ast``, the whitelist, the interpretation over a symbol) cost
~70 us of host time on the CI machine, more than the rest of a small call. Two strings that
differ only in numbers compared directly with the variable parse to one tree with those
numbers as its parameters, in order: the interpreter turns each number it meets as a
comparison's operand into a parameter of its own (``Tracer.param``, one per occurrence), and
nothing in the tree depends on the number's value, only on its kind (int or float, part of
the shape). So :func:`like_parsed` gives such a string the tree of the first string of its
shape, with its own numbers, without parsing it.

A shape is kept (:func:`remember_parsed`) only where the first string's parse shows it: every
number in the text is an operand of a comparison whose neighbours read ``x`` (``0.2 < x <
0.5``, ``(x > 1e-3) & ~isnan(x)``), or such an operand negated (``x > -0.5``, the parse's
parameter then being the negative number, which is what the shape lifts), the parameters are
exactly those numbers in text order, and no two of them are equal (equal values would hide
two parameters exchanged). A number anywhere else (``x * 2 > 1``, ``abs(-3)``, ``2 ** 0.5``,
``np.float64(0.5)``, ``0 * False``) is computed by the parse itself (Python folds constant
expressions before the tree sees them), so its value can change the tree: such texts are
parsed every time, as is a text with quotes (a date string holds digits too).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from .expr import Param, walk
from .parse import MAX_LENGTH

# An unsigned decimal number, or one negated by a minus written right before it where that
# minus cannot be binary (at the start, or after an opening bracket, a comparison, a comma or
# a logical operator); group 1 a float, group 2 an int. Not a digit inside a name (x1), nor a
# number followed by a letter, a dot or an underscore (1j, 1_000, 0x10, 1.5.2): those stay in
# the shape as text, so that only strings that are valid Python where the first was share it.
# ASCII digits only: Python's syntax has no others, but float() and int() read any of
# Unicode's, and until 2026-12-02 (seventeenth session, a regression review) "x < ١.٥" ran
# as x < 1.5 once "x < 0.25" had kept its shape, refused as invalid syntax before.
_NUMBER = re.compile(
    r"(?:(?<=[(\[<>=!,&|~])|^|(?<=\s))"
    r"(?:(-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))"
    r"|(-?(?:0+|[1-9]\d*)))"
    r"(?![\w.])",
    re.ASCII,
)
_INT64_LIMIT = 1 << 63
# shape -> the Predicate parsed from the first text of that shape; emptied past _MAX entries
_SHAPES: dict[tuple, Any] = {}
_MAX = 256


def shape_of(text: str) -> tuple[tuple, tuple] | None:
    """``(shape, numbers)``: the text's pieces between the numbers :data:`_NUMBER` finds,
    with each number's kind, and the numbers as Python reads them; None where it has none,
    has quotes, or an int outside int64 (a parse refuses some of those by their size), or is
    longer than a parse takes."""
    # here, not in like_parsed alone: the GPU's kept call per shape (backends/cupy_shaped.py)
    # finds a text's shape with no parse, and until 2026-12-02 (seventeenth session, a
    # regression review) ran a text of a kept shape the parse refuses by its length (a
    # number of 2,100 digits), and int() refused one of 4,300 digits in its own words
    if len(text) > MAX_LENGTH or "'" in text or '"' in text:
        return None
    pieces: list[str] = []
    kinds: list[str] = []
    numbers: list[Any] = []
    at = 0
    for m in _NUMBER.finditer(text):
        pieces.append(text[at:m.start()])
        at = m.end()
        token = m.group(0)
        if m.group(1) is not None:
            kinds.append("f")
            numbers.append(float(token))
        else:
            value = int(token)
            if not -_INT64_LIMIT <= value < _INT64_LIMIT:
                return None
            kinds.append("i")
            numbers.append(value)
    if not numbers:
        return None
    pieces.append(text[at:])
    return (tuple(pieces), tuple(kinds)), tuple(numbers)


def like_parsed(text: str) -> Any:
    """A Predicate equal to ``parse(text)``, made from the kept tree of ``text``'s shape with
    ``text``'s numbers, or None where no shape is kept for it."""
    found = shape_of(text)
    if found is None:
        return None
    shape, numbers = found
    first = _SHAPES.get(shape)
    if first is None:
        return None
    from .core import Predicate

    return Predicate(expr=first.expr, params=numbers, func=None, source=text.strip())


def kept_shape(text: str) -> bool:
    """Whether ``text``'s shape is kept: :func:`like_parsed` gives any text of it its tree."""
    found = shape_of(text)
    return found is not None and found[0] in _SHAPES


def remember_parsed(text: str, parsed: Any) -> None:
    """Keep ``parsed`` (``parse(text)``'s fused Predicate) as the tree of ``text``'s shape
    where its parse shows that the shape's numbers are the tree's parameters (see the module
    docstring)."""
    if parsed.expr is None or parsed.fields or not text.isascii() or "\n" in text \
            or "\r" in text:
        return  # (the syntax tree's offsets: bytes of one line)
    found = shape_of(text)
    if found is None:
        return
    shape, numbers = found
    if shape in _SHAPES or not _params_are(parsed, numbers):
        return
    lead = len(text) - len(text.lstrip())
    tokens = [(m.start() - lead, m.group(0).startswith("-")) for m in _NUMBER.finditer(text)]
    if _compared_with_x(text.strip()) != tokens:
        return
    if len(_SHAPES) >= _MAX:
        _SHAPES.clear()
    _SHAPES[shape] = parsed


def _params_are(parsed: Any, numbers: tuple) -> bool:
    """The parse's parameters are ``numbers``, in order, each of the same type and bits
    (``value_key``: 0.0 and -0.0 apart), no two equal, each one leaf of its own in the tree."""
    from .memo import value_key

    params = parsed.params
    if len(params) != len(numbers) or len(set(numbers)) != len(numbers):
        return False
    if any(value_key(p) != value_key(v) for p, v in zip(params, numbers)):
        return False
    leaves = [n for n in walk(parsed.expr) if isinstance(n, Param)]
    return sorted(p.index for p in leaves) == list(range(len(numbers)))


def _compared_with_x(text: str) -> list[tuple[int, bool]] | None:
    """Where the numbers of ``text``'s syntax tree start (each with whether a minus right
    before it is part of it), in text order, where every one is a comparison's operand, or
    such an operand negated by a minus written right before it, whose neighbours in the
    comparison read ``x``; None otherwise. The caller compares them with what
    :data:`_NUMBER` lifted: a minus the parse applies must be one the shape lifts, since
    ``-0`` is ``0`` and a shape that lifted ``0`` alone would give ``- 5`` the value 5."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    numbers = 0
    placed: list[tuple[int, bool]] = []
    for node in ast.walk(tree):
        if _is_number(node):
            numbers += 1
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for j, op in enumerate(operands):
                if _is_number(op):
                    start, negated = op.col_offset, False
                elif (isinstance(op, ast.UnaryOp) and isinstance(op.op, ast.USub)
                      and _is_number(op.operand)
                      and op.operand.col_offset == op.col_offset + 1):
                    start, negated = op.col_offset, True
                else:
                    continue
                beside = [operands[k] for k in (j - 1, j + 1) if 0 <= k < len(operands)]
                if not all(_reads_x(b) for b in beside):
                    return None
                placed.append((start, negated))
    return sorted(placed) if numbers == len(placed) else None


def _is_number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _reads_x(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "x" for n in ast.walk(node))
