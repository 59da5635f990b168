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

Where the target has AVX2 but not AVX-512F (AMD's Zen 2 and 3, many laptops, and virtual
machines that hide AVX-512, as the 2-core CI machine's Zen 4 does), the same functions pack
4- and 8-byte units by AVX2's permute (``vpermd``) with a table of lane orders, 256 bits a
step (8 or 4 lanes), and 1- and 2-byte units by SSSE3's byte shuffle (``pshufb``), 8 lanes a
step (:data:`HAVE_PERMUTE`, :func:`pack_lanes`, :data:`IOTA_LANES`): the "left pack" of a
vector without a compress instruction.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic, register_jitable

__all__ = [
    "COMPRESS_ITEMSIZES", "HAVE_COMPRESS", "HAVE_PERMUTE", "HAVE_IOTA", "IOTA_LANES",
    "VECTOR_BYTES", "MAX_LANES", "compress_iota", "compress_store", "ctpop", "pack_lanes",
    "target_has",
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
# AVX2's permute (4- and 8-byte units) and SSSE3's byte shuffle (1- and 2-byte ones) stand in
# for the compress where AVX-512F is not
HAVE_PERMUTE = not HAVE_COMPRESS and target_has("avx2")
# the most bytes one compress_store reads and writes, and the most lanes it packs: its lanes
# for an element of s bytes are min(VECTOR_BYTES // s, MAX_LANES) (pack_lanes)
VECTOR_BYTES = 64 if HAVE_COMPRESS else 32
MAX_LANES = 64 if HAVE_COMPRESS else 8
# the element sizes (bytes) compress_store serves on this target
COMPRESS_ITEMSIZES: frozenset[int] = (
    frozenset({1, 2, 4, 8}) if (HAVE_COMPRESS and target_has("avx512vbmi2")) or HAVE_PERMUTE
    else frozenset({4, 8}) if HAVE_COMPRESS
    else frozenset()
)  # fmt: skip
# compress_iota on this target, and the int64 positions it packs a step
HAVE_IOTA = HAVE_COMPRESS or HAVE_PERMUTE
IOTA_LANES = 8 if HAVE_COMPRESS else 4


@register_jitable
def pack_lanes(itemsize: int) -> int:
    """The elements of ``itemsize`` bytes one compress_store packs on this target (callable
    from compiled code too: the gathers take their lanes from it)."""
    return min(VECTOR_BYTES // itemsize, MAX_LANES)


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


def _orders(lanes: int, parts: int, width: int) -> list[list[int]]:
    """For every mask of ``lanes`` bits, the indices (``width`` of them) of the shuffle that
    brings the selected lanes to the front, in order, each lane being ``parts`` consecutive
    shuffle elements: ``vpermd``'s 8 x 32-bit indices for 8 lanes of 4 bytes (parts 1) or 4
    of 8 bytes (parts 2), ``pshufb``'s 16 byte indices for 8 lanes of 1 or 2 bytes. The
    elements after them take index 0 (what they hold does not matter)."""
    orders = []
    for m in range(1 << lanes):
        kept = [lane for lane in range(lanes) if m >> lane & 1]
        order = [lane * parts + h for lane in kept for h in range(parts)]
        orders.append(order + [0] * (width - len(order)))
    return orders


def _table_entry(builder: Any, name: str, entry: Any, orders: list[list[int]],
                 mask: Any) -> Any:
    """Entry ``mask`` (its low log2(len(orders)) bits) of the module constant ``name``: a
    table of vectors of type ``entry``, one per mask, made in the module at its first use."""
    table_type = ir.ArrayType(entry, len(orders))
    table = builder.module.globals.get(name)
    if table is None:
        table = ir.GlobalVariable(builder.module, table_type, name)
        table.linkage = "internal"
        table.global_constant = True
        table.align = entry.count * entry.element.width // 8
        table.initializer = ir.Constant(table_type, [ir.Constant(entry, o) for o in orders])
    i64 = ir.IntType(64)
    index = builder.and_(mask, ir.Constant(i64, len(orders) - 1))
    return builder.load(builder.gep(table, [ir.Constant(i64, 0), index]), align=table.align)


def _permute_into(builder: Any, values: Any, mask: Any, dst_ptr: Any) -> None:
    """:func:`_compress_into` by AVX2: ``values`` (256 bits: 8 x i32 or 4 x i64) permuted by the
    table entry of ``mask``'s low lanes bits (a module constant: 8 KiB for 8 lanes, 512 bytes
    for 4), all lanes stored."""
    vec = values.type
    lanes = vec.count
    i32x8 = ir.VectorType(ir.IntType(32), 8)
    order = _table_entry(builder, f"dask_compact_lane_orders_{lanes}", i32x8,
                         _orders(lanes, 8 // lanes, 8), mask)
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(i32x8, [i32x8, i32x8]), "llvm.x86.avx2.permd")
    packed = builder.call(fn, [builder.bitcast(values, i32x8), order])
    builder.store(builder.bitcast(packed, vec), builder.bitcast(dst_ptr, vec.as_pointer()),
                  align=vec.element.width // 8)


def _shuffle_into(builder: Any, values: Any, mask: Any, dst_ptr: Any) -> None:
    """:func:`_compress_into` of 8 lanes of 1 or 2 bytes (64 or 128 bits) by SSSE3's
    ``pshufb`` with the table entry of ``mask``'s low 8 bits (4 KiB), all lanes stored."""
    vec = values.type
    lanes, unit = vec.count, vec.element.width // 8
    i8x16 = ir.VectorType(ir.IntType(8), 16)
    i32 = ir.IntType(32)
    order = _table_entry(builder, f"dask_compact_byte_orders_{lanes}x{unit}", i8x16,
                         _orders(lanes, unit, 16), mask)
    if lanes * unit == 16:
        wide = builder.bitcast(values, i8x16)
    else:  # 8 bytes: widened to 16 (the upper half unused), narrowed back after the shuffle
        wide = builder.shuffle_vector(
            values, ir.Constant(vec, None), ir.Constant(ir.VectorType(i32, 16), list(range(16))))
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(i8x16, [i8x16, i8x16]), "llvm.x86.ssse3.pshuf.b.128")
    packed = builder.call(fn, [wide, order])
    if lanes * unit == 16:
        packed = builder.bitcast(packed, vec)
    else:
        packed = builder.shuffle_vector(
            packed, ir.Constant(i8x16, None), ir.Constant(ir.VectorType(i32, lanes),
                                                          list(range(lanes))))
    builder.store(packed, builder.bitcast(dst_ptr, vec.as_pointer()), align=unit)


def _pack_into(builder: Any, values: Any, mask: Any, dst_ptr: Any) -> None:
    """The target's packing of ``values`` by ``mask`` to ``dst_ptr``: the compress, the
    permute (4- and 8-byte lanes) or the byte shuffle (1- and 2-byte lanes)."""
    if HAVE_COMPRESS:
        _compress_into(builder, values, mask, dst_ptr)
    elif values.type.element.width >= 32:
        _permute_into(builder, values, mask, dst_ptr)
    else:
        _shuffle_into(builder, values, mask, dst_ptr)


@intrinsic
def compress_store(typingctx: Any, dst: Any, at: Any, src: Any, start: Any, mask: Any) -> Any:
    """``dst[at : at + L]`` = the rows of ``src[start : start + L]`` whose bit of ``mask`` is
    set, packed to the front, where L = pack_lanes(itemsize) lanes (with AVX-512 64, 32, 16,
    8 for 1-, 2-, 4-, 8-byte arrays; with AVX2 8, 8, 8, 4);
    the lanes after them are written too (garbage), so ``at + L <= len(dst)`` and
    ``start + L <= len(src)`` are the caller's to ensure. Only for the element sizes of
    :data:`COMPRESS_ITEMSIZES`."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)):
        return None
    width = _bits_of(dst.dtype)
    if width not in (8, 16, 32, 64) or _bits_of(src.dtype) != width:
        return None
    if dst.layout != "C" or src.layout != "C":  # whole lanes: contiguous arrays only
        return None
    if width // 8 not in COMPRESS_ITEMSIZES:
        return None
    lanes = pack_lanes(width // 8)
    sig = types.void(dst, types.int64, src, types.int64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_at, s, s_at, m = args
        out = context.make_array(signature.args[0])(context, builder, d)
        inp = context.make_array(signature.args[2])(context, builder, s)
        vec = ir.VectorType(ir.IntType(width), lanes)
        src_ptr = builder.bitcast(builder.gep(inp.data, [s_at]), vec.as_pointer())
        values = builder.load(src_ptr, align=width // 8)
        _pack_into(builder, values, m, builder.gep(out.data, [d_at]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def ctpop(typingctx: Any, word: Any) -> Any:
    """The set bits of an integer, as an int64, by LLVM's ``ctpop`` (one ``popcnt`` where the
    target has it: every AVX2 CPU; LLVM's own bit arithmetic elsewhere). Numba has no such
    function; the packing loops count every step's mask with it. With the bit arithmetic
    written out (numpy_gather.popcount until 2026-12-04) the AVX2 permute's steps were bound
    by it: the fused loop on the 2-core Zen 4, 2^22, float32 values at p >= .3 1.75-1.79
    against 1.03-1.13 ms, float64 at p = .5 3.1 against 2.0 ms."""
    if not isinstance(word, types.Integer):
        return None
    sig = types.int64(word)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        (w,) = args
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(w.type, [w.type]), f"llvm.ctpop.i{w.type.width}")
        count = builder.call(fn, [w])
        # numba's integers are at most 64 bits wide
        return builder.zext(count, ir.IntType(64)) if w.type.width < 64 else count

    return sig, codegen


@intrinsic
def compress_iota(typingctx: Any, dst: Any, at: Any, first: Any, mask: Any) -> Any:
    """``dst[at : at + L]`` = those of ``first``, ``first + 1``, ..., ``first + L - 1`` whose
    bit of ``mask`` is set, packed to the front, where L = :data:`IOTA_LANES` (int64 ``dst``;
    all L lanes written, so ``at + L <= len(dst)`` is the caller's to ensure). Only with
    :data:`HAVE_IOTA`."""
    if not (isinstance(dst, types.Array) and dst.dtype == types.int64 and dst.layout == "C"):
        return None
    if not HAVE_IOTA:
        return None
    lanes = IOTA_LANES
    sig = types.void(dst, types.int64, types.int64, types.uint64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        d, d_at, start, m = args
        out = context.make_array(signature.args[0])(context, builder, d)
        vec = ir.VectorType(ir.IntType(64), lanes)
        zero = ir.Constant(vec, None)
        lane0 = builder.insert_element(zero, start, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(
            lane0, zero, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))
        values = builder.add(splat, ir.Constant(vec, list(range(lanes))))
        _pack_into(builder, values, m, builder.gep(out.data, [d_at]))
        return context.get_dummy_value()

    return sig, codegen
