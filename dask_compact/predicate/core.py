"""The :class:`Predicate` every backend receives, and :func:`as_predicate` that makes one."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from .expr import (
    ConstantOverflowError,
    Fold,
    Node,
    Param,
    ParamOverflow,
    Typed,
    Var,
    bind_params,
    check_power_exponents,
    constant_text,
    evaluate,
    fold_outside,
    infer_types,
    param_dtypes,
    params_of,
    resolve_scalar_powers,
    result_dtype,
    shorten,
    signed_power_exponents,
    structure_key,
    to_source,
    walk,
)

# at the top: a function-level import costs a small call ~1 us, three times per call
from .memo import TRACED_UNDER, token_form, trace_key, trace_under_key, value_key

logger = logging.getLogger("dask_compact")

PredicateLike = Union[Callable[[Any], Any], str, "Predicate"]

# Elements of each of the two slices a mask-path evaluation is checked on (see Predicate.mask).
SLICE_CHECK = 32


class NotElementwise(ValueError):
    """The predicate does something that is not elementwise; refused, never run per chunk."""


# What a callable can raise on a slice of a chunk it ran on for reasons outside its own shape
# logic: memory (CuPy's OutOfMemoryError is a MemoryError), I/O and the network (OSError, with
# TimeoutError and ConnectionError), the stack. The slice check passes these on as they are:
# until 2026-11-30 a transient MemoryError on rows 0:32 was reported as NotElementwise ("it
# depends on how the array is chunked"), hiding the real error (a new-user probe).
RESOURCE_ERRORS: tuple[type[Exception], ...] = (MemoryError, OSError, RecursionError)


@dataclass(frozen=True)
class TypedPredicate:
    """A fused predicate typed for one input dtype: what a code generator compiles."""

    expr: Node
    dtype: Any  # np.dtype (one array), or the FieldDtypes of a record's predicate fields
    types: dict[Node, Typed] = field(hash=False, compare=False)
    key: str  # structure key + dtype: one compiled loop/kernel per key (and output, algorithm)
    param_dtypes: tuple[np.dtype, ...] = ()
    _bound: dict = field(default_factory=dict, hash=False, compare=False, repr=False)
    # exponents of integer powers that may be negative (see expr.signed_power_exponents)
    powers: tuple[Node, ...] = field(default=(), hash=False, compare=False)
    # comparisons with a Python int outside the compared integer's dtype, made boolean
    # parameters of the tree (see expr.fold_outside): their values come from the constants
    folds: tuple[Fold, ...] = ()
    # the tree's parameters in order (expr.params_of): bind's per-call walk, kept
    param_nodes: tuple[Param, ...] = field(default=(), hash=False, compare=False, repr=False)

    def with_folds(self, params: tuple) -> tuple:
        """The constants the tree takes: ``params``, then each fold's value from them."""
        if not self.folds:
            return params
        return (*params, *(f.value(params) for f in self.folds))

    @property
    def data_powers(self) -> bool:
        """Whether an exponent of :attr:`powers` depends on the data: its check costs a host
        sync per call, where one of constants holds for every call of the predicate."""
        return any(isinstance(n, Var) for e in self.powers for n in walk(e))

    def check_powers(self, x: Any, params: tuple, xp: Any) -> None:
        """Where NumPy would raise for a negative integer exponent, raise before a GPU kernel
        (which cannot) runs; nothing to do, and no sync, for most predicates."""
        if self.powers:
            check_power_exponents(self.powers, x, self.with_folds(params), xp)

    def bind(self, params: tuple) -> tuple:
        """Parameter values as NumPy scalars of their loop dtypes (may raise ParamOverflow).

        Remembered per parameter values (by type and exact value, see
        :func:`.memo.value_key`), as repeated small calls bind the same constants every time."""
        key: tuple | None = tuple(value_key(v) for v in params)
        if key is not None and None in key:
            key = None  # a constant value_key cannot key (an int subclass's): not remembered
        hit = None if key is None else self._bound.get(key)
        if hit is None:
            hit = bind_params(self.expr, self.types, self.with_folds(params),
                              list(self.param_dtypes), self.param_nodes or None)
            if key is not None:
                if len(self._bound) >= 256:
                    self._bound.clear()
                self._bound[key] = hit
        return hit


def dtype_tag(dtype: Any) -> str:
    """The dtype part of a TypedPredicate key: ``<f4``, or ``energy:<f4,eta:<f8`` for fields."""
    if isinstance(dtype, tuple):
        return ",".join(f"{name}:{dt.str}" for name, dt in dtype)
    return str(dtype.str)


def field_dtypes(dtypes: Any) -> tuple:
    """A mapping name -> dtype as the sorted (name, dtype) pairs typing takes."""
    return tuple(sorted((str(k), np.dtype(v)) for k, v in dict(dtypes).items()))


def _typed(expr: Node, dtype: Any, source: str) -> TypedPredicate:
    tp = _typed_tree(expr, dtype)
    if isinstance(tp, np.dtype):
        raise TypeError(
            f"predicate {source} gives {tp} values for "
            f"{_describe_dtype(dtype) + ' input' if dtype != () else 'no field (a constant)'}; it "
            f"must give booleans (a comparison, isnan, ...), e.g. {_bool_example(dtype)}"
        )
    return tp


@functools.lru_cache(maxsize=1024)
def _typed_tree(expr: Node, dtype: Any) -> TypedPredicate | np.dtype:
    # Typing walks the tree and asks NumPy for every call's loop: once per (tree, dtype), not
    # once per chunk. Nodes are frozen dataclasses, so equal trees share the entry; the
    # source, which only the refusal names (its result dtype returned for _typed to word),
    # is not in the key: until 2026-12-02 (sixteenth session) it was, and a string predicate
    # with a new constant at each call (`f"x < {t}"`) typed its tree anew every time.
    expr = resolve_scalar_powers(expr, dtype)  # `v ** -1`, `v ** 0.5`: by the dtype
    types = infer_types(expr, dtype)
    out = result_dtype(expr, types, dtype)
    if out != np.dtype(bool):
        return np.dtype(out)
    key = f"{structure_key(expr)}-{dtype_tag(dtype)}"
    return TypedPredicate(expr, dtype, types, key, tuple(param_dtypes(expr, types)),
                          powers=signed_power_exponents(expr, types),
                          param_nodes=tuple(params_of(expr)))


def _folded(tp: TypedPredicate, params: tuple, source: str) -> TypedPredicate:
    """``tp`` with its comparisons of integers with Python ints outside their dtype made
    boolean parameters (expr.fold_outside), which the compiled code runs where binding the
    constant itself would fail; ``tp`` itself where there is none. The folded tree has its
    own key (a boolean parameter in the comparison's place), so a compiled loop or kernel of
    the tree with an int inside the dtype is never taken for it, nor the other way round."""
    expr, folds = fold_outside(tp.expr, tp.types, tp.dtype, params)
    if not folds:
        return tp
    return _typed_folds(expr, tp.dtype, source, folds)


@functools.lru_cache(maxsize=256)
def _typed_folds(expr: Node, dtype: Any, source: str, folds: tuple[Fold, ...]) -> TypedPredicate:
    # a bound-constants memo of its own: its values include the folds'
    return dataclasses.replace(_typed(expr, dtype, source), folds=folds, _bound={})


def _describe_dtype(dtype: Any) -> str:
    if isinstance(dtype, tuple):
        return "(" + ", ".join(f"{name}: {dt}" for name, dt in dtype) + ")"
    return str(dtype)


def _bool_example(dtype: Any) -> str:
    """A boolean form of what a non-boolean predicate wrote, in its own names: a record
    predicate's first field, or a constant's ``True``/``False``. Until 2026-12-01
    (thirteenth session, a review) every one was shown `x > 0`, and a constant record
    predicate's input was "()"."""
    if isinstance(dtype, tuple):
        if not dtype:
            return "`True` or `False`"
        name = dtype[0][0]
        return f"`{name} > 0` rather than `{name}`"
    return "`x > 0` rather than `x`"


def failed_on(source: str, what: str, a: Any) -> str:
    """The note added to an exception a predicate's callable raised: which predicate, on
    what (``a``'s array type: a callable on the mask path runs on the chunks' own arrays,
    CuPy ones on a GPU, where NumPy functions dispatch to CuPy's)."""
    kind = f"{type(a).__module__.split('.')[0]}.{type(a).__name__}"
    return (f"dask_compact: the predicate {source} failed on {what} ({kind} of dtype "
            f"{getattr(a, 'dtype', '?')}; a predicate's callable gets the arrays as they are, "
            "CuPy arrays on a GPU)")


@dataclass(frozen=True, eq=False)
class Predicate:
    """An elementwise predicate, either fused (an expression tree) or evaluated as a mask.

    ``path`` is ``"fused"`` when the predicate was traced or parsed into :attr:`expr`; the
    compiled loop (CPU) or kernel (GPU) evaluates it while compacting, with no mask array.
    ``path`` is ``"mask"`` when it could not be traced (:attr:`reason` says why): the callable
    is evaluated on each chunk to get a boolean mask, which is then compacted.
    """

    expr: Node | None
    params: tuple
    func: Callable[[Any], Any] | None
    source: str
    reason: str | None = None
    # A record predicate (dask_compact.compact_records): the fields it reads, sorted. Empty
    # for a predicate of one array (the variable `x`).
    fields: tuple[str, ...] = ()
    # What backends derive from this predicate per dtype (its typing, a CuPy launch plan):
    # kept on the object, which repeated calls get back from as_predicate's caches. Not
    # pickled: a worker derives its own.
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "memo": {}, "func": picklable(self.func)}

    @property
    def path(self) -> str:
        return "fused" if self.expr is not None else "mask"

    def __repr__(self) -> str:
        if self.expr is not None:
            ps = ", ".join(f"p{i}={constant_text(v)}" for i, v in enumerate(self.params))
            return f"<Predicate fused: {to_source(self.expr)}{' where ' + ps if ps else ''}>"
        return f"<Predicate mask: {self.source} ({self.reason})>"

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        if self.expr is not None:
            # The constants by their exact keys (value_key: a float's bits, a NumPy scalar's
            # dtype and bytes): dask's tokenize takes NaNs of either sign as one value, so
            # until 2026-12-01 two predicates differing only in a NaN's sign (which signbit,
            # copysign and np.where pass on) had one key, and dask.compute of both gave the
            # first one's result for each (a new-user probe).
            exact = tuple(value_key(v) for v in self.params)
            if None in exact:  # a constant value_key cannot key (an int subclass's, a member
                # of an enum with methods: memo._fixed)
                _refuse_if_deterministic_asked(self)
                return ("dask_compact.Predicate", uuid.uuid4().hex)
            return ("dask_compact.Predicate", repr(self.expr), tokenize(exact))
        # A callable run as it is (the mask path) acts on what it reads when it runs. dask
        # tokenizes a function of an importable module by its name alone, so a call after a
        # global it reads changed took the earlier call's keys and, on a cluster where that
        # result was still held, its answer (a new-user probe). Its trace key holds what it
        # reads; where that cannot be known (None), the call's keys are its own.
        key = trace_key(self.func) if self.func is not None else None
        if key is None:
            _refuse_if_deterministic_asked(self)
            return ("dask_compact.Predicate", uuid.uuid4().hex)
        # The key's contents, not its hash: until 2026-12-01 the token was hash(key), and two
        # keys of one hash (hash(-1) == hash(-2)) gave two predicates one dask name, so that
        # on a cluster still holding one's result the other's call got it; and a str's hash
        # changes with PYTHONHASHSEED, so the names differed from process to process (a
        # new-user probe). The key first: dask's tokenize gives a class it meets there (one of
        # __main__, pickled) a __slotnames__ the first time, and the function's token, which
        # pickles such a class by value, taken before it differed between a first call and
        # the next ones until 2026-12-01 (a new-user probe).
        held = tokenize(token_form(key))
        return ("dask_compact.Predicate", tokenize(self.func), held)

    def mask(self, a: Any, xp: Any = None, *, every_row: bool = False,
             what: str = "a chunk") -> Any:
        """The boolean mask of ``a`` (same shape), computed with ``a``'s array module.

        A mask-path callable is checked on parts of ``a`` (:func:`check_parts`); on every
        row alone with ``every_row`` (a sample checked before anything runs). ``what``: what
        ``a`` is, for the errors (``"a test sample"``: the sample is made up by the checks,
        and a message that called it a chunk named a shape the caller never made)."""
        if xp is None:
            xp = array_module(a)
        if self.expr is not None:
            return check_mask(evaluate(self.expr, a, self.params, xp), a, self.source, xp)
        assert self.func is not None
        if isinstance(a, np.ndarray):  # once, its parts for the checks sliced from it
            a = frozen(a)
        if a.size == 0:
            # An elementwise predicate selects nothing from no values; not called there, since
            # some callables cannot run on none (np.vectorize without otypes: NumPy will not
            # guess an output type from size 0, and map_compact's empty test chunk failed)
            return xp.zeros(a.shape, dtype=bool)
        m = self._mask_of(self._call(a, what), a, xp, what)
        self._check_slices(a, m, xp, every_row, what)
        return m

    def _call(self, a: Any, what: str = "a chunk") -> Any:
        """The callable on ``a`` (``what``: a chunk, a slice of one, a test sample); where it
        fails to broadcast an array it holds against ``a``, NotElementwise saying why (an
        array the shape of the whole input is compared with one chunk at a time)."""
        assert self.func is not None
        given = given_to_callable(a)
        try:
            got = self.func(given)
        except Exception as e:
            refuse_writes(e, self.source)
            if not (isinstance(e, ValueError) and "broadcast" in str(e)):
                e.add_note(failed_on(self.source, what, a))
                raise
            # the shape is the one it failed on (a slice's, where what names a chunk's rows);
            # the way out in memory too: compact_array's caller has no dask array (a probe)
            raise NotElementwise(
                f"predicate {self.source} failed on {what}, an array of shape "
                f"{tuple(a.shape)} ({e}): a predicate gets one chunk (or a slice of one) at a "
                "time, and before anything runs a test sample of a few values (rows of N-D "
                "input), so an array it compares with must broadcast against any of them. For "
                "values aligned with the whole input, compute the condition on the dask array "
                "(m = x > t) and use dask_compact.compact(x, m) (or, in memory, NumPy's "
                "a[m])."
            ) from None
        refuse_if_changed(given, a, self.source)
        return got

    def _mask_of(self, got: Any, a: Any, xp: Any, what: str) -> Any:
        """:func:`check_mask` of what the callable returned for ``a``; where it refuses a mask
        of another shape and the callable reads an array from outside (most often a mask of
        the whole input, ``lambda v: mask``), the refusal says what works. Until 2026-12-01
        (thirteenth session) it had the general message, which spoke of shapes only (the
        records' twin is ``fields.record_mask``'s)."""
        try:
            return check_mask(got, a, self.source, xp, what)
        except NotElementwise:
            # only an array of more than one element, of the size of the mask returned (a
            # mask of the whole input: it, or one made from it); one read beside it (a (1,)
            # constant, a lookup table it indexed) is none, and until 2026-12-01
            # (fourteenth session, a regression review) was named as one, with the advice
            # to select by it (its size by its shape: not every array type has .size)
            outside = [(k, v) for k, v in outside_arrays(self.func)
                       if np.prod(v.shape) == got.size > 1]  # fmt: skip
            if not outside:
                raise
        held = ", ".join(f"`{k}` (shape {tuple(v.shape)})" for k, v in outside)
        raise NotElementwise(
            f"predicate {self.source} returned shape {tuple(got.shape)} for {what} (shape "
            f"{tuple(a.shape)}); it reads {held} from outside: a predicate gets one chunk (or a "
            "slice of one) at a time, so a mask of the whole input does not line up with it. "
            "Select by the mask itself: dask_compact.compact(x, mask) (or, in memory, NumPy's "
            "a[mask])."
        )

    def _check_slices(self, a: Any, m: Any, xp: Any, every_row: bool = False,
                      what: str = "a chunk") -> None:
        """Raise if the callable gives a part of the chunk other values than the chunk (see
        :func:`check_parts`).

        The tracer refuses what it can see (reductions, sizes, conversions), but a callable on
        the mask path runs unseen code, e.g. a statistic computed after ``v.astype(...)``.
        """
        if a.ndim == 0:
            return

        def part(sl: slice) -> Any:
            try:
                got = self._call(a[sl], f"rows {sl.start}:{sl.stop} of {what} of "
                                        f"{a.shape[0]} rows")
            except NotElementwise:
                raise
            except RESOURCE_ERRORS:
                raise  # a resource's failure, as it is (with _call's note naming the predicate)
            except Exception as e:
                # It ran on the whole chunk: failing on some of its rows is depending on them
                # (np.sort(v)[-10] on one row raised IndexError, with a note that blamed a
                # chunk; a new-user probe)
                raise NotElementwise(
                    f"predicate {self.source} is not elementwise: it ran on {what} of "
                    f"{a.shape[0]} rows but failed on rows {sl.start}:{sl.stop} alone "
                    f"({type(e).__name__}: {e}), so it depends on how the array is chunked "
                    "(a statistic or an element of the chunk, its size...). Use elementwise "
                    "operations only; compute statistics on the dask array first."
                ) from None
            return self._mask_of(got, a[sl], xp, f"rows {sl.start}:{sl.stop} of {what} of "
                                                 f"{a.shape[0]} rows")

        check_parts(part, m, a.shape[0], self.source, xp, every_row)

    def typed(self, dtype: Any) -> TypedPredicate:
        """Type the fused tree for ``dtype`` (a record's predicate: a mapping field -> dtype, or
        its sorted pairs); TypeError if NumPy would refuse or not give bools."""
        if self.expr is None:
            raise ValueError("a mask-path predicate has no expression to type")
        dtype = field_dtypes(dtype) if isinstance(dtype, (dict, tuple)) else np.dtype(dtype)
        tp = self.memo.get(("typed", dtype))
        if tp is None:
            tp = self.memo[("typed", dtype)] = _folded(
                _typed(self.expr, dtype, self.source), self.params, self.source)
        return tp

    def check(self, dtype: Any) -> None:
        """Raise now, at graph-build time, what would otherwise fail inside every chunk task.

        Types the fused tree, then binds its constants: a constant that does not fit its loop
        dtype makes the chunks evaluate the predicate with NumPy (comparisons of an integer
        with an int outside its dtype, ``int64_array > 10**30``, are folded by typing and
        bind), so NumPy is asked now, on one element, whether it has an answer; where it
        raises (``float64_array > 10**400``, ``int8_array + 1000``), so does this, before
        anything runs.
        """
        if self.expr is None:
            return
        # a repeated small call checks once per dtype (a record's mapping is not remembered)
        done = ("checked", dtype) if isinstance(dtype, np.dtype) else None
        if done is not None and done in self.memo:
            return
        tp = self.typed(dtype)
        try:
            tp.bind(self.params)
        except ParamOverflow as e:
            one: Any = (
                {name: np.zeros(1, dt) for name, dt in tp.dtype}
                if isinstance(tp.dtype, tuple) else np.zeros(1, dtype=tp.dtype)
            )
            try:
                with np.errstate(all="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    evaluate(self.expr, one, self.params, np)
            except (OverflowError, ValueError, TypeError) as numpy_error:
                refused = (ConstantOverflowError if isinstance(numpy_error, OverflowError)
                           else ValueError)
                raise refused(
                    f"predicate {shorten(self.source)}: {e}, and NumPy refuses it for {tp.dtype} "
                    f"data ({type(numpy_error).__name__}: {numpy_error}); use a constant that fits"
                ) from None
        if done is not None:
            self.memo[done] = True


def _refuse_if_deterministic_asked(p: Predicate) -> None:
    """Raise dask's TokenizationError where dask is asked for deterministic names
    (``tokenize.ensure-deterministic``, or ``tokenize(..., ensure_deterministic=True)``) and
    the mask-path predicate ``p`` has no trace key: its token is new at every call, which dask
    promises to refuse under that setting (a new-user probe: a functools.partial got a new
    random output name at every call, silently)."""
    from dask.tokenize import TokenizationError

    try:
        from dask.tokenize import _maybe_raise_nondeterministic as maybe_raise
    except ImportError:  # dask's private helper moved: the setting alone

        def maybe_raise(msg: str) -> None:
            import dask

            if dask.config.get("tokenize.ensure-deterministic", False):
                raise TokenizationError(msg)

    where = (f"runs on the mask path ({p.reason})" if p.expr is None
             else "holds a constant of a subclass of a number type (whose own == could call "
             "two different values equal; an enum member whose class has Python code of its "
             "own)")
    maybe_raise(
        f"dask_compact: the predicate {shorten(p.source)} {where} "
        "and holds or reads what cannot be named by value (an array, an object, another "
        "function, a name computed as it runs) or reads the world as it runs (the clock, "
        "random numbers, a file: time.time(), random.random(), np.datetime64('now')), so its "
        "dask token, and the result's name, is new at every call; dask's "
        "tokenize.ensure-deterministic asks for names that are not. Write it as a string "
        "expression or a callable the tracer compiles, holding only numbers and strings, "
        "or compute the mask with dask (m = x.map_blocks(pred, dtype=bool)) and use "
        "dask_compact.compact(x, m)."
    )


def array_module(a: Any) -> Any:
    """numpy, or cupy for a CuPy array (imported only then)."""
    mod = type(a).__module__.split(".")[0]
    if mod == "cupy":
        import cupy

        return cupy
    return np


def picklable(func: Any) -> Any:
    """``func`` as it can travel to a worker process. np.vectorize keeps the ufunc it makes
    at its first call (``_ufunc``), which pickle refuses ("Can't pickle <ufunc ...
    (vectorized)>"), and map_compact's checks call the predicate on the client: such a
    predicate failed under the processes scheduler and on a cluster (a new-user probe). The
    copy sent has an empty cache, which the worker fills at its own first call."""
    if isinstance(func, np.vectorize) and getattr(func, "_ufunc", None):
        func = copy.copy(func)
        func._ufunc = {} if isinstance(func._ufunc, dict) else None  # older NumPy: None
    return func


def read_only(a: Any) -> Any:
    """``a`` (a NumPy chunk) as a read-only view, for a mask-path callable: one that wrote
    into its argument (``v *= 2``) changed the caller's array, or a persisted chunk, once per
    call of the checks (a probe's array came out multiplied by 2 to 8, unevenly). CuPy arrays
    have no such flag and are passed as they are."""
    if isinstance(a, np.ndarray) and a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


class _Frozen:
    """The memory of a NumPy array ``a`` offered read-only through the array interface: an
    array made from it is a view of ``a`` that cannot be made writeable again, as its base is
    not an array (``setflags(write=True)`` raises). A plain read-only view's base is the
    caller's writeable array, so a callable could turn the flag back on and write: a records
    probe's predicate did (``a.setflags(write=True); a[:] = 7``), and the call returned 7s
    and left the caller's array all 7s (2026-12-06)."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, a: np.ndarray) -> None:
        face = a.__array_interface__.copy()
        face["data"] = (face["data"][0], True)  # (address, read-only)
        self.__array_interface__ = face
        # keeps the memory alive as long as the view; not named `base`, which a callable
        # walking `v.base.base` took to the caller's writeable array (a review)
        self._owner = a


def frozen(a: np.ndarray) -> np.ndarray:
    """A view of ``a`` that cannot be made writeable (see :class:`_Frozen`), of its type;
    ``a`` itself where it is one already, or a view of one (a part of a chunk the checks
    call the callable on: its bases, a short chain as NumPy collapses them, end at one)."""
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is _Frozen:
        return a
    try:
        v = np.asarray(_Frozen(a))
    except (TypeError, ValueError):  # a dtype the interface cannot say (StringDType)
        return read_only(a)
    if v.dtype != a.dtype:  # a structured dtype with gaps: the interface names its padding
        v = v.view(a.dtype)
    return v if type(a) is np.ndarray else v.view(type(a))


def given_to_callable(a: Any) -> Any:
    """What a mask-path callable is given of the data ``a``: a NumPy chunk as a read-only view
    that it cannot make writeable (:func:`frozen`; about 3 us more than a plain view, beside
    a mask path's hundreds); a CuPy one, which has no such flag, as a copy, which
    :func:`refuse_if_changed` compares with ``a`` after the call. Until 2026-12-06 (forty-
    fourth session, an audit after the traced ``v += 1`` of a probe) a mask-path callable
    writing into its argument (``np.isin`` beside ``v *= 2``) changed the caller's CuPy
    array, or a persisted chunk, silently. The copy and the comparison are two passes over
    the chunk's bytes on the device, next to the CuPy kernels the mask path runs anyway."""
    if isinstance(a, np.ndarray):
        return frozen(a)
    if array_module(a) is np:  # not an array (a NumPy scalar): nothing to write into
        return a
    return a.copy()


def refuse_if_changed(given: Any, a: Any, source: str) -> None:
    """Raise the refusal of :func:`refuse_writes` where the callable changed ``given``, the
    copy :func:`given_to_callable` made of the CuPy array ``a`` (compared as bytes: NaNs and
    -0.0 compare by their bits)."""
    if given is a or isinstance(given, np.ndarray):
        return
    xp = array_module(a)
    now = given.reshape(-1).view(xp.uint8)
    was = xp.ascontiguousarray(a).reshape(-1).view(xp.uint8)
    if bool((now != was).any()):
        raise ValueError(_writes_message(source, "it changed the values it was given"))


def _writes_message(source: str, how: str) -> str:
    return (
        f"predicate {source} writes into its argument ({how}): it is called on the data "
        "itself (a chunk, its parts for the checks), which it must leave as it is; "
        "compute new arrays instead (v * 2, not v *= 2)"
    )


def refuse_writes(e: Exception, source: str) -> None:
    """Raise a ValueError saying what to do where ``e`` is NumPy's refusal to write into a
    read-only argument (:func:`read_only`); return otherwise."""
    if isinstance(e, ValueError) and ("read-only" in str(e) or "WRITEABLE flag" in str(e)):
        raise ValueError(_writes_message(source, str(e))) from None


def check_parts(part: Callable[[slice], Any], m: Any, n: int, source: str, xp: Any,
                every_row: bool = False) -> None:
    """Raise NotElementwise unless ``part(sl) == m[sl]`` for the chunk's first and last
    :data:`SLICE_CHECK` rows and for its first, middle and last row alone (every row with
    ``every_row``): ``part(sl)`` is the mask-path callable's answer on those rows alone, ``m``
    its answer on all ``n``.

    An elementwise callable gives a part of the chunk the same values; one that looks at the
    whole chunk (a statistic, its size, random numbers) almost never does. A row alone is
    where a statistic differs most from the chunk's: its mean is the row itself, its spread
    zero, so ``v > v.mean() - c`` and ``abs(v - v.mean()) < 3 * v.std()`` flip there even
    where every slice of a smooth chunk agrees. A few small calls, next to the chunk's, and
    one host sync on a GPU.
    """
    if n < 2:
        return
    k = min(SLICE_CHECK, n // 2)
    rows = range(n) if every_row else sorted({0, n // 2, n - 1})
    same: Any = True
    for sl in (slice(0, k), slice(n - k, n), *(slice(i, i + 1) for i in rows)):
        same = same & xp.array_equal(part(sl), m[sl])
    if not bool(same):
        raise NotElementwise(
            f"predicate {source} is not elementwise: it gives a part of a chunk other values "
            "than the same rows in the whole chunk, so it depends on how the array is chunked "
            "(a statistic of the chunk, its size, random numbers...). Use elementwise "
            "operations only; compute statistics on the dask array first, and for a random "
            "sample pass a boolean dask array (da.random) to dask_compact.compact(x, mask)."
        )


def check_sample(dtype: np.dtype, n: int = 64, like: Any = None) -> Any:
    """``n`` values of ``dtype`` (in ``like``'s array type: NumPy by default) for the checks of
    a mask-path callable before anything runs (:func:`check_parts` on every row): a ramp 0,
    1, ... (the first half), then values spread over the dtype's range, alternating in sign
    where it has one, the largest last.

    A ramp makes the statistics of a slice (its mean, maximum, length) differ from the whole
    sample's; the spread makes them differ from one row's alone by more than the constants a
    callable compares with (``v > v.mean() - 1000`` agrees on every part of a chunk of
    values within 1000 of each other, never on this sample). The ramp ends with its first two
    values again: a callable that looks for other rows of equal value (the first occurrence
    of each value by ``np.unique``) agrees with itself on any chunk of distinct values, and
    on every part of one, but not on a row of this sample alone."""
    half = n // 2
    ramp = np.arange(half)  # 0..31: fits every integer dtype
    if half >= 4:
        ramp[-2:] = ramp[:2]
    spread_n = n - half
    if dtype.kind == "b":
        return _in_type_of(np.arange(n) >= half, like)
    signs = [1 if i % 2 or dtype.kind == "u" else -1 for i in range(spread_n)]
    values: list[Any] = [int(v) for v in ramp]
    if dtype.kind in "iumM":  # datetimes and timedeltas: their int64 counts
        # Python ints: 2**62 and 2**63 do not survive a cast through float64 to int64/uint64
        top = int(np.iinfo(dtype if dtype.kind in "iu" else np.int64).max) // 2
        mags = sorted({min(top, round(v)) for v in np.geomspace(1, max(top, 1), spread_n)})
        mags = [1] * (spread_n - len(mags)) + mags  # small dtypes: fewer distinct powers
        values += [s * m for s, m in zip(signs, mags)]
        ints = np.array(values, dtype=dtype if dtype.kind in "iu" else np.int64)
        return _in_type_of(ints.astype(dtype), like)
    top_exp = min(12.0, float(np.log10(np.finfo(dtype).max)) - 1)
    values += [s * float(m) for s, m in zip(signs, np.logspace(-3, top_exp, spread_n))]
    real = np.array(values, dtype=np.float64)
    a = (real + 1j * real[::-1]) if dtype.kind == "c" else real
    return _in_type_of(a.astype(dtype), like)


def _in_type_of(a: np.ndarray, like: Any) -> Any:
    return a if like is None or isinstance(like, np.ndarray) else array_module(like).asarray(a)


def outside_arrays(func: Any) -> list[tuple[str, Any]]:
    """The arrays (of one axis or more) that ``func`` reads from its closure's cells or from
    the globals, by name."""
    code = getattr(func, "__code__", None)
    if code is None:
        return []
    pairs = [(k, c.cell_contents) for k, c in zip(code.co_freevars, func.__closure__ or ())
             if _filled(c)]  # fmt: skip
    glob = getattr(func, "__globals__", {})
    pairs += [(k, glob.get(k)) for k in code.co_names]
    # an array's shape is a tuple; a module (numpy: np.dtype, np.shape) has the names too
    return [(k, v) for k, v in pairs
            if hasattr(v, "dtype") and isinstance(getattr(v, "shape", None), tuple) and v.shape]


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True


def check_mask(m: Any, a: Any, source: str, xp: Any = np, what: str = "a chunk") -> Any:
    """Validate what a predicate returned: booleans of ``a``'s shape (a scalar broadcasts).
    ``what``: what ``a`` is, for the error (a chunk, a slice of one, a test sample)."""
    if isinstance(m, (bool, np.bool_)) or (getattr(m, "ndim", None) == 0 and m.dtype == bool):
        return xp.full(a.shape, bool(m), dtype=bool)
    dt = getattr(m, "dtype", None)
    if dt is None or dt != np.dtype(bool):
        raise TypeError(
            f"predicate {source} must return a boolean array, got "
            f"{type(m).__name__}{'' if dt is None else ' of dtype ' + str(dt)}"
        )
    if m.shape != a.shape:
        # NotElementwise (a ValueError): map_compact then tries the predicate on blocks of
        # whole rows, where a constant that broadcasts over several trailing axes (shape
        # (5, 1) against rows of (5, 3)) gives a flat chunk a mask of another shape
        raise NotElementwise(
            f"predicate {source} is not elementwise: it returned shape {tuple(m.shape)} for "
            f"{what} of shape {tuple(a.shape)}; a predicate must give one boolean per element"
            + _grown_by_broadcast(m.shape, a.shape)
        )
    return m


def _grown_by_broadcast(got: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """Why a mask came back larger than its input, where an array the predicate reads
    broadcast it: a (3, 1) constant against rows of (3, 100) data gives every row three
    masks. Until 2026-12-07 the refusal named only the shapes, and for an in-memory call
    the shape of a sample the caller never made."""
    try:
        if tuple(np.broadcast_shapes(tuple(got), tuple(shape))) != tuple(got) or got == shape:
            return ""
    except ValueError:
        return ""
    return (" (an array it reads broadcast the input to a larger shape: the predicate sees a "
            "few rows at a time, so arrays beside it must broadcast against each row's "
            "trailing axes, as a (3,) constant does on (n, 3) data, not along the rows)")


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> Predicate:
    from .parse import parse
    from .template import like_parsed, remember_parsed

    # a text whose numbers alone differ from an earlier one's (a threshold new at each
    # call): that one's tree with these numbers, unparsed (predicate/template.py)
    p = like_parsed(text)
    if p is None:
        p = parse(text)
        remember_parsed(text, p)
    return p


_traced_memo: Any = None  # a BoundedCache of trace_key -> Predicate, made on first use


def _traced() -> Any:
    global _traced_memo
    if _traced_memo is None:
        from ..cache import BoundedCache

        _traced_memo = BoundedCache("traced predicates")
    return _traced_memo


def as_predicate(pred: PredicateLike) -> Predicate:
    """Make a :class:`Predicate` from a callable (traced), a string (parsed) or a Predicate."""
    if isinstance(pred, Predicate):
        return pred
    if isinstance(pred, str):
        p = _parsed(pred)
    elif callable(pred):
        key = trace_key(pred)
        hit = None if key is None else _traced().get(key)
        if hit is not None:
            # The same predicate object: its per-dtype typing and bound constants are kept on
            # it, so a repeated small call does no per-predicate Python work.
            return hit if hit.expr is not None else Predicate(
                expr=None, params=(), func=pred, source=hit.source, reason=hit.reason)
        from .function_shape import learn, like_traced
        from .trace import trace  # imports this module: here, not at the top

        # a function whose ints and floats alone differ from a traced one's of its shape:
        # that trace's tree with its own numbers (function_shape.py)
        shaped = None if key is None else like_traced(pred)
        if shaped is not None:
            p, key = shaped
        else:
            # a key None (what it reads could change unseen) is traced every time, as it is
            p, key = (trace(pred), None) if key is None else trace_under_key(pred, trace)
            if key is not None and p.expr is not None:
                learn(pred, p)
        if key is not None:
            p.memo[TRACED_UNDER] = key
            _traced().put(key, p)
    else:
        # an array here is a mask (NumPy's habit, a[a > 0.5]): until 2026-12-01 (fourteenth
        # session) it was told only "not Array" (a new-user probe); compact selects by one
        mask = ("; a boolean array is a mask, not a predicate: select by it with "
                "dask_compact.compact(x, mask) (in memory, NumPy's a[mask]), or pass the "
                "condition that made it, lambda v: v > 0.5"
                if hasattr(pred, "shape") and hasattr(pred, "dtype") else "")
        raise TypeError(
            f"pred must be a callable or a string expression in `x`, not "
            f"{type(pred).__name__}{mask}"
        )
    logger.debug("predicate %s runs on the %s path", p, p.path)
    return p


__all__ = [
    "Predicate",
    "TypedPredicate",
    "PredicateLike",
    "ParamOverflow",
    "as_predicate",
    "check_mask",
]
