"""Reusing an earlier trace of a callable whose behaviour cannot have changed.

A user compacting many small arrays writes ``compact_array(a, lambda v: v < p)`` in a loop: a
new function object each time, with the same code. Tracing it again costs more than the GPU
work at 2^20 elements, so :func:`trace_key` gives such a callable a key that holds everything
its trace can depend on, and :func:`.core.as_predicate` reuses the predicate traced under an
equal key. The key is None (trace every time) unless everything the code can read is a value
whose equality means equal behaviour:

* its code object (the bytecode, constants included);
* the contents of its closure cells and its defaults;
* the globals its code names, and the attributes its code names of modules and classes among
  them (one and two levels down: ``np.sin``, ``np.random.rand``, ``Cfg.T``): scalars and
  strings by type and exact value (:func:`value_key`); modules, NumPy ufuncs, builtins and
  classes by identity.

Anything else (another Python function, an array, an object with state) makes the key None:
its behaviour could change between calls with nothing in the key changing.
"""

from __future__ import annotations

import functools
import struct
import types
from collections.abc import Callable
from typing import Any

import numpy as np

_VALUES = (bool, int, float, complex, str, bytes, type(None), np.generic)
_BY_IDENTITY = (types.ModuleType, np.ufunc, types.BuiltinFunctionType, type)
_pack_d = struct.Struct("<d").pack


@functools.lru_cache(maxsize=1024)
def _names(code: types.CodeType) -> tuple[str, ...]:
    names = set(code.co_names)
    for const in code.co_consts:  # nested code: comprehensions, inner lambdas
        if isinstance(const, types.CodeType):
            names |= set(_names(const))
    return tuple(sorted(names))


def value_key(value: Any) -> tuple:
    """``value`` by type and exact value: ``-0.0`` and ``0.0`` are equal but differ to
    ``signbit`` (and ``1 == 1.0 == True`` to NumPy's typing), so floats go by their bits."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        return (type(value), value.tobytes())
    if isinstance(value, float):  # the bits: float.hex() gives "nan" for either sign
        return (type(value), struct.pack("<d", value))
    if isinstance(value, complex):
        return (type(value), struct.pack("<dd", value.real, value.imag))
    return (type(value), value)


def _part(value: Any) -> tuple | None:
    if type(value) is float:  # the common closure value (a threshold): value_key's answer
        return (float, _pack_d(value))
    if isinstance(value, _VALUES):
        return value_key(value)
    if isinstance(value, _BY_IDENTITY):
        return (type(value), id(value))
    return None


def trace_key(func: Callable[..., Any]) -> tuple | None:
    """A key equal for two callables only if tracing them gives the same predicate; None if
    this one's trace must not be reused (see the module docstring)."""
    code = getattr(func, "__code__", None)
    if not isinstance(func, types.FunctionType) or code is None:
        return None
    parts: list[Any] = [code]
    # (each part only where the function has it: a bare lambda's key costs ~1 us less, which
    # is a few per cent of a small GPU call)
    closure, defaults, kwdefaults = func.__closure__, func.__defaults__, func.__kwdefaults__
    if closure or defaults or kwdefaults:
        try:
            cells = [c.cell_contents for c in closure or ()]
        except ValueError:  # an empty cell: a name not yet bound
            return None
        kw = [v for _, v in sorted(kwdefaults.items())] if kwdefaults else []
        for v in [*cells, *(defaults or ()), *kw]:
            part = _part(v)
            if part is None:
                return None
            parts.append(part)
    names = _names(code)
    if not names:
        return (code,) if len(parts) == 1 else _hashable(parts)
    g = func.__globals__
    owners = []
    for name in names:
        if name not in g:
            continue  # an attribute name, or a builtin
        part = _part(g[name])
        if part is None:
            return None
        parts.append((name, part))
        if isinstance(g[name], (types.ModuleType, type)):
            owners.append(g[name])
    # Attributes the code may read off modules and classes (np.sin, np.random.rand, Cfg.T):
    # their current values, so that rebinding one changes the key.
    for depth in (1, 2):
        nested = []
        for owner in owners:
            for name in names:
                value = getattr(owner, name, None)
                if value is None:
                    continue
                part = _part(value)
                if part is None:
                    return None
                parts.append((id(owner), name, part))
                if depth == 1 and isinstance(value, (types.ModuleType, type)):
                    nested.append(value)
        owners = nested
    return _hashable(parts)


def _hashable(parts: list[Any]) -> tuple | None:
    try:
        key = tuple(parts)
        hash(key)
    except TypeError:
        return None
    return key
