"""Reusing an earlier trace of a callable whose behaviour cannot have changed.

A user compacting many small arrays writes ``compact_array(a, lambda v: v < p)`` in a loop: a
new function object each time, with the same code. Tracing it again costs more than the GPU
work at 2^20 elements, so :func:`trace_key` gives such a callable a key that holds everything
its trace can depend on, and :func:`.core.as_predicate` reuses the predicate traced under an
equal key. The key is None (trace every time) unless everything the code can read is a value
whose equality means equal behaviour:

* its code object (the bytecode, constants included);
* the contents of its closure cells and its defaults;
* the globals its code names, and the attributes its code names of the modules and classes
  among them and among its closure cells and defaults, at any depth (``np.sin``,
  ``np.linalg.norm``, ``Cfg.T``, ``Cuts.E.W.lo``, a class held in a closure or a default):
  scalars and strings by type and exact value (:func:`value_key`, a NumPy scalar with its
  dtype: ``np.timedelta64``'s unit); modules, NumPy ufuncs and functions (``np.isin``), pure
  builtins (``abs``, ``math.sqrt``) and classes whose construction runs no Python code
  (``Cfg``, ``np.float32``, enums) by identity, the key holding the object; a builtin method
  of a value (``line.count``) by the value and the method's name.

Anything else (another Python function, an array, an object with state) makes the key None:
its behaviour could change between calls with nothing in the key changing. So does a builtin
that reads the world rather than its arguments (``time.time``, ``random.random``,
``np.random.rand``, ``datetime.datetime.now``, ``open``), a class whose construction runs
Python code, and a string that makes NumPy read the clock (``np.datetime64("now")``): the
trace calls them once, and until 2026-11-30 a later call reused the value the first one got
(a predicate ``v > time.time() - 3600`` kept its first hour forever). So does code that
names something that reads by a computed name (``getattr(Cfg, "T")``, ``globals()["T"]``,
``vars(Cfg)``, ``Cfg.__dict__``): no list of names can follow it. Until 2026-11-30 the
attributes of a class or module held in a closure or a default, those three or more levels
down, and those read by a computed name were not in the key, and a call after one of them
changed reused the old trace (a new-user probe: ``Cfg.T = 8`` and the result still ``v > 5``).
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import struct
import types
from collections.abc import Callable
from typing import Any

import numpy as np

_VALUES = (bool, int, float, complex, str, bytes, type(None), np.generic)
# Names through which code reads a variable or an attribute by a computed name
_DYNAMIC = frozenset({"getattr", "globals", "vars", "locals", "eval", "exec", "__dict__",
                      "__getattribute__", "attrgetter", "__import__", "import_module"})
# How deep attributes of modules and classes are followed (np.random.rand is 2 below np);
# a chain deeper than this is not keyed
_MAX_DEPTH = 8
_MISSING = object()
# NumPy's public functions (np.isin, np.where: dispatchers of its own type) act as NumPy does
# (pure builtins and classes are keyed by identity too, after their own checks in _part)
_BY_IDENTITY = (types.ModuleType, np.ufunc, type(np.isin))
_pack_d = struct.Struct("<d").pack
# Builtin functions whose result depends on their arguments alone, so that a trace that called
# them holds what any later call would compute. Anything else a predicate calls while traced
# (``time.time()``, ``random.random()``, ``datetime.datetime.now()``, ``open(f).read()``)
# gives something new each call, and a reused trace would keep the first call's value.
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "callable", "chr", "divmod", "format", "hash", "hex",
    "isinstance", "issubclass", "len", "max", "min", "oct", "ord", "pow", "repr", "round",
    "sorted", "sum"})
_PURE_MODULES = frozenset({"math", "cmath", "operator", "_operator"})
# NumPy's C functions that read something other than their arguments
_IMPURE_NUMPY = frozenset({"empty", "fromfile", "frombuffer"})
_ENUM_CALL = enum.EnumMeta.__call__


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> tuple[str, ...]:
    """The global and attribute names ``code`` reads, with those of the code nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:  # nested code: comprehensions, inner lambdas
        if isinstance(const, types.CodeType):
            names |= set(code_names(const))
    return tuple(sorted(names))


def value_key(value: Any) -> tuple:
    """``value`` by type and exact value: ``-0.0`` and ``0.0`` are equal but differ to
    ``signbit`` (and ``1 == 1.0 == True`` to NumPy's typing), so floats go by their bits.

    Made of types, strings, bytes, ints and bools alone, so that it also serves as a dask
    token (:meth:`.core.Predicate.__dask_tokenize__`) and hashes alike in every process."""
    if isinstance(value, np.generic):  # before float: np.float64 is a float
        dtype = value.dtype
        text = _DTYPE_TEXT.get(dtype)
        return (type(value), text or _dtype_text(dtype), value.tobytes())
    if isinstance(value, float):  # the bits: float.hex() gives "nan" for either sign
        return (type(value), struct.pack("<d", value))
    if isinstance(value, complex):
        return (type(value), struct.pack("<dd", value.real, value.imag))
    return (type(value), value)


# dtype -> _dtype_text(dtype): dtype.str makes a new string each time (0.2 us, half of what a
# NumPy scalar's key costs); a few dtypes are met, and the dict is emptied past 256
_DTYPE_TEXT: dict[np.dtype, str] = {}


def _dtype_text(dtype: np.dtype) -> str:
    """A NumPy scalar's dtype as value_key holds it. Its bytes and type alone leave the rest
    out: ``np.timedelta64(5, "m")`` and ``np.timedelta64(5, "s")`` are one type with the same
    bytes (until 2026-12-01 a closure constant changed from one to the other reused the first
    trace: a new-user probe), as are two ``np.void`` records of different fields. Text, not
    the dtype: np.dtype's hash leaves the datetime unit out (the mask path's dask token is a
    hash of the trace key), and a dask token of the text holds it all (dask tokenizes a
    structured dtype without its field names)."""
    text = dtype.str if dtype.fields is None else str(dtype)
    if len(_DTYPE_TEXT) >= 256:
        _DTYPE_TEXT.clear()
    _DTYPE_TEXT[dtype] = text
    return text


def _part(value: Any) -> tuple | None:
    if type(value) is float:  # the common closure value (a threshold): value_key's answer
        return (float, _pack_d(value))
    if isinstance(value, str):
        return None if _reads_clock(value) else (str, value)
    if isinstance(value, _VALUES):
        return value_key(value)
    if isinstance(value, types.BuiltinFunctionType):
        return _builtin_part(value) if _pure_builtin(value) else None
    if isinstance(value, type):
        return _held(value) if _pure_class(value) else None
    if isinstance(value, _BY_IDENTITY):
        return _held(value)
    return None


# Modules, classes, ufuncs, NumPy's functions and builtins are keyed by identity. Until
# 2026-12-01 the key held id(value) and not the object: once the object was freed another one
# could get its id, and a global rebound to it hit the entry of the freed one (a new-user
# probe: `count = line.count` rebound for each line of a file, and `v > count(",")` kept the
# first line's count). The key now holds the object itself, so that while the entry lives no
# other object can have its id. Nothing of these need be let go of: the entry's Predicate
# holds the callable, and through it its closure, defaults and globals, already; what the key
# adds is the objects rebound since, at most one entry's worth each (the memo is bounded).
_IDENTITY_EQ = (object.__eq__, types.BuiltinFunctionType.__eq__)
_IDENTITY_HASH = (object.__hash__, types.BuiltinFunctionType.__hash__)


# type -> whether its objects compare by identity: the types of modules, classes (type,
# EnumMeta, a metaclass), ufuncs and builtins, a few
_IDENTITY_KINDS: dict[type, bool] = {}


def _compares_by_identity(kind: type) -> bool:
    """Whether ``kind``'s objects compare and hash by identity, in C: object's own (modules,
    classes of ``type`` or ``EnumMeta``, ufuncs) or a builtin function's (the same C function
    bound to the same object). A key holding such an object costs what an id() did: the
    tuple compares it by identity first, and its hash is its address."""
    known = _IDENTITY_KINDS.get(kind)
    if known is None:
        eq, hash_ = kind.__eq__, kind.__hash__
        known = _IDENTITY_KINDS[kind] = (any(eq is e for e in _IDENTITY_EQ)
                                         and any(hash_ is h for h in _IDENTITY_HASH))
    return known


def _held(value: Any) -> tuple:
    """``value`` by identity, the key holding it (see above)."""
    if _compares_by_identity(type(value)):
        return (type(value), value)
    # a class whose metaclass has its own __eq__ or __hash__ (Python code, whose "equal"
    # need not mean "the same class"): compared by identity all the same
    return (type(value), _Same(value))


class _Same:
    """An object in a key that compares by identity whatever its own ``==`` says, and holds
    it (so that its id, the hash, is no other object's while the key lives)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


_METHOD = "method of a value"


def _builtin_part(func: types.BuiltinFunctionType) -> tuple:
    """A pure builtin (:func:`_pure_builtin`) in a key. A method of a value (``line.count``,
    ``"a,b".split``) by the value (:func:`value_key`) and the method's name: such a method acts
    on its value alone, so the same method of an equal value, another object, takes the same
    entry; the key holds the value, not the method. Where the name would not find this method
    on the value (``object.__format__.__get__(s)``), and for a function of a module (``abs``,
    ``math.sqrt``, ``np.arange``), by identity (:func:`_held`)."""
    owner, name = func.__self__, func.__name__
    if isinstance(owner, _VALUES):
        found = getattr(owner, name, None)  # a new bound method: equal, not the same object
        if type(found) is type(func) and found == func:
            return (_METHOD, value_key(owner), name)
    return _held(func)


def _pure_builtin(func: types.BuiltinFunctionType) -> bool:
    """Whether a call of ``func`` gives the same result for the same arguments every time:
    ``math.sqrt``, ``abs``, ``operator.add``, ``np.arange``, ``"a,b".split``; not
    ``time.time``, ``random.random``, ``datetime.datetime.now``, ``open``, ``np.empty``."""
    owner = func.__self__
    if isinstance(owner, types.ModuleType):
        module = owner.__name__
        if module == "builtins":
            return func.__name__ in _PURE_BUILTINS
        if module.startswith("numpy"):
            return func.__name__ not in _IMPURE_NUMPY
        return module in _PURE_MODULES
    return isinstance(owner, _VALUES)  # a method of a value


def _pure_class(cls: type) -> bool:
    """Whether calling ``cls`` runs no Python code of its own (a config holder read as
    ``Cfg.T``, NumPy's and Python's scalar types, enums): a class whose construction runs
    Python (an ``__init__``, ``__new__`` or metaclass ``__call__``: a dataclass reading the
    clock in a default factory) could make something new each call."""
    meta_call = type(cls).__call__
    if meta_call is not type.__call__ and meta_call is not _ENUM_CALL:
        return False
    if isinstance(cls, enum.EnumMeta):
        return True
    return not any(isinstance(getattr(cls, name, None), types.FunctionType)
                   for name in ("__init__", "__new__"))


@functools.lru_cache(maxsize=1024)
def impure_builtin_names(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` reads that are builtins other than pure functions and classes
    (``open``, ``input``, ``print``, ``next``), where no global of that name hides them."""
    found = []
    for name in code_names(code):
        value = getattr(builtins, name, None)
        if isinstance(value, types.BuiltinFunctionType) and not _pure_builtin(value):
            found.append(name)
    return tuple(found)


@functools.lru_cache(maxsize=256)
def _reads_clock(text: str) -> bool:
    """``np.datetime64("now")``, ``np.datetime64("today")`` (and pandas' ``Timestamp``) read
    the clock: a predicate holding such a string is traced every call."""
    return text.strip().lower() in ("now", "today")


@functools.lru_cache(maxsize=1024)
def code_reads_clock(code: types.CodeType) -> bool:
    """Whether ``code`` (or code nested in it) holds a string constant that reads the clock."""
    return any(_reads_clock(c) if isinstance(c, str)
               else isinstance(c, types.CodeType) and code_reads_clock(c)
               for c in code.co_consts)


def trace_key(func: Callable[..., Any]) -> tuple | None:
    """A key equal for two callables only if tracing them gives the same predicate; None if
    this one's trace must not be reused (see the module docstring)."""
    code = getattr(func, "__code__", None)
    if not isinstance(func, types.FunctionType) or code is None:
        return None
    parts: list[Any] = [code]
    names = code_names(code)
    if not _DYNAMIC.isdisjoint(names) or code_reads_clock(code):
        return None
    g = func.__globals__
    if any(name not in g for name in impure_builtin_names(code)):
        return None  # open, input, print: the builtin itself, not a global of that name
    owners = []  # modules and classes whose attributes the code may read
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
            if isinstance(v, (types.ModuleType, type)):
                owners.append(v)
    if not names:
        return (code,) if len(parts) == 1 else _hashable(parts)
    for name in names:
        if name not in g:
            continue  # an attribute name, or a builtin
        part = _part(g[name])
        if part is None:
            return None
        parts.append((name, part))
        if isinstance(g[name], (types.ModuleType, type)):
            owners.append(g[name])
    # Attributes the code may read off modules and classes (np.sin, np.random.rand, Cfg.T,
    # Cuts.E.W.lo): their current values, so that rebinding one changes the key.
    seen = {id(o) for o in owners}
    for _ in range(_MAX_DEPTH):
        if not owners:
            return _hashable(parts)
        nested = []
        for owner in owners:
            for name in names:
                value = getattr(owner, name, _MISSING)
                if value is _MISSING:
                    continue
                part = _part(value)
                if part is None:
                    return None
                # the owner by id(): the key holds the owner itself in its own part (a
                # global's, a closure value's or an attribute's above), so the id is no
                # other object's while the key lives
                parts.append((id(owner), name, part))
                if isinstance(value, (types.ModuleType, type)) and id(value) not in seen:
                    seen.add(id(value))
                    nested.append(value)
        owners = nested
    return None if owners else _hashable(parts)


def _hashable(parts: list[Any]) -> tuple | None:
    try:
        key = tuple(parts)
        hash(key)
    except TypeError:
        return None
    return key


# The key a memo entry's predicate was traced under, kept in its Predicate.memo (not pickled),
# so that a backend keeping the call a function made (cupy_backend.remember_call) keeps it only
# under the key of the values that call used.
TRACED_UNDER = "traced under"


def frozen(func: Callable[..., Any]) -> types.FunctionType | None:
    """A copy of ``func`` reading the values its globals, closure cells and defaults hold now;
    None where one cannot be read (a cell emptied meanwhile). Its trace key and its trace then
    see the same values even while another thread rebinds one (see :func:`trace_under_key`)."""
    if not isinstance(func, types.FunctionType):
        return None
    code, g = func.__code__, func.__globals__
    # Only the names the code reads: a copy of a whole module's namespace per trace would cost
    # more than the trace
    snap = {name: v for name in code_names(code)
            if (v := g.get(name, _MISSING)) is not _MISSING}
    snap["__builtins__"] = getattr(func, "__builtins__", g.get("__builtins__"))  # 3.10+
    try:
        cells = tuple(types.CellType(c.cell_contents) for c in func.__closure__ or ())
    except ValueError:  # an empty cell: a name not yet bound
        return None
    copy = types.FunctionType(code, snap, func.__name__, func.__defaults__, cells or None)
    copy.__kwdefaults__ = dict(func.__kwdefaults__) if func.__kwdefaults__ else None
    copy.__qualname__, copy.__module__ = func.__qualname__, func.__module__
    return copy


def trace_under_key(func: Callable[..., Any], trace: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``(trace(f), key)``: the predicate traced from ``func``'s current values and the trace
    key to keep it under, None where it must not be kept.

    Until 2026-11-30 the memo took the key, then traced, and kept the trace under that key:
    a thread rebinding a constant the code reads (``lambda v: v > t``, ``t`` rebound) between
    the two left a trace of the new value under the old value's key, and every later call
    with the old value got the other threshold (a new-user probe: 758 values where NumPy
    selected 911). Now the key and the trace come from one copy of the globals, closure cells
    and defaults (:func:`frozen`); the attributes of modules and classes (``Cfg.T``) are read
    as the trace runs, so a key taken again after the trace that differs means one changed
    meanwhile: the trace serves this call (it read either value, as Python would) and is not
    kept. The predicate returned holds ``func`` itself: a mask-path one runs it as it is."""
    fixed = frozen(func)
    if fixed is None:
        return trace(func), None
    key = trace_key(fixed)
    p = dataclasses.replace(trace(fixed), func=func)
    if key is None or trace_key(fixed) != key:
        return p, None
    return p, key
