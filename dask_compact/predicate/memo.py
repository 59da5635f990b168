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
  scalars and strings of the exact builtin and NumPy types by type and exact value
  (:func:`value_key`, a NumPy scalar with its dtype: ``np.timedelta64``'s unit), enum members
  of plain enums by identity; modules, NumPy ufuncs and functions (``np.isin``), pure
  builtins (``abs``, ``math.sqrt``) and classes that hold no Python code of their own
  (``Cfg``, ``np.float32``, plain enums: :func:`_holds_code`) by identity, the key holding
  the object; a builtin method of a value (``line.count``) by the value and the method's name.

Anything else (another Python function, an array, an object with state, an instance of a
subclass of ``int`` or ``str``, whose own ``==`` decides nothing here, a class with methods,
whose code Python can run unnamed: ``float(Cut())``, unless the code only reads attributes
off it, ``CfgM.T``: :func:`attribute_only_names`) makes the key None:
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
import dis
import enum
import functools
import itertools
import operator
import struct
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

_VALUES = (bool, int, float, complex, str, bytes, type(None), np.generic)
# The types whose objects value_key takes by value. Exact types, not their subclasses: a
# subclass's own ==, hash and methods are Python code, whose "equal" need not mean "acts the
# same" (until 2026-12-01 a str subclass was keyed as the str it equals, and an int subclass
# by its own ==: a new-user probe got another value's trace back)
_PLAIN = frozenset({bool, int, str, bytes, type(None)})
# A type made by a class statement (Py_TPFLAGS_HEAPTYPE), rather than one of C's static types:
# NumPy's scalar types are static, a Python subclass of one is not
_HEAPTYPE = 1 << 9
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


def value_key(value: Any) -> tuple | None:
    """``value`` by type and exact value: ``-0.0`` and ``0.0`` are equal but differ to
    ``signbit`` (and ``1 == 1.0 == True`` to NumPy's typing), so floats go by their bits.
    None for a value that cannot be keyed so (:func:`_plain`): an instance of a subclass of
    ``int``, ``str``, ``float``..., an ``np.void`` holding Python objects.

    Made of types, strings, bytes, ints and bools alone (an enum member: its class and itself,
    held as :func:`_held` holds a class), so that it also serves as a dask token
    (:meth:`.core.Predicate.__dask_tokenize__`) and hashes alike in every process."""
    kind = type(value)
    if kind is float:  # the bits: float.hex() gives "nan" for either sign
        return (float, _pack_d(value))
    if kind in _PLAIN:
        return (kind, value)
    if kind is complex:
        return (complex, struct.pack("<dd", value.real, value.imag))
    if isinstance(value, np.generic):
        if kind.__flags__ & _HEAPTYPE or value.dtype.hasobject:
            return None
        dtype = value.dtype
        text = _DTYPE_TEXT.get(dtype)
        return (kind, text or _dtype_text(dtype), value.tobytes())
    if isinstance(value, enum.Enum) and type(kind).__call__ is _ENUM_CALL and _fixed(value):
        # a member is one object for the life of its class (a Flag's combinations are kept
        # too): by identity, its class as a class is (dask tokenizes a member by its class's
        # name, its name and value)
        return (_held(kind), _Same(value))
    return None


# What an enum member holds of its own (a Flag's combination: the first two)
_MEMBER_ATTRS = frozenset({"_value_", "_name_", "__objclass__", "_sort_order_"})


def _fixed(member: enum.Enum) -> bool:
    """Whether an enum member acts the same for the life of its class: one object, but not a
    constant where it holds attributes of its own (set by an ``__init__``, or later:
    ``Band.LOW.lo = 4``), its class Python code (a property, ``__float__``) or its value one
    NumPy reads the clock from (``"now"``). Until 2026-12-01 any member was keyed by identity
    alone, and a call after ``Band.LOW.lo = 4`` kept the first trace's ``v > 0`` (a new-user
    probe)."""
    own = member.__dict__
    if not own.keys() <= _MEMBER_ATTRS or _holds_code(type(member)):
        return False
    value = own.get("_value_")
    return type(value) is int or _part(value) is not None


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
    kind = type(value)
    if kind is float:  # the common closure value (a threshold): value_key's answer
        return (float, _pack_d(value))
    if kind is str:
        return None if _reads_clock(value) else (str, value)
    if isinstance(value, _VALUES):
        if isinstance(value, (str, bytes)) and _reads_clock(value):  # np.str_, bytes
            return None
        return value_key(value)  # None for a subclass's object (see _PLAIN)
    if isinstance(value, types.BuiltinFunctionType):
        return _builtin_part(value) if _pure_builtin(value) else None
    if isinstance(value, type):
        return _held(value) if _pure_class(value) else None
    if isinstance(value, _BY_IDENTITY):
        return _held(value)
    return value_key(value) if isinstance(value, enum.Enum) else None


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
# EnumMeta, a metaclass), ufuncs and builtins, a few. Emptied past 64: it holds the types,
# and a program making classes of new metaclasses in a loop kept every one of them alive
# until 2026-12-01 (a new-user probe)
_IDENTITY_KINDS: dict[type, bool] = {}


def _compares_by_identity(kind: type) -> bool:
    """Whether ``kind``'s objects compare and hash by identity, in C: object's own (modules,
    classes of ``type`` or ``EnumMeta``, ufuncs) or a builtin function's (the same C function
    bound to the same object). A key holding such an object costs what an id() did: the
    tuple compares it by identity first, and its hash is its address."""
    known = _IDENTITY_KINDS.get(kind)
    if known is None:
        if len(_IDENTITY_KINDS) >= 64:
            _IDENTITY_KINDS.clear()
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
    # only a value value_key takes by value: a str subclass's own == and hash would decide
    # which entry its method takes, and its count could be another method (until 2026-12-01:
    # a new-user probe); the method of such a value is held by identity
    owner_key = value_key(owner) if isinstance(owner, _VALUES) else None
    if owner_key is not None:
        found = getattr(owner, name, None)  # a new bound method: equal, not the same object
        if type(found) is type(func) and found == func:
            return (_METHOD, owner_key, name)
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
    """Whether ``cls`` runs no Python code of its own (a config holder read as ``Cfg.T``,
    NumPy's and Python's scalar types, enums): a class whose construction runs Python (an
    ``__init__``, ``__new__`` or metaclass ``__call__``: a dataclass reading the clock in a
    default factory) could make something new each call, and one with any other code could
    run it unnamed (:func:`_holds_code`)."""
    meta_call = type(cls).__call__
    if meta_call is not type.__call__ and meta_call is not _ENUM_CALL:
        return False
    return not _holds_code(cls)


# The enum module's own code, which EnumType copies into every enum class (its __new__, a
# Flag's __or__): it makes no new member, and keeps those it makes
_ENUM_GLOBALS = vars(enum)
_ENUM_BASES = frozenset(v for v in vars(enum).values() if isinstance(v, type))


def _holds_code(cls: type) -> bool:
    """Whether ``cls``, a base of it, or its metaclass holds Python code of its own: a method,
    a property, a classmethod. Python and NumPy call such code unnamed (``float(Cut())`` calls
    ``Cut.__float__``, ``Table["lo"]`` its metaclass's ``__getitem__``, ``Scaled()(v)`` its
    ``__call__``, ``np.round(Cut())`` its ``round``), and what that code reads (``Cut.level``,
    a global) is no name of the predicate's code, so not in its key: until 2026-12-01 a
    call after ``Cut.level = 8`` got the trace of ``v > 5`` (a new-user probe). Only a class
    of data (``Cfg.T``), NumPy's and Python's C types and plain enums are keyed. A method the
    code names was always refused (a Python function is no value): this refuses the rest.

    Remembered per class while its bases, its metaclass and the number of names in each of
    their namespaces stay the same (an enum's namespace holds its members: walking it every
    call cost an IntEnum constant 10 us); an attribute added to any of them looks again. The
    class itself by a weak reference (a key's class must die with the key)."""
    mro: tuple[type, ...] = cls.__mro__
    meta: type = type(cls)
    known = _CODE_SEEN.get(id(cls))
    if (known is not None and known[0]() is cls and known[1] == mro[1:] and known[2] is meta
            and known[3] == len(cls.__dict__)):
        for c, n in known[4]:
            if len(c.__dict__) != n:
                break
        else:
            return known[5]
    own = [c for c in (*mro, *meta.__mro__) if c.__flags__ & _HEAPTYPE and c not in _ENUM_BASES]
    found = any(type(v) not in _INERT and _runs_code(v) for c in own for v in vars(c).values())
    if len(_CODE_SEEN) >= 256:
        _CODE_SEEN.clear()
    _CODE_SEEN[id(cls)] = (weakref.ref(cls), mro[1:], meta, len(cls.__dict__),
                           tuple((c, len(c.__dict__)) for c in own if c is not cls), found)
    return found


# id(class) -> (a weak reference to it, its bases (its __mro__ after it), its metaclass, the
# number of names in its namespace, (class, number of names) for each other class of a
# class statement's among its bases and its metaclass's, whether one holds code):
# _holds_code's answers, emptied past 256
_CODE_SEEN: dict[int, tuple[Any, tuple, type, int, tuple, bool]] = {}
# What a class's namespace holds most (its name, data, its __dict__'s descriptor): no code
_INERT = frozenset({str, float, int, bool, bytes, type(None), tuple, dict, list, frozenset,
                    types.GetSetDescriptorType, types.MemberDescriptorType,
                    types.BuiltinFunctionType, types.WrapperDescriptorType,
                    types.MethodDescriptorType, np.ufunc, type(np.isin)})


def _runs_code(value: Any) -> bool:
    """Whether ``value``, in a class's namespace, is Python code that Python may call or bind
    through the class or its objects."""
    kind = type(value)
    if kind in _INERT:
        return False
    if kind is types.FunctionType:
        return value.__globals__ is not _ENUM_GLOBALS
    if kind is staticmethod or kind is classmethod:
        return _runs_code(value.__func__)
    if isinstance(value, type):
        return False  # a nested class: checked where the code reads it
    if isinstance(value, (property, types.DynamicClassAttribute)):  # enum.property too
        return any(f is not None and _runs_code(f) for f in (value.fget, value.fset, value.fdel))
    # anything else Python may call (a bound method, a functools.partial: what _INERT lists
    # of C's, builtins and NumPy's functions, do not hold Python code), or a descriptor a
    # class statement made (an enum's members, objects of its own class, are neither)
    return callable(value) or bool(kind.__flags__ & _HEAPTYPE) and hasattr(kind, "__get__")


# The instructions that read an attribute of what the one before left (LOAD_METHOD: 3.11)
_ATTRIBUTE_READS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


@functools.lru_cache(maxsize=1024)
def attribute_only_names(code: types.CodeType) -> frozenset[str]:
    """The global names whose value ``code`` (and code nested in it) only reads attributes
    of: every instruction naming one is a ``LOAD_GLOBAL`` the next instruction reads an
    attribute of (``Cfg.T``, ``Cfg.f()``). What such a global holds goes nowhere else:
    not called, indexed, compared or handed to a function, so no instance of it is made."""
    fine: set[str] = set()
    other: set[str] = set()

    def walk(c: types.CodeType) -> None:
        ins = list(dis.get_instructions(c))
        for i, op in enumerate(ins):
            if not isinstance(op.argval, str) or op.opname in _ATTRIBUTE_READS:
                continue  # an attribute of that name is not the global
            if (op.opname == "LOAD_GLOBAL" and i + 1 < len(ins)
                    and ins[i + 1].opname in _ATTRIBUTE_READS):
                fine.add(op.argval)
            else:  # the global loaded otherwise, a local of its name, a string constant
                other.add(op.argval)
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    walk(code)
    return frozenset(fine - other)


def _attributes_run_no_code(cls: type) -> bool:
    """Whether reading an attribute off ``cls`` itself (not off an instance) runs none of
    its Python code: its metaclass is ``type``, and its code and its bases' is plain
    functions, properties and static and class methods of functions, which a read through
    the class gives as they are (a function, a property, a bound method: no values, so a
    key naming one is None) without running them. Not a descriptor of a class statement's,
    whose ``__get__`` runs on the read, nor ``classmethod(property(f))``, which runs ``f``.
    With :func:`attribute_only_names`, a class with methods read only as ``CfgM.T`` is
    keyed (until 2026-12-01 it was traced every call: +49-53% on a 2^10 CPU call); the
    code of a class the predicate calls, holds an instance of, or hands on stays refused
    (:func:`_holds_code`: ``float(Cut())`` runs ``Cut.__float__`` unnamed)."""
    if type(cls) is not type:
        return False
    for c in cls.__mro__:
        if not c.__flags__ & _HEAPTYPE:
            continue
        for v in vars(c).values():
            kind = type(v)
            if kind in _INERT or kind is types.FunctionType or kind is property:
                continue
            if kind is staticmethod or kind is classmethod:
                if type(v.__func__) is types.FunctionType:
                    continue
                return False
            if _runs_code(v):
                return False
    return True


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
def _reads_clock(text: str | bytes) -> bool:
    """``np.datetime64("now")``, ``np.datetime64("today")`` (and pandas' ``Timestamp``) read
    the clock: a predicate holding such a string is traced every call. Bytes and NumPy's
    strings too (``np.datetime64(b"now")``; until 2026-12-01 only a str was looked at: a
    new-user probe)."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    return text.strip().lower() in ("now", "today")


@functools.lru_cache(maxsize=1024)
def code_reads_clock(code: types.CodeType) -> bool:
    """Whether ``code`` (or code nested in it) holds a string constant that reads the clock."""
    return any(_reads_clock(c) if isinstance(c, (str, bytes))
               else isinstance(c, types.CodeType) and code_reads_clock(c)
               for c in code.co_consts)


def trace_key(func: Callable[..., Any]) -> tuple | None:
    """A key equal for two callables only if tracing them gives the same predicate; None if
    this one's trace must not be reused (see the module docstring).

    None too where taking the key raises: reading an attribute of a class or module runs its
    metaclass's or module's own code (a property, ``__getattr__``), and until 2026-12-01 an
    error there came out of ``compact_array`` before the predicate ran at all (a new-user
    probe); the trace, which reads the same attribute as the user's code, says what it has to.

    A function whose code, globals and values are those of a recent key's function is given
    that key at once (:func:`_recent_key`)."""
    if type(func) is types.FunctionType:
        hit = _RECENT.get(id(func.__code__))
        if hit is not None:
            key = _recent_key(func, hit)
            if key is not None:
                return key
        try:
            return _keep_recent(func)
        except Exception:
            return None
    return _key_or_none(func)


def _key_or_none(func: Callable[..., Any]) -> tuple | None:
    """:func:`_trace_key`, None where taking it raises (see :func:`trace_key`)."""
    try:
        return _trace_key(func)
    except Exception:
        return None


# The keys of recent functions that read only immutable plain values (a threshold in a
# closure cell, a default or a global: ``lambda v: v < p`` made anew in a loop), by id of
# their code: (code, globals, builtins as the function has them, the builtins dict its names
# are looked up in, the names the code reads, the values the key was made of (_values' order),
# the key). The full key costs 2-3 us of host time (the code's analyses, each value's part,
# the tuple's hash: the 5 us a lambda's 2^20 GPU call took over a string's, on one H200 in
# 2026-12-02's runs); a function whose code and globals are the entry's and whose values are
# the entry's very objects gets the entry's key, each value compared where it is read
# (:func:`_recent_key`). Values by identity,
# not equality: ``0.0 == -0.0`` and ``1 == 1.0 == True`` key differently. Only values of
# _RECENT_TYPES, which nothing can change in place (not a NumPy array, nor ``np.void``, a view
# of its array), and which the entry holds, so that no other object can take their ids while
# it lives. Emptied past _RECENT_MAX entries.
_RECENT: dict[int, tuple] = {}
_RECENT_MAX = 256
_RECENT_TYPES = frozenset({bool, int, float, complex, str, bytes, type(None)}
                          | {t for t in set(np.sctypeDict.values())
                             if issubclass(t, (np.number, np.bool_))})


def _values(func: types.FunctionType, g: dict, names: tuple[str, ...]) -> list[Any] | None:
    """What ``func``'s key is made of besides its code and its owners' attributes: its closure
    cells' values, its defaults and the globals its code names (_MISSING where none), in that
    order; None where a cell is empty or it has keyword-only defaults (not kept)."""
    if func.__kwdefaults__:
        return None
    closure = func.__closure__
    try:
        values = list(map(_cell_value, closure)) if closure else []
    except ValueError:  # an empty cell
        return None
    defaults = func.__defaults__
    if defaults:
        values.extend(defaults)
    if names:
        values.extend(map(g.get, names, itertools.repeat(_MISSING)))
        values.extend(map(_builtins_of(func).get, names, itertools.repeat(_MISSING)))
    return values


def _builtins_of(func: types.FunctionType) -> dict:
    """The builtins ``func``'s code reads a name from where its globals have none: its
    ``__builtins__`` (a dict, or the module as ``exec`` may give it)."""
    b = getattr(func, "__builtins__", None)
    if isinstance(b, types.ModuleType):
        return vars(b)
    return b if isinstance(b, dict) else {}


_cell_value = operator.attrgetter("cell_contents")


def _recent_key(func: types.FunctionType, hit: tuple) -> tuple | None:
    """The key of ``hit`` (a :data:`_RECENT` entry) if ``func`` reads what it was made of:
    the same code, globals, and value objects; else None."""
    code, g, b, bt, names, values, key = hit
    if (func.__code__ is not code or func.__globals__ is not g
            or getattr(func, "__builtins__", None) is not b or func.__kwdefaults__):
        return None
    # What _values reads, compared as it is read, in its order: building its list and the
    # list of ids took 2.0 of the 2.7 us of a hit for `lambda v: v < p` on the 2-core machine
    # (0.8 us now), on the path of every repeated small GPU call
    closure, defaults = func.__closure__ or (), func.__defaults__ or ()
    if len(closure) + len(defaults) + 2 * len(names) != len(values):
        return None  # defaults given or taken away since
    i = 0
    for cell in closure:
        try:
            if cell.cell_contents is not values[i]:
                return None
        except ValueError:  # an empty cell
            return None
        i += 1
    for v in defaults:
        if v is not values[i]:
            return None
        i += 1
    for name in names:
        if g.get(name, _MISSING) is not values[i]:
            return None
        i += 1
    for name in names:
        if bt.get(name, _MISSING) is not values[i]:
            return None
        i += 1
    return key


def _fixed_builtin(v: Any) -> bool:
    """A builtin function or a C type (``abs``, ``float``): nothing changes it, and the entry
    holding it keeps its id its own (whether the key takes it is _trace_key's to say)."""
    kind = type(v)
    return kind is types.BuiltinFunctionType or (kind is type and not v.__flags__ & _HEAPTYPE)


def _keep_recent(func: types.FunctionType) -> tuple | None:
    """:func:`_trace_key` of ``func``, kept in :data:`_RECENT` where its values allow. The
    values are read once, and the key made from a function holding those very objects
    (:func:`frozen`'s way): a thread rebinding one meanwhile leaves no key under values it
    was not made of (the race that trace_under_key closes for the traces)."""
    code, g = func.__code__, func.__globals__
    names = code_names(code)
    values = _values(func, g, names)
    if values is None or any(type(v) not in _RECENT_TYPES and v is not _MISSING
                             and not _fixed_builtin(v) for v in values):
        return _trace_key(func)
    key = _trace_key(rebuilt(func, names, values))
    if key is not None:
        if len(_RECENT) >= _RECENT_MAX:
            _RECENT.clear()
        _RECENT[id(code)] = (code, g, getattr(func, "__builtins__", None), _builtins_of(func),
                             names, tuple(values), key)
    return key


def rebuilt(func: types.FunctionType, names: tuple[str, ...], values: list[Any]
            ) -> types.FunctionType:
    """A function of ``func``'s code reading ``values`` (:func:`_values`' order: its cells,
    defaults, the globals ``names`` and the builtins it reads, as read: a builtins dict of
    the names alone)."""
    ncells = len(func.__closure__ or ())
    at = ncells + len(func.__defaults__ or ())
    snap = {n: v for n, v in zip(names, values[at:at + len(names)]) if v is not _MISSING}
    snap["__builtins__"] = {n: v for n, v in zip(names, values[at + len(names):])
                            if v is not _MISSING}
    copy = types.FunctionType(func.__code__, snap, func.__name__,
                              tuple(values[ncells:at]) or None,
                              tuple(types.CellType(v) for v in values[:ncells]) or None)
    copy.__qualname__, copy.__module__ = func.__qualname__, func.__module__
    return copy


def _trace_key(func: Callable[..., Any], reads: dict | None = None) -> tuple | None:
    """``reads``, where given, gets ``{id(owner): (owner, {name: value})}``: each attribute of
    a module or class the key holds, as it was read (:data:`_MISSING` where it had none)."""
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
    builtin = _builtins_of(func)
    for name in names:
        if name not in g:
            # a builtin (or an attribute name, which no builtin has): what it is now, so
            # that builtins.abs patched, or a function of another __builtins__, is another
            # key (until 2026-12-02, seventeenth session, a review of the recent keys: the
            # trace of the first abs was reused)
            value = builtin.get(name, _MISSING)
            if value is _MISSING:
                continue
            part = _part(value)
            if part is None:
                return None
            parts.append(("builtin", name, part))
            continue
        value = g[name]
        part = _part(value)
        if part is None:
            if not (isinstance(value, type) and name in attribute_only_names(code)
                    and _attributes_run_no_code(value)):
                return None
            part = _held(value)  # a config class with methods beside its data (CfgM.T)
        parts.append((name, part))
        if isinstance(value, (types.ModuleType, type)):
            owners.append(value)
    # Attributes the code may read off modules and classes (np.sin, np.random.rand, Cfg.T,
    # Cuts.E.W.lo): their current values, so that rebinding one changes the key.
    # Each owner by its place in the order they are met: the key holds the owner itself in its
    # own part (a global's, a closure value's or an attribute's above), so two keys equal up
    # to here met the same owners in the same order. Not its id(), which the mask path's dask
    # token (Predicate.__dask_tokenize__) would carry as a number new in every process.
    seen: dict[int, int] = {}
    for o in owners:
        seen.setdefault(id(o), len(seen))
    if len(seen) < len(owners):  # one owner met twice (a closure's module, also a global)
        owners = list({id(o): o for o in owners}.values())
    for _ in range(_MAX_DEPTH):
        if not owners:
            return _hashable(parts)
        nested = []
        for owner in owners:
            at = seen[id(owner)]
            got = None if reads is None else reads.setdefault(id(owner), (owner, {}))[1]
            for name in names:
                value = getattr(owner, name, _MISSING)
                if got is not None:
                    got[name] = value
                if value is _MISSING:
                    continue
                part = _part(value)
                if part is None:
                    return None
                parts.append((at, name, part))
                if isinstance(value, (types.ModuleType, type)) and id(value) not in seen:
                    seen[id(value)] = len(seen)
                    nested.append(value)
        owners = nested
    return None if owners else _hashable(parts)


def _hashable(parts: list[Any]) -> tuple | None:
    key = tuple(parts)
    hash(key)  # what raises here makes trace_key None
    return key


def token_form(key: Any) -> Any:
    """A trace key as the mask path's dask token takes it (Predicate.__dask_tokenize__):
    what it holds by identity by name where the name finds that object (``np.isin``,
    ``math.sqrt``, ``np.float32``, a module; a class of a class statement with its bases and
    metaclass), since dask tokenizes some of them (NumPy's
    function dispatchers and their type) by a number new at every call; the rest, and code,
    as dask tokenizes them (a class of ``__main__`` shadowed by a newer one of its name by
    its pickle, which holds its contents)."""
    kind = type(key)
    if kind is tuple:
        return tuple(token_form(part) for part in key)
    if kind is _Same:
        return token_form(key.obj)
    if kind in _PLAIN or kind is types.CodeType:
        return key
    if isinstance(key, types.ModuleType):
        return ("module", key.__name__)
    if isinstance(key, type) and not key.__flags__ & _HEAPTYPE:
        # a C type, one per process under its name (NumPy's function dispatchers' type
        # names a module that does not hold it)
        return ("C type", key.__module__, key.__qualname__)
    name = _import_name(key)
    if name is None:
        return key
    if isinstance(key, type):
        # with its bases and metaclass: the key holds the class itself, and a module reloaded
        # (or a class rebound under its name) gives another under the same name; until
        # 2026-12-01 ``class K(float)`` edited to ``class K(int)`` and reloaded kept the earlier
        # call's dask name, and a persisted result of ``K(2.5) * 2`` (a new-user probe)
        return ("named class", *name, tuple(token_form(b) for b in key.__bases__),
                token_form(type(key)))
    return ("named", *name)


def _import_name(obj: Any) -> tuple[str, str] | None:
    """``(module, qualified name)`` where importing that finds ``obj`` itself."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None  # a class of a script or notebook, which a newer one of its name shadows
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return (module, qualname) if found is obj else None


# The key a memo entry's predicate was traced under, kept in its Predicate.memo (not pickled),
# so that a backend keeping the call a function made (cupy_calls.remember_call) keeps it only
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
    and defaults (:func:`frozen`). Until 2026-12-01 the attributes of modules and classes
    (``Cfg.T``) were read live as the trace ran, and the key taken again after it: a thread
    setting ``Cfg.T`` from A to B and back to A while the trace ran left B's trace under A's
    key (a probe: 1-7 in 100 calls under forced thread switching), and a later call with A
    selected what B does. The trace now reads them from the values the key was made of
    (:func:`_snapshot`); where it reaches the live class some other way (makes an instance
    of it, which reads the class's attributes unseen) it serves this call and is not kept,
    nor where the key taken again after it differs (a class given code meanwhile).
    The predicate returned holds ``func`` itself: a mask-path one runs it as it is."""
    fixed = frozen(func)
    if fixed is None:
        return trace(func), None
    reads: dict[int, tuple[Any, dict[str, Any]]] = {}
    try:
        key = _trace_key(fixed, reads)
    except Exception:  # as trace_key: the trace says what it has to
        key = None
    if key is None:
        return dataclasses.replace(trace(fixed), func=func), None
    live: list[str] = []
    p = dataclasses.replace(trace(_snapshot(fixed, reads, live)), func=func)
    # the key again all the same: what it holds besides those attributes (whether a class
    # holds code, an enum member attributes of its own) is read live
    # (not trace_key: a copy's key is not worth a recent entry, which would take the place
    # of the caller's function's)
    return p, None if live or _key_or_none(fixed) != key else key


def _snapshot(fixed: types.FunctionType, reads: dict[int, tuple[Any, dict[str, Any]]],
              live: list[str]) -> types.FunctionType:
    """A copy of ``fixed`` (:func:`frozen`'s) whose modules and classes, in its globals,
    cells and defaults and among their attributes, are :class:`_Seen` stand-ins giving the
    attributes ``reads`` holds. NumPy's and Python's C types stay themselves: their
    attributes cannot be set."""
    seen: dict[int, Any] = {}
    for i, (owner, values) in reads.items():
        if isinstance(owner, types.ModuleType) or owner.__flags__ & _HEAPTYPE:
            seen[i] = _Seen(owner, values, seen, live)

    def shown(value: Any) -> Any:
        return seen.get(id(value), value)

    g = {name: shown(v) for name, v in fixed.__globals__.items()}
    cells = tuple(types.CellType(shown(c.cell_contents)) for c in fixed.__closure__ or ())
    defaults = tuple(shown(v) for v in fixed.__defaults__) if fixed.__defaults__ else None
    copy = types.FunctionType(fixed.__code__, g, fixed.__name__, defaults, cells or None)
    if fixed.__kwdefaults__:
        copy.__kwdefaults__ = {k: shown(v) for k, v in fixed.__kwdefaults__.items()}
    copy.__qualname__, copy.__module__ = fixed.__qualname__, fixed.__module__
    return copy


class _Seen:
    """A module or class as the trace reads it (:func:`_snapshot`): the attributes its code
    names are the values the key holds (an attribute it had none of raises, as it did);
    another module or class among them is its own stand-in. Anything else (Python or NumPy
    looking up a name the code does not hold, the class called, indexed, iterated) goes to
    the live object and, but for an enum's members, which are fixed for the life of the
    class, marks the trace as not to be kept (``live``): an instance made of a class reads
    the class's attributes unseen."""

    __slots__ = ("_obj", "_values", "_seen", "_live")

    def __init__(self, obj: Any, values: dict[str, Any], seen: dict[int, Any],
                 live: list[str]) -> None:
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_seen", seen)
        object.__setattr__(self, "_live", live)

    def __getattribute__(self, name: str) -> Any:
        get = object.__getattribute__
        values = get(self, "_values")
        if name in values:
            value = values[name]
            if value is _MISSING:
                raise AttributeError(f"{get(self, '_obj')!r} has no attribute {name!r}")
            return get(self, "_seen").get(id(value), value)
        return getattr(_Seen._live_obj(self, name), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(_Seen._live_obj(self, name), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(_Seen._live_obj(self, name), name)

    def _live_obj(self, what: str) -> Any:
        obj = object.__getattribute__(self, "_obj")
        if not (isinstance(obj, type) and type(obj).__call__ is _ENUM_CALL
                and what in _ENUM_FIXED):
            object.__getattribute__(self, "_live").append(what)
        return obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Seen._live_obj(self, "__call__")(*args, **kwargs)

    def __getitem__(self, key: Any) -> Any:
        return _Seen._live_obj(self, "__getitem__")[key]

    def __iter__(self) -> Any:
        return iter(_Seen._live_obj(self, "__iter__"))

    def __len__(self) -> int:
        return len(_Seen._live_obj(self, "__len__"))

    def __contains__(self, item: Any) -> bool:
        return item in _Seen._live_obj(self, "__contains__")

    def __repr__(self) -> str:
        return repr(_Seen._live_obj(self, "__repr__"))


# What Python does with an enum class that gives one of its members (fixed for the life of
# the class: members are keyed by identity, value_key): Lvl(7), Lvl["HI"], list(Lvl)
_ENUM_FIXED = frozenset({"__call__", "__getitem__", "__iter__", "__len__", "__contains__"})
