"""compact_records on CuPy fields (the record kernels of kernels/records.cu), against NumPy:
odd sizes, empty and full selections, every dtype as the predicate's field with every dtype
gathered, trailing axes and row widths of every copy unit, unaligned views, the mask path,
dask arrays of CuPy chunks (of unknown row sizes too), and more than 2^31 rows."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

from conftest import device_pool_capped, key_predicate, random_array  # noqa: E402

from dask_compact import compact_records  # noqa: E402
from dask_compact.backends import cupy_tuning  # noqa: E402
from dask_compact.validate import DTYPES  # noqa: E402

pytestmark = pytest.mark.gpu

SIZES = [0, 1, 31, 32, 33, 1023, 1025, 2047, 2048, 2049, 65_537, 1_000_003]


def check(got: dict, f_np: dict, mask: np.ndarray, indices: bool = False) -> None:
    want = {k: v[mask] for k, v in f_np.items()}
    if indices:
        want["indices"] = np.flatnonzero(mask)
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        assert isinstance(g, cupy.ndarray), k
        assert g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_array_equal(cupy.asnumpy(g), w, err_msg=k)


def fields(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "mass": (rng.random(n) * 10).astype(np.float32),
        "r": rng.random(n),
        "pos": rng.random((n, 3)).astype(np.float32),  # 12-byte rows: 4-byte units
        "vel": rng.standard_normal((n, 2)),  # 16-byte rows
        "id": np.arange(n, dtype=np.int64),
        "tag": rng.integers(0, 255, n).astype(np.uint8),  # 1-byte rows
        "pix": rng.integers(0, 2**16, (n, 3)).astype(np.uint16),  # 6-byte rows: 2-byte units
        "z": (rng.random(n) + 1j * rng.random(n)).astype(np.complex128),
    }


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 0.95, 1.0])
def test_against_numpy(n: int, p: float) -> None:
    f_np = fields(n, n)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    t = 10 * (1 - p) - (1e-3 if p == 1 else 0)
    mask = (f_np["mass"] > t) & (f_np["r"] < 2)
    check(compact_records(f, f"(mass > {t!r}) & (r < 2)", indices=True), f_np, mask, True)


@pytest.mark.parametrize("pdt", DTYPES, ids=str)
def test_every_dtype_pair(pdt: np.dtype) -> None:
    rng = np.random.default_rng(1)
    n = 4099
    key = random_array(rng, n, pdt)
    f_np = {"key": key, **{f"g_{d.name}": random_array(rng, (n,), d) for d in DTYPES}}
    pred, mask = key_predicate(key)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    check(compact_records(f, pred, indices=True), f_np, mask, True)


def test_unaligned_views_and_mask_path() -> None:
    n = 50_001
    rng = np.random.default_rng(2)
    base = {k: rng.random(n + 1) for k in ("a", "b")}
    f = {k: cupy.asarray(v)[1:] for k, v in base.items()}  # 8-byte, not 16-byte aligned
    f["c"] = cupy.asarray(rng.integers(0, 9, n + 3).astype(np.uint8))[3:]
    f_np = {k: cupy.asnumpy(v) for k, v in f.items()}
    check(compact_records(f, "(a < 0.3) | (c == 4)"), f_np, (f_np["a"] < 0.3) | (f_np["c"] == 4))
    # v.astype(...) is not traced: the callable runs per chunk on CuPy (the mask path)
    got = compact_records(f, lambda a, c: (c.astype(np.int64) % 3 == 1) & (a < 0.9))
    check(got, f_np, (f_np["c"].astype(np.int64) % 3 == 1) & (f_np["a"] < 0.9))
    # a constant beyond the field's dtype: evaluated by CuPy (whatever CuPy does with it, we
    # do the same, as the one-array path)
    try:
        want = cupy.asnumpy(f["c"] < 1000)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):
            compact_records(f, "c < 1000")
    else:
        check(compact_records(f, "c < 1000"), f_np, want)
    # float16 and a transcendental function compile on the GPU
    f["h"] = f["a"].astype(np.float16)
    f_np["h"] = cupy.asnumpy(f["h"])
    check(compact_records(f, "sin(h) < 0.5"), f_np, np.sin(f_np["h"]) < 0.5)


def test_dask_cupy_chunks() -> None:
    n = 300_007
    f_np = fields(n, 3)
    d = {k: da.from_array(v, chunks=(40_000,) + v.shape[1:]).map_blocks(cupy.asarray)
         for k, v in f_np.items()}  # fmt: skip
    d["r"] = da.from_array(f_np["r"], chunks=70_000).map_blocks(cupy.asarray)  # misaligned
    out = compact_records(d, lambda mass, r: (mass > 5) & (r < 0.5), indices=True)
    assert all(isinstance(v._meta, cupy.ndarray) for v in out.values())
    assert len({v.chunks[0] for v in out.values()}) == 1
    assert not any(np.isnan(out["id"].chunks[0]))
    got = {k: v.compute() for k, v in out.items()}
    check(got, f_np, (f_np["mass"] > 5) & (f_np["r"] < 0.5), True)


@pytest.mark.parametrize("lazy", [False, True])
def test_dask_cupy_fields_of_unknown_sizes(lazy: bool) -> None:
    """Dask fields of CuPy chunks of unknown row sizes (a boolean selection's, declared CuPy:
    dask's own boolean indexing declares NumPy chunks), paired chunk by chunk: eager, the
    result's sizes from the counts; the indices' starts from a task over every chunk's rows
    (the CPU tests: test_records_unknown.py)."""
    n = 300_007
    f_np = fields(n, 5)
    # the first two chunks select nothing
    keep = (np.arange(n) > 50_000) & (np.random.default_rng(5).random(n) < 0.7)
    m = da.from_array(keep, chunks=40_000).map_blocks(cupy.asarray)
    d = {}
    for k, v in f_np.items():
        u = da.from_array(v, chunks=(40_000, *v.shape[1:])).map_blocks(cupy.asarray)[m]
        d[k] = da.Array(u.dask, u.name, u.chunks, meta=cupy.empty((0, *v.shape[1:]), v.dtype))
    assert np.isnan(d["pos"].shape[0]) and d["pos"].chunks[1] == (3,)
    sel = {k: v[keep] for k, v in f_np.items()}
    out = compact_records(d, lambda mass, r: (mass > 5) & (r < 0.5), indices=True, lazy=lazy)
    assert all(isinstance(v._meta, cupy.ndarray) for v in out.values())
    assert len({v.chunks[0] for v in out.values()}) == 1
    assert lazy == any(np.isnan(out["id"].chunks[0]))
    got = {k: v.compute() for k, v in out.items()}
    check(got, sel, (sel["mass"] > 5) & (sel["r"] < 0.5), True)


@pytest.mark.parametrize("dense_from", [0.0, 2.0], ids=["scatter-only", "list-only"])
@pytest.mark.parametrize("n", [1, 33, 8191, 8192, 8193, 65_537, 1_000_003])
@pytest.mark.parametrize("p", [0.05, 0.5, 1.0])
def test_each_copy_form(monkeypatch, dense_from: float, n: int, p: float) -> None:
    """Every span through one form of the copy pass (the per-lane scatter, or the list in
    shared memory), every row width and unit, in memory and into buffers."""
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_tuning

    monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", dense_from)
    f_np = fields(n, n + 5)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    t = 10 * (1 - p) - (1e-3 if p == 1 else 0)
    mask = f_np["mass"] > t
    check(compact_records(f, f"mass > {t!r}", indices=True), f_np, mask, True)
    out = {"vel": cupy.empty((n, 2)), "indices": cupy.empty(n, np.int64)}
    k = int(compact_records_into(f, f"mass > {t!r}", out).get()[0])
    assert k == int(mask.sum())
    np.testing.assert_array_equal(cupy.asnumpy(out["vel"][:k]), f_np["vel"][mask])
    np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(mask))


@pytest.mark.parametrize("n", [4096, 3 * 4096 + 17, 65_536, 1_000_003])
@pytest.mark.parametrize("p", [0.3, 0.5, 0.95, 1.0])
def test_staged_copy_every_width(monkeypatch, n: int, p: float) -> None:
    """The scatter's columns staged through shared memory (stride-1 rows of 1, 2, 4 and 8
    bytes, whole tiles, 16-byte aligned addresses; every span to the scatter): every width, a
    column of two 4-byte or two 1-byte values a row, outputs at odd offsets (each tile's run
    starting anywhere in its 16 bytes), in memory and into fresh, 16-byte aligned and
    misaligned buffers (the last copied per lane), rows in order."""
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_tuning

    monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", 0.0)
    rng = np.random.default_rng(n)
    f_np = {
        "key": rng.random(n),
        "u1": rng.integers(0, 255, n).astype(np.uint8),
        "b": rng.random(n) < 0.5,
        "i2": rng.integers(-30000, 30000, n).astype(np.int16),
        "h": rng.standard_normal(n).astype(np.float16),
        "f4": rng.standard_normal(n).astype(np.float32),
        "i8": rng.integers(-(2**62), 2**62, n),
        "c8": (rng.random(n) + 1j * rng.random(n)).astype(np.complex64),
        "xy": rng.standard_normal((n, 2)).astype(np.float32),  # 8-byte rows
        "rg": rng.integers(0, 255, (n, 2)).astype(np.uint8),  # 2-byte rows
    }
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    t = 1 - p - (1e-3 if p == 1 else 0)
    mask = f_np["key"] > t
    check(compact_records(f, f"key > {t!r}", indices=True), f_np, mask, True)
    k = int(mask.sum())
    for offset in (0, 1, 3):  # rows into a larger buffer: 16-byte aligned only at 0
        out = {name: cupy.full((n + offset,) + v.shape[1:], 7, v.dtype)[offset:]
               for name, v in f_np.items() if name != "key"}  # fmt: skip
        out["indices"] = cupy.full(n + offset, -7, np.int64)[offset:]
        got = int(compact_records_into(f, f"key > {t!r}", out).get()[0])
        assert got == k, offset
        for name, buf in out.items():
            want = np.flatnonzero(mask) if name == "indices" else f_np[name][mask]
            np.testing.assert_array_equal(cupy.asnumpy(buf[:k]), want, err_msg=name)


@pytest.mark.parametrize("form", ["scatter", "list"])
@pytest.mark.parametrize("n", [4096, 3 * 4096 + 17, 65_537, 1_000_003])
@pytest.mark.parametrize("p", [0.05, 0.5, 1.0])
def test_rows_of_several_units_in_each_form(monkeypatch, form: str, n: int, p: float) -> None:
    """Rows of several units, each field one entry of the column table whose row the copy
    moves whole: in the scatter staged through shared memory (whole tiles of rows up to
    1022 bytes, by 16-byte loads or, where the field is not 16-byte aligned, by loads of its
    unit) or a warp a row (wider rows, the last tile), or through the list form's run of units;
    field views starting inside a row's buffer, outputs into buffers at odd row offsets whose
    rows past the count stay as they were, rows in order."""
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_tuning

    monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", 2.0 if form == "list" else 0.0)
    rng = np.random.default_rng(n + 7)
    f_np = {
        "key": rng.random(n),
        "ray": rng.standard_normal((n, 3)).astype(np.float32),  # 12 bytes: 3 words
        "r64": rng.standard_normal((n, 3)),  # 24 bytes: 8-byte units
        "wide": rng.standard_normal((n, 16)).astype(np.float32),  # 64 bytes: 16-byte units
        "wider": rng.standard_normal((n, 17)).astype(np.float32),  # 68 bytes: 17 words
        "m": rng.standard_normal((n, 2, 2)),  # 32 bytes, two 16-byte units
        "i2": rng.integers(-30000, 30000, (n, 3)).astype(np.int16),  # 2-byte units
        "u1": rng.integers(0, 255, (n, 5)).astype(np.uint8),  # 1-byte units
    }
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    # a view one row into its buffer: 12 bytes off the allocation (staged by 4-byte loads)
    f["ray"] = cupy.concatenate([cupy.zeros((1, 3), np.float32), f["ray"]])[1:]
    if n <= 65_537:  # rows wider than the stage takes: a warp a row in every tile
        f_np["huge"] = rng.standard_normal((n, 260)).astype(np.float32)
        f["huge"] = cupy.asarray(f_np["huge"])
    # float32 rows 2 bytes off: 2-byte units, staged by 2-byte loads
    f_np["odd"] = rng.standard_normal((n, 3)).astype(np.float32)
    raw = cupy.zeros(12 * n + 16, np.uint8)
    f["odd"] = cupy.ndarray((n, 3), np.float32, memptr=raw.data + 2)
    f["odd"][...] = cupy.asarray(f_np["odd"])
    t = 1 - p - (1e-3 if p == 1 else 0)
    mask = f_np["key"] > t
    check(compact_records(f, f"key > {t!r}", indices=True), f_np, mask, True)
    k = int(mask.sum())
    for offset in (0, 1, 3):
        out = {name: cupy.full((n + offset,) + v.shape[1:], 7, v.dtype)[offset:]
               for name, v in f_np.items() if name != "key"}  # fmt: skip
        got = int(compact_records_into(f, f"key > {t!r}", out).get()[0])
        assert got == k, offset
        for name, buf in out.items():
            np.testing.assert_array_equal(cupy.asnumpy(buf[:k]), f_np[name][mask], err_msg=name)
            assert bool((buf[k:] == 7).all()), (name, offset)


def test_mixed_density_takes_both_forms() -> None:
    """Stretches of every density, not aligned to the 8192-row spans: sparse spans go to the
    list form, dense ones to the scatter, in one call, and the rows still land in order."""
    n = 400_009
    f_np = fields(n, 21)
    rng = np.random.default_rng(22)
    stretch = np.repeat(rng.random(n // 5_000 + 1), 5_000)[:n]  # a density per 5000 rows
    mask = rng.random(n) < stretch
    f_np["keep"] = mask
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    check(compact_records(f, "keep", indices=True), f_np, mask, True)


def test_into_takes_both_work_lists() -> None:
    """The sync-free call cannot size the copy's grids by the two work lists (their lengths
    stay on the device): each form's grid covers every span and reads its list's length. 49
    spans of mixed density (both lists long), every row in order, in memory and into buffers."""
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_records
    from dask_compact.records_check import check_record_predicate

    n = 400_009
    f_np = fields(n, 31)
    rng = np.random.default_rng(32)
    stretch = np.repeat(rng.random(n // 5_000 + 1), 5_000)[:n]
    mask = rng.random(n) < stretch
    f_np["keep"] = mask
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    total, dense, sparse = cupy_records._Pass(f, check_record_predicate("keep", f), n).read_back()
    assert total == int(mask.sum()) and dense >= 5 and sparse >= 5, (dense, sparse)
    check(compact_records(f, "keep", indices=True), f_np, mask, True)
    out = {"pos": cupy.full((n, 3), -7, np.float32), "tag": cupy.zeros(n, np.uint8),
           "vel": cupy.empty((n, 2)), "indices": cupy.full(n, -7, np.int64)}  # fmt: skip
    k = int(compact_records_into(f, "keep", out).get()[0])
    assert k == int(mask.sum())
    for name in ("pos", "tag", "vel"):
        np.testing.assert_array_equal(cupy.asnumpy(out[name][:k]), f_np[name][mask])
    np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(mask))


@pytest.mark.usefixtures("big_device_memory")
@pytest.mark.slow
@pytest.mark.parametrize("dense_from", [0.0, 0.5], ids=["scatter-only", "default"])
def test_more_than_2_31_rows(monkeypatch, dense_from: float) -> None:
    from dask_compact.backends import cupy_tuning

    monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", dense_from)
    n = 2**31 + 2**20 + 5
    # every 1000th row from row 3, set in place: `cupy.arange(n, dtype=int64) % 1000 == 3`
    # made two 17 GB temporaries, and beside the other workers' pools one failed to allocate
    # on an 80 GB H100 under -n 15 (2026-12-06), the big-memory lock notwithstanding
    key = cupy.zeros(n, dtype=cupy.bool_)
    key[3::1000] = True
    pay = cupy.ones(n, dtype=cupy.uint8)
    out = compact_records({"key": key, "pay": pay}, "key", indices=True)
    want = int(cupy.count_nonzero(key))
    assert out["pay"].shape == (want,) and int(out["pay"].sum()) == want
    idx = out["indices"]
    assert int(idx[-1]) == n - 1 - ((n - 1 - 3) % 1000)
    assert bool(cupy.all(idx % 1000 == 3)) and bool(cupy.all(cupy.diff(idx) == 1000))


@pytest.mark.parametrize("n", [1, 33, 4097, 1_000_003])
def test_into_on_a_stream(n: int) -> None:
    """compact_records_into: queued on a non-blocking stream, the count stays on the device;
    the first count rows of every buffer are the selection."""
    from dask_compact import compact_records_into

    f_np = fields(n, 11)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    mask = (f_np["mass"] > 3) & (f_np["r"] < 0.6)
    out = {"pos": cupy.full((n, 3), -7, np.float32), "z": cupy.empty(n + 5, np.complex128),
           "indices": cupy.full(n, -7, np.int64)}  # fmt: skip
    count = cupy.full(1, -1, np.int64)
    s = cupy.cuda.Stream(non_blocking=True)
    # the fields, buffers and count were written on the default stream, which a non-blocking
    # stream does not wait for: order them as a user must (an event, no host wait). Without
    # it the fill of count with -1 ran after the call's count once (H100, 2026-11-26).
    s.wait_event(cupy.cuda.Stream.null.record())
    got = compact_records_into(f, "(mass > 3) & (r < 0.6)", out, count=count, stream=s)
    assert got is count
    s.synchronize()
    k = int(count.get()[0])
    assert k == int(mask.sum())
    np.testing.assert_array_equal(cupy.asnumpy(out["pos"][:k]), f_np["pos"][mask])
    np.testing.assert_array_equal(cupy.asnumpy(out["z"][:k]), f_np["z"][mask])
    np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(mask))


def test_into_graph_capture_replays_on_new_data() -> None:
    """Captured once (capture refuses a host synchronisation), replayed on new data written
    into the same fields: each replay gives that data's selection and count."""
    from dask_compact import compact_records_into

    n = (1 << 20) + 7
    f = {k: cupy.asarray(v) for k, v in fields(n, 12).items()}
    out = {"id": cupy.empty(n, np.int64), "vel": cupy.empty((n, 2)),
           "indices": cupy.empty(n, np.int64)}  # fmt: skip
    count = cupy.zeros(1, dtype=np.int64)
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())  # the fields were written on the default one
    compact_records_into(f, "(mass > 5) & (r < 0.5)", out, count=count, stream=s)  # warm
    s.synchronize()
    with s:
        s.begin_capture()
        compact_records_into(f, "(mass > 5) & (r < 0.5)", out, count=count, stream=s)
        graph = s.end_capture()
    for seed in (13, 14, 15):
        host = fields(n, seed)
        for k in f:
            f[k].set(host[k])
        count.fill(-1)
        cupy.cuda.Device().synchronize()
        graph.launch(stream=s)
        s.synchronize()
        mask = (host["mass"] > 5) & (host["r"] < 0.5)
        k = int(count.get()[0])
        assert k == int(mask.sum())
        np.testing.assert_array_equal(cupy.asnumpy(out["vel"][:k]), host["vel"][mask])
        np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(mask))


def test_records_out_of_device_memory_say_what_they_needed():
    """Where the selected rows do not fit, CuPy's OutOfMemoryError (a MemoryError) carries a
    note with the rows, the bytes and the ways out; with room, the same call answers."""
    import dask_compact

    n = 1 << 22
    rng = np.random.default_rng(8)
    host = {k: rng.random(n, dtype=np.float32) for k in ("a", "b", "c", "d")}
    dev = {k: cupy.asarray(v) for k, v in host.items()}
    with device_pool_capped(8 << 20):  # the passes fit, 61 MiB of rows not
        with pytest.raises(MemoryError) as err:
            dask_compact.compact_records(dev, "a < 0.95")
    assert any("selected rows of" in note for note in getattr(err.value, "__notes__", ()))
    got = dask_compact.compact_records(dev, "a < 0.95")
    m = host["a"] < 0.95
    for k, v in host.items():
        np.testing.assert_array_equal(cupy.asnumpy(got[k]), v[m])


@pytest.mark.parametrize("id_dtype", ["uint8", "uint64"])
def test_sentinel_outside_the_dtype_keeps_float32_subnormals(monkeypatch, id_dtype) -> None:
    """``id != -1`` on an unsigned field (NumPy 2: all True) made the predicate CuPy-evaluated,
    whose ufuncs flush float32 subnormals (``-ftz=true``: ``1e-40 > 0`` False); it is folded
    now and the record kernel runs (the mask path refused here)."""
    from dask_compact.backends import cupy_records

    def refuse(*args, **kwargs):
        raise AssertionError("the mask path ran")

    monkeypatch.setattr(cupy_records, "record_mask", refuse)
    small = {"id": np.array([1, 2, 3, 4], id_dtype),
             "e": np.array([1e-40, -1e-40, 2, 0], np.float32)}
    got = compact_records({k: cupy.asarray(v) for k, v in small.items()},
                          "(id != -1) & (e > 0)", indices=True)
    assert cupy.asnumpy(got["indices"]).tolist() == [0, 2]
    rng = np.random.default_rng(7)
    n = 1025
    f_np = {"id": rng.integers(0, 200, n).astype(id_dtype),
            "e": rng.choice(np.array([1e-40, -1e-40, 1e-45, 2, 0], np.float32), n)}
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    for pred, mask in [
        ("(id != -1) & (e > 0)", (f_np["id"] != -1) & (f_np["e"] > 0)),
        ("(id == -1) | (e < 0)", (f_np["id"] == -1) | (f_np["e"] < 0)),
        ("(id < 2**64) & (e != 0)", (f_np["id"] < 2**64) & (f_np["e"] != 0)),
    ]:
        check(compact_records(f, pred, indices=True), f_np, mask, True)


# -- fields of the other byte order ---------------------------------------------------------

def other_order(a_np: np.ndarray) -> cupy.ndarray:
    """``a_np``'s numbers as a CuPy array of the other byte order: CuPy makes none, only views
    of a swapped dtype (here of the swapped numbers' bytes, copied as they are); a dtype of
    one byte has no order and comes back as it is."""
    swapped = a_np.astype(a_np.dtype.newbyteorder())
    return cupy.asarray(swapped.view(np.uint8)).view(swapped.dtype)


def with_specials(a: np.ndarray) -> np.ndarray:
    """``a`` with signed zeros and NaNs among its numbers (floats and complex), to be compared
    by their bits."""
    if a.dtype.kind in "fc" and a.size:
        flat = a.reshape(-1)
        flat[::7] = -0.0
        flat[3::11] = np.nan
    return a


def same_bits(got: cupy.ndarray, want: np.ndarray, what: str) -> None:
    """``got`` is ``want`` (native), bit for bit."""
    assert isinstance(got, cupy.ndarray), what
    assert got.dtype == want.dtype and got.dtype.isnative, (what, got.dtype, want.dtype)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_array_equal(np.ascontiguousarray(cupy.asnumpy(got)).view(np.uint8),
                                  np.ascontiguousarray(want).view(np.uint8), err_msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ready", [True, False], ids=["ready-call", "general"])
def test_fields_of_the_other_byte_order_match_numpy(dtype: np.dtype, ready: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """compact_records of CuPy fields of the other byte order (views of a swapped dtype): the
    predicate's field, a gathered field and one of rows of three, with a native field beside
    them. The sized call made its outputs in the fields' dtypes, which CuPy refuses to make
    (ValueError: big-endian byte-order) until 2026-12-01 (fourteenth session): every field of
    the other order is taken as a native copy now (cupy_records_common.native_fields), as the
    one-array calls take such input, and its output is native. Odd sizes, some, none and all
    rows, with and without indices, each call twice (the second through the kept repeated
    call where ``ready``), a mask-path callable; bit for bit against NumPy on the
    swapped-back numbers. compact_records_into of the same fields into buffers of their own
    dtype (views, as CuPy allows) copies them as they are."""
    from dask_compact import compact_records_into

    monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", ready)
    for n in (0, 1, 31, 33, 1025, 65_537):
        rng = np.random.default_rng(n)
        f_np = {"key": with_specials(random_array(rng, n, dtype)), "m": rng.random(n),
                "g": with_specials(random_array(rng, n, dtype)),
                "pos": with_specials(random_array(rng, (n, 3), dtype)),
                "id": np.arange(n, dtype=np.int64)}  # fmt: skip
        f = {k: other_order(v) if k != "id" else cupy.asarray(v) for k, v in f_np.items()}
        if dtype.itemsize > 1:
            assert not any(f[k].dtype.isnative for k in ("key", "m", "g", "pos"))
        pred, mask = key_predicate(f_np["key"])
        cases = [(pred, mask), ("m < 2", np.ones(n, bool)), ("m < -1", np.zeros(n, bool)),
                 ("(m < 0.5) & (m > 0.25)", (f_np["m"] < 0.5) & (f_np["m"] > 0.25))]
        for p, want in cases:
            for indices in (False, True):
                for _ in range(2):
                    got = compact_records(f, p, indices=indices)
                    assert list(got) == list(f) + (["indices"] if indices else [])
                    for k, v in f_np.items():
                        same_bits(got[k], v[want], f"{dtype} n={n} {p} {k}")
                    if indices:
                        same_bits(got["indices"], np.flatnonzero(want), f"{dtype} {p} indices")
        # v.astype(...) is not traced: the callable runs on CuPy on the native copies
        got = compact_records(f, lambda m: m.astype(np.float32) < 0.5, indices=True)
        want = f_np["m"].astype(np.float32) < 0.5
        for k, v in f_np.items():
            same_bits(got[k], v[want], f"{dtype} n={n} mask path {k}")
        same_bits(got["indices"], np.flatnonzero(want), f"{dtype} n={n} mask path indices")
        if n:
            out = {"g": cupy.empty(n, np.dtype(dtype)).view(f["g"].dtype),
                   "pos": cupy.empty((n, 3), np.dtype(dtype)).view(f["pos"].dtype),
                   "indices": cupy.empty(n, np.int64)}  # fmt: skip
            for _ in range(2):
                k = int(compact_records_into(f, "m < 0.5", out)[0])
                want = f_np["m"] < 0.5
                assert k == int(want.sum())
                for name in ("g", "pos"):
                    assert out[name].dtype == f[name].dtype
                    same_bits(out[name][:k].view(np.dtype(dtype)),
                              f_np[name][want].astype(f[name].dtype).view(np.dtype(dtype)),
                              f"{dtype} n={n} into {name}")
                same_bits(out["indices"][:k], np.flatnonzero(want), f"{dtype} into indices")
            # native buffers (what a user makes: CuPy makes no array of the other order),
            # the predicate's field among them, on a stream of the call's own: filled from
            # native copies made on that stream; refused until 2026-12-01 (fifteenth session)
            nat = {"m": cupy.empty(n, np.float64), "g": cupy.empty(n, np.dtype(dtype)),
                   "pos": cupy.empty((n, 3), np.dtype(dtype)),
                   "indices": cupy.empty(n, np.int64)}  # fmt: skip
            s = cupy.cuda.Stream(non_blocking=True)
            want = f_np["m"] < 0.5
            for _ in range(2):
                k = int(compact_records_into(f, "m < 0.5", nat, stream=s).get(stream=s)[0])
                s.synchronize()
                assert k == int(want.sum())
                for name in ("m", "g", "pos"):
                    same_bits(nat[name][:k], f_np[name][want], f"{dtype} n={n} native {name}")
                same_bits(nat["indices"][:k], np.flatnonzero(want), f"{dtype} native indices")



def test_into_a_buffer_of_another_dtype_names_each_byte_order_taken() -> None:
    """compact_records_into of a CuPy field of the other byte order into a buffer of another
    dtype: the refusal names the field's dtype and the native one, each of which is taken
    (``records_check.out_dtypes``; until 2026-12-02, nineteenth session, it named the
    field's alone, where the native buffer is what a user makes). Written without a GPU:
    the rule itself is tested on the CPU (test_records.py)."""
    from dask_compact import compact_records_into

    m_np = np.linspace(0, 2, 33)
    f = {"m": other_order(m_np)}
    be, le = f["m"].dtype, f["m"].dtype.newbyteorder("=")
    assert not be.isnative
    with pytest.raises(TypeError) as e:
        compact_records_into(f, "m > 1", {"m": cupy.empty(33, np.float32)})
    assert str(e.value) == (f"out['m'] must have dtype {be} or {le} (either byte order); "
                            "got float32")
    keep = m_np > 1
    for buf in (cupy.empty(33, le), cupy.empty(33, le).view(be)):
        k = int(compact_records_into(f, "m > 1", {"m": buf})[0])
        assert k == int(keep.sum())
        np.testing.assert_array_equal(cupy.asnumpy(buf[:k]).astype(le), m_np[keep])

@pytest.mark.parametrize("dtype", ["float32", "int64", "complex128", "uint16"])
def test_dask_cupy_fields_of_the_other_byte_order_match_numpy(dtype: str) -> None:
    """compact_records over dask arrays of CuPy chunks of the other byte order (views of a
    swapped dtype), one of them chunked apart (rechunked to the others): each field is taken
    in native order as its chunks are read (records_graph._native_cupy), and the result is
    native. Until 2026-12-01 (fourteenth session) the result declared the fields' dtype, whose
    CuPy meta CuPy refuses to make, and each chunk's sized call made its outputs in it."""
    n = 100_003
    rng = np.random.default_rng(5)
    dt = np.dtype(dtype)
    f_np = {"key": with_specials(random_array(rng, n, dt)), "m": rng.random(n),
            "pos": with_specials(random_array(rng, (n, 3), dt)),
            "id": np.arange(n, dtype=np.int64)}  # fmt: skip

    def on_gpu(v: np.ndarray, chunks: int) -> da.Array:
        swapped = v.astype(v.dtype.newbyteorder())
        meta = cupy.empty((0, *v.shape[1:]), v.dtype).view(swapped.dtype)
        return da.from_array(swapped, chunks=(chunks, *v.shape[1:])).map_blocks(
            lambda b: cupy.asarray(b.view(np.uint8)).view(b.dtype), dtype=swapped.dtype,
            meta=meta)

    d = {k: on_gpu(v, 20_000) for k, v in f_np.items()}
    d["m"] = on_gpu(f_np["m"], 30_001)  # misaligned: rechunked to the predicate's first field
    pred, mask = key_predicate(f_np["key"])
    want = mask & (f_np["m"] < 0.7)
    for lazy in (False, True):
        out = compact_records(d, f"({pred}) & (m < 0.7)", indices=True, lazy=lazy)
        assert all(isinstance(v._meta, cupy.ndarray) for v in out.values())
        assert all(v.dtype.isnative for v in out.values())
        got = {k: v.compute(scheduler="threads") for k, v in out.items()}
        for k, v in f_np.items():
            same_bits(got[k], v[want], f"{dtype} lazy={lazy} {k}")
        same_bits(got["indices"], np.flatnonzero(want), f"{dtype} lazy={lazy} indices")
