"""Predicates over the fields of a record (:func:`dask_compact.compact_records`).

The same tracer and parser as one-array predicates, with one variable per field: a string
names the fields (``"(energy > 5) & (abs(eta) < 2.5)"``), a callable takes them by parameter
name (``lambda energy, eta: ...``, called with one symbolic array per field). The tree's
variables are ``Var(name)``; typing takes the fields' dtypes (sorted ``(name, dtype)`` pairs),
so one compiled loop or kernel serves every call with the same predicate and field dtypes.

Only the fields a predicate reads are evaluated; the others are gathered. A callable the
tracer cannot record takes the mask path: it is called per chunk with the fields it names,
and its result is checked as a one-array mask is (one boolean per row, slices agree).
"""

from __future__ import annotations

import functools
import inspect
import unicodedata
from collections.abc import Callable
from typing import Any

from ..cache import BoundedCache
from .core import (
    NotElementwise,
    Predicate,
    array_module,
    check_mask,
    check_parts,
    failed_on,
    given_to_callable,
    outside_arrays,
    read_only,
    refuse_if_changed,
    refuse_writes,
)
from .expr import variables
from .memo import TRACED_UNDER, trace_key, trace_under_key

__all__ = ["record_predicate", "record_mask", "callable_fields"]


@functools.lru_cache(maxsize=256)
def _parsed(text: str, names: tuple[str, ...]) -> Predicate:
    from .parse import parse

    p = parse(text, names)
    return _with_fields(p, variables(p.expr) if p.expr is not None else ())


def _with_fields(p: Predicate, fields: tuple[str, ...]) -> Predicate:
    return Predicate(
        expr=p.expr, params=p.params, func=p.func, source=p.source, reason=p.reason,
        fields=tuple(sorted(fields)),
    )  # fmt: skip


def callable_fields(func: Callable[..., Any], names: tuple[str, ...]) -> tuple[str, ...]:
    """The fields ``func`` takes, by its parameter names (none: a constant predicate);
    ValueError for a parameter that is not a field and has no default."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        raise TypeError(
            f"the record predicate {func!r} has no signature to read field names from; "
            "use a function whose parameters are field names, or a string expression"
        ) from None
    taken: list[str] = []
    for prm in sig.parameters.values():
        if prm.kind is inspect.Parameter.VAR_KEYWORD:
            taken = list(names)
            break
        if prm.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise ValueError(
                f"the record predicate takes *{prm.name}" if prm.kind is prm.VAR_POSITIONAL
                else f"the record predicate's parameter {prm.name!r} is positional-only"
                "; fields are passed by name (lambda energy, eta: ...)"
            )
        if prm.name in names:
            taken.append(prm.name)
        elif prm.default is inspect.Parameter.empty:
            # Python reads a parameter's name in its NFKC form: `lambda \ufb01eld: ...` takes
            # `field`, which no keyword of the field's own spelling reaches
            spelt = [n for n in names if unicodedata.normalize("NFKC", n) == prm.name]
            why = (f"; Python reads the name {spelt[0]!r} as {prm.name!r} (Unicode's NFKC "
                   "form): rename the field, or use a string expression" if spelt else "")
            raise ValueError(
                f"the record predicate takes {prm.name!r}, which is not a field "
                f"(fields: {', '.join(names)}){why}"
            )
    # None taken (lambda: True): a constant, as the string "True" is; refused until
    # 2026-12-01 where the string was taken (a record probe). Its trace must give one
    # boolean for every row: anything else is refused there (trace, record_mask).
    return tuple(sorted(set(taken)))


# (trace_key, fields) -> the traced Predicate, as core.as_predicate keeps one-array traces
_traced: BoundedCache[tuple, Predicate] = BoundedCache("traced record predicates")


def record_predicate(pred: Any, names: tuple[str, ...]) -> Predicate:
    """The Predicate of ``pred`` (string, callable or Predicate) over the fields ``names``."""
    names = tuple(names)
    if isinstance(pred, Predicate):
        if pred.expr is not None:
            fields = variables(pred.expr)
        else:
            fields = pred.fields
        missing = [f for f in fields if f not in names]
        if missing:
            raise ValueError(
                f"the predicate reads {', '.join(missing)}, which "
                f"{'is not a field' if len(missing) == 1 else 'are not fields'} "
                f"(fields: {', '.join(names)})"
            )
        return pred if pred.fields == fields else _with_fields(pred, fields)
    if isinstance(pred, str):
        return _parsed(pred, names)
    if not callable(pred):
        # a mask of the rows (what compact takes) goes in as one more field: until
        # 2026-12-01 the refusal did not say so (a record probe)
        mask = (
            "; a boolean mask of the rows goes in as a field the predicate reads: "
            'compact_records({**fields, "keep": mask}, "keep")'
            if hasattr(pred, "shape") and hasattr(pred, "dtype") else ""
        )
        raise TypeError(
            "pred must be a string over the field names or a callable taking fields by name, "
            f"not {type(pred).__name__}{mask}"
        )
    fields = callable_fields(pred, names)
    key = trace_key(pred)
    hit = None if key is None else _traced.get((key, fields))
    if hit is not None:
        if hit.expr is not None:
            return hit
        return Predicate(
            expr=None, params=(), func=pred, source=hit.source, reason=hit.reason,
            fields=hit.fields,
        )  # fmt: skip
    from .trace import trace

    # the key comes again with the trace (see trace_under_key: a constant rebound meanwhile)
    p, key = ((trace(pred, fields), None) if key is None
              else trace_under_key(pred, lambda f: trace(f, fields)))
    p = _with_fields(p, variables(p.expr) if p.expr is not None else fields)
    if key is not None:
        p.memo[TRACED_UNDER] = key
        _traced.put((key, fields), p)
    return p


def _rows_advice(outside: list[tuple[str, Any]]) -> str:
    """What to do where a record predicate's mask is not one of the rows it was given: most
    often a mask of all the rows that it reads from outside (``lambda: mask``, ``lambda b:
    mask & (b > 3)``), named where found among its closure's cells and the globals it reads
    (``outside``: :func:`_rows_arrays`'s). Until 2026-12-01 (thirteenth session) the first was
    refused with the general "not elementwise" message, the second with NumPy's broadcast
    error alone (a records probe)."""
    named = [f"`{k}` (shape {tuple(v.shape)})" for k, v in outside]
    held = f"; it reads {', '.join(named)} from outside" if named else ""
    return (f"{held}: a record predicate gets one chunk of each field at a time (and first a "
            "test sample of a few rows), so an array of all the rows from outside it does not "
            "line up with them. A boolean mask of the rows goes in as a field the predicate "
            'reads: compact_records({**fields, "keep": mask}, "keep"), or, with conditions '
            'on other fields, a predicate such as lambda keep, b: keep & (b > 3)')


def _rows_arrays(func: Any, rows: Any) -> list[tuple[str, Any]]:
    """The arrays ``func`` reads from outside that could be a mask of all the rows: ``rows(k)``
    of their length ``k``. Until 2026-12-01 (fourteenth session, a regression review) every
    one was named as such, and told to go in as a field: a (1,) constant, a lookup table."""
    return [(k, v) for k, v in outside_arrays(func) if rows(v.shape[0])]


def record_mask(p: Predicate, fields: dict[str, Any], n: int, xp: Any = None, *,
                every_row: bool = False) -> Any:
    """The boolean mask (``n`` rows) of a record predicate over in-memory fields.

    The mask path's callable is checked as a one-array one is: one boolean per row, and the
    same values for parts of the rows computed alone as within the chunk (``check_parts``;
    every row alone with ``every_row``).
    """
    if xp is None:
        xp = array_module(next(iter(fields.values())))
    like = xp.empty(n, dtype=bool)
    if p.expr is not None:
        from .expr import evaluate

        read = {name: read_only(fields[name]) for name in p.fields}
        return check_mask(evaluate(p.expr, read, p.params, xp), like, p.source, xp)
    func: Any = p.func  # a record predicate's callable takes the fields by keyword
    assert func is not None
    if n == 0:  # no rows, nothing selected: not called (see Predicate.mask)
        return xp.zeros(0, dtype=bool)
    # a CuPy field is given as a copy (core.given_to_callable), compared after the calls
    read = {name: given_to_callable(fields[name]) for name in p.fields}
    try:
        got = func(**read)
    except Exception as e:
        refuse_writes(e, p.source)
        # an array that does not broadcast against the rows given, as a mask of all the rows
        longer = _rows_arrays(func, lambda k: k not in (1, n)) if isinstance(e, ValueError) else []
        if longer and "broadcast" in str(e):
            raise NotElementwise(f"record predicate {p.source} failed on {n} rows ({e})"
                                 f"{_rows_advice(longer)}") from None  # fmt: skip
        e.add_note(failed_on(p.source, "the fields", next(iter(read.values()), like)))
        raise
    _refuse_if_changed(read, fields, p)
    if str(getattr(got, "dtype", "")) == "bool" and tuple(got.shape) not in ((), (n,)):
        # of more than one row, as long as what it returned (a (1,) constant, a lookup table
        # it indexed, are no mask of all the rows)
        held = _rows_arrays(func, lambda k: k == got.shape[0] > 1)
        if held:
            raise NotElementwise(f"record predicate {p.source} returned shape "
                                 f"{tuple(got.shape)} for {n} rows{_rows_advice(held)}")
    m = check_mask(got, like, p.source, xp)

    def part(sl: slice) -> Any:
        return check_mask(func(**{f: v[sl] for f, v in read.items()}), like[sl], p.source, xp)

    try:
        check_parts(part, m, n, p.source, xp, every_row)
    except NotElementwise:
        # a part's call that wrote into the copies it was given reads as another answer:
        # said as the write it is (a GPU run: it was refused as not elementwise)
        _refuse_if_changed(read, fields, p)
        raise
    _refuse_if_changed(read, fields, p)
    return m


def _refuse_if_changed(read: dict[str, Any], fields: dict[str, Any], p: Predicate) -> None:
    """:func:`.core.refuse_if_changed` of each field the callable was given a copy of."""
    for name in p.fields:
        refuse_if_changed(read[name], fields[name], p.source)
