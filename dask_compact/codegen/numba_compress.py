"""AVX-512's compress for the compiled CPU loops and gathers: the rows a mask selects out of 64,
32, 16 or 8 (1-, 2-, 4-, 8-byte units; int64 indices 8) packed side by side by one instruction
(``vpcompressb/w/d/q``).

A scalar loop stores one row at a time, each store's place depending on the one before; on the
2-core machine (Xeon, AVX-512) the gather of a float32 column of 2^24 rows took 16-27 ms at
p = 0.5-0.99 that way and 9.3-10.3 ms with the compress (``benchmarks/cpu_gather_sweep.py``).
Numba has no such function and LLVM no portable one that stays fast everywhere
(``llvm.masked.compressstore`` compresses to memory, which AMD's Zen 4 is reported to run
far slower than the register form), so the register form (``llvm.x86.avx512.mask.compress``)
is called through numba's ``intrinsic`` and its result stored whole: the caller leaves room
for every lane.

:data:`HAVE_COMPRESS` says whether the target numba compiles for has AVX-512F (the compress of
4- and 8-byte lanes), :data:`COMPRESS_ITEMSIZES` the element sizes served (1 and 2 bytes too,
64 or 32 lanes a step, where the target also has AVX512_VBMI2). The host's
features count, or ``NUMBA_CPU_FEATURES`` where it is set; another ``NUMBA_CPU_NAME`` (a
portable cache) or another architecture turns them off, and the loops keep their scalar forms.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

__all__ = [
    "COMPRESS_ITEMSIZES", "HAVE_COMPRESS", "compress_iota", "compress_store", "target_has",
]  # fmt: skip


def target_has(feature: str) -> bool:
    """Whether the CPU numba compiles for has ``feature`` (LLVM's name, e.g. ``avx512f``)."""
    features = getattr(config, "CPU_FEATURES", None)  # set at run time from the environment
    if features is not None:
        return f"+{feature}" in features.split(",")
    if getattr(config, "CPU_NAME", None) not in (None, "host"):
        return False
    try:
        from llvmlite import binding

        return bool(binding.get_host_cpu_features().get(feature, False))
    except Exception:  # noqa: BLE001 -- no feature map on this host: the scalar loops
        return False


HAVE_COMPRESS = target_has("avx512f")
# the element sizes (bytes) compress_store serves on this target
COMPRESS_ITEMSIZES: frozenset[int] = (
    frozenset() if not HAVE_COMPRESS
    else frozenset({1, 2, 4, 8}) if target_has("avx512vbmi2")
    else frozenset({4, 8})
)  # fmt: skip


def _bits_of(dtype: Any) -> int | None:
    """An element's bits (numba keeps a bool in a byte; Boolean has no bitwidth)."""
    return 8 if isinstance(dtype, types.Boolean) else getattr(dtype, "bitwidth", None)


def _compress_into(builder: Any, values: Any, mask: Any, dst_ptr: Any) -> None:
    """Store ``values`` (an LLVM vector of L lanes) compressed by the low L bits of ``mask``
    (an i64) at ``dst_ptr``, all L lanes written."""
    vec = values.type
    lanes, width = vec.count, vec.element.width
    bits = ir.VectorType(ir.IntType(1), lanes)
    if lanes < 64:
        mask = builder.trunc(mask, ir.IntType(lanes))
    keep = builder.bitcast(mask, bits)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec, [vec, vec, bits]),
        f"llvm.x86.avx512.mask.compress.v{lanes}i{width}",
    )
    packed = builder.call(fn, [values, ir.Constant(vec, None), keep])
    builder.store(packed, builder.bitcast(dst_ptr, vec.as_pointer()), align=width // 8)


@intrinsic
def compress_store(typingctx: Any, dst: Any, at: Any, src: Any, start: Any, mask: Any) -> Any:
    """``dst[at : at + L]`` = the rows of ``src[start : start + L]`` whose bit of ``mask`` is
    set, packed to the front, where L = 64 / itemsize lanes (64, 32, 16, 8 for 1-, 2-, 4-,
    8-byte arrays); the lanes after them are written too (garbage), so ``at + L <= len(dst)``
    and ``start + L <= len(src)`` are the caller's to ensure. Only for the element sizes of
    :data:`COMPRESS_ITEMSIZES`."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None
    width = _bits_of(dst.dtype)
    if width not in (8, 16, 32, 64) or _bits_of(src.dtype) != width:
        return None
    if dst.layout != "C" or src.layout != "C":  # whole lanes: contiguous arrays only
        return None
    lanes = 512 // width
    sig = types.void(dst, types.int64, src, types.int64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_at, s, s_at, m = args
        out = context.make_array(signature.args[0])(context, builder, d)
        inp = context.make_array(signature.args[2])(context, builder, s)
        vec = ir.VectorType(ir.IntType(width), lanes)
        src_ptr = builder.bitcast(builder.gep(inp.data, [s_at]), vec.as_pointer())
        values = builder.load(src_ptr, align=width // 8)
        _compress_into(builder, values, m, builder.gep(out.data, [d_at]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def compress_iota(typingctx: Any, dst: Any, at: Any, first: Any, mask: Any) -> Any:
    """``dst[at : at + 8]`` = those of ``first``, ``first + 1``, ..., ``first + 7`` whose bit
    of ``mask`` is set, packed to the front (int64 ``dst``; all 8 lanes written, so
    ``at + 8 <= len(dst)`` is the caller's to ensure). Only with :data:`HAVE_COMPRESS`."""
    if not (isinstance(dst, types.Array) and dst.dtype == types.int64 and dst.layout == "C"):
        return None
    sig = types.void(dst, types.int64, types.int64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_at, start, m = args
        out = context.make_array(signature.args[0])(context, builder, d)
        vec = ir.VectorType(ir.IntType(64), 8)
        zero = ir.Constant(vec, None)
        lane0 = builder.insert_element(zero, start, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(lane0, zero, ir.Constant(ir.VectorType(ir.IntType(32), 8),
                                                                [0] * 8))
        values = builder.add(splat, ir.Constant(vec, list(range(8))))
        _compress_into(builder, values, m, builder.gep(out.data, [d_at]))
        return context.get_dummy_value()

    return sig, codegen
