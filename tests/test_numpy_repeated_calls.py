"""compact_array's repeated call on NumPy arrays (backends/numpy_calls.py): an equal
predicate on the same dtype and arguments runs the kept compiled loop without the checks and
the dispatch, exactly as the checked call would; anything the kept call does not serve
(another layout, byte order, array type, a large call) is checked and dispatched as before."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import after_next_call, in_threads
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_compact.backends.numpy_backend as nb
import dask_compact.backends.numpy_calls as nc
import dask_compact.chunk as chunk
from dask_compact import as_predicate, clear_cache, compact_array
from dask_compact.validate import output_bytes

SIZES = [0, 1, 31, 33, 1023, 1025, 4099, 65_537]
THRESHOLD = 0.5


def expect(a: np.ndarray, m: np.ndarray, output: str):
    flat, mf = a.ravel(), m.ravel()
    values, indices = flat[mf], np.flatnonzero(mf).astype(np.int64)
    return {"values": values, "indices": indices, "both": (values, indices)}[output]


def check(got, want, output: str) -> None:
    if output == "both":
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want):
            check(g, w, "values")
        return
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.ndim == 1
    np.testing.assert_array_equal(got, want)


def _no_dispatch(monkeypatch) -> None:
    """From here on a call that is checked and dispatched fails: only kept calls run."""

    def refuse(*args, **kwargs):
        raise AssertionError("dispatched")

    monkeypatch.setattr(chunk, "compact_chunk", refuse)


def _data(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return rng.random(n) < 0.5
    return (rng.random(n) * 100).astype(dtype)


@pytest.fixture(autouse=True)
def _fresh():
    nc._repeat_calls.clear()
    nc._records_calls.clear()
    yield
    nc._repeat_calls.clear()
    nc._records_calls.clear()


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8", "int64"])
def test_repeated_call_is_kept_and_exact_on_new_data_of_any_size(output, dtype, monkeypatch):
    rng = np.random.default_rng(1)
    pred = lambda v: v < 40  # noqa: E731
    a = _data(rng, 1000, dtype)
    check(compact_array(a, pred, output=output), expect(a, a < 40, output), output)
    assert len(nc._repeat_calls) == 1
    _no_dispatch(monkeypatch)
    for n in SIZES:  # new data, every size: the kept loop, exact
        a = _data(rng, n, dtype)
        check(compact_array(a, pred, output=output), expect(a, a < 40, output), output)
    for sel in (np.zeros(4099, dtype), np.full(4099, 99, dtype)):  # all selected, none
        check(compact_array(sel, pred, output=output), expect(sel, sel < 40, output), output)
    # N-D input: flat C-order indices, as the checked call gives
    b = _data(rng, 3 * 5 * 7, dtype).reshape(3, 5, 7)
    check(compact_array(b, pred, output=output), expect(b, b < 40, output), output)
    c = np.asarray(_data(rng, 1, dtype)[0])  # 0-d
    check(compact_array(c, pred, output=output), expect(c, c < 40, output), output)


@pytest.mark.parametrize("output", ["values", "both"])
def test_other_layouts_and_arguments_are_checked_and_exact(output, monkeypatch):
    """What the kept call does not serve: the checked call, with its own result or error."""
    rng = np.random.default_rng(2)
    pred = lambda v: v > 0.5  # noqa: E731
    a = rng.random(17 * 241)
    compact_array(a, pred, output=output)
    assert len(nc._repeat_calls) == 1
    with monkeypatch.context() as m:
        _no_dispatch(m)
        for other in (
            a[::2],  # not contiguous
            np.asfortranarray(a.reshape(17, 241)),  # Fortran order
            a.astype(">f8"),  # big-endian
            a.astype(np.float32),  # another dtype
        ):
            with pytest.raises(AssertionError, match="dispatched"):
                compact_array(other, pred, output=output)
        with pytest.raises(AssertionError, match="dispatched"):
            compact_array(a, pred, output=output, stable=False)
        with pytest.raises(AssertionError, match="dispatched"):
            compact_array(a, pred, output=output, algorithm="three-pass")
    for other in (a[::2], np.asfortranarray(a.reshape(17, 241)), a.astype(">f8")):
        native = other.astype(other.dtype.newbyteorder("="))  # the results' byte order
        check(compact_array(other, pred, output=output), expect(native, native > 0.5, output),
              output)
    # a masked array is refused every time, as before the kept call
    with pytest.raises(TypeError, match="masked"):
        compact_array(np.ma.array(a, mask=a > 0.9), pred, output=output)
    # a read-only array: the kept loop (numba's read-only specialization), exact
    ro = rng.random(4099)
    ro.flags.writeable = False
    check(compact_array(ro, pred, output=output), expect(ro, ro > 0.5, output), output)
    # bad arguments still get their own errors
    with pytest.raises(ValueError, match="output"):
        compact_array(a, pred, output="nope")
    with pytest.raises(ValueError, match="output"):
        compact_array(a, pred, output=["values"])  # unhashable: not looked up, then refused


def test_a_call_larger_than_one_loop_call_is_checked(monkeypatch):
    """The checked call runs a large call over segments (numpy_backend._SEGMENT): the kept
    call never takes one."""
    monkeypatch.setattr(nb, "_SEGMENT", 1024)
    rng = np.random.default_rng(3)
    pred = "x < 0.25"
    small = rng.random(1000)
    compact_array(small, pred)
    assert len(nc._repeat_calls) == 1
    big = rng.random(5000)
    assert nc.repeated_call(big, pred, "values", True, "auto") is None
    assert nc.repeated_call(small, pred, "values", True, "auto") is not None
    np.testing.assert_array_equal(compact_array(big, pred), big[big < 0.25])


@pytest.mark.parametrize("heap", [None, 4096, 4097, 1 << 15])
def test_the_kept_size_limit_is_one_calls_boundary(monkeypatch, heap):
    """A kept call compares a size with its limit (one_call_limit) where the checked call asks
    one_call: the same boundary for every dtype and output, whichever bound binds."""
    if heap is not None:
        monkeypatch.setattr(nb, "_HEAP_BYTES", heap)
    monkeypatch.setattr(nb, "_SEGMENT", 3000)
    for dtype in ("int8", "float16", "float32", "complex64", "complex128"):
        for output in ("values", "indices", "both"):
            width = output_bytes(np.dtype(dtype).itemsize, output)

            def fits(n: int) -> bool:  # one loop call: under both bounds (see numpy_backend)
                return n <= nb._SEGMENT and n * width < nb._HEAP_BYTES  # noqa: B023

            limit = nb.one_call_limit(np.dtype(dtype), output)
            assert fits(limit) and not fits(limit + 1)
            assert nb.one_call(limit, np.dtype(dtype), output)
            assert not nb.one_call(limit + 1, np.dtype(dtype), output)


def test_repeated_call_follows_a_rebound_constant():
    """A function reading a global or a closure cell: rebinding it is a new predicate (the
    trace key), never the kept loop of the old value."""
    global THRESHOLD
    pred = lambda v: v < THRESHOLD  # noqa: E731
    a = np.random.default_rng(4).random(65_537).astype(np.float32)
    try:
        for t in (0.5, 0.5, 0.25, 0.75, 0.25, 0.5):
            THRESHOLD = t
            np.testing.assert_array_equal(compact_array(a, pred), a[a < t])
        assert len(nc._repeat_calls) == 3
        limit = 0.1
        closure = lambda v: v < limit  # noqa: E731
        for limit in (0.1, 0.9, 0.1, 0.9):
            np.testing.assert_array_equal(compact_array(a, closure), a[a < limit])
    finally:
        THRESHOLD = 0.5


@pytest.mark.parametrize("pred", ["x < 0.3", as_predicate("x < 0.3")], ids=["str", "Predicate"])
def test_repeated_call_for_strings_and_predicates(pred, monkeypatch):
    a = np.random.default_rng(5).random(4099)
    compact_array(a, pred)
    _no_dispatch(monkeypatch)
    b = np.random.default_rng(6).random(1025)
    np.testing.assert_array_equal(compact_array(b, pred), b[b < 0.3])


def test_not_kept_where_it_must_not_be():
    a = np.random.default_rng(7).random(4099)
    # the textbook scan compaction: its own path every time
    np.testing.assert_array_equal(compact_array(a, "x > 0.5", algorithm="scan"), a[a > 0.5])
    assert len(nc._repeat_calls) == 0
    # a predicate on the mask path (not traced: np.isin) runs itself
    def listed(v):
        return np.isin(np.round(v * 10), [1.0, 3.0, 7.0])

    np.testing.assert_array_equal(compact_array(a, listed), a[listed(a)])
    assert len(nc._repeat_calls) == 0
    # a traced predicate the loop cannot compute exactly (float16: NumPy's mask)
    h = a.astype(np.float16)
    for _ in range(2):
        np.testing.assert_array_equal(compact_array(h, "x > 0.5"), h[h > 0.5])
    assert len(nc._repeat_calls) == 0
    # datetimes: NumPy's mask, never the loop
    t = np.arange(100).astype("datetime64[s]")
    np.testing.assert_array_equal(compact_array(t, lambda v: v > t[50]), t[51:])
    assert len(nc._repeat_calls) == 0
    # kept, then clear_cache(): checked again
    compact_array(a, "x > 0.5")
    assert len(nc._repeat_calls) == 1
    clear_cache()
    assert len(nc._repeat_calls) == 0


def test_a_constant_rebound_while_a_call_runs_is_not_kept_under_the_new_value(monkeypatch):
    """Another thread rebinding a global the predicate reads while a call compacts (here from
    inside the call): the call used the old value and must not be kept under the new one's
    key (the trace memo's race, repeat_keys.kept_key)."""
    global THRESHOLD
    pred = lambda v: v < THRESHOLD  # noqa: E731
    a = np.random.default_rng(8).random(4099).astype(np.float32)

    def rebind() -> None:
        global THRESHOLD
        THRESHOLD = 0.875

    try:
        THRESHOLD = 0.125
        after_next_call(monkeypatch, chunk, "compact_chunk", rebind)
        np.testing.assert_array_equal(compact_array(a, pred), a[a < 0.125])
        assert len(nc._repeat_calls) == 0
        for t in (0.875, 0.875, 0.125, 0.125):
            THRESHOLD = t
            np.testing.assert_array_equal(compact_array(a, pred), a[a < t])
        assert len(nc._repeat_calls) == 2
    finally:
        THRESHOLD = 0.5


def test_threads_sharing_a_kept_call_each_get_their_own_result():
    pred = lambda v: (v > 10) & (v < 60)  # noqa: E731
    compact_array(np.arange(100, dtype=np.int32), pred, output="both")

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            a = rng.integers(0, 100, int(rng.integers(0, 3000)), dtype=np.int32)
            check(compact_array(a, pred, output="both"),
                  expect(a, (a > 10) & (a < 60), "both"), "both")

    in_threads(work, 4)
    assert len(nc._repeat_calls) == 1


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(["float32", "float64", "int8", "int32", "uint16", "bool"]),
       sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
       output=st.sampled_from(["values", "indices", "both"]),
       seed=st.integers(0, 2**32 - 1))
def test_repeated_calls_equal_numpy(dtype, sizes, output, seed):
    rng = np.random.default_rng(seed)
    pred = "x != 0" if dtype == "bool" else "(x > 20) & (x <= 70)"
    for n in sizes:
        a = _data(rng, n, dtype)
        want = a != 0 if dtype == "bool" else (a > 20) & (a <= 70)
        check(compact_array(a, pred, output=output), expect(a, want, output), output)


# -- compact_records ---------------------------------------------------------------------------


def _no_records_dispatch(monkeypatch) -> None:
    """From here on a records call that is checked fails: only kept calls run."""
    import dask_compact.records as records

    def refuse(*args, **kwargs):
        raise AssertionError("checked")

    monkeypatch.setattr(records, "records_call", refuse)


def _record(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {"e": (rng.random(n) * 10).astype(np.float32),
            "eta": rng.standard_normal(n),
            "pos": rng.random((n, 3)).astype(np.float32),
            "id": rng.integers(0, 1 << 40, n),
            "ok": rng.random(n) < 0.7,
            "q": rng.integers(-3, 4, n).astype(">i2")}


def _want(fields: dict[str, np.ndarray], m: np.ndarray, indices: bool) -> dict[str, np.ndarray]:
    out = {k: v[m] for k, v in fields.items()}
    if indices:
        out["indices"] = np.flatnonzero(m).astype(np.int64)
    return out


def _check_record(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)


@pytest.mark.parametrize("indices", [False, True])
@pytest.mark.parametrize("pred", ["(e > 5) & (abs(eta) < 1.5) & ok",
                                  lambda e, eta, ok: (e > 5) & (abs(eta) < 1.5) & ok],
                         ids=["str", "lambda"])
def test_records_call_is_kept_and_exact_on_new_rows_of_any_count(pred, indices, monkeypatch):
    from dask_compact import compact_records

    rng = np.random.default_rng(20)
    fields = _record(rng, 1000)

    def mask(f):
        return (f["e"] > 5) & (np.abs(f["eta"]) < 1.5) & f["ok"]

    _check_record(compact_records(fields, pred, indices=indices),
                  _want(fields, mask(fields), indices))
    assert len(nc._records_calls) == 1
    _no_records_dispatch(monkeypatch)
    for n in SIZES:
        f = _record(rng, n)
        _check_record(compact_records(f, pred, indices=indices), _want(f, mask(f), indices))
    f = _record(rng, 4099)
    f["pos"] = np.random.default_rng(21).random((8198, 3)).astype(np.float32)[::2]  # strided
    _check_record(compact_records(f, pred, indices=indices), _want(f, mask(f), indices))


def test_records_layouts_and_arguments_the_kept_call_does_not_serve_are_checked(monkeypatch):
    from dask_compact import compact_records

    rng = np.random.default_rng(22)
    fields = _record(rng, 999)
    pred = "e > 5"
    compact_records(fields, pred)
    assert len(nc._records_calls) == 1
    with monkeypatch.context() as m:
        _no_records_dispatch(m)
        others = [
            {**fields, "e": fields["e"].astype(np.float64)},  # another dtype
            {**fields, "pos": fields["pos"][:, :2]},  # another row shape
            {k: fields[k] for k in reversed(list(fields))},  # another order of the fields
            {**fields, "id": fields["id"][:998]},  # lengths that differ
            {**fields, "e": fields["e"].view(np.recarray)},  # not a plain ndarray
            {**fields, "id": fields["id"][:, None]},  # another number of dimensions
            {**fields, "ok": np.array(True)},  # a 0-d field (no rows)
            {"ok": np.array(True), **fields},  # ... first: the length compared with it
        ]
        for other in others:
            with pytest.raises(AssertionError, match="checked"):
                compact_records(other, pred)
        with pytest.raises(AssertionError, match="checked"):
            compact_records(fields, pred, indices=True)
    # and checked, each gets its own result or refusal, as before
    with pytest.raises(ValueError, match="same number of rows"):
        compact_records({**fields, "id": fields["id"][:998]}, pred)
    with pytest.raises(ValueError, match="1-D"):
        compact_records(fields, "pos > 0.5")
    m = fields["e"] > 5
    _check_record(compact_records({**fields, "e": fields["e"].astype(np.float64)}, pred),
                  _want({**fields, "e": fields["e"].astype(np.float64)}, m, False))


def test_records_not_kept_where_they_must_not_be():
    from dask_compact import compact_records

    rng = np.random.default_rng(23)
    fields = _record(rng, 1000)

    def listed(e):
        return np.isin(np.round(e), [1.0, 3.0, 7.0])

    for _ in range(2):  # the mask path: the predicate runs itself every call
        _check_record(compact_records(fields, listed), _want(fields, listed(fields["e"]), False))
    assert len(nc._records_calls) == 0
    h = {"h": fields["e"].astype(np.float16), "id": fields["id"]}
    for _ in range(2):  # float16: NumPy's mask, not the compiled pass
        _check_record(compact_records(h, "h > 5"), _want(h, h["h"] > 5, False))
    assert len(nc._records_calls) == 0
    compact_records(fields, "e > 5")
    assert len(nc._records_calls) == 1
    clear_cache()
    assert len(nc._records_calls) == 0


def test_records_call_follows_a_rebound_constant_and_threads():
    from dask_compact import compact_records

    global THRESHOLD
    pred = lambda e: e < THRESHOLD * 10  # noqa: E731
    fields = _record(np.random.default_rng(24), 3001)
    try:
        for t in (0.5, 0.5, 0.25, 0.5):
            THRESHOLD = t
            _check_record(compact_records(fields, pred), _want(fields, fields["e"] < t * 10,
                                                               False))
        assert len(nc._records_calls) == 2
    finally:
        THRESHOLD = 0.5

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(50):
            f = _record(rng, int(rng.integers(0, 2000)))
            _check_record(compact_records(f, pred, indices=True),
                          _want(f, f["e"] < 5, True))

    in_threads(work, 4)


def _native_record(rng: np.random.Generator, n: int, p: float) -> dict[str, np.ndarray]:
    """Native fields of every gather form: one unit a row of 1, 2, 4 and 8 bytes (bool, int8,
    float32, float64, complex64, an (n, 1) uint16), and rows of several units (complex128,
    (n, 3) float32): ``e < 10 * p`` selects about p of the rows."""
    return {"e": (rng.random(n) * 10).astype(np.float32),
            "eta": rng.standard_normal(n),
            "ok": rng.random(n) < p ** 0.5 if p < 1 else np.ones(n, bool),
            "k": rng.integers(-100, 100, n).astype(np.int8),
            "h": rng.integers(0, 60_000, (n, 1)).astype(np.uint16),
            "z": (rng.random(n) + 1j * rng.random(n)).astype(np.complex64),
            "w": (rng.random(n) - 1j * rng.random(n)).astype(np.complex128),
            "pos": rng.random((n, 3)).astype(np.float32)}


def _backend_calls(monkeypatch) -> list:
    """The kept calls that took the backend's call (numpy_records.compact_records)."""
    seen: list = []
    real = nc.records_backend

    def spy(fields, *args):
        seen.append(next(iter(fields.values())).shape[0])
        return real(fields, *args)

    monkeypatch.setattr(nc, "records_backend", spy)
    return seen


@pytest.mark.parametrize("indices", [False, True])
@pytest.mark.parametrize("pred", ["(e < 10 * 0.5) & ok", lambda e, ok: (e < 5) & ok],
                         ids=["str", "lambda"])
def test_records_kept_pass_and_gathers_run_directly(pred, indices, monkeypatch):
    """A kept call on native, C-contiguous fields runs the kept predicate pass and each
    field's gather itself (numpy_calls.RecordsCall.direct), never the backend's call, and
    equals NumPy for every row count, none and all selected, every gather form; a field not
    C-contiguous, or fields past numpy_records.THREADED_BYTES in all, take the backend's
    call (its threads), equal to NumPy too."""
    from dask_compact import compact_records
    from dask_compact.backends import numpy_records

    rng = np.random.default_rng(30)

    def mask(f):
        return (f["e"] < 5) & f["ok"]

    first = _native_record(rng, 1000, 0.5)
    _check_record(compact_records(first, pred, indices=indices),
                  _want(first, mask(first), indices))
    (call,) = nc._records_calls._items.values()
    assert call.loop is not None and call.reads == ("e", "ok")
    forms = {name: gather is not None for name, _, _, gather in call.columns}
    assert forms == {"e": True, "eta": True, "ok": True, "k": True, "h": True, "z": True,
                     "w": False, "pos": False}
    backend = _backend_calls(monkeypatch)
    _no_records_dispatch(monkeypatch)
    for n in [*SIZES, 2, 97, 8191]:
        for p in (0.5, 0.0, 1.0):
            f = _native_record(rng, n, p)
            if p == 0.0:
                f["ok"][:] = False
            if p == 1.0:
                f["e"][:] = 1
            _check_record(compact_records(f, pred, indices=indices), _want(f, mask(f), indices))
    assert backend == []
    f = _native_record(rng, 4099, 0.5)
    f["eta"] = rng.standard_normal(2 * 4099)[::2]  # strided: the backend's copy
    _check_record(compact_records(f, pred, indices=indices), _want(f, mask(f), indices))
    assert backend == [4099]
    monkeypatch.setattr(numpy_records, "THREADED_BYTES", 1 << 12)  # 4099 rows are past it
    f = _native_record(rng, 4099, 0.5)
    _check_record(compact_records(f, pred, indices=indices), _want(f, mask(f), indices))
    assert backend == [4099, 4099]


def test_records_kept_call_of_the_other_byte_order_keeps_no_pass():
    """A field of the other byte order: the kept call holds no pass of its own (the backend
    reads such a field through a native copy), and stays exact."""
    from dask_compact import compact_records

    rng = np.random.default_rng(31)
    for _ in range(3):
        f = _native_record(rng, 777, 0.5)
        f["k"] = f["k"].astype(">i2")
        _check_record(compact_records(f, "(e < 5) & (k > 0)"),
                      _want(f, (f["e"] < 5) & (f["k"] > 0), False))
    (call,) = nc._records_calls._items.values()
    assert call.loop is None


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32 - 1),
       t=st.floats(0, 10, allow_nan=False), indices=st.booleans())
def test_records_kept_direct_calls_equal_numpy(n, seed, t, indices):
    """Kept direct calls (a threshold read from a closure, new rows each call) against
    NumPy's boolean indexing of every field."""
    from dask_compact import compact_records

    rng = np.random.default_rng(seed)
    pred = lambda e, k: (e < t) | (k == 7)  # noqa: E731
    for _ in range(2):  # the first call checks and keeps, the second runs the kept call
        f = _native_record(rng, n, 0.5)
        _check_record(compact_records(f, pred, indices=indices),
                      _want(f, (f["e"] < t) | (f["k"] == 7), indices))
