"""The public ``compact_into`` on NumPy arrays: the selection written into the caller's
buffers and its count, against NumPy's boolean indexing, for every dtype, output, odd sizes
and empty and full selections; and the errors for buffers that cannot receive it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_numpy_backend import DTYPES, PS, SIZES, random_array, selector

from dask_compact import compact_into

OUT_DTYPES = {"values": None, "indices": np.dtype(np.int64)}


def buffers(a: np.ndarray, output: str, n: int | None = None):
    n = a.size if n is None else n
    v = np.empty(n, dtype=a.dtype) if output != "indices" else None
    i = np.full(n, -7, dtype=np.int64) if output != "values" else None
    out = {"values": v, "indices": i, "both": (v, i)}[output]
    return out, v, i


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_numpy_every_dtype(dtype):
    """Every size (0, 1, around 32 and 64, 1023, 1025, a prime) and selectivity from none to
    all, for one dtype (one test per dtype: 700 tiny tests cost more in pytest than in us)."""
    for n in SIZES:
        for p in PS:
            a = random_array(dtype, (n,), seed=n)
            pred = selector(a, p)
            m = np.asarray(pred(a))
            out, v, i = buffers(a, "both")
            count = compact_into(a, pred, out, output="both")
            assert count.dtype == np.int64 and count.shape == (1,)
            k = int(count[0])
            assert k == int(m.sum()), (n, p)
            np.testing.assert_array_equal(v[:k], a[m])
            np.testing.assert_array_equal(i[:k], np.flatnonzero(m))


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("count_dtype", [np.int64, np.uint64])
def test_outputs_and_given_count(output, count_dtype):
    a = random_array("float32", (7, 149), seed=3)  # 2-D: flattened in C order
    out, v, i = buffers(a, output, n=a.size + 5)  # more room than needed is fine
    count = np.full(1, 99, dtype=count_dtype)
    got = compact_into(a, "x < 0.3", out, output=output, count=count)
    assert got is count
    m = (a < 0.3).ravel()
    k = int(count[0])
    assert k == m.sum()
    if v is not None:
        np.testing.assert_array_equal(v[:k], a.ravel()[m])
    if i is not None:
        np.testing.assert_array_equal(i[:k], np.flatnonzero(m))


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize(
    "fn",
    [lambda v: np.isin(np.round(v * 10), [1.0, 3.0, 7.0]),  # untraceable: the mask path
     lambda v: np.exp(v) > 1.5],  # traced, but the loop cannot run it bit-exactly
)
def test_mask_path_predicates(fn, output):
    a = random_array("float32", (1025,), seed=4)
    out, v, i = buffers(a, output)
    k = int(compact_into(a, fn, out, output=output)[0])
    m = np.asarray(fn(a))
    assert k == m.sum()
    if v is not None:
        np.testing.assert_array_equal(v[:k], a[m])
    if i is not None:
        np.testing.assert_array_equal(i[:k], np.flatnonzero(m))


def test_reuses_buffers_in_a_loop():
    """The point of the call: one pair of buffers for a stream of inputs."""
    out = np.empty(4099, dtype=np.float32)
    count = np.zeros(1, dtype=np.int64)
    for seed in range(4):
        a = random_array("float32", (4099 - seed,), seed=seed)
        compact_into(a, lambda v: v > 0.25, out, count=count)
        np.testing.assert_array_equal(out[: count[0]], a[a > 0.25])


@settings(max_examples=60, deadline=None)
@given(
    a=hnp.arrays(np.dtype(np.int16), hnp.array_shapes(max_dims=2, max_side=40)),
    t=st.integers(-2**15, 2**15 - 1),
)
def test_property_matches_numpy(a, t):
    out, v, i = buffers(a, "both")
    k = int(compact_into(a, lambda x: x >= t, out, output="both")[0])
    m = (a >= t).ravel()
    np.testing.assert_array_equal(v[:k], a.ravel()[m])
    np.testing.assert_array_equal(i[:k], np.flatnonzero(m))


@pytest.mark.parametrize(
    "make, kwargs, err, match",
    [
        (lambda a: np.empty(a.size - 1, a.dtype), {}, ValueError, "every element may be selected"),
        (lambda a: np.empty(a.size, np.float64), {}, TypeError, "dtype float32"),
        (lambda a: np.empty((a.size, 1), a.dtype), {}, ValueError, "1-D contiguous"),
        (lambda a: np.empty(2 * a.size, a.dtype)[::2], {}, ValueError, "not contiguous"),
        (lambda a: a, {}, ValueError, "overlaps the input"),
        (lambda a: [1.0] * a.size, {}, TypeError, "must be a numpy array"),
        (lambda a: np.empty(a.size, np.int32), {"output": "indices"}, TypeError, "int64"),
        (lambda a: np.empty(a.size, a.dtype), {"output": "both"}, TypeError, "out=.values"),
        (lambda a: np.empty(a.size, a.dtype), {"count": np.zeros(1, np.int32)}, TypeError,
         "int64 or uint64"),
        (lambda a: np.empty(a.size, a.dtype), {"count": np.zeros(2, np.int64)}, ValueError,
         "1 element"),
        (lambda a: np.empty(a.size, a.dtype), {"stream": object()}, TypeError, "stream is for"),
        (lambda a: np.empty(a.size, a.dtype), {"output": "mask"}, ValueError, "output"),
        # written into with its mask left as it was until 2026-12-06 (a records probe)
        (lambda a: np.ma.zeros(a.size, a.dtype), {}, TypeError,
         r"out \(values\) is a masked array"),
        (lambda a: (np.empty(a.size, a.dtype), np.ma.zeros(a.size, np.int64)),
         {"output": "both"}, TypeError, "is a masked array.*values, not its mask"),
    ],
)
def test_bad_buffers_refused_and_untouched(make, kwargs, err, match):
    a = random_array("float32", (33,), seed=5)
    before = a.copy()
    out = make(a)
    with pytest.raises(err, match=match):
        compact_into(a, "x > 0.5", out, **kwargs)
    np.testing.assert_array_equal(a, before)


def test_a_refused_buffer_is_told_each_byte_order_taken():
    """A NumPy buffer of the other byte order is taken (written through a native view, then
    swapped): the refusal of a buffer of another dtype names both orders, and the count's
    too; a one-byte dtype has one. Until 2026-12-02 (nineteenth session, found beside
    compact_records_into's same gap) it named the native dtype alone."""
    a = random_array("float64", (33,), seed=5)
    le, be = np.dtype("<f8"), np.dtype(">f8")
    for inp in (a, a.astype(be)):
        with pytest.raises(TypeError) as e:
            compact_into(inp, "x > 0.5", np.empty(33, np.float32))
        assert str(e.value) == ("out (values) must have dtype float64 (either byte order); "
                                "got float32")
    with pytest.raises(TypeError) as e:
        compact_into(a, "x > 0.5", np.empty(33, np.int32), output="indices")
    assert str(e.value) == "out (indices) must have dtype int64 (either byte order); got int32"
    with pytest.raises(TypeError) as e:
        compact_into(a, "x > 0.5", np.empty(33, a.dtype), count=np.zeros(1, ">i4"))
    assert str(e.value) == ("count must be a 1-element int64 or uint64 array (either byte "
                            "order)")
    b = random_array("int8", (33,), seed=5)
    with pytest.raises(TypeError) as e:
        compact_into(b, "x > 0", np.empty(33, np.uint8))
    assert str(e.value) == "out (values) must have dtype int8; got uint8"
    for out in (np.empty(33, le), np.empty(33, be)):  # both orders named are taken
        count = compact_into(a, "x > 0.5", out)
        np.testing.assert_array_equal(out[:int(count[0])], a[a > 0.5])


def _strided_cases():
    """(input, out, overlapping) views of one buffer: reversed and strided inputs whose
    elements lie below their data pointer or beyond their nbytes."""
    def buf():
        return np.arange(40, dtype=np.float64)

    b1 = buf()
    yield b1[:10][::-1], b1[10:20], False  # reversed input below the buffer: disjoint
    b2 = buf()
    yield b2[::2][:10], b2[10:20], True  # strided input reaching into the buffer
    b3 = buf()
    yield b3[5:15][::-1], b3[0:10], True  # reversed input over the buffer's end
    b4 = buf()
    yield b4[20:30][::-1], b4[0:10], False
    b5 = buf()
    yield b5[::10], b5[1:5], False  # interleaved in the buffer's span, no element shared
    b6 = buf()
    yield b6.reshape(4, 10)[:2, ::-3], b6[12:22], True  # 2-D, negative strides


@pytest.mark.parametrize("case", range(6))
def test_overlap_is_judged_by_the_elements_strides_included(case):
    a, out, overlapping = list(_strided_cases())[case]
    before = a.copy()
    if overlapping:
        with pytest.raises(ValueError, match="overlaps the input"):
            compact_into(a, "x > 2", out)
        np.testing.assert_array_equal(a, before)
        return
    k = int(compact_into(a, "x > 2", out)[0])
    np.testing.assert_array_equal(a, before)
    np.testing.assert_array_equal(out[:k], before.ravel()[before.ravel() > 2])


def test_big_endian_input_shared_with_out_is_refused_and_untouched():
    # big-endian input is compacted from a native copy: the overlap was judged against the
    # copy, and the caller's own array was written over
    mem = (np.arange(33) / 33).astype(">f8")
    before = mem.copy()
    out = mem.view(np.float64)  # the same bytes, read natively
    for o in (out, out[5:]):
        with pytest.raises(ValueError, match="overlaps the input"):
            compact_into(mem[:28], "x > 0.5", o)
    np.testing.assert_array_equal(mem, before)
    v = np.empty(33, np.float64)
    with pytest.raises(ValueError, match="out .indices. overlaps the input"):
        compact_into(mem, "x > 0.5", (v, mem.view(np.int64)), output="both")
    np.testing.assert_array_equal(mem, before)


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i8", ">u2", ">c8", "<f4", "<i2"])
@pytest.mark.parametrize("order", ["=", ">"])
def test_buffers_of_either_byte_order_receive_the_selection(dtype, order):
    """``np.empty_like(a)`` of a big-endian ``a`` (FITS and many instrument formats) is a
    buffer of a's dtype, as NumPy's ``a[m]`` keeps it: it was refused ("must have dtype
    float32 (native byte order ...)"; a new-user probe, 2026-12-01). Values, indices and the
    count are written in the byte order of the buffer that receives them, bit for bit:
    signed zeros and NaN payloads."""
    rng = np.random.default_rng(3)
    n = 1031
    bits = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    a = bits.view(np.dtype(dtype).newbyteorder("=")).astype(dtype)  # payloads, -0.0, ...
    pred = "real(x) > 0" if a.dtype.kind == "c" else "~(x < 0)"
    an = a.astype(a.dtype.newbyteorder("="))
    m = an.real > 0 if a.dtype.kind == "c" else ~(an < 0)
    v = np.full(n, 7, a.dtype.newbyteorder(order))
    i = np.full(n, -7, np.dtype(np.int64).newbyteorder(order))
    count = np.zeros(1, np.dtype(np.int64).newbyteorder(order))
    got = compact_into(a, pred, (v, i), output="both", count=count)
    assert got is count
    k = int(count[0])
    assert k == int(m.sum())
    want = an[m]
    assert v[:k].astype(want.dtype).tobytes() == want.tobytes()
    np.testing.assert_array_equal(i[:k], np.flatnonzero(m))
    v2 = np.empty_like(a)
    k2 = int(compact_into(a, pred, v2)[0])
    assert k2 == k and v2[:k].astype(want.dtype).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8", ">i2", ">u4", ">i8", ">c8", ">c16"])
@pytest.mark.parametrize("shape, view", [((1031,), lambda x: x), ((6, 35), lambda x: x[:, ::3]),
                                         ((), lambda x: x), ((0,), lambda x: x)])
def test_reversed_bytes_converts_the_other_byte_order(dtype, shape, view):
    """How a CuPy array of the other byte order is converted (validate.to_native): CuPy's
    ``astype`` to the native dtype copies the bits as they are, so each number's bytes (each
    part's, for complex) are reversed by a copy; run here through NumPy, the same calls.
    Strided views, 0-d and empty arrays; NaN payloads and signed zeros bit for bit."""
    from dask_compact.validate import reversed_bytes

    rng = np.random.default_rng(5)
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    a = view(rng.integers(0, 256, size, dtype=np.uint8).view(dtype).reshape(shape))
    got = reversed_bytes(np, a)
    want = a.astype(a.dtype.newbyteorder("="))
    assert got.dtype == want.dtype and got.dtype.isnative and got.shape == a.shape
    assert got.flags.c_contiguous and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("output, out", [("values", None), ("indices", None),
                                         ("both", (None, np.empty(31, np.int64))),
                                         ("both", (np.empty(31), None))])
def test_none_for_a_buffer_is_refused(output, out):
    a = random_array("float64", (31,), seed=9)
    with pytest.raises(TypeError, match="must be an array to write into, not None"):
        compact_into(a, "x > 0.5", out, output=output)


def test_output_buffers_sharing_memory_are_refused():
    a = random_array("float64", (33,), seed=8)
    mem = np.empty(2 * a.size, np.float64)
    with pytest.raises(ValueError, match="out .values. and out .indices. overlap"):
        compact_into(a, "x > 0.5", (mem[: a.size], mem[5 : 5 + a.size].view(np.int64)),
                     output="both")
    count = mem[a.size : a.size + 1].view(np.int64)
    with pytest.raises(ValueError, match="out .values. and count overlap"):
        compact_into(a, "x > 0.5", mem[1 : 1 + a.size], count=count)
    # apart: accepted, exact
    v, i = mem[: a.size], np.empty(a.size, np.int64)
    k = int(compact_into(a, "x > 0.5", (v, i), output="both", count=count)[0])
    np.testing.assert_array_equal(v[:k], a[a > 0.5])
    np.testing.assert_array_equal(i[:k], np.flatnonzero(a > 0.5))


def test_read_only_output_refused():
    a = random_array("int32", (31,), seed=6)
    out = np.empty(31, np.int32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        compact_into(a, "x > 0", out)


def test_not_an_array_refused():
    with pytest.raises(TypeError, match="NumPy or CuPy array"):
        compact_into([1, 2, 3], "x > 1", np.empty(3))


def test_a_stream_must_be_a_cuda_stream_object():
    """What the GPU path calls ``stream.ptr`` on: refused up front unless it has an integer
    ``ptr`` (cupy.cuda.Stream, ExternalStream); NumPy input takes none at all."""
    from types import SimpleNamespace

    from dask_compact.validate import check_stream

    check_stream(None, True, "input")
    check_stream(SimpleNamespace(ptr=0), True, "input")  # the legacy default stream's handle
    for bad in ("stream", 7, SimpleNamespace(ptr="0"), object()):
        with pytest.raises(TypeError, match="must be a CUDA stream"):
            check_stream(bad, True, "input")
    with pytest.raises(TypeError, match="NumPy input is compacted"):
        check_stream(SimpleNamespace(ptr=0), False, "input")
    with pytest.raises(TypeError, match="NumPy fields are compacted"):
        check_stream(SimpleNamespace(ptr=0), False, "fields")


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_non_contiguous_input_of_several_segments(output, monkeypatch):
    """A non-contiguous chunk of more than a segment (numpy_backend._SEGMENT, lowered here) is
    run segment by segment into the caller's buffers: equal to NumPy, indices in C order."""
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", 256)
    base = random_array("float64", (6, 50, 7), seed=6)
    long_rows = random_array("int32", (3, 1000), seed=7)
    views = [base[:, ::3, :], base.transpose(2, 0, 1), np.asfortranarray(base)]
    for a in views + [base.ravel()[::2], long_rows[:, ::2]]:
        for t in (-1, 0.3, 2**40):
            out, v, i = buffers(a, output)
            k = int(compact_into(a, f"x < {t}", out, output=output)[0])
            m = (a < t).ravel()
            assert k == m.sum()
            if v is not None:
                np.testing.assert_array_equal(v[:k], a.ravel()[m])
            if i is not None:
                np.testing.assert_array_equal(i[:k], np.flatnonzero(m))


def test_non_contiguous_input_is_not_copied_whole(monkeypatch):
    """The loop runs on C-contiguous 1-D input; a non-contiguous chunk was copied whole into C
    order first (as large as the chunk). Now one segment at a time: a strided 2^22-element
    float32 view (16 MiB) with the segment lowered to 2^16 holds under 2 MiB (tracemalloc)."""
    import tracemalloc

    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", 1 << 16)
    a = random_array("float32", (1 << 23,), seed=1)[::2]
    out = np.empty(a.size, np.float32)
    compact_into(a[:1000], "x < 0.5", out)  # the loop compiled or loaded first
    tracemalloc.start()
    try:
        k = int(compact_into(a, "x < 0.5", out)[0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out[:k], a[a < 0.5])
    assert peak < a.nbytes // 8, peak


@pytest.mark.parametrize("dtype", ["datetime64[s]", ">M8[ms]", "timedelta64[us]"])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_times_are_told_the_int64_views_compact_into_takes(dtype, output):
    """compact_into refused times with the list of calls that take them, none of which
    writes into buffers (a refusal probe, 2026-12-02, sixteenth session): it says to pass
    the int64 views, and what it says, run as written, gives NumPy's selection."""
    import re

    import dask_compact

    a = (np.arange(37)[::-1] * 5 % 17).astype(dtype)
    a[3] = np.array("NaT", dtype)
    t = a[1]
    m = a > t
    values, indices = np.empty_like(a), np.empty(a.size, np.int64)
    out = {"values": values, "indices": indices, "both": (values, indices)}[output]
    with pytest.raises(TypeError, match="compact_into compacts numbers only") as e:
        compact_into(a, lambda v: v > t, out, output=output)
    (code,) = re.findall(r"`([^`]*)`", str(e.value))
    count = eval(code, {"dask_compact": dask_compact, "a": a, "t": t, "out": out})
    k = int(count[0])
    assert k == m.sum()
    if output != "indices":
        np.testing.assert_array_equal(values[:k], a[m])
    if output != "values":
        np.testing.assert_array_equal(indices[:k], np.flatnonzero(m))
