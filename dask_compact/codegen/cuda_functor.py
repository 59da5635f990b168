"""A typed predicate tree becomes a CUDA C++ functor, inlined into the compaction kernels.

The functor is the only CUDA text built in Python, and it is small: one ``struct`` whose data
members are the predicate's constants (kernel arguments, so a new threshold reuses the compiled
kernel) and whose ``operator()`` evaluates the tree on one element in SSA form. Every argument is
cast to the loop dtype NumPy resolves for its call
(:func:`~dask_compact.predicate.expr.infer_types`) and every call is one function of
``kernels/npy_ops.cuh``, which implements NumPy's semantics for that loop (integer wrap-around
and division by zero, float16 rounded per operation, NaN rules of comparisons and
minimum/maximum, complex ordering). Nothing a user wrote reaches the source: only node kinds
from a whitelist, dtype names from a fixed table, and integers.

Calls the CUDA side has no NumPy-exact version of (complex transcendentals, complex sign/power,
...) raise :class:`CodegenUnsupported`; the backend then evaluates the predicate as a mask.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from ..predicate.core import TypedPredicate
from ..predicate.expr import Call, Node, Param, Var, param_dtypes, params_of, walk

__all__ = [
    "CodegenUnsupported", "CudaFunctor", "DIVMOD_CALLS", "ctype", "generate_functor",
    "generate_record_functor", "calls_float_divmod",
]  # fmt: skip


class CodegenUnsupported(NotImplementedError):
    """The predicate (or one of its calls at these dtypes) has no compiled CUDA form."""


# NumPy dtype -> device storage type (kernels/dcx_types.cuh). Sizes and alignments equal the
# itemsize, as CuPy packs NumPy scalar kernel arguments.
_CTYPES: dict[str, str] = {
    "b1": "bool",
    "i1": "signed char",
    "i2": "short",
    "i4": "int",
    "i8": "long long",
    "u1": "unsigned char",
    "u2": "unsigned short",
    "u4": "unsigned int",
    "u8": "unsigned long long",
    "f2": "dcx::half_t",
    "f4": "float",
    "f8": "double",
    "c8": "dcx::cfloat",
    "c16": "dcx::cdouble",
}

# Calls with no complex loop on the device (NumPy has one, but not a simple exact one here).
_NO_COMPLEX = frozenset(
    {
        "sqrt", "exp", "log", "log2", "log10", "sin", "cos", "tan", "rint", "sign", "power",
        "reciprocal",
        "floor_divide", "remainder", "floor", "ceil", "trunc", "signbit",
    }
)
# Calls that exist only on integer/bool loops in NumPy; guard against surprises in typing.
_INT_ONLY = frozenset(
    {"bitwise_and", "bitwise_or", "bitwise_xor", "invert", "left_shift", "right_shift"}
)
# Calls that reach NumPy's float divmod in kernels/npy_ops.cuh (its out-of-line fdivmod_pair,
# dmod, smod) on float loops: each unrolled item of a tile makes a real call, whose live state
# decides the tile shape of 8-byte types (cupy_tuning.DIVMOD_TABLE). power's out-of-line dpow
# is not here: at that shape float64 `x ** 1.5 < 3` ran 5-15% slower, not faster.
DIVMOD_CALLS = frozenset({"floor_divide", "remainder"})


def ctype(dtype: np.dtype | str) -> str:
    """The device type of a NumPy dtype; CodegenUnsupported for any other dtype."""
    dt = np.dtype(dtype)
    key = f"{dt.kind}{dt.itemsize}"
    if dt.byteorder == ">" or key not in _CTYPES:
        raise CodegenUnsupported(f"dtype {dt} has no device type")
    return _CTYPES[key]


@dataclass(frozen=True)
class CudaFunctor:
    """Generated source of one predicate for one input dtype."""

    name: str  # the struct's name, a template argument of the kernels
    source: str  # the struct definition (needs kernels/npy_ops.cuh before it)
    input_ctype: str
    param_ctypes: tuple[str, ...]  # types of the data members, in kernel-argument order
    param_dtypes: tuple[np.dtype, ...]
    # whether operator() calls NumPy's float divmod (DIVMOD_CALLS on a float loop)
    float_divmod: bool = False


def calls_float_divmod(tp: TypedPredicate) -> bool:
    """Whether ``tp``'s functor calls NumPy's float divmod (``%`` or ``//`` of floats)."""
    return any(
        isinstance(node, Call) and node.fn in DIVMOD_CALLS
        and any(np.dtype(d).kind == "f" for d in tp.types[node].loop)
        for node in walk(tp.expr)
    )


def functor_name(key: str) -> str:
    """A C identifier for a TypedPredicate key (structure hash + dtype string)."""
    tr = {"<": "L", ">": "B", "|": "N", "=": "E", "-": "_"}
    return "dcx_pred_" + re.sub(r"[^0-9A-Za-z_]", "x", "".join(tr.get(c, c) for c in key))


def _emit(
    tp: TypedPredicate, var: dict[Node, tuple[str, np.dtype]]
) -> tuple[list[str], str, tuple[np.dtype, ...], dict[int, str]]:
    """The SSA body of ``tp``'s tree: its lines, the boolean result, the constants' dtypes and
    device types. ``var`` names each variable (``x``, or a record field's loaded value)."""
    pdts = tuple(np.dtype(d) for d in param_dtypes(tp.expr, tp.types))
    pnodes = params_of(tp.expr)
    pc = {p.index: ctype(dt) for p, dt in zip(pnodes, pdts)}
    pdt = {p.index: dt for p, dt in zip(pnodes, pdts)}

    lines: list[str] = []
    names: dict[Node, tuple[str, np.dtype]] = {}

    def ref(node: Node) -> tuple[str, np.dtype]:
        if isinstance(node, Var):
            return var[node]
        if isinstance(node, Param):
            return f"p{int(node.index)}", pdt[node.index]
        return names[node]

    for node in walk(tp.expr):
        if not isinstance(node, Call) or node in names:
            continue
        typed = tp.types[node]
        for dt in (*typed.loop, typed.out):
            ctype(dt)  # every dtype of the call must have a device type
        if node.fn in _NO_COMPLEX and any(np.dtype(d).kind == "c" for d in typed.loop):
            raise CodegenUnsupported(f"np.{node.fn} of complex numbers is not compiled for GPUs")
        if node.fn in _INT_ONLY and any(np.dtype(d).kind in "fc" for d in typed.loop):
            raise CodegenUnsupported(f"np.{node.fn} on floats")
        args = []
        for a, loop_dt in zip(node.args, typed.loop):
            expr, dt = ref(a)
            same = np.dtype(dt) == np.dtype(loop_dt)
            args.append(expr if same else f"dcx::cast<{ctype(loop_dt)}>({expr})")
        fn = str(node.fn)
        if not fn.isidentifier():  # Call validates fn against the whitelist; belt and braces
            raise CodegenUnsupported(f"bad function name {fn!r}")
        out_c = ctype(typed.out)
        tmp = f"t{len(names)}"
        call = f"dcx::np::{fn}({', '.join(args)})"
        lines.append(f"    const {out_c} {tmp} = dcx::cast<{out_c}>({call});")
        names[node] = (tmp, np.dtype(typed.out))

    result, rdt = ref(tp.expr)
    if rdt != np.dtype(bool):
        result = f"dcx::cast<bool>({result})"
    return lines, result, pdts, pc


def _struct(what: str, name: str, members: str, arg: str, lines: list[str], result: str) -> str:
    """The functor's definition: data members, then ``operator()(arg)`` over the body lines."""
    body = "\n".join(lines)
    return (
        f"// {what}: generated by dask_compact.codegen.cuda_functor\n"
        f"struct {name} {{\n{members}"
        f"  __device__ __forceinline__ bool operator()({arg}) const {{\n"
        f"{body + chr(10) if body else ''}"
        f"    return {result};\n"
        f"  }}\n}};\n"
    )


def generate_functor(tp: TypedPredicate) -> CudaFunctor:
    """Generate the functor of ``tp``; raise CodegenUnsupported where the GPU has no exact form."""
    in_dt = np.dtype(tp.dtype)
    in_c = ctype(in_dt)
    lines, result, pdts, pc = _emit(tp, {Var(): ("x", in_dt)})
    pnodes = params_of(tp.expr)
    name = functor_name(tp.key)
    members = "".join(f"  {pc[p.index]} p{int(p.index)};\n" for p in pnodes)
    source = _struct(f"predicate {tp.key}", name, members, f"const {in_c}& x", lines, result)
    return CudaFunctor(
        name=name,
        source=source,
        input_ctype=in_c,
        param_ctypes=tuple(pc[p.index] for p in pnodes),
        param_dtypes=pdts,
        float_divmod=calls_float_divmod(tp),
    )


def generate_record_functor(tp: TypedPredicate) -> CudaFunctor:
    """The functor of a record predicate (``tp`` typed over FieldDtypes): members are a pointer
    per field it reads (sorted by name), then the constants; ``operator()(row)`` loads the
    fields' values of that row and evaluates the tree. ``param_ctypes`` lists every member's
    device type in that order (the flags kernel's argument types)."""
    assert isinstance(tp.dtype, tuple)
    var: dict[Node, tuple[str, np.dtype]] = {}
    loads, pointers = [], []
    for j, (name, dt) in enumerate(tp.dtype):
        c = ctype(dt)
        var[Var(name)] = (f"v{j}", np.dtype(dt))
        pointers.append(f"const {c}*")
        loads.append(f"    const {c} v{j} = f{j}[i];")
    lines, result, pdts, pc = _emit(tp, var)
    pnodes = params_of(tp.expr)
    # Field names are the user's text: they reach neither the name nor the comment (a hash of
    # the key does), and the loads use f0, v0, ... by sorted position.
    digest = hashlib.sha1(tp.key.encode()).hexdigest()[:20]
    name = f"dcx_rec_{digest}"
    members = "".join(f"  {ptr} f{j};\n" for j, ptr in enumerate(pointers))
    members += "".join(f"  {pc[p.index]} p{int(p.index)};\n" for p in pnodes)
    source = _struct(f"record predicate {digest}", name, members, "long long i", loads + lines,
                     result)
    return CudaFunctor(
        name=name,
        source=source,
        input_ctype="long long",
        param_ctypes=(*pointers, *(pc[p.index] for p in pnodes)),
        param_dtypes=pdts,
        float_divmod=calls_float_divmod(tp),
    )
