"""The CPU record path's two steps against NumPy: the predicate pass writing one bit per row
(in parts on several threads), and the gathers of the rows the bits select (``src[mask]``):
the scalar loops and, where the CPU has AVX-512, the compress (where it has AVX2 only, AVX2's
permute in its place)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_compact import compact_records
from dask_compact.backends import numpy_gather, numpy_records
from dask_compact.backends.numpy_gather import as_rows, gather_rows
from dask_compact.codegen.numba_compress import (
    COMPRESS_ITEMSIZES,
    HAVE_IOTA,
    pack_lanes,
    target_has,
)
from dask_compact.records_check import check_record_predicate

UNITS = [np.uint8, np.uint16, np.uint32, np.uint64]


def every_hit_count(seed: int = 3) -> np.ndarray:
    """Words of every hit count 0..64 at random places, after a run of full words and after
    a run of empty ones, the last word partial: every form of every gather."""
    rng = np.random.default_rng(seed)
    blocks = []
    for hits in range(65):
        m = np.zeros(64, bool)
        m[rng.choice(64, hits, replace=False)] = True
        blocks += [np.ones(64 * 4, bool), m, np.zeros(64 * 4, bool), m]
    return np.concatenate(blocks + [np.ones(64 * 2, bool), rng.random(64) < 0.6])[:-11]


def ends_at_the_end() -> np.ndarray:
    """Whole words to the input's end (n a multiple of 64), the last of 40 rows: the forms
    that write whole words or lanes must stop short of the output's end."""
    m = np.ones(64 * 9, bool)
    m[3] = False
    m[-64:] = np.random.default_rng(8).permutation(np.arange(64) < 40)
    return m


def ends_early() -> np.ndarray:
    """Dense words, then empty ones to the input's end: the output ends where a compress would
    run (the input's last words are far), so only the output's guard keeps its lanes in."""
    m = np.random.default_rng(12).random(64 * 8) < 0.7
    m[64 * 5 :] = False
    return m


def packed(mask: np.ndarray) -> np.ndarray:
    words = (mask.size + 63) // 64
    b = np.zeros(words * 8, np.uint8)
    b[: (mask.size + 7) // 8] = np.packbits(mask, bitorder="little")
    return b.view("<u8").astype(np.uint64)


def distinct(unit: type, n: int, seed: int = 0) -> np.ndarray:
    # random bits, so a row put in the wrong place cannot equal the right one by chance often
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(unit).max, size=n, dtype=unit, endpoint=True)


@pytest.mark.parametrize("unit", UNITS)
@pytest.mark.parametrize("form", ["scalar", "compress"])
def test_each_form_at_every_hit_count(unit, form):
    if form == "compress" and np.dtype(unit).itemsize not in COMPRESS_ITEMSIZES:
        pytest.skip("AVX-512F compresses 4- and 8-byte units, AVX512_VBMI2 1- and 2-byte ones "
                    "(AVX2 packs every width)")
    gather = numpy_gather._gather1 if form == "scalar" else numpy_gather._gather1_compress
    for seed, mask in enumerate((every_hit_count(), ends_at_the_end(), ends_early())):
        src = distinct(unit, mask.size, seed=seed)
        want = src[mask]
        buf = np.full(want.size + 64, 7, unit)  # rows after the output's end must stay
        dst = buf[: want.size]
        assert gather(packed(mask), mask.size, src, dst) == want.size
        np.testing.assert_array_equal(dst, want)
        assert (buf[want.size :] == 7).all()


@pytest.mark.parametrize("shape", [(3,), (2, 5), (0,)])
def test_rows_of_several_units(shape):
    mask = every_hit_count(seed=4)
    rng = np.random.default_rng(2)
    src = rng.random((mask.size, *shape)).astype(np.float32)
    dst = np.empty((int(mask.sum()), *shape), np.float32)
    assert gather_rows(packed(mask), mask.size, as_rows(src), as_rows(dst)) == dst.shape[0]
    np.testing.assert_array_equal(dst, src[mask])


# (unit, units a row): float32 (n, 3) and (n, 5), float64 (n, 2) and (n, 3), int16 (n, 3),
# uint8 (n, 3) (21 rows a compress step, three lookups of the spread table) and (n, 7), and
# rows as wide as the lanes (8 float64, 16 float32: one row a step)
ROWS = [(np.uint32, 3), (np.uint32, 5), (np.uint64, 2), (np.uint64, 3), (np.uint16, 3),
        (np.uint8, 3), (np.uint8, 7), (np.uint64, 8), (np.uint32, 16)]


@pytest.mark.parametrize("unit,u", ROWS)
@pytest.mark.parametrize("form", ["scalar", "compress"])
def test_rows_of_several_units_in_each_form_at_every_hit_count(unit, u, form):
    if form == "compress" and np.dtype(unit).itemsize not in COMPRESS_ITEMSIZES:
        pytest.skip("AVX-512F compresses 4- and 8-byte units, AVX512_VBMI2 1- and 2-byte ones "
                    "(AVX2 packs every width)")
    if form == "compress" and u > pack_lanes(np.dtype(unit).itemsize):
        pytest.skip("rows wider than the vector (gather_rows never packs them)")

    def gather(bits, n, src, dst):
        if form == "scalar":
            return numpy_gather._gather2(bits, src, dst)
        return numpy_gather._gather2_compress(bits, n, u, numpy_gather._spread(u),
                                              src.reshape(-1), dst.reshape(-1))

    for seed, mask in enumerate((every_hit_count(seed=11), ends_at_the_end(), ends_early())):
        src = distinct(unit, mask.size * u, seed=seed).reshape(-1, u)
        want = src[mask]
        buf = np.full((want.shape[0] + 64, u), 7, unit)  # rows after the output's end stay
        dst = buf[: want.shape[0]]
        assert gather(packed(mask), mask.size, src, dst) == want.shape[0]
        np.testing.assert_array_equal(dst, want)
        assert (buf[want.shape[0] :] == 7).all()


# (dtype, row shape): one unit a row (1-D; a trailing axis of one element), several units,
# a row of odd bytes (one byte unit, several), an empty row, a big-endian field
PLAN_FIELDS = [("float32", ()), ("int8", ()), ("float64", (1,)), ("int16", (3,)),
               ("complex128", ()), ("float32", (2, 3)), ("V3", ()), ("uint8", (0,)),
               (">f4", ()), (">i8", (2,))]


@pytest.mark.parametrize("dtype,tail", PLAN_FIELDS)
@pytest.mark.parametrize("strided", [False, True])
def test_gather_field_by_each_column_of_the_plan(dtype, tail, strided):
    # the step both the backend's call and a kept call run (numpy_records.gather_new): a
    # field's column (compiled gather or None) from column_plan, a strided field by the rows
    mask = every_hit_count(seed=9)
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (2 * mask.size, *tail, np.dtype(dtype).itemsize), np.uint8)
    whole = raw.view(dtype).reshape(2 * mask.size, *tail)
    src = whole[::2] if strided else whole[: mask.size]
    assert src.flags.c_contiguous != strided or src.size == 0
    ((name, dt, row, gather),) = numpy_gather.column_plan({"f": src})
    assert (name, dt, row) == ("f", src.dtype, tail)
    row_bytes = src.dtype.itemsize * int(np.prod(tail))
    assert (gather is None) == (row_bytes not in (1, 2, 4, 8))
    dst = np.empty((int(mask.sum()), *tail), src.dtype)
    numpy_gather.gather_field(packed(mask), mask.size, src, dst, gather)
    assert dst.tobytes() == src[mask].tobytes()


@pytest.mark.parametrize("indices", [False, True])
def test_the_backend_gathers_strided_and_contiguous_fields_alike(indices):
    rng = np.random.default_rng(10)
    n = 1031
    key = rng.random(2 * n)[::2]  # strided: the pass reads a copy, the gather the rows
    pos = rng.random((n, 3)).astype(np.float32)
    tag = rng.integers(0, 9, (n, 1)).astype(np.int16)
    fields = {"key": key, "pos": pos, "tag": tag}
    p = check_record_predicate("key < 0.3", fields, "compact_records")
    out = numpy_records.compact_records(fields, p, indices, True, 5)
    m = key < 0.3
    for name, a in fields.items():
        np.testing.assert_array_equal(out[name], a[m])
        assert out[name].flags.c_contiguous and out[name].dtype == a.dtype
    if indices:
        np.testing.assert_array_equal(out["indices"], np.flatnonzero(m) + 5)
    else:
        assert "indices" not in out


def test_the_spread_table_repeats_each_row_bit_over_its_units():
    assert numpy_gather._spread(3)[0b101] == 0b111000111
    assert numpy_gather._spread(2)[0b11000001] == 0b1111 << 12 | 0b11
    assert numpy_gather._spread(8)[255] == 2**64 - 1


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint64", "complex64",
                                   "int16", "bool"])
def test_records_through_the_gathers_at_every_hit_count(dtype):
    # the public call: the predicate field's mask of every hit count, every field gathered
    mask = every_hit_count(seed=5)
    rng = np.random.default_rng(6)
    key = np.where(mask, 1 + rng.integers(0, 100, mask.size), 0).astype(np.int32)
    other = (rng.random(mask.size) * 1000).astype(dtype)
    rays = (rng.random((mask.size, 3)) * 1000).astype(dtype)  # rows of several units
    out = compact_records({"key": key, "other": other, "rays": rays}, "key != 0")
    np.testing.assert_array_equal(out["key"], key[mask])
    np.testing.assert_array_equal(out["other"], other[mask])
    np.testing.assert_array_equal(out["rays"], rays[mask])
    assert out["other"].dtype == other.dtype and out["rays"].dtype == rays.dtype


def test_the_compress_follows_the_compiled_target(monkeypatch):
    from numba.core import config

    monkeypatch.setattr(config, "CPU_FEATURES", "+sse2,-avx512f")
    assert not target_has("avx512f")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+avx512f")
    assert target_has("avx512f") and not target_has("avx512vbmi2")
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    assert not target_has("avx512f")


def test_the_lane_orders_of_the_permute_and_shuffle_bring_the_selected_lanes_first():
    from dask_compact.codegen.numba_compress import _orders

    eight, four = _orders(8, 1, 8), _orders(4, 2, 8)  # vpermd: 4- and 8-byte lanes
    assert len(eight) == 256 and len(four) == 16
    assert eight[0b10100110] == [1, 2, 5, 7, 0, 0, 0, 0]
    assert four[0b1010] == [2, 3, 6, 7, 0, 0, 0, 0]  # 8-byte lanes as pairs of halves
    for m, order in enumerate(eight):
        kept = [lane for lane in range(8) if m >> lane & 1]
        assert order[: len(kept)] == kept and all(0 <= i < 8 for i in order)
    pairs = _orders(8, 2, 16)  # pshufb: 2-byte lanes as pairs of bytes
    assert pairs[0b10000010] == [2, 3, 14, 15] + [0] * 12
    assert _orders(8, 1, 16)[0b101] == [0, 2] + [0] * 14


@pytest.mark.parametrize("features,permute,vector", [
    ("+avx2,+avx512f,-avx512vbmi2", False, 64), ("+avx2,-avx512f", True, 32),
    ("+sse4.2,-avx2", False, 32),
])
def test_the_permute_stands_in_where_the_target_has_avx2_alone(features, permute, vector):
    # what a process compiling for these features packs with (NUMBA_CPU_FEATURES is read at
    # numba's import): only the flags, no loop is built
    import json
    import os
    import subprocess
    import sys

    code = ("import json; from dask_compact.codegen import numba_compress as c; "
            "print(json.dumps([c.HAVE_COMPRESS, c.HAVE_PERMUTE, c.VECTOR_BYTES, "
            "sorted(c.COMPRESS_ITEMSIZES), c.HAVE_IOTA, c.IOTA_LANES]))")
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": features}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    compress, has_permute, vector_bytes, sizes, iota, iota_lanes = json.loads(out)
    assert (compress, has_permute, vector_bytes) == (not permute and vector == 64, permute,
                                                     vector)
    assert sizes == ([1, 2, 4, 8] if permute else [4, 8] if compress else [])
    assert (iota, iota_lanes) == (compress or permute, 8 if compress else 4)


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1025, 4099, 64 * 67])
@pytest.mark.parametrize("threads", [2, 3, 4])
def test_the_predicate_pass_in_parts(monkeypatch, n, threads):
    # parts begin at multiples of 64 rows, each writing its own words; the counts add up
    monkeypatch.setattr(numpy_records, "THREADED_BYTES", 0)
    rng = np.random.default_rng(n)
    f = {"e": rng.random(n).astype(np.float32), "eta": rng.standard_normal(n)}
    pred = check_record_predicate("(e > 0.3) & (abs(eta) < 1.5)", f)
    bits, count = numpy_records.predicate_bits(pred, f, n, threads)
    mask = (f["e"] > np.float32(0.3)) & (np.abs(f["eta"]) < 1.5)
    assert count == int(mask.sum())
    np.testing.assert_array_equal(bits, packed(mask))
    out = numpy_records.compact_records(f, pred, True, True, 5, threads)
    np.testing.assert_array_equal(out["eta"], f["eta"][mask])
    np.testing.assert_array_equal(out["indices"], 5 + np.flatnonzero(mask))


@pytest.mark.parametrize("dtype,output,values,indices", [
    ("float32", "values", True, False), ("int64", "values", True, False),
    ("complex64", "values", True, False), ("float32", "indices", False, True),
    ("uint8", "indices", False, True), ("float64", "both", True, True),
    ("uint8", "values", True, False), ("bool", "both", True, True),
    ("int16", "values", True, False), ("complex128", "values", False, False),
])
def test_the_fused_loop_stores_by_the_compress_where_it_can(dtype, output, values, indices):
    # the one-array loop's full blocks (its results are checked against NumPy at every hit
    # count, every output and several dtypes in test_numpy_backend.py)
    from dask_compact.codegen import numba_loop
    from dask_compact.predicate import as_predicate

    source = numba_loop.generate_source(as_predicate("x != 0").typed(dtype), output,
                                        cache=False)
    served = np.dtype(dtype).itemsize in COMPRESS_ITEMSIZES
    assert ("compress_store(out" in source) == (values and served)
    assert ("compress_iota(idx" in source) == (indices and HAVE_IOTA and (served or not values))


@pytest.mark.parametrize("form", ["scalar", "compress"])
def test_indices_in_each_form_at_every_hit_count(form):
    if form == "compress" and not HAVE_IOTA:
        pytest.skip("the compress needs AVX-512F, the permute AVX2")
    gather = numpy_gather._indices if form == "scalar" else numpy_gather._indices_compress
    for mask in (every_hit_count(seed=9), np.ones(64 * 5, bool)):
        want = 1000 + np.flatnonzero(mask)
        buf = np.full(want.size + 64, -7, np.int64)
        assert gather(packed(mask), np.int64(1000), buf[: want.size]) == want.size
        np.testing.assert_array_equal(buf[: want.size], want)
        assert (buf[want.size :] == -7).all()


def test_every_generated_loop_names_the_helpers_it_was_built_with():
    # a loop cached on disk by another version of the intrinsics or the popcount it compiles
    # in (the same predicate, the same text otherwise) gets another file name, and is rebuilt
    import hashlib
    from pathlib import Path

    from dask_compact.codegen import numba_compress, numba_loop, numba_records
    from dask_compact.predicate import as_predicate

    h = hashlib.sha1()
    for module in (numba_compress, numpy_gather):
        h.update(Path(module.__file__).read_bytes())
    line = f"# helpers: {h.hexdigest()[:16]}"
    assert numba_loop.helpers_digest() == h.hexdigest()[:16]
    loop = numba_loop.generate_source(as_predicate("x < 3").typed("float32"), "values",
                                      cache=False)
    pred = check_record_predicate("(e > 0.3) & (eta < 1)", {
        "e": np.zeros(4, np.float32), "eta": np.zeros(4)})
    record = numba_records.generate_record_source(
        pred.typed({"e": np.dtype(np.float32), "eta": np.dtype(np.float64)}), cache=False)
    assert line in loop.splitlines() and line in record.splitlines()
