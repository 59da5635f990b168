"""map_compact on CuPy chunks: CuPy results and meta, known chunks, on the threaded scheduler
and on a dask_cuda.LocalCUDACluster. Needs CuPy and a CUDA device (and dask_cuda for the
cluster test)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402

import dask_compact  # noqa: E402  (registers Array.map_compact)

pytestmark = pytest.mark.gpu


def _input(n: int = 2**20 + 11, chunks: int = 2**18):
    x_np = np.random.default_rng(0).random(n).astype(np.float32)
    return x_np, da.from_array(x_np, chunks=chunks).map_blocks(cupy.asarray)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize(
    "algorithm,stable", [("auto", True), ("three-pass", True), ("hybrid", False)]
)
def test_threaded_scheduler(output: str, algorithm: str, stable: bool) -> None:
    x_np, x = _input()
    with dask.config.set(scheduler="threads"):
        r = x.map_compact(
            lambda v: (v > 0.2) & (v < 0.3), output=output, stable=stable, algorithm=algorithm
        )
        parts = r if output == "both" else (r,)
        for part in parts:
            assert isinstance(part._meta, cupy.ndarray)
            assert not any(np.isnan(c) for c in part.chunks[0])
        got = [p.compute() for p in parts]
    for g in got:
        assert isinstance(g, cupy.ndarray)
    m = (x_np > 0.2) & (x_np < 0.3)
    want = {
        "values": [x_np[m]],
        "indices": [np.flatnonzero(m)],
        "both": [x_np[m], np.flatnonzero(m)],
    }[output]
    for g, w in zip(got, want):
        g = cupy.asnumpy(g)
        if not stable:
            g, w = np.sort(g), np.sort(w)
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("low_latency", [False, True])
def test_local_cuda_cluster(low_latency: bool) -> None:
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    x_np, x = _input(2**22 + 3, 2**20)
    with (
        dask_cuda.LocalCUDACluster(n_workers=1, threads_per_worker=2) as cluster,
        distributed.Client(cluster) as client,
    ):
        if low_latency:  # every stream of the cluster unbatched: the same results
            dask_compact.low_latency(client)
            assert client.scheduler_comm.interval == 0
        y = x.map_compact("x < 0.125", output="both")
        v, i = y
        assert isinstance(v._meta, cupy.ndarray) and isinstance(i._meta, cupy.ndarray)
        assert sum(v.chunks[0]) == int((x_np < 0.125).sum())
        vv, ii = client.compute([v, i], sync=True)
        assert isinstance(vv, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(vv), x_np[x_np < 0.125])
        np.testing.assert_array_equal(cupy.asnumpy(ii), np.flatnonzero(x_np < 0.125))


def test_local_cuda_cluster_one_task_per_worker_run() -> None:
    """A persisted CuPy input: each worker compacts its run of chunks in one task, the result
    is in order with known chunks, and no chunk moves between workers."""
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    ngpu = cupy.cuda.runtime.getDeviceCount()
    with (
        dask_cuda.LocalCUDACluster(n_workers=min(2, ngpu), threads_per_worker=1) as cluster,
        distributed.Client(cluster) as client,
    ):
        workers = sorted(client.nthreads())
        x_np = np.random.default_rng(4).random(2**22 + 5).astype(np.float32)
        cut = len(x_np) // len(workers)
        bounds = [
            (i * cut, len(x_np) if i == len(workers) - 1 else (i + 1) * cut)
            for i in range(len(workers))
        ]
        slabs = [
            client.persist(
                da.from_array(x_np[a:b], chunks=2**18).map_blocks(cupy.asarray), workers=[w]
            )
            for (a, b), w in zip(bounds, workers)
        ]
        x = da.concatenate(slabs).persist()
        distributed.wait(x)
        with distributed.get_task_stream() as ts:
            v, i = x.map_compact("x < 0.3", output="both")
        assert "-direct-" in v.name  # asked of the workers directly: no phase-1 task ran
        assert not [t for t in ts.data if "compact" in str(t["key"])]
        # one run per worker, its output cut into parts for 5 chunks at least (direct._parts)
        assert v.numblocks == (len(workers) * -(-5 // len(workers)),) and v.chunks == i.chunks
        moved = [s for t in ts.data for s in t["startstops"] if s["action"] == "transfer"]
        assert moved == []
        m = x_np < 0.3
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()), x_np[m])
        np.testing.assert_array_equal(cupy.asnumpy(i.compute()), np.flatnonzero(m))
        w = x.map_compact("x < 0.3", by_worker=False)
        # a chunk per input chunk, less those that selected nothing (results hold no empty
        # chunk: graph.without_empty_chunks); the slabs' last chunks hold 2-3 elements here
        edges = np.cumsum((0,) + x.chunks[0])
        kept = sum(bool(m[a:b].any()) for a, b in zip(edges[:-1], edges[1:]))
        assert w.numblocks == (kept,)
        np.testing.assert_array_equal(cupy.asnumpy(w.compute()), x_np[m])


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize(
    "algorithm,stable", [("auto", True), ("three-pass", True), ("hybrid", False), ("scan", True)]
)
def test_compact_runs_one_output_per_run(output: str, algorithm: str, stable: bool) -> None:
    """The CuPy compact_runs (every chunk of a worker's task, one host sync): one output per
    run, each its chunks' selections in order, empty chunks and runs included."""
    from dask_compact.dispatch import compact_runs
    from dask_compact.predicate import as_predicate

    rng = np.random.default_rng(21)
    sizes = [[1025, 0, 31], [2**16 + 7], [0], [33, 2**12, 1]]
    runs_np = [[rng.random(n).astype(np.float32) for n in run] for run in sizes]
    bases, at = [], 0
    for run in runs_np:
        bases.append([])
        for b in run:
            bases[-1].append(at)
            at += b.size + 1000  # gaps: the runs are not consecutive in the input
    pred = as_predicate(lambda v: (v < 0.3) | (v > 0.95))
    got = compact_runs.dispatch(cupy.ndarray)(
        [[cupy.asarray(b) for b in r] for r in runs_np], pred, output, stable, algorithm, bases
    )
    assert len(got) == len(runs_np)
    for g, run, bs in zip(got, runs_np, bases):
        m = [(b < 0.3) | (b > 0.95) for b in run]
        want_v = np.concatenate([b[k] for b, k in zip(run, m)])
        want_i = np.concatenate([np.flatnonzero(k) + base for k, base in zip(m, bs)])
        parts = g if output == "both" else (g,)
        wants = {"values": (want_v,), "indices": (want_i,), "both": (want_v, want_i)}[output]
        for p, w in zip(parts, wants):
            assert isinstance(p, cupy.ndarray)
            p = cupy.asnumpy(p)
            if not stable:
                p, w = np.sort(p), np.sort(w)
            np.testing.assert_array_equal(p, w)


@pytest.mark.parametrize("chunks", [(1000, 3), (999, 2)])
def test_per_column_constants_on_cupy_rows(chunks) -> None:
    """N-D CuPy chunks and a callable holding a CuPy array that broadcasts against the
    trailing axis: evaluated on blocks of whole rows, CuPy results with known chunks, equal
    to NumPy's a[a < c]."""
    a = np.random.default_rng(4).random((10_007, 3))
    c = np.array([0.2, 0.5, 0.8])
    x = da.from_array(a, chunks=chunks).map_blocks(cupy.asarray)
    cc = cupy.asarray(c)
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact(lambda q: q < cc, output="both")
        assert isinstance(v._meta, cupy.ndarray) and not any(np.isnan(v.chunks[0]))
        got_v, got_i = v.compute(), i.compute()
    assert isinstance(got_v, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got_v), a[a < c])
    np.testing.assert_array_equal(cupy.asnumpy(got_i), np.flatnonzero(a < c))


def _in_turn(client, a: np.ndarray, step: int):
    """``a`` as persisted CuPy blocks of ``step`` rows (whole trailing axes), block k on
    worker k mod 2 (loosely: a lost block is remade elsewhere)."""
    import distributed

    workers = sorted(client.nthreads())
    parts = [
        client.persist(
            da.from_array(a[s : s + step], chunks=(step, *a.shape[1:])).map_blocks(cupy.asarray),
            workers=[workers[k % 2]],
            allow_other_workers=True,
        )
        for k, s in enumerate(range(0, len(a), step))
    ]
    x = da.concatenate(parts).persist()
    distributed.wait(x)
    return x


@pytest.mark.parametrize("direct", [True, False])
def test_cluster_scattered_placement_one_task_per_worker(direct: bool) -> None:
    """CuPy chunks placed on two worker processes in turn (Dask's placement of a generated
    array, made deterministic; both may share one GPU): each worker asked directly (or, with
    that off, one phase-1 task per worker), one output chunk per input chunk in order, nothing
    moved, exact; a rebalance right after moves only merged pieces (the pieces stay where
    their groups are)."""
    import dask

    distributed = pytest.importorskip("distributed")
    x_np = np.random.default_rng(22).random(2**21 + 13).astype(np.float32)
    step = 2**17
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc,
        distributed.Client(lc) as client,
    ):
        x = _in_turn(client, x_np, step)
        with distributed.get_task_stream() as ts, dask.config.set(
                {"dask-compact.direct": direct}):
            v, i = x.map_compact("x < 0.3", output="both")
        keys = {str(t["key"]) for t in ts.data}
        if direct:
            assert "-direct-" in v.name and not [k for k in keys if "compact" in k], keys
        else:
            assert len([k for k in keys if "compact-group-" in k]) == 2, keys  # one per worker
        assert not [s for t in ts.data for s in t["startstops"] if s["action"] == "transfer"]
        assert v.numblocks == x.numblocks and v.chunks == i.chunks
        assert isinstance(v._meta, cupy.ndarray)
        m = x_np < 0.3
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()), x_np[m])
        np.testing.assert_array_equal(cupy.asnumpy(i.compute()), np.flatnonzero(m))
        np.testing.assert_array_equal(cupy.asnumpy(v[1000:300000].compute()), x_np[m][1000:300000])
        with distributed.get_task_stream() as ts:
            r = v.rechunk(2**16).persist()
            distributed.wait(r)
        moved = {str(t["key"]).split("-")[1] for t in ts.data
                 for s in t["startstops"] if s["action"] == "transfer"}
        assert moved <= {"merge"}, moved
        np.testing.assert_array_equal(cupy.asnumpy(r.compute()), x_np[m])


def test_cluster_scattered_nd_blocks_read_as_held() -> None:
    """N-D CuPy blocks of whole trailing axes, placed on two worker processes in turn: the
    group tasks read the persisted blocks themselves (flattened in C order); exact."""
    import dask

    distributed = pytest.importorskip("distributed")
    b = np.random.default_rng(23).random((2**15 + 3, 3, 4)).astype(np.float32)
    step = 2**12
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc,
        distributed.Client(lc) as client,
    ):
        x = _in_turn(client, b, step)
        with distributed.get_task_stream() as ts, dask.config.set(
                {"dask-compact.direct": False}):  # the group tasks (direct: tests/test_direct.py)
            v, i = x.map_compact("x < 0.3", output="both")
        keys = {str(t["key"]) for t in ts.data}
        assert len([k for k in keys if "compact-group-" in k]) == 2, keys
        m = b < 0.3
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()), b[m])
        np.testing.assert_array_equal(cupy.asnumpy(i.compute()), np.flatnonzero(m))


def test_one_selected_element_is_one_chunk_of_cupy() -> None:
    # chunks (0, 1, 0) were taken by Dask as broadcastable: ``y + 1`` computed three elements
    a = np.array([0.1, 0.2, 0.3, 0.9, 0.4, 0.1, 0.3], dtype=np.float32)
    x = da.from_array(a, chunks=2).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact("x > 0.5", output="both")
        r = dask_compact.compact_records({"e": x, "w": x * 2}, "e > 0.5", indices=True)
        y, k = dask_compact.partition(x[3:4], "x > 0.5")
        outs = [v, i, *r.values(), y, dask_compact.sort(v), dask_compact.cumsum(v)]
        for o in outs:
            assert o.numblocks == (1,) and isinstance(o._meta, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy((v + 1).compute()), a[3:4] + 1)
        np.testing.assert_array_equal(cupy.asnumpy((i * 1).compute()), [3])
        np.testing.assert_array_equal(cupy.asnumpy((r["w"] + r["e"]).compute()), a[3:4] * 3)
        np.testing.assert_array_equal(cupy.asnumpy((y - 1).compute()), a[3:4] - 1)
    assert k == 1


def _cupy_odd_chunks_as(b, chunk_dtype, planted=None, block_id=None):
    """CuPy chunk ``b``, in ``chunk_dtype`` where its index is odd (a dtype the array does
    not declare), holding ``planted`` in its middle where given."""
    b = cupy.asarray(b)
    if not block_id[0] % 2:
        return b
    c = b.astype(chunk_dtype)
    if planted is not None:
        c[c.size // 2] = planted
    return c


def test_cupy_chunks_of_another_dtype_than_declared() -> None:
    """The rule of every chunk (validate.as_declared) on CuPy chunks, the code NumPy's take:
    float32 chunks under float64 are cast on the device (every call's chunks float64, equal
    to NumPy on the declared values); float64 chunks of whole numbers under float32 are cast
    by their values, as well; float64 chunks holding 0.1 under float32 are refused, naming
    it."""
    a = (np.arange(4000) * 7 % 37).astype(np.float64)
    meta = cupy.empty(0, np.float64)
    x = da.from_array(a, chunks=500).map_blocks(_cupy_odd_chunks_as, "float32", meta=meta)
    m = a > 3
    with dask.config.set(scheduler="threads"):
        calls = {
            "map_compact": (x.map_compact("x > 3"), a[m]),
            "compact": (dask_compact.compact(x, x > 3), a[m]),
            "records": (dask_compact.compact_records({"a": x}, "a > 3")["a"], a[m]),
            "cumsum": (dask_compact.cumsum(x), np.cumsum(a)),
            "partition": (dask_compact.partition(x, "x > 3")[0],
                          np.concatenate([a[m], a[~m]])),
            "sort": (dask_compact.sort(x, buckets=3), np.sort(a)),
        }
        for name, (got, want) in calls.items():
            blocks = [b.compute() for b in got.to_delayed().ravel()]
            assert {b.dtype for b in blocks} == {np.dtype(np.float64)}, name
            assert all(isinstance(b, cupy.ndarray) for b in blocks), name
            np.testing.assert_array_equal(cupy.asnumpy(got.compute()), want, err_msg=name)
        f = a.astype(np.float32)
        whole = da.from_array(f, chunks=500).map_blocks(
            _cupy_odd_chunks_as, "float64", meta=cupy.empty(0, np.float32))
        got = whole.map_compact("x > 3")
        assert {b.compute().dtype for b in got.to_delayed().ravel()} == {f.dtype}
        np.testing.assert_array_equal(cupy.asnumpy(got.compute()), f[f > 3])
        y = da.from_array(f, chunks=500).map_blocks(
            _cupy_odd_chunks_as, "float64", 0.1, meta=cupy.empty(0, np.float32))
        for call in (lambda: y.map_compact("x > 3"), lambda: dask_compact.sort(y, buckets=3),
                     lambda: dask_compact.cumsum(y).compute()):
            with pytest.raises(TypeError, match=r"chunk [1357] of the input holds float64, "
                                                "but its dask array declares float32, and its "
                                                r"value 0.1 \(element 250 of the chunk\)"):
                call()


@pytest.mark.parametrize("values, chunk_dtype, declared", [
    ([1.5, np.nan, np.inf, -0.0, 0.1], "f8", "f4"), ([1.5, np.nan, np.inf, -0.0], "f8", "f4"),
    ([3, 2**53, 2**53 + 1], "i8", "f8"), ([3, 2**53], "i8", "f8"), ([2**64 - 1], "u8", "f8"),
    ([1, 2**63], "u8", "i8"), ([1, 2**63 - 1], "u8", "i8"), ([-1, 5], "i8", "u4"),
    ([0.0, -0.0, 7.0, 2.0**63], "f8", "i8"), ([0.0, -0.0, 7.0], "f8", "i8"),
    ([np.nan], "f8", "i8"), ([1 + 0j, 2j], "c16", "f4"), ([1 + 0j, np.nan], "c16", "f4"),
    ([0, 1, 2], "i8", "bool"), ([0, 1], "i8", "bool"), ([2**24 + 1], "i8", "c8"),
    # float32 subnormals, which CuPy's -ftz=true kernels compare as 0 (a review: cast to 0)
    ([1e-40, 2.0], "f4", "i4"), ([2.0, 1e-40], "f4", "u1"), ([-1e-40, 2.0], "f4", "i8"),
    ([1e-40, 2.0], "f4", "f2"), ([0.0, 1e-40, 1.0], "f4", "bool"),
    ([0.5, 1e-40, 3.0], "f4", "i4"), ([1 + 1e-40j, 2 + 0j], "c8", "f4"),
    ([1e-40 + 0j, 2 + 0j], "c8", "f2"), ([1e-40 + 0j, -1e-40 + 0j], "c8", "f4"),
    ([1e-40, 2.0], "f4", "c8"),
    # the casts CuPy's own astype flushes, rebuilt from the bits (design.md, "CuPy")
    ([1e-40, -1e-40, 2.0], "f4", "f8"), ([1e-40, -1e-40, 2.0], "f4", "c16"),
    ([1e-40 - 1e-40j, -1e-40 + 2j], "c8", "c16"), ([1e-40 + 0j, -1e-40 + 0j], "c8", "f8"),
    ([2.0**-149, -(2.0**-149), 1.0], "f8", "f4"), ([2.0**-149, 1e-40], "f8", "f4"),
    ([2.0**-149 - 2.0**-140j, 1.0], "c16", "c8"), ([-(2.0**-149), 1.0], "f8", "c8")])
def test_cupy_chunks_are_cast_or_refused_by_value_as_numpy_chunks(values, chunk_dtype,
                                                                  declared) -> None:
    """validate.as_declared on a CuPy chunk: the same cast, or the same refusal naming the
    same value, as on the NumPy chunk of its values (the comparisons run on the device;
    float32 subnormals decided by their bits, validate.float32_subnormals)."""
    from dask_compact.validate import as_declared

    host = np.array(values, dtype=chunk_dtype)
    try:
        want = as_declared(host, np.dtype(declared), "f", 2)
    except TypeError as e:
        with pytest.raises(TypeError) as refused:
            as_declared(cupy.asarray(host), np.dtype(declared), "f", 2)
        assert str(refused.value) == str(e)
        return
    got = as_declared(cupy.asarray(host), np.dtype(declared), "f", 2)
    assert isinstance(got, cupy.ndarray) and got.dtype == want.dtype
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


def _float32_values(n: int, seed: int) -> np.ndarray:
    """The brief's float32 values (subnormals at both ends and of both signs, signed zeros,
    NaN, inf, the least normal) and ``n`` random bit patterns, half of them subnormals
    (exponent bits cleared), NaNs quiet (a signalling NaN's cast warns)."""
    named = np.array([1e-40, -1e-40, 2.0**-149, -(2.0**-149), 1.1754942e-38, 0.0, -0.0, 2.0,
                      np.nan, np.inf, -1.1754942e-38, -np.inf, 2.0**-126], np.float32)
    bits = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32)
    bits[::2] &= np.uint32(0x807FFFFF)
    nan = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    bits[nan] |= np.uint32(0x00400000)
    return np.concatenate([named, bits.view(np.float32)])


def _values_in(dtype: str, other: str, n: int, seed: int) -> np.ndarray:
    """``_float32_values`` in ``dtype`` (exact: each part a float32), exact in ``other``
    too: complex ones (imaginary parts another draw) where both dtypes are complex, real
    ones (imaginary parts 0) where either is real."""
    real = _float32_values(n, seed)
    if np.dtype(dtype).kind != "c" or np.dtype(other).kind != "c":
        return real.astype(dtype)
    out = np.empty(real.size, dtype)
    out.real, out.imag = real, _float32_values(n, seed + 1)[::-1]
    return out


def _same_floats(got, want, what: str, signs: bool = True) -> None:
    """``got`` (CuPy) holds ``want``'s values in its dtype: NaN where NaN, and the signs of
    numbers, zeros and subnormals among them (each part of a complex) where ``signs``. Not
    a NaN's sign: CuPy's float64 -> float32 cast gives its one NaN (a negative NaN came
    back positive on an H200, 2026-12-01), NumPy's keeps the sign; like the payload, which
    IEEE leaves to the conversion (design.md, "The GPU against NumPy")."""
    assert isinstance(got, cupy.ndarray), what
    got = cupy.asnumpy(got)
    assert got.dtype == want.dtype, what
    np.testing.assert_array_equal(got, want, err_msg=what)
    if signs:
        for g, w in ((got.real, want.real), (got.imag, want.imag)):
            number = ~np.isnan(w)
            np.testing.assert_array_equal(np.signbit(g[number]), np.signbit(w[number]),
                                          err_msg=what)


# (declared, chunk dtype): the casts CuPy's astype flushes float32 subnormals in (float32
# parts into float64 ones, by dtype and by value) and those it flushed into float32 parts
# (float64 values that are float32 subnormals exactly, cast by value)
FLUSHED_CASTS = [("f8", "f4"), ("c16", "f4"), ("c16", "c8"), ("f8", "c8"),
                 ("f4", "f8"), ("c8", "c16"), ("c8", "f8"), ("f4", "c16")]


@pytest.mark.parametrize("declared, chunk_dtype", FLUSHED_CASTS)
@pytest.mark.parametrize("n", [0, 18, 1031])
def test_cupy_chunks_keep_float32_subnormals_in_the_casts_cupy_flushes(declared, chunk_dtype,
                                                                       n) -> None:
    """validate.as_declared on a CuPy chunk whose dtype CuPy's own cast flushes float32
    subnormals in (-ftz=true: float32 [1e-40, -1e-40, 2] under float64 came back [0, -0, 2],
    a float64 2**-149 under float32 was refused): NumPy's cast of the same chunk, each value,
    the signs of zeros and subnormals included."""
    from dask_compact.validate import as_declared

    host = _values_in(chunk_dtype, declared, n, 11)
    want = as_declared(host, np.dtype(declared), "f", 0)
    assert want.dtype == np.dtype(declared) and np.isnan(want).any()
    tiny = (want.real != 0) & (np.abs(want.real) < np.finfo(np.float32).tiny)
    assert tiny.sum() >= min(n // 3, 5)  # the test's own check: many subnormals
    _same_floats(as_declared(cupy.asarray(host), np.dtype(declared), "f", 0), want, "cast")
    # a strided view (the parts of a complex, a step of 3) takes the same path
    _same_floats(as_declared(cupy.asarray(host)[::3], np.dtype(declared), "f", 0), want[::3],
                 "strided")


@pytest.mark.parametrize("declared", ["f4", "c8"])
def test_cupy_float64_chunks_of_inexact_float32_subnormals_are_refused_as_numpy_does(
        declared) -> None:
    """float64 values in float32's subnormal range that float32 does not hold exactly (1e-40,
    2**-150, 3 * 2**-150: NumPy's cast rounds them) are refused on CuPy as on NumPy, the same
    message naming the same value and counting the others; 2**-149 beside them is cast."""
    from dask_compact.validate import as_declared

    host = np.array([2.0**-149, 1.0, 1e-40, -(2.0**-149), 2.0**-150, 3 * 2.0**-150])
    with pytest.raises(TypeError) as on_host:
        as_declared(host, np.dtype(declared), "f", 5)
    assert "its value 1e-40 (element 2 of the chunk; 2 more besides)" in str(on_host.value)
    with pytest.raises(TypeError) as on_device:
        as_declared(cupy.asarray(host), np.dtype(declared), "f", 5)
    assert str(on_device.value) == str(on_host.value)
    exact = host[[0, 1, 3]]
    _same_floats(as_declared(cupy.asarray(exact), np.dtype(declared), "f", 5),
                 as_declared(exact, np.dtype(declared), "f", 5), "exact")


def _chunk_in(b, chunk_dtype, on_gpu, block_id=None):
    """Chunk ``b`` (NumPy, the declared dtype), cast into ``chunk_dtype`` where its index is
    odd, on the host (NumPy's cast, exact for these values: CuPy's would flush what the test
    is about), then on the device where ``on_gpu``."""
    if block_id[0] % 2:  # a real chunk of complex values takes their real parts (imag 0)
        b = (b.real if np.dtype(chunk_dtype).kind != "c" else b).astype(chunk_dtype)
    return cupy.asarray(b) if on_gpu else b


def _calls(host: np.ndarray, chunk_dtype: str, on_gpu: bool) -> dict:
    """Every public call that takes chunks in their declared dtype, on ``host``'s values in
    chunks of 97 (odd ones in ``chunk_dtype``), NumPy or CuPy chunks: computed."""
    xp = cupy if on_gpu else np
    x = da.from_array(host, chunks=97).map_blocks(_chunk_in, chunk_dtype, on_gpu,
                                                  dtype=host.dtype, meta=xp.empty(0, host.dtype))
    keep = host.real < 1  # NaN not kept; subnormals and signed zeros kept (in either rounding)
    mask = da.from_array(keep, chunks=97).map_blocks(xp.asarray, dtype=bool,
                                                     meta=xp.empty(0, bool))
    k = da.from_array(np.arange(host.size) % 3, chunks=97).map_blocks(
        xp.asarray, meta=xp.empty(0, np.int64))
    with dask.config.set(scheduler="threads"):
        values, indices = x.map_compact(lambda v: v.real < 1, output="both")
        calls = {
            "map_compact": x.map_compact(lambda v: v.real < 1),
            "map_compact both, values": values,
            "map_compact both, indices": indices,
            "compact": dask_compact.compact(x, mask),
            "compact_records": dask_compact.compact_records({"a": x, "k": k}, "k != 0")["a"],
            "partition": dask_compact.partition(x, lambda v: v.real < 1)[0],
        }
        if host.dtype == np.float64:
            calls["sort"] = dask_compact.sort(x, buckets=3)
        return dict(zip(calls, dask.compute(*calls.values())))


@pytest.mark.parametrize("declared, chunk_dtype", FLUSHED_CASTS)
def test_cupy_chunks_keep_float32_subnormals_through_every_call(declared, chunk_dtype) -> None:
    """Chunks of another dtype than declared, whose cast on CuPy flushes float32 subnormals
    (odd chunks of 97 in ``chunk_dtype``): every public call that takes chunks in the
    declared dtype (map_compact, its output="both", compact, compact_records' fields,
    partition, sort) gives the answer of the same call on NumPy chunks, each value and the
    sign of each zero and subnormal (sort: the values; its order of -0.0 and 0.0 is its
    own, design.md)."""
    host = _values_in(declared, chunk_dtype, 1031, 13)
    assert (np.abs(host.real) < np.finfo(np.float32).tiny).sum() > 400  # the test's check
    want = _calls(host, chunk_dtype, on_gpu=False)
    got = _calls(host, chunk_dtype, on_gpu=True)
    assert got.keys() == want.keys()
    for name in want:
        if name.endswith("indices"):
            np.testing.assert_array_equal(cupy.asnumpy(got[name]), want[name], err_msg=name)
        else:
            _same_floats(got[name], want[name], name, signs=name != "sort")


def test_cupy_float32_chunks_of_subnormals_are_summed_as_numpy_chunks_under_float64() -> None:
    """cumsum of float64 whose odd chunks are float32 subnormals (of both signs, and zeros):
    CuPy's cast flushed them to 0, so the sums were 0; now NumPy's, bit for bit (every sum of
    such values is exact in float64, in any order)."""
    bits = np.random.default_rng(17).integers(0, 2**32, 1031, dtype=np.uint32)
    host = (bits & np.uint32(0x807FFFFF)).view(np.float32).astype(np.float64)
    got, want = (
        dask_compact.cumsum(da.from_array(host, chunks=97).map_blocks(
            _chunk_in, "f4", on_gpu, dtype=host.dtype,
            meta=(cupy if on_gpu else np).empty(0, host.dtype))).compute(scheduler="threads")
        for on_gpu in (True, False))
    assert np.abs(want).max() > 0
    _same_floats(got, want, "cumsum", signs=False)


@pytest.mark.parametrize("dtype", ["float32", "int64", "float64"])
def test_chunks_of_the_other_byte_order(dtype: str) -> None:
    """A dask array of CuPy chunks of a swapped dtype (views: CuPy makes no such arrays
    otherwise) is compacted as the numbers they hold: each chunk is taken in native order
    with its bytes reversed (validate.as_declared -> to_native). CuPy's casts copy them as
    they are, which is how they were taken until 2026-12-01 (thirteenth session). Against
    NumPy."""
    x_np = (np.random.default_rng(3).random(2**18 + 5) * 100).astype(dtype)
    swapped = x_np.astype(x_np.dtype.newbyteorder())
    x = da.from_array(swapped, chunks=2**16).map_blocks(
        lambda b: cupy.asarray(b.view(np.uint8)).view(b.dtype), dtype=swapped.dtype,
        meta=cupy.empty(0, np.uint8).view(swapped.dtype))
    m = x_np < 50
    with dask.config.set(scheduler="threads"):
        values, indices = x.map_compact("x < 50", output="both")
        got_v, got_i = values.compute(), indices.compute()
    assert got_v.dtype == x_np.dtype
    np.testing.assert_array_equal(cupy.asnumpy(got_v), x_np[m])
    np.testing.assert_array_equal(cupy.asnumpy(got_i), np.flatnonzero(m))
