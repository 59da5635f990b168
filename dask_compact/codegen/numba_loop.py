"""The fused CPU loop: a typed predicate tree becomes one numba compaction loop.

For ``(x > p0) & (x < p1)`` on float32 and ``output="values"`` the generated function walks
the input in blocks of 64 (:func:`generate_source` has the whole text)::

    def compact_loop(a, out, p0, p1):
        ...
        for j in range(64):            # the predicate into a bitmask: loads only
            x = a[s + j]
            t0 = x > p0
            t1 = x < p1
            t2 = t0 & t1
            bits |= np.uint64(t2) << np.uint64(j)
        hits = hits - (hits >> 3) + popcount(bits)  # 8 x the running mean of hits
        if bits != 0 and hits < 8 * 44:    # few hits: visit the set bits
            while bits != 0:
                j = trailing_zeros(bits)
                out[k] = a[s + j]
                k += 1
                bits &= bits - 1
        elif bits != 0:                # many: store every element, keep it if its bit is set
            for j in range(64):
                out[k] = a[s + j]      # no branch to mispredict at p = 0.5
                k += bits & 1
                bits >>= 1
        ...
        return k

One pass over the input, no mask array. ``out`` has the input's length (``k <= i`` always).

Exactness: every argument is cast to the loop dtype NumPy would use and every result to NumPy's
output dtype (numba computes small-int arithmetic in int64; NumPy wraps in the small type), and
operations whose C semantics differ from NumPy's (integer division by zero, shifts past the
width, float floor division, NaN-propagating min/max, mixed int64/uint64 comparisons) go
through helpers that spell NumPy's rules out. Where numba cannot match NumPy bit for bit --
float16 (no CPU half type in numba), transcendental functions and float powers (NumPy uses its
own SIMD implementations, not libm), complex multiplication, division, absolute value and
friends -- the loop is reported unsupported and the backend takes the mask path.

Parameters are arguments of the compiled function, so a new threshold reuses the loop; the
in-process cache is keyed by (TypedPredicate.key, output) and bounded (:mod:`dask_compact.cache`),
but for the loops of structures that came back after their eviction, kept for good (``_kept``).
Numba's disk cache needs a source file, so the generated source is written to a cache directory
(``DASK_COMPACT_CACHE_DIR``, default ``~/.cache/dask_compact``) under a name that hashes its
text, and imported from there; the directory is trimmed to its size cap as it grows.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import logging
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..batch.signals import deferred, held_signal
from ..cache import BoundedCache, cache_dir, disk_bytes, trim
from ..compiler_room import no_room_for_compiler
from ..predicate.core import TypedPredicate
from ..predicate.expr import Call, Node, Var, param_dtypes, params_of, to_source, walk

__all__ = [
    "OUTPUTS",
    "CompiledLoop",
    "UnsupportedPredicate",
    "cache_dir",
    "cache_info",
    "fused_loop",
    "generate_source",
]

logger = logging.getLogger("dask_compact")

OUTPUTS = ("values", "indices", "both")

# Ufuncs the loop computes through the platform's libm or NumPy's own SIMD code: results may
# differ from NumPy's in the last bit, which flips a comparison at the boundary.
_INEXACT = frozenset({"exp", "log", "log2", "log10", "sin", "cos", "tan"})
_COMPARISONS = {
    "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
    "equal": "==", "not_equal": "!=",
}  # fmt: skip
_ARITHMETIC = {"add": "+", "subtract": "-", "multiply": "*"}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}


class UnsupportedPredicate(Exception):
    """The fused loop cannot compute this predicate exactly as NumPy does; use the mask path."""


def _np(dt: np.dtype) -> str:
    return "np.bool_" if dt == np.dtype(bool) else f"np.{dt.name}"


def _u64(expr: str) -> str:
    # Integer arithmetic goes through uint64: numba emits signed add/sub/mul/shl with LLVM's
    # "no signed wrap" flag, so overflow is undefined there and e.g. `x + 100 < x` folds to
    # False; NumPy wraps. Modulo 2**64 then truncated to the output type is NumPy's result.
    return f"np.uint64({expr})"


class _Emitter:
    """Turns a typed tree into straight-line numba statements, collecting helper functions."""

    def __init__(self, tp: TypedPredicate) -> None:
        self.tp = tp
        self.lines: list[str] = []
        self.helpers: dict[str, str] = {}
        self.names: dict[Node, tuple[str, np.dtype]] = {}
        pdts = param_dtypes(tp.expr, tp.types)
        for p, dt in zip(params_of(tp.expr), pdts):
            self.names[p] = (f"p{p.index}", dt)
        self.param_dtypes = pdts
        if isinstance(tp.dtype, tuple):  # a record's fields: v0, v1, ... in sorted name order
            for j, (name, dt) in enumerate(tp.dtype):
                self.names[Var(name)] = (f"v{j}", dt)
        else:
            self.names[Var()] = ("x", tp.dtype)

    # -- casts -----------------------------------------------------------------------------
    def cast(self, expr: str, src: np.dtype, dst: np.dtype) -> str:
        if src == dst:
            return expr
        if dst == np.dtype(bool):
            if src.kind == "c":
                return f"(({expr}).real != 0) | (({expr}).imag != 0)"
            return f"({expr} != 0)"
        if src.kind == "c" and dst.kind != "c":
            raise UnsupportedPredicate(f"a cast from {src} to {dst}")
        return f"{_np(dst)}({expr})"

    def truth(self, expr: str, dt: np.dtype) -> str:
        return self.cast(expr, dt, np.dtype(bool))

    def helper(self, name: str, text: str) -> str:
        self.helpers.setdefault(name, text)
        return name

    # -- the tree ----------------------------------------------------------------------------
    def emit(self) -> str:
        """Emit the statements for the whole tree; return the name of the boolean result."""
        for node in walk(self.tp.expr):
            if node in self.names or not isinstance(node, Call):
                continue
            typed = self.tp.types[node]
            for dt in (*typed.loop, typed.out):
                self.check_dtype(dt, f"np.{node.fn}")
            args = []
            for a, dt in zip(node.args, typed.loop):
                name, src = self.names[a]
                args.append(self.cast(name, src, dt))
            expr = self.op(node.fn, args, typed.loop, typed.out)
            tmp = f"t{len(self.lines)}"
            self.lines.append(f"{tmp} = {expr}")
            self.names[node] = (tmp, typed.out)
        name, dt = self.names[self.tp.expr]
        return self.truth(name, dt)

    @staticmethod
    def check_dtype(dt: np.dtype, what: str) -> None:
        """``what``: ``np.<ufunc>`` computing in ``dt``, or "the input", "a parameter"."""
        if dt.kind not in "biufc":
            raise UnsupportedPredicate(f"{what} computes in {dt}")
        if dt == np.dtype(np.float16):
            raise UnsupportedPredicate(f"{what} computes in float16 (numba has no CPU float16)")
        if (dt.kind == "f" and dt.itemsize > 8) or dt.itemsize > 16:
            raise UnsupportedPredicate(f"{what} computes in {dt} (no numba type)")

    def op(self, fn: str, args: list[str], loop: tuple[np.dtype, ...], out: np.dtype) -> str:
        kinds = "".join(dt.kind for dt in loop)
        k = loop[0].kind
        o = _np(out)
        if fn in _INEXACT or (fn == "power" and k in "fc"):
            raise UnsupportedPredicate(
                f"np.{fn} on {loop[0]}: NumPy's implementation is not bit-reproducible in numba"
            )
        if "c" in kinds and fn not in _COMPLEX_OK:
            raise UnsupportedPredicate(f"np.{fn} on complex numbers is not compiled exactly")
        a = args[0]
        b = args[1] if len(args) > 1 else ""  # binary ufuncs below always have two arguments
        if fn in _COMPARISONS:
            return self.compare(fn, a, b, loop)
        if fn in ("logical_and", "logical_or", "logical_xor"):
            sym = {"logical_and": "&", "logical_or": "|", "logical_xor": "!="}[fn]
            return f"({self.truth(a, loop[0])}) {sym} ({self.truth(b, loop[1])})"
        if fn == "logical_not":
            return f"not ({self.truth(a, loop[0])})"
        if fn in _BITWISE:
            if k == "b":
                return f"({a} {'!=' if fn == 'bitwise_xor' else _BITWISE[fn]} {b})"
            return f"{o}({a} {_BITWISE[fn]} {b})"
        if fn == "invert":
            return f"not {a}" if k == "b" else f"{o}(~{a})"
        if fn in ("left_shift", "right_shift"):
            return f"{self.shift_helper(fn, loop[0])}({a}, {b})"
        if fn in _ARITHMETIC:
            if k == "b":  # NumPy's bool loops: add is or, multiply is and
                return {"add": f"({a} | {b})", "multiply": f"({a} & {b})"}[fn]
            if k in "iu":
                return f"{o}({_u64(a)} {_ARITHMETIC[fn]} {_u64(b)})"
            return f"{o}({a} {_ARITHMETIC[fn]} {b})"
        if fn == "true_divide":
            return f"{o}({a} / {b})"
        if fn in ("floor_divide", "remainder"):
            return f"{self.divmod_helper(fn, loop[0])}({a}, {b})"
        if fn == "negative":
            return f"{o}(np.uint64(0) - {_u64(a)})" if k in "iu" else f"{o}(-{a})"
        if fn == "positive":
            return a
        if fn == "absolute":
            if k == "i":
                return f"{o}({_u64(a)} if {a} >= 0 else np.uint64(0) - {_u64(a)})"
            return a if k in "bu" else f"{o}(abs({a}))"
        if fn == "square":
            return f"{o}({_u64(a)} * {_u64(a)})" if k in "iu" else f"{o}({a} * {a})"
        if fn in ("minimum", "maximum", "fmin", "fmax"):
            return self.minmax(fn, a, b, loop[0])
        if fn == "reciprocal":  # only float arrays get it (expr.resolve_scalar_powers)
            return f"{o}({o}(1) / {a})"
        if fn in ("sqrt", "floor", "ceil", "trunc", "rint"):
            return a if k in "biu" else f"{o}(np.{fn}({a}))"
        if fn == "sign":
            return f"{self.sign_helper(loop[0])}({a})"
        if fn in ("isnan", "isinf", "isfinite"):
            return self.classify(fn, a, loop[0])
        if fn == "signbit":
            if k in "biu":
                return "False" if k != "i" else f"({a} < 0)"
            return f"(math.copysign(1.0, {a}) < 0)"
        if fn == "power":
            return f"{self.power_helper(loop[0])}({a}, {b})"
        if fn == "where":
            return f"({b} if {a} else {args[2]})"
        if fn in ("real", "imag"):
            if k == "c":
                return f"{o}({a}.{fn})"
            return a if fn == "real" else f"{o}(0)"
        raise UnsupportedPredicate(f"np.{fn} has no numba translation")  # pragma: no cover

    # -- operations with NumPy-specific rules -------------------------------------------------
    def compare(self, fn: str, a: str, b: str, loop: tuple[np.dtype, ...]) -> str:
        op = _COMPARISONS[fn]
        d1, d2 = loop
        if d1 == d2 and d1.kind != "c":
            return f"({a} {op} {b})"
        if d1 == d2:  # complex: NumPy orders lexicographically, with its own NaN rules
            if fn in ("equal", "not_equal"):
                return f"({a} {op} {b})"
            return f"{self.complex_compare_helper(fn, d1)}({a}, {b})"
        if {d1.kind, d2.kind} == {"i", "u"}:
            # NumPy compares int64 with uint64 exactly; numba would go through float64.
            if d1.kind == "i":
                neg, lhs, rhs = f"({a} < 0)", f"np.uint64({a})", b
                when_neg = fn in ("less", "less_equal", "not_equal")
            else:
                neg, lhs, rhs = f"({b} < 0)", a, f"np.uint64({b})"
                when_neg = fn in ("greater", "greater_equal", "not_equal")
            if when_neg:
                return f"({neg} | ({lhs} {op} {rhs}))"
            return f"((not {neg}) & ({lhs} {op} {rhs}))"
        raise UnsupportedPredicate(f"np.{fn} on mixed ({d1}, {d2})")

    def complex_compare_helper(self, fn: str, dt: np.dtype) -> str:
        # NumPy's CLT/CLE/CGT/CGE macros (umath loops.c.src).
        op = _COMPARISONS[fn].rstrip("=")
        eq = "=" if fn.endswith("equal") else ""
        name = f"_{fn}_{dt.name}"
        return self.helper(
            name,
            f"""
@njit(nogil=True, cache=CACHE, error_model="numpy")
def {name}(a, b):
    ar, ai, br, bi = a.real, a.imag, b.real, b.imag
    return ((ar {op} br) & (ai == ai) & (bi == bi)) | ((ar == br) & (ai {op}{eq} bi))
""",
        )

    def shift_helper(self, fn: str, dt: np.dtype) -> str:
        # NumPy (npy_lshift/npy_rshift): a shift by a negative or >= bit-width count gives 0
        # (or -1 for a negative value shifted right); C and LLVM leave it undefined.
        if dt.kind not in "iu":
            raise UnsupportedPredicate(f"np.{fn} on {dt}")
        name = f"_{fn}_{dt.name}"
        t, bits = _np(dt), dt.itemsize * 8
        if fn == "left_shift":
            body = f"""
    if b < 0 or b >= {bits}:
        return {t}(0)
    return {t}(np.uint64(a) << np.uint64(b))"""
        else:
            out_of_range = f"{t}(-1) if a < 0 else {t}(0)" if dt.kind == "i" else f"{t}(0)"
            body = f"""
    if b < 0 or b >= {bits}:
        return {out_of_range}
    return {t}(a >> b)"""
        return self.helper(
            name,
            f'\n@njit(nogil=True, cache=CACHE, error_model="numpy")\ndef {name}(a, b):{body}\n',
        )

    def divmod_helper(self, fn: str, dt: np.dtype) -> str:
        name = f"_{fn}_{dt.name}"
        t = _np(dt)
        if dt.kind in "iu":
            # NumPy: x // 0 == 0 and x % 0 == 0 (with a warning); MIN // -1 wraps to MIN.
            # Python floor semantics otherwise, which numba's // and % implement for ints.
            #
            # Through a float where a and b are under 2^53 in magnitude (double; float for 1-
            # and 2-byte types, under 2^24): the divisor is a call's constant, not the compiled
            # loop's, so LLVM cannot make it a multiply, and a float division costs a fraction
            # of an integer one. floor() of the rounded quotient is exact there: its error,
            # under |a / b| * 2^-53 (2^-24) < 1 / |b|, never reaches an integer, which lies at
            # least 1 / |b| from a quotient that is not one; a - q * b is exact in the same
            # float, as |q * b| <= |a| + |b|. Up to 4 bytes that is every value, b = -1
            # included (floor(-a) is exact; MIN // -1, the one quotient past MAX, is wrapped to
            # MIN in the float, as NumPy wraps it), so the helper's only branch is b == 0:
            # a branch for b == -1 returning a value made from a kept LLVM from vectorising
            # the loop (int32 `x // 7 == 200` 29 ms against 7.5 without it, one core).
            # 2^24 elements, 2 cores, public compact_array, 2026-12-04: int32 `x // 7 == 2`
            # 109 ms (integer division) -> 33 (double, with the -1 branch) -> 16-19 (this
            # form; NumPy, with libdivide, 38), `x % 5 == 1` 153 -> 25-29 -> 17-20 (NumPy 196-223)
            # (benchmarks/results/2026-12-04_cpu_integer_divmod_vectorised.md).
            op = "//" if fn == "floor_divide" else "%"
            # uint64 converts through int64 (below 2^53 here): x86 has no unsigned conversion
            wide = "np.int64" if dt == np.uint64 else ""
            fl = "np.float32" if dt.itemsize <= 2 else "np.float64"
            fa, fb = f"{fl}({wide}(a))", f"{fl}({wide}(b))"
            q = f"np.floor({fa} / {fb})"
            if dt.itemsize <= 4:
                if fn == "remainder":  # |a - q * b| < |b|: in the type's range
                    ret = f"{t}({fa} - q * {fb})"
                elif dt.kind == "u":  # b >= 1: 0 <= q <= a
                    ret = f"{t}(q)"
                else:  # only MIN // -1 is past MAX: wrapped in the float, a select
                    big = 2 ** (8 * dt.itemsize)
                    ret = f"{t}(q - {fl}({big}) if q > {fl}({big // 2 - 1}) else q)"
                body = f"""
    if b == 0:
        return {t}(0)
    q = {q}
    return {ret}"""
            else:
                at_minus_one = (
                    f"{t}(np.uint64(0) - np.uint64(a))" if fn == "floor_divide" else f"{t}(0)"
                )
                minus_one = (
                    f"\n    if b == -1:\n        return {at_minus_one}" if dt.kind == "i" else ""
                )
                fast = (f"{t}({q})" if fn == "floor_divide"
                        else f"{t}(np.int64(a) - np.int64({q}) * np.int64(b))")
                lim = f"{t}(9007199254740992)"  # 2^53, in the loop's type (no float compare)
                both = (f"-{lim} < a < {lim} and -{lim} < b < {lim}" if dt.kind == "i"
                        else f"a < {lim} and b < {lim}")
                # b = -1 goes the fast way where a fits (-a is exact); MIN // -1, which
                # numba's integer // would trap on, is past it
                body = f"""
    if b == 0:
        return {t}(0)
    if {both}:
        return {fast}{minus_one}
    return {t}(a {op} b)"""
        else:
            # npy_divmod / npy_floor_divide / npy_remainder (npymath), in the loop's float type.
            # np.fmod, not math.fmod, which numba does not compile: until 2026-12-01 (fifteenth
            # session, a mixed-dtype probe) every float // and % took the mask path. fmod is
            # exact, so numba's (LLVM's frem) and C's agree bit for bit.
            zero, one, half = f"{t}(0)", f"{t}(1)", f"{t}(0.5)"
            if fn == "floor_divide":
                body = f"""
    if b == 0:
        return {t}(a / b)
    mod = {t}(np.fmod(a, b))
    div = {t}((a - mod) / b)
    if mod != 0:
        if (b < 0) != (mod < 0):
            div = {t}(div - {one})
    if div != 0:
        floordiv = {t}(np.floor(div))
        if div - floordiv > {half}:
            floordiv = {t}(floordiv + {one})
    else:
        floordiv = {t}(math.copysign({zero}, a / b))
    return floordiv"""
            else:
                body = f"""
    mod = {t}(np.fmod(a, b))
    if b == 0:
        return mod
    if mod != 0:
        if (b < 0) != (mod < 0):
            mod = {t}(mod + b)
    else:
        mod = {t}(math.copysign({zero}, b))
    return mod"""
        return self.helper(
            name,
            f'\n@njit(nogil=True, cache=CACHE, error_model="numpy")\ndef {name}(a, b):{body}\n',
        )

    def minmax(self, fn: str, a: str, b: str, dt: np.dtype) -> str:
        if dt.kind == "b":
            return f"({a} {'|' if 'max' in fn else '&'} {b})"
        op = ">" if "max" in fn else "<"
        if dt.kind in "iu":
            return f"({a} if {a} {op} {b} else {b})"
        # NumPy's float loops: ties (+0.0 vs -0.0) give the second operand; maximum/minimum
        # propagate the first NaN, fmax/fmin ignore a NaN.
        name = f"_{fn}_{dt.name}"
        if fn in ("maximum", "minimum"):
            body = f"""
    if a != a:
        return a
    if b != b:
        return b
    return a if a {op} b else b"""
        else:
            body = f"""
    if b != b:
        return a
    if a != a:
        return b
    return a if a {op} b else b"""
        return (
            self.helper(
                name,
                f'\n@njit(nogil=True, cache=CACHE, error_model="numpy")\ndef {name}(a, b):{body}\n',
            )
            + f"({a}, {b})"
        )

    def sign_helper(self, dt: np.dtype) -> str:
        name = f"_sign_{dt.name}"
        t = _np(dt)
        if dt.kind == "b":
            raise UnsupportedPredicate("np.sign on bool")
        tail = "a" if dt.kind == "f" else f"{t}(0)"  # NaN stays NaN
        body = f"""
    if a > 0:
        return {t}(1)
    if a < 0:
        return {t}(-1)
    if a == 0:
        return {t}(0)
    return {tail}"""
        return self.helper(
            name, f'\n@njit(nogil=True, cache=CACHE, error_model="numpy")\ndef {name}(a):{body}\n'
        )

    def classify(self, fn: str, a: str, dt: np.dtype) -> str:
        if dt.kind in "biu":
            return "True" if fn == "isfinite" else "False"
        if dt.kind == "c":
            re, im = f"{a}.real", f"{a}.imag"
            if fn == "isfinite":
                return f"(np.isfinite({re}) & np.isfinite({im}))"
            return f"(np.{fn}({re}) | np.{fn}({im}))"
        return f"np.{fn}({a})"

    def power_helper(self, dt: np.dtype) -> str:
        # NumPy's integer power: square-and-multiply with wrap-around, error on negative powers.
        if dt.kind not in "iu":
            raise UnsupportedPredicate(f"np.power on {dt}")
        name = f"_power_{dt.name}"
        t = _np(dt)
        body = f"""
    if b < 0:
        raise ValueError("Integers to negative integer powers are not allowed.")
    r = {t}(1)
    base = a
    e = b
    while e > 0:
        if e & 1:
            r = {t}(np.uint64(r) * np.uint64(base))
        base = {t}(np.uint64(base) * np.uint64(base))
        e = e >> 1
    return r"""
        return self.helper(
            name,
            f'\n@njit(nogil=True, cache=CACHE, error_model="numpy")\ndef {name}(a, b):{body}\n',
        )


# Functions the emitter handles exactly for complex loops; the rest are refused.
_COMPLEX_OK = frozenset(
    {
        "less", "less_equal", "greater", "greater_equal", "equal", "not_equal",
        "logical_and", "logical_or", "logical_xor", "logical_not",
        "add", "subtract", "negative", "positive", "isnan", "isinf", "isfinite",
        "real", "imag", "where",
    }
)  # fmt: skip


_SIGNATURES = {
    "values": ("a", "out"),
    "indices": ("a", "idx", "base"),
    "both": ("a", "out", "idx", "base"),
}
_STORES = {
    "values": ("out[k] = a[s + j]",),
    "indices": ("idx[k] = base + s + j",),
    "both": ("out[k] = a[s + j]", "idx[k] = base + s + j"),
}
BLOCK = 64  # elements per predicate bitmask (one uint64)
# While the running mean of selected rows per block of 64 (over about its last 8 blocks) is
# below this, a block visits only its set bits (found by their trailing zeros: a branch per
# selected row, and one mispredicted at the end of the block); above it, a block stores every
# row (each kept or overwritten: 64 stores, no branch). Visiting costs less up to ~44 of 64
# selected rows on the 2-core CI machine. Decided by the running mean, not by each block's own
# count: at p near the crossover a block's count falls on either side by chance, and that
# branch mispredicted (0.90x around p = 0.6 with a per-block threshold of 40).
SPARSE_BELOW = 44
# Where numba's target has the compress (numba_compress.COMPRESS_ITEMSIZES: AVX-512F for 4- and
# 8-byte values, AVX512_VBMI2 for 1- and 2-byte ones), a full block of values is stored by it,
# 64 / itemsize elements a step, instead of a row at a time (2-core CI machine, 2^22): float32
# 2.0-2.6x and float64 1.3-1.5x at p >= 0.2-0.3, uint8 and int16 2.2-5.8x at p >= 0.05. It
# beats visiting the set bits from a much lower running mean, by the element size (at p = 0.1,
# 6.4 hits a block: float32 1.86x from 4, 0.97x from 8; float64 lost below 16; uint8 and int16
# from 1: 1.4x at p = 0.02, level at p = 0.005). Where AVX2's permute stands in for it (8 or 4
# lanes a step, numba_compress.HAVE_PERMUTE) the same thresholds measured best on the 2-core
# Zen 4 (2^22, the scalar loop's time over the permute's): float32 1.92-3.0x at p >= 0.1 from
# 4 (from 8 1.05x at p = 0.1), float64 1.10-1.90x at p >= 0.3 and level below from 16 (from 32
# 1.14x at p = 0.5 against 1.33x), the int64 indices 1.20-2.71x at p >= 0.3 from 8 or 16.
COMPRESS_FROM = {1: 1, 2: 1, 4: 4, 8: 16}
# The int64 indices, 8 a step, from an iota of the block's positions: 1.28-1.58x at p >= 0.2-0.3
# (2^22 float32, 2-core CI machine), level below; visiting wins under a mean of 8 hits.
INDICES_COMPRESS_FROM = 8


@functools.cache
def helpers_digest() -> str:
    """A digest of the modules every generated loop calls into and numba compiles into it
    (``numba_compress``'s intrinsics, ``numpy_gather``'s popcount), written into each loop's
    source, so that a change of them (a new version of the package) names new loop files:
    numba's disk cache of a loop follows the loop's own file, not the functions compiled into
    it, so a loop built by an earlier version (the same predicate, the same source text)
    would otherwise run with that version's intrinsics for as long as the cache keeps it."""
    from ..backends import numpy_gather
    from . import numba_compress

    h = hashlib.sha1()
    for module in (numba_compress, numpy_gather):
        h.update(Path(module.__file__ or "").read_bytes())
    return h.hexdigest()[:16]


def generate_source(tp: TypedPredicate, output: str, cache: bool = True) -> str:
    """The Python source of the fused compaction loop ``compact_loop`` for ``tp``.

    Raises :class:`UnsupportedPredicate` if numba cannot compute the predicate exactly.
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")
    _Emitter.check_dtype(tp.dtype, "the input")
    if not tp.dtype.isnative:
        raise UnsupportedPredicate(f"non-native byte order {tp.dtype.str}")
    em = _Emitter(tp)
    for dt in em.param_dtypes:
        _Emitter.check_dtype(dt, "a parameter")
    cond = em.emit()
    params = [f"p{p.index}" for p in params_of(tp.expr)]
    args = ", ".join((*_SIGNATURES[output], *params))
    pred = "\n".join(
        f"                {line}"
        for line in (
            "x = a[s + j]",
            *em.lines,
            f"c = {cond}",
            "bits |= np.uint64(c) << np.uint64(j)",
        )
    )
    stores = "\n".join(f"                {line}" for line in _STORES[output])
    from .numba_compress import (  # numba's, when built
        COMPRESS_ITEMSIZES,
        HAVE_IOTA,
        IOTA_LANES,
        pack_lanes,
    )

    sparse_below, compress = SPARSE_BELOW, ""
    parts = []  # (running mean below which the set bits are visited, the compress of a block)
    lanes = pack_lanes(tp.dtype.itemsize)
    if output in ("values", "both") and tp.dtype.itemsize in COMPRESS_ITEMSIZES:
        # whole lanes read from a[s:] and written at out[k:]: within both, as k <= s and the
        # block is full
        parts.append((COMPRESS_FROM[tp.dtype.itemsize], f"""
            r = k
            for q in range({BLOCK // lanes}):
                w = (bits >> np.uint64({lanes} * q)) & np.uint64({(1 << lanes) - 1})
                compress_store(out, r, a, s + {lanes} * q, w)
                r += popcount(w)"""))
    if HAVE_IOTA and (output == "indices" or (output == "both" and parts)):
        il = IOTA_LANES
        parts.append((INDICES_COMPRESS_FROM, f"""
            r = k
            for q in range({BLOCK // il}):
                w = (bits >> np.uint64({il} * q)) & np.uint64({(1 << il) - 1})
                compress_iota(idx, r, base + s + {il} * q, w)
                r += popcount(w)"""))
    if parts:
        sparse_below = max(below for below, _ in parts)
        compress = f"""
        elif bits != 0 and m == {BLOCK}:{"".join(code for _, code in parts)}
            k = r"""
    helpers = "".join(em.helpers.values()).replace("cache=CACHE", f"cache={cache}")
    # Two passes per block of 64: the predicate into a bitmask (no stores, so the loads run
    # ahead freely), then an unconditional store of every element at k with k advanced by its
    # bit. Storing in the same loop as the loads makes each store address wait for a compare
    # and runs ~2.5x slower at p = 0.05..0.5 (measured); blocks with no hit skip the stores.
    # The bits are consumed by shifting the word one place per element, not by a shift of j
    # places: 4-12% faster for every dtype, output and p on the 2-core CI machine (2^24).
    # While the running mean of hits per block is under SPARSE_BELOW, a block stores only
    # its hits (see there).
    return f"""# Generated by dask_compact.codegen.numba_loop; do not edit.
# predicate: {to_source(tp.expr)} on {tp.dtype}, output={output}, key={tp.key}
# helpers: {helpers_digest()}
import math

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from dask_compact.backends.numpy_gather import popcount
from dask_compact.codegen.numba_compress import compress_iota, compress_store
{helpers}

@njit(nogil=True, cache={cache}, error_model="numpy", boundscheck=False)
def compact_loop({args}):
    n = a.shape[0]
    k = 0
    s = 0
    hits = 0  # 8 x the running mean of selected rows per block
    while s < n:
        m = min({BLOCK}, n - s)
        bits = np.uint64(0)
        if m == {BLOCK}:
            for j in range({BLOCK}):
{pred}
        else:
            for j in range(m):
{pred}
        hits = hits - (hits >> 3) + popcount(bits)
        if bits != 0 and hits < {8 * sparse_below}:
            while bits != 0:
                j = np.int64(trailing_zeros(bits))
{stores}
                k += 1
                bits &= bits - np.uint64(1){compress}
        elif bits != 0:
            for j in range(m):
{stores}
                k += np.int64(bits & np.uint64(1))
                bits >>= np.uint64(1)
        s += {BLOCK}
    return k
"""


@dataclass
class CompiledLoop:
    """A compiled loop: ``loop(flat, out, idx, base, params) -> count`` (unused arrays None)."""

    func: Callable[..., int]
    output: str
    source: str
    path: str | None  # the file numba caches it under, or None (compiled without disk cache)
    specializations: list = field(default_factory=list)
    module: str | None = None  # its entry in sys.modules, dropped with it from the cache

    def __call__(
        self, flat: np.ndarray, out: np.ndarray | None, idx: np.ndarray | None, base: int,
        params: tuple,
    ) -> int:  # fmt: skip
        try:
            return self._run(flat, out, idx, base, params)
        except Exception as e:  # a specialization loaded at the call (a read-only array)
            if self.path is None or not damaged_cache(e):
                raise
            drop_damaged_cache(self.path, e)
            return self._run(flat, out, idx, base, params)

    def _run(self, flat: np.ndarray, out: np.ndarray | None, idx: np.ndarray | None,
             base: int, params: tuple) -> int:
        if self.output == "values":
            return self.func(flat, out, *params)
        if self.output == "indices":
            return self.func(flat, idx, np.int64(base), *params)
        return self.func(flat, out, idx, np.int64(base), *params)


# numba's cache code: an error of the kinds that reading damaged bytes gives, raised through
# it, is a cache file it could not load. A damaged file gives many: truncated,
# UnpicklingError ("pickle data was truncated") or EOFError; random bytes, UnpicklingError
# ("invalid load key"), ValueError ("unsupported pickle protocol"), now and then MemoryError (a
# length field of billions), and others from what the bytes happen to name; a damaged middle,
# UnicodeDecodeError. Until 2026-11-30 these went to the caller, in every later process, with
# nothing rebuilding the file (a new-user probe: an interrupted copy of ~/.cache).
_NUMBA_CACHING = os.path.join("numba", "core", "caching.py")
# Not these, which are about this process, not the file: an OSError (a cache directory numba
# cannot write), and AttributeError, ImportError, NotImplementedError... from numba's modules
# left half imported by an interrupt (2026-11-30, a new-user probe: Ctrl-C in the first call's
# import of numba, then `module 'numba' has no attribute 'core'` through caching.py removed
# sound cache files, and the compile again failed all the same).
_DAMAGE = (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
           OverflowError, MemoryError)


def damaged_cache(error: BaseException) -> bool:
    """Whether ``error`` came from numba loading a damaged cache file."""
    if not isinstance(error, _DAMAGE):
        return False
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.endswith(_NUMBA_CACHING):
            return True
        tb = tb.tb_next
    return False


def cache_files(path: str) -> list[Path]:
    """numba's cache files (index and data) of the loop whose source file is ``path``."""
    source = Path(path)
    return sorted((source.parent / "__pycache__").glob(f"{source.stem}.*.nb[ic]"))


def drop_damaged_cache(path: str, error: BaseException) -> None:
    """Remove the numba cache files of the loop at ``path`` that could not be loaded, with a
    warning naming them; the caller compiles again (numba then writes them anew)."""
    files = cache_files(path)
    for f in files:
        try:
            f.unlink()
        except FileNotFoundError:
            pass  # another process dropped it first
    warnings.warn(
        f"dask_compact: numba's cache of a compiled loop could not be loaded "
        f"({type(error).__name__}: {error}); removed the damaged cache "
        f"{', '.join(str(f) for f in files) or 'files'} and compiled it again. If this "
        f"repeats, clear the cache: dask_compact.clear_cache(disk=True).",
        RuntimeWarning, stacklevel=3,
    )


def jit_disabled() -> bool:
    """Whether numba runs its ``njit`` functions as plain Python (``NUMBA_DISABLE_JIT``)."""
    from numba.core import config

    return bool(getattr(config, "DISABLE_JIT", 0))


def compile_loop(func: Any, signature: tuple, path: str | None) -> None:
    """``func.compile(signature)``, loading numba's cache of it; a damaged cache file is
    dropped and the loop compiled again (:func:`drop_damaged_cache`).

    With numba's JIT disabled (``NUMBA_DISABLE_JIT=1``, read at numba's import) ``njit`` gives
    back the plain Python function, which has no ``compile``: raises
    :class:`UnsupportedPredicate`, so the caller takes the NumPy mask path (right answers,
    vectorised; the loop run as Python would be far slower). Until 2026-11-30 every compiled
    call failed with ``'function' object has no attribute 'compile'`` (a new-user probe)."""
    if jit_disabled():
        raise UnsupportedPredicate("numba's JIT is disabled (NUMBA_DISABLE_JIT)")
    try:
        func.compile(signature)
    except Exception as e:
        if path is None or not damaged_cache(e):
            raise
        drop_damaged_cache(path, e)
        func.compile(signature)


def _forget(key: tuple[str, str], loop: CompiledLoop | UnsupportedPredicate) -> None:
    """An evicted loop's module goes too, once nothing holds the loop (:func:`_sweep`); a
    kept loop (:data:`_kept`) stays."""
    if _kept.get(key) is loop:
        return
    if isinstance(loop, CompiledLoop) and loop.module is not None:
        _retired.append((weakref.ref(loop), loop.module))
    # under _loops.lock (an eviction is a put's): the sweep only where no build is under way
    # in another thread (the lock order is _build_lock, then _loops.lock); else that build's
    # thread, or the next build, sweeps
    if _build_lock.acquire(blocking=False):
        try:
            _sweep_held()
        finally:
            _build_lock.release()


# Evicted loops whose module waits for its last holder: (a weak reference to the loop, the
# module's name). A loop's module is dropped from sys.modules and its namespace emptied (the
# dispatchers and the namespace refer to each other through ``__globals__``, a cycle the
# garbage collector does not free: numba's dispatcher type does not take part in it), but only
# when no task holds the loop: a held loop still compiles a new specialization at its call (a
# read-only array: _build compiles the writeable signature only), which imports the module by
# name and types the function with its globals. Until 2026-11-30 eviction emptied the module at
# once, and clear_cache() from one thread failed the calls of others on read-only arrays
# (ModuleNotFoundError for the module; with the disk cache removed, NameError for `np`).
_retired: list[tuple[weakref.ref, str]] = []
# Modules imported by a build that then failed (numba's cache save raised, the loop compiled
# in memory instead; or the compile refused): no loop refers to them. Dropped by the next
# sweep unless a live loop shares one. Until 2026-12-01 they stayed in sys.modules for the
# process's life, and a later build of the same source took the module up again, its
# dispatcher bound to the old file and cache directory: after DASK_COMPACT_CACHE_DIR
# changed, nothing was imported or cached in the new directory (the cache tests failed in
# the reverse order).
_failed: set[str] = set()


# Builds and sweeps, one at a time: a build (the only thing that takes a module from
# sys.modules again) must not meet a sweep dropping that module. Lookups take _loops.lock
# alone, so a thread calling a compiled loop no longer waits for another thread's build
# (0.5-1 s): until 2026-12-02 (eighteenth session) builds held _loops.lock throughout.
# Lock order: a loop's compile lock (one_compile_at_a_time), _build_lock, _loops.lock.
_build_lock = threading.RLock()


def _fresh_build_lock() -> None:
    """In a forked child, ``_build_lock`` anew: one another thread of the parent held at the
    fork (its build, a second or so) stays held in the child, where no thread will release
    it. Until 2026-12-02 (eighteenth session, a lock review) such a child's first build of a
    loop waited for ever (the BoundedCache locks: cache._fresh_locks)."""
    global _build_lock
    _build_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_build_lock)


def _sweep() -> None:
    """Drop the modules of evicted loops nothing holds any more, except those a loop in the
    cache (built again from the same source), a kept loop or a loop still held uses."""
    with _build_lock:
        _sweep_held()


def _sweep_held() -> None:
    """:func:`_sweep`, ``_build_lock`` held."""
    with _loops.lock:
        live = {v.module for v in _loops.values() if isinstance(v, CompiledLoop)}
        live |= {v.module for v in _kept.values()}
        live |= {name for ref, name in _retired if ref() is not None}
        gone = ({name for ref, name in _retired if ref() is None} | _failed) - live
        _retired[:] = [(ref, name) for ref, name in _retired if ref() is not None]
        _failed.clear()  # those live go with the loop that uses them
        for name in gone:
            module = sys.modules.pop(name, None)
            if module is not None:
                module.__dict__.clear()


# Every (TypedPredicate.key, output) whose loop this process built, and the loops built a
# second time (their structure came back after its loop was evicted): those are kept for the
# process's life, beside the LRU. Numba never unloads machine code, so an evicted loop's code
# stays, and each build loaded a new copy: until 2026-11-30 a process cycling through more
# structures than ``memory-entries`` built one at every call and grew without bound (a
# new-user probe: 8 structures with 4 kept, 48 ms and +32 kB a call from numba's disk cache;
# 0.4-1.1 s and +1.2 MB where the disk cache could not hold the loops). Now such a cycle
# builds each loop at most twice, and memory grows only with the distinct structures ever
# built. A structure seen once is still evicted, which frees most of its loop (what stays:
# ~0.1 MB of a loop loaded from the disk cache, ~1.7 MB of a compiled one; design.md,
# "Caches"); clear_cache() empties both.
_built: set[tuple[str, str]] = set()
_kept: dict[tuple[str, str], CompiledLoop] = {}


def _clear_kept() -> None:
    """At clear_cache(), before ``_loops`` evicts its entries: the kept loops go as evicted
    ones do (those out of the LRU too)."""
    for loop in _kept.values():
        if loop.module is not None:
            _retired.append((weakref.ref(loop), loop.module))
    _kept.clear()
    _built.clear()


# (TypedPredicate.key, output) -> the loop, or the reason there is none (also worth keeping).
_loops: BoundedCache[tuple[str, str], CompiledLoop | UnsupportedPredicate] = BoundedCache(
    "numba loops", _forget, _clear_kept
)
_stats = {"builds": 0, "hits": 0, "unsupported": 0}


def cache_info() -> dict[str, int]:
    """Counters of the in-process loop cache: builds (code generations), hits, unsupported,
    loops held (in the LRU), loops kept for good (:data:`_kept`), evictions, and numba
    specializations compiled (a new one means numba recompiled)."""
    with _loops.lock:
        compiled = [v for v in _loops.values() if isinstance(v, CompiledLoop)]
        return {
            **_stats,
            "loops": len(compiled),
            "kept": len(_kept),
            "evictions": _loops.evictions,
            "specializations": sum(len(getattr(v.func, "signatures", ())) for v in compiled),
        }


def _group(file_name: str) -> str:
    """A loop's files on disk share its name's stem: ``loop_<digest>.py`` and numba's
    ``__pycache__/loop_<digest>.compact_loop-*.nbi/.nbc``."""
    return file_name.split(".", 1)[0]


def _digest(source: str) -> str:
    """The name of a loop's files: ``loop_<digest>.py`` (and its module's)."""
    return hashlib.sha1(source.encode()).hexdigest()[:24]


# How long a build waits for another process's compile of the same loop before it compiles
# the loop itself (a stopped or very slow process holds the lock: no build waits for ever).
LOCK_WAIT_S = 120.0


# The fds of the locks one_compile_at_a_time holds now (by the id of its block's token): a
# forked child closes them (_forget_inherited_locks). A flock belongs to the open file, which
# a fork shares: until 2026-12-02 (seventeenth session, a regression review) a process forked
# during a compile (another thread's fork-started pool) held the lock for its whole life, and
# every later build of that loop on the host, a load of the compiled loop too, waited
# LOCK_WAIT_S.
_lock_fds: dict[int, int] = {}


def _forget_inherited_locks() -> None:
    for fd in _lock_fds.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    _lock_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_locks)


@contextlib.contextmanager
def one_compile_at_a_time(directory: Path, digest: str) -> Iterator[None]:
    """Inside, no other process compiles the loop ``digest`` into ``directory``: an exclusive
    ``flock`` on ``loop_<digest>.lock`` there, so a process that needs a loop another is
    compiling waits for it and then loads it from numba's disk cache (10-20 ms) instead of
    compiling it too (0.5-1 s of CPU). Until 2026-12-02 (sixteenth session, CI time) every
    worker of a host that met a new predicate at the same moment compiled it: n workers, n
    compiles. Without ``fcntl``, or where the lock file cannot be made (a read-only
    directory: the build then compiles in memory anyway), or after :data:`LOCK_WAIT_S`, the
    build goes on unlocked, as before: the lock saves work, it guards nothing (numba's own
    saves are atomic). In-process builds are one at a time (``_build_lock``, taken after
    this lock: :func:`_found_or_built`; a record loop's per key). The lock file belongs to
    the loop's files (trimmed and cleared with them)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / f"loop_{digest}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    token = object()
    _lock_fds[id(token)] = fd
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # a Ctrl-C held meanwhile (numba_held) ends the wait: until 2026-12-02
                # (seventeenth session, a regression review) it waited out LOCK_WAIT_S,
                # deaf to Ctrl-C, behind a process stopped mid-compile (Ctrl-Z)
                if time.monotonic() > deadline or held_signal():
                    break  # compiled here too, unlocked
                time.sleep(0.01)
            except OSError:  # a file system without locks
                break
        yield
    finally:
        if _lock_fds.pop(id(token), None) is not None:  # not closed at a fork (a child's)
            os.close(fd)  # releases the lock


def _load_from_file(source: str, directory: Path) -> tuple[Callable[..., int], str, str, bool]:
    """Write ``source`` (once; numba's cache checks the file's mtime) and import it.

    Returns the function, the file, the module name and whether the file was new. A file
    another process removes between the write and the import (trimming or clearing a shared
    cache) is written again; lost twice, :class:`FileNotFoundError` (the caller compiles in
    memory)."""
    digest = _digest(source)
    path = directory / f"loop_{digest}.py"
    directory.mkdir(parents=True, exist_ok=True)
    new = _write_source(path, source)
    name = f"_dask_compact_loop_{digest}"
    module = sys.modules.get(name)
    if module is None:
        try:
            module = _import(name, path)
        except Exception:
            # Lost meanwhile: numba's decorator finds no file to cache for ("cannot cache
            # function 'compact_loop': no locator available for file", a RuntimeError), or the
            # import none to read. Until 2026-11-30 that went to the caller (a new-user probe:
            # processes sharing a cache directory, one of them trimming).
            if path.exists():
                raise
            new = _write_source(path, source) or new
            try:
                module = _import(name, path)
            except Exception as again:
                if path.exists():
                    raise
                raise FileNotFoundError(
                    errno.ENOENT, "the generated loop was removed while imported", str(path)
                ) from again
    return module.compact_loop, str(path), name, new


def _write_source(path: Path, source: str) -> bool:
    """Write ``source`` to ``path`` unless it holds it; whether it was written."""
    try:
        if path.read_text() == source:
            return False
    except FileNotFoundError:
        pass
    # Atomic: other processes (dask workers) may import the same file concurrently. The
    # temporary file is named after the loop, so trim and clear_cache know it as ours.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def _import(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def _load_in_memory(source: str, key: str) -> Callable[..., int]:
    namespace: dict[str, Any] = {}
    code = compile(source, f"<dask_compact loop {key}>", "exec")
    exec(code, namespace)  # noqa: S102 - our generated code
    return namespace["compact_loop"]


def _numba_signature(tp: TypedPredicate, output: str) -> tuple:
    from numba import from_dtype, types

    arr = types.Array(from_dtype(tp.dtype), 1, "C")
    idx = types.Array(types.int64, 1, "C")
    head = {
        "values": (arr, arr),
        "indices": (arr, idx, types.int64),
        "both": (arr, arr, idx, types.int64),
    }
    return (*head[output], *[from_dtype(dt) for dt in param_dtypes(tp.expr, tp.types)])


def numba_held() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C held while numba is imported and compiles (main thread; raised as the block
    ends). An interrupt there leaves numba half imported or its registries half installed for
    the rest of the process: 2026-11-30, a new-user probe: Ctrl-C during the first call, then
    every compiled loop failed (`module 'numba' has no attribute 'core'`, `No definition for
    lowering <built-in function lt>(int64, int64)`) until the interpreter restarted. The wait:
    the compile's time, a second or so."""
    return deferred(signal.SIGINT)


def _build_held(tp: TypedPredicate, output: str, source: str, directory: Path) -> CompiledLoop:
    """The loop of ``source`` (``generate_source(tp, output)``) written to ``directory``,
    imported and compiled: inside :func:`numba_held`, under ``_build_lock`` and the loop's
    :func:`one_compile_at_a_time` (:func:`_found_or_built` takes them)."""
    signature = _numba_signature(tp, output)
    try:
        func, path, module, new_file = _load_from_file(source, directory)
        try:
            _compile(func, signature, path)
        except Exception:
            _failed.add(module)  # no loop will use it (see _failed)
            raise
    except OSError as e:
        # Read-only home, full disk (numba's cache save: ENOSPC), a file another process
        # trimmed away (numba's rename of its temporary file: FileNotFoundError): compiled
        # in memory, without numba's disk cache. Until 2026-11-30 the last two failed the
        # call (a new-user probe).
        _without_disk_cache(directory, e)
        source = generate_source(tp, output, cache=False)
        func = _load_in_memory(source, tp.key)
        _compile(func, signature, None)
        return CompiledLoop(func, output, source, None)
    if new_file:
        trim_grown(directory)
    return CompiledLoop(func, output, source, path, module=module)


def trim_grown(directory: Path) -> None:
    """The cache directory, just grown by a new loop (the newest), trimmed to its cap. The
    record loops' builds call it too: until 2026-12-01 (fourteenth session, a long-running
    probe) only this module's did, so a process building record loops alone (a worker of
    record jobs) grew the directory past ``disk-bytes`` without bound."""
    try:
        trim(directory, disk_bytes(), _group)
    except OSError as e:
        logger.debug("dask_compact cache dir %s not trimmed: %s", directory, e)


def _compile(func: Any, signature: tuple, path: str | None) -> None:
    """:func:`compile_loop`; a typing problem is :class:`UnsupportedPredicate` (the mask
    path), an :class:`OSError` of numba's cache inside it (a helper's save) the OSError."""
    from numba.core.errors import NumbaError

    try:
        # Compile now for the signature the backend calls with, so a typing problem shows up
        # here (and falls back to the mask path) rather than inside a running task.
        compile_loop(func, signature, path)
    except NumbaError as e:
        cause = _os_error(e)
        if cause is not None:
            raise cause from None
        first = str(e).splitlines()[0]
        raise UnsupportedPredicate(f"numba could not compile the loop: {first}") from None


def _os_error(error: BaseException) -> OSError | None:
    """The :class:`OSError` that ``error`` was raised from, if any."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


# The cache directories this process warned about (once each: every build would repeat it).
_warned: set[str] = set()


def _without_disk_cache(directory: Path, error: OSError) -> None:
    """Say once per process and directory that loops are compiled without the disk cache,
    unless a file was merely lost to another process sharing the directory (it goes on)."""
    lost = isinstance(error, FileNotFoundError) and directory.is_dir()
    if lost or str(directory) in _warned:
        logger.debug("dask_compact: compiled in memory, no disk cache in %s (%s)", directory,
                     error)
        return
    _warned.add(str(directory))
    warnings.warn(
        f"dask_compact: the cache directory {directory} cannot be used "
        f"({type(error).__name__}: {error}); compiled loops are kept in memory only, so each "
        f"process compiles them again (a second or so each). Point DASK_COMPACT_CACHE_DIR at "
        f"a writable directory with free space.",
        RuntimeWarning, stacklevel=5,
    )


def fused_loop(tp: TypedPredicate, output: str) -> CompiledLoop:
    """The compiled loop for ``tp`` and ``output``, built once per process and key while
    the bounded cache keeps it, at most twice in all (:data:`_kept`).

    Raises :class:`UnsupportedPredicate` (also cached) when the loop cannot match NumPy, and
    (not cached: the room may come later) on a worker without the memory to load numba
    (:func:`.compiler_room.no_room_for_compiler`), so the caller takes the NumPy mask path.
    """
    key = (tp.key, output)
    hit = _found(key)
    if hit is None:
        no_room = no_room_for_compiler()  # a dict lookup once numba is loaded
        if no_room is not None:
            raise UnsupportedPredicate(no_room)
        with numba_held():  # generate_source imports numba; the loop's module and compile use it
            hit = _found_or_built(tp, output, key)
    if isinstance(hit, UnsupportedPredicate):
        raise hit
    return hit


def _found(key: tuple[str, str]) -> CompiledLoop | UnsupportedPredicate | None:
    """``key``'s loop (or reason) in the cache, or kept (then back in the LRU), counted as a
    hit; None if this process has none."""
    with _loops.lock:
        hit = _loops.get(key)
        if hit is None:
            hit = _kept.get(key)
            if hit is not None:  # a kept loop, back in the LRU
                _loops.put(key, hit)
        if hit is not None:
            _stats["hits"] += 1
        return hit


def _found_or_built(tp: TypedPredicate, output: str, key: tuple[str, str]
                    ) -> CompiledLoop | UnsupportedPredicate:
    """``key``'s loop, built unless another thread built it meanwhile (inside numba_held).

    Another process's compile of the loop is waited for (:func:`one_compile_at_a_time`, up to
    :data:`LOCK_WAIT_S`) before ``_build_lock`` is taken, which the build then holds: until
    2026-12-02 (seventeenth session, a regression review) the wait was inside the lock, and
    every other thread's call of an already compiled loop, looked up under it, stalled for
    the whole wait (measured: 19.5 s with the wait set to 20 s). Two threads building the
    same loop still build it once: the second waits for the first's lock (its own open file,
    so the flock excludes it too), then finds the loop."""
    try:
        source: str | None = generate_source(tp, output, cache=True)
    except UnsupportedPredicate as e:
        source, refused = None, e
    directory = cache_dir()
    locked = (contextlib.nullcontext() if source is None
              else one_compile_at_a_time(directory, _digest(source)))
    with locked, _build_lock:
        hit = _found(key)  # built by another thread meanwhile
        if hit is not None:
            return hit
        _sweep_held()  # the modules of evicted loops let go of since the last eviction
        try:
            if source is None:
                raise refused
            hit = _build_held(tp, output, source, directory)
            logger.debug("compiled fused loop %s for %s", key, to_source(tp.expr))
            with _loops.lock:
                _stats["builds"] += 1
                if key in _built:  # back after its eviction: kept (see _kept)
                    _kept[key] = hit
                _built.add(key)
        except UnsupportedPredicate as e:
            hit = e
            with _loops.lock:
                _stats["unsupported"] += 1
        _loops.put(key, hit)
        return hit


# What else in this process holds loops (``backends.numpy_calls``' kept calls register their
# cache's clear): emptied with the loops by :func:`clear_cache`, so that a test's "new
# process" finds no loop through them.
_holders: list[Callable[[], None]] = []


def holds_loops(clear: Callable[[], None]) -> None:
    """Have :func:`clear_cache` call ``clear``: it forgets loops its caller holds."""
    _holders.append(clear)


def clear_cache() -> None:
    """Forget the in-process loops and counters (the disk cache stays); for tests."""
    for clear in _holders:
        clear()
    with _loops.lock:
        _loops.clear()
        for k in _stats:
            _stats[k] = 0


__all__ += ["clear_cache", "holds_loops"]
