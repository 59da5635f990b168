"""GPU kernels against NumPy: every algorithm x output x dtype, sizes around the warp, group
and tile boundaries, selectivities from none to all, poisoned outputs, > 2^31 elements.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from dask_compact.backends import cupy_backend as cb  # noqa: E402
from dask_compact.backends import cupy_exact as ce  # noqa: E402
from dask_compact.backends import cupy_tuning  # noqa: E402
from dask_compact.predicate.core import Predicate  # noqa: E402
from dask_compact.predicate.expr import Call, Param, Var  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
ALGORITHMS = ["single-pass", "three-pass", "hybrid"]
# Test id -> (algorithm, keyword overrides). compact() (exact-size path): the single-pass exact
# modes x look-back schedules that can run; compact_into(): the look-back schedules. The
# module defaults (cupy_tuning.EXACT_MODE, cupy_tuning.variant_for) are one of these combinations.
EXACT_CONFIGS = {
    "single-pass:prefix": ("single-pass", {"exact_mode": "prefix"}),
    "single-pass:lookback-early": ("single-pass", {"exact_mode": "lookback", "variant": "early"}),
    "single-pass:lookback-classic": (
        "single-pass",
        {"exact_mode": "lookback", "variant": "classic"},
    ),
    "three-pass": ("three-pass", {}),
    "hybrid": ("hybrid", {}),
    # the module defaults, where calls within cupy_tuning.ONE_READ_ALWAYS_BYTES read their input
    # once
    # (through the cached packed launch, cupy_ready.OneReadCall, and without it)
    "single-pass:one-read": ("single-pass", {}),
    "hybrid:one-read": ("hybrid", {}),
    "single-pass:one-read-general": ("single-pass", {}),
    "hybrid:one-read-general": ("hybrid", {}),
}
ONE_READ_CONFIGS = {"single-pass:one-read", "hybrid:one-read", "single-pass:one-read-general",
                    "hybrid:one-read-general"}
INTO_CONFIGS = {
    "single-pass:early": ("single-pass", {"variant": "early"}),
    "single-pass:classic": ("single-pass", {"variant": "classic"}),
    "three-pass": ("three-pass", {}),
    "hybrid": ("hybrid", {}),
}
OUTPUTS = ["values", "indices", "both"]


@pytest.fixture(autouse=True)
def _count_first_unless_one_read(request, monkeypatch):
    """Calls within cupy_tuning.ONE_READ_ALWAYS_BYTES read their input once; every other exact
    configuration counts first at every size, so that both paths are tested at every size."""
    callspec = getattr(request.node, "callspec", None)
    config = callspec.params.get("config") if callspec is not None else None
    if config in EXACT_CONFIGS and config not in ONE_READ_CONFIGS:
        monkeypatch.setattr(cupy_tuning, "ONE_READ_ALWAYS_BYTES", 0)
    if config is not None and config.endswith("one-read-general"):
        monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", False)

SMALL_SIZES = [0, 1, 31, 32, 33, 1023, 1024, 1025, 8191, 8192, 8193, 65537, 1000003]
PS = [0.0, 0.001, 0.05, 0.5, 0.95, 1.0]


def make_data(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """Uniform keys in [0, 1) mapped to the dtype: a threshold p selects a fraction ~p."""
    u = rng.random(n)
    dt = np.dtype(dtype)
    if dt == np.dtype(bool):
        return u < 0.5
    if dt.kind in "iu":
        return np.floor(u * 100).astype(dt)  # 0..99, repeated values
    if dt.kind == "c":
        return (u + 1j * rng.random(n)).astype(dt)
    return u.astype(dt)


def threshold(dtype: str, p: float) -> Predicate:
    """``x < t`` selecting a fraction ~p of make_data's values (``x`` / ``~x`` for bool)."""
    dt = np.dtype(dtype)
    if dt == np.dtype(bool):
        if p == 0.0:
            return Predicate(
                Call("logical_and", (Var(), Call("logical_not", (Var(),)))), (), None, "none"
            )
        if p == 1.0:
            return Predicate(
                Call("logical_or", (Var(), Call("logical_not", (Var(),)))), (), None, "all"
            )
        return (
            Predicate(Var(), (), None, "x")
            if p <= 0.5
            else Predicate(Call("logical_not", (Var(),)), (), None, "~x")
        )
    if dt.kind in "iu":
        t: float = int(round(p * 100))
        return Predicate(Call("less", (Var(), Param(0, "int"))), (t,), None, "x < t")
    t = -1.0 if p == 0 else (2.0 if p == 1 else p)
    return Predicate(Call("less", (Var(), Param(0, "float"))), (t,), None, "x < t")


def poison(shape: int, dtype) -> cupy.ndarray:
    out = cupy.empty(max(shape, 1), dtype=dtype)
    out.view(np.uint8).fill(0xA5)
    return out


def check(a_np, pred, output, got, stable: bool, index_base: int = 0) -> None:
    mask = pred.mask(a_np)
    want_v = a_np.ravel()[mask.ravel()]
    want_i = np.flatnonzero(mask) + index_base
    vals, idx = got if output == "both" else ((got, None) if output == "values" else (None, got))
    if vals is not None:
        v = cupy.asnumpy(vals)
        assert v.dtype == a_np.dtype and v.shape == want_v.shape
        if stable:
            np.testing.assert_array_equal(v.view(np.uint8), want_v.view(np.uint8))
        else:
            np.testing.assert_array_equal(np.sort(v), np.sort(want_v))
    if idx is not None:
        i = cupy.asnumpy(idx)
        assert i.dtype == np.int64 and i.shape == want_i.shape
        if stable:
            np.testing.assert_array_equal(i, want_i)
        else:
            np.testing.assert_array_equal(np.sort(i), want_i)
    if vals is not None and idx is not None:  # pairs stay pairs, also unordered
        isz = a_np.dtype.itemsize
        np.testing.assert_array_equal(
            cupy.asnumpy(vals).view(np.uint8).reshape(len(want_v), isz),
            a_np.ravel()[cupy.asnumpy(idx) - index_base].view(np.uint8).reshape(len(want_v), isz),
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(EXACT_CONFIGS))
def test_exact_path_small_sizes(dtype: str, config: str) -> None:
    """compact(): exact-length results, all outputs, sizes around every boundary, every p."""
    algorithm, kw = EXACT_CONFIGS[config]
    rng = np.random.default_rng(abs(hash((dtype, config))) % 2**32)
    stable = algorithm != "hybrid"
    for n in SMALL_SIZES:
        a_np = make_data(rng, n, dtype)
        a = cupy.asarray(a_np)
        for p in PS:
            pred = threshold(dtype, p)
            for output in OUTPUTS:
                got = cb.compact(a, pred, output, stable, algorithm, 7, **kw)
                check(a_np, pred, output, got, stable, index_base=7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", list(INTO_CONFIGS))
def test_preallocated_outputs_are_poison_checked(dtype: str, config: str) -> None:
    """compact_into(): the device count, the first `count` entries right, the rest untouched."""
    algorithm, kw = INTO_CONFIGS[config]
    rng = np.random.default_rng(1 + abs(hash((dtype, config))) % 2**32)
    stable = algorithm != "hybrid"
    for n in (1, 31, 33, 1023, 1025, 8191, 8193, 2**20 + 7):
        a_np = make_data(rng, n, dtype)
        a = cupy.asarray(a_np)
        for p in (0.0, 0.001, 0.05, 0.5, 1.0):
            pred = threshold(dtype, p)
            vals, idx = poison(n, a_np.dtype), poison(n, np.int64)
            ref_v, ref_i = cupy.asnumpy(vals), cupy.asnumpy(idx)
            d = cb.compact_into(a, pred, vals, idx, algorithm=algorithm, **kw)
            c = int(d.get()[0])
            m = pred.mask(a_np).ravel()
            assert c == int(m.sum())
            check(a_np, pred, "both", (vals[:c], idx[:c]), stable)
            np.testing.assert_array_equal(
                cupy.asnumpy(vals[c:]).view(np.uint8), ref_v[c:].view(np.uint8)
            )
            np.testing.assert_array_equal(cupy.asnumpy(idx[c:]), ref_i[c:])


@pytest.mark.parametrize("dtype", ["int8", "float16", "float32", "float64", "complex128"])
@pytest.mark.parametrize(
    "config", ["single-pass:prefix", "single-pass:lookback-early", "three-pass", "hybrid"]
)
@pytest.mark.parametrize("n", [2**20 + 7, 2**26])
def test_large_sizes(dtype: str, config: str, n: int) -> None:
    algorithm, kw = EXACT_CONFIGS[config]
    rng = np.random.default_rng(n)
    a_np = make_data(rng, n, dtype)
    a = cupy.asarray(a_np)
    stable = algorithm != "hybrid"
    for p in (0.001, 0.5, 0.95):
        pred = threshold(dtype, p)
        check(a_np, pred, "both", cb.compact(a, pred, "both", stable, algorithm, 0, **kw), stable)
    if algorithm == "single-pass":  # compact_into, both look-back schedules, same input
        pred = threshold(dtype, 0.5)
        want = int(pred.mask(a_np).sum())
        for variant in ("early", "classic"):
            vals, idx = poison(n, a_np.dtype), poison(n, np.int64)
            c = int(cb.compact_into(a, pred, vals, idx, variant=variant).get()[0])
            assert c == want
            check(a_np, pred, "both", (vals[:c], idx[:c]), True)


def test_tile_scan_many_rounds() -> None:
    """The exact path's one-block tile scan over more tiles than one round (1024 x 8 = 8192
    tiles; int8 tiles are 8192 elements, so 2^26 + 2^20 + 3 elements are 8321 tiles)."""
    n = 2**26 + 2**20 + 3
    rng = np.random.default_rng(11)
    a_np = make_data(rng, n, "int8")
    a = cupy.asarray(a_np)
    for p in (0.001, 0.5):
        pred = threshold("int8", p)
        got = cb.compact(a, pred, "both", True, "single-pass", 5, exact_mode="prefix")
        check(a_np, pred, "both", got, True, index_base=5)


def test_variant_and_mode_are_checked() -> None:
    a = cupy.asarray(make_data(np.random.default_rng(2), 100, "float32"))
    pred = threshold("float32", 0.5)
    with pytest.raises(ValueError):
        cb.compact(a, pred, "values", True, "single-pass", 0, variant="bogus")
    with pytest.raises(ValueError):
        cb.compact(a, pred, "values", True, "single-pass", 0, exact_mode="bogus")
    assert {e.variant for e in cupy_tuning.TABLE.values()} <= set(cupy_tuning.SINGLE_PASS_VARIANTS)
    assert cupy_tuning.EXACT_MODE in cupy_tuning.EXACT_MODES


@pytest.mark.parametrize("config", list(EXACT_CONFIGS))
def test_mask_path_and_fallbacks(config: str, monkeypatch) -> None:
    """Mask-path predicates, literals that overflow the loop dtype, and compact_masked."""
    algorithm, kw = EXACT_CONFIGS[config]
    # the mask path and compact_masked take the module defaults
    if kw.get("variant") is not None:
        monkeypatch.setattr(ce, "variant_for", lambda itemsize, cc=None: kw["variant"])
    if kw.get("exact_mode") is not None:
        monkeypatch.setattr(cupy_tuning, "EXACT_MODE", kw["exact_mode"])
    rng = np.random.default_rng(3)
    stable = algorithm != "hybrid"
    a_np = make_data(rng, 100003, "float32")
    a = cupy.asarray(a_np)
    # an untraceable predicate: evaluated as a mask (with a's array module), then compacted
    fn = lambda v: (v * 7 % 1) < 0.3  # noqa: E731
    mp = Predicate(None, (), fn, "untraceable", "test")
    got = cb.compact(a, mp, "both", stable, algorithm, 0)
    mask = (a_np * 7 % 1) < 0.3
    idx = cupy.asnumpy(got[1])
    np.testing.assert_array_equal(np.sort(idx), np.flatnonzero(mask))
    # ParamOverflow: int8 > 1000 (NEP 50 leaves the literal weak; it cannot be an int8 kernel arg)
    i8 = cupy.asarray(make_data(rng, 5000, "int8"))
    big = Predicate(Call("less", (Var(), Param(0, "int"))), (1000,), None, "x < 1000")
    try:
        want = cupy.asnumpy(cupy.flatnonzero(big.mask(i8)))
    except Exception as e:  # whatever CuPy does with the out-of-range literal, we do the same
        with pytest.raises(type(e)):
            cb.compact(i8, big, "indices", stable, algorithm, 0)
    else:
        got = cupy.asnumpy(cb.compact(i8, big, "indices", stable, algorithm, 0))
        np.testing.assert_array_equal(np.sort(got), want)
    # complex sqrt has no compiled form: mask path
    c_np = make_data(rng, 4099, "complex64")
    sq = Predicate(
        Call("less", (Call("real", (Call("sqrt", (Var(),)),)), Param(0, "float"))),
        (0.5,),
        None,
        "s",
    )
    got = cb.compact(cupy.asarray(c_np), sq, "indices", stable, algorithm, 0)
    np.testing.assert_array_equal(
        np.sort(cupy.asnumpy(got)), np.flatnonzero(np.sqrt(c_np).real < 0.5)
    )
    # compact_masked with a separate boolean array
    m = cupy.asarray(rng.random(a_np.shape) < 0.4)
    v = cb.compact_masked(a, m, "values", 0, algorithm=algorithm if stable else "auto")
    np.testing.assert_array_equal(cupy.asnumpy(v), a_np[cupy.asnumpy(m)])


@pytest.mark.parametrize("config", list(EXACT_CONFIGS))
def test_views_and_shapes(config: str) -> None:
    """Misaligned views (element-wise path), non-contiguous and N-D chunks (C order)."""
    algorithm, kw = EXACT_CONFIGS[config]
    rng = np.random.default_rng(5)
    stable = algorithm != "hybrid"
    base = make_data(rng, 3 * 8192 + 5, "float32")
    for a_np in (base[1:], base[3:-2], base[: 3 * 8192].reshape(96, 256).T, base[::3]):
        pred = threshold("float32", 0.5)
        got = cb.compact(_same_view(base, a_np), pred, "both", stable, algorithm, 11, **kw)
        check(np.ascontiguousarray(a_np), pred, "both", got, stable, index_base=11)
        if algorithm == "single-pass":  # misaligned views through compact_into too
            view = _same_view(base, a_np)  # compact_into flattens it as compact does
            vals, idx = poison(view.size, np.float32), poison(view.size, np.int64)
            c = int(
                cb.compact_into(
                    view, pred, vals, idx, variant=kw.get("variant"), index_base=11
                ).get()[0]
            )
            check(
                np.ascontiguousarray(a_np), pred, "both", (vals[:c], idx[:c]), True, index_base=11
            )


def _same_view(base_np: np.ndarray, view_np: np.ndarray) -> cupy.ndarray:
    """The CuPy view of a device copy of ``base_np`` matching ``view_np``'s offset and strides."""
    base = cupy.asarray(base_np)
    offset = view_np.__array_interface__["data"][0] - base_np.__array_interface__["data"][0]
    return cupy.ndarray(view_np.shape, base.dtype, base.data + offset, view_np.strides)


def test_auto_and_errors() -> None:
    a = cupy.asarray(make_data(np.random.default_rng(0), 1000, "float32"))
    pred = threshold("float32", 0.5)
    with pytest.raises(ValueError):
        cb.compact(a, pred, "values", True, "hybrid", 0)
    with pytest.raises(ValueError):
        cb.compact(a, pred, "bogus", True, "auto", 0)
    un = cb.compact(a, pred, "indices", False, "auto", 0)  # hybrid
    st = cb.compact(a, pred, "indices", True, "auto", 0)  # single-pass
    np.testing.assert_array_equal(np.sort(cupy.asnumpy(un)), cupy.asnumpy(st))


def test_dispatch_and_compact_array_return_cupy() -> None:
    from dask_compact import dispatch

    a = cupy.asarray(make_data(np.random.default_rng(1), 5000, "float64"))
    pred = threshold("float64", 0.3)
    out = dispatch.compact_chunk(a, pred, "values", True, "auto", 0)
    assert isinstance(out, cupy.ndarray)
    from dask_compact.chunk import compact_array

    v = compact_array(a, pred, output="values")
    assert isinstance(v, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(v), cupy.asnumpy(a)[cupy.asnumpy(a) < 0.3])


@pytest.mark.usefixtures("big_device_memory")
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_chunk_larger_than_2_pow_31(algorithm: str) -> None:
    """One int8 chunk of 2^31 + 2^20 + 3 elements: 64-bit offsets and indices end to end."""
    n = 2**31 + 2**20 + 3
    free = cupy.cuda.runtime.memGetInfo()[0]
    if free < 8 * 2**30:
        pytest.skip("needs ~8 GiB of free device memory")
    a = cupy.empty(n, dtype=cupy.int8)
    # cheap pseudo-random bytes without a 64-bit temporary: a hash of the index
    cupy.ElementwiseKernel(
        "",
        "int8 y",
        "unsigned long long h = (unsigned long long)i * 0x9E3779B97F4A7C15ull; "
        "y = (signed char)(h >> 56);",
        "dcx_test_fill",
    )(a)
    a[-5] = 7  # a selected element past 2^31
    stable = algorithm != "hybrid"
    pred = Predicate(Call("equal", (Var(), Param(0, "int"))), (7,), None, "x == 7")
    vals, idx = cb.compact(a, pred, "both", stable, algorithm, 0)
    want = int(cupy.count_nonzero(a == 7))
    assert idx.size == want == vals.size
    if not stable:
        idx = cupy.sort(idx)
    assert int(idx[-1]) == n - 5
    assert bool(cupy.all(a[idx] == 7))
    assert bool(cupy.all(vals == 7))
    assert bool(cupy.all(cupy.diff(idx) > 0))
    del a, vals, idx
    cupy.get_default_memory_pool().free_all_blocks()


def test_threads_share_modules() -> None:
    """Many threads compacting at once (dask's threaded scheduler): one module, right results."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(9)
    arrays = [make_data(rng, 300000 + k, "float32") for k in range(8)]
    pred = threshold("float32", 0.25)

    def run(a_np):
        with cupy.cuda.Stream(non_blocking=True):
            return cupy.asnumpy(cb.compact(cupy.asarray(a_np), pred, "values", True, "auto", 0))

    with ThreadPoolExecutor(8) as ex:
        for a_np, got in zip(arrays, ex.map(run, arrays)):
            np.testing.assert_array_equal(got, a_np[a_np < 0.25])


# --------------------------------------------------------------------------- runs of chunks ---

RUN_SIZES = [[1], [0, 33, 0, 1025], [31, 1, 65537, 1023], [8192, 8193, 1000003, 0, 7]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "algorithm,stable", [("auto", True), ("three-pass", True), ("hybrid", False)]
)
@pytest.mark.parametrize("output", OUTPUTS)
def test_compact_many_is_the_concatenation(
    dtype: str, algorithm: str, stable: bool, output: str
) -> None:
    """A run of chunks (one task) gives the chunks' outputs concatenated, indices global."""
    rng = np.random.default_rng(len(dtype))
    for sizes in RUN_SIZES:
        for p in (0.0, 0.5, 1.0):
            parts = [make_data(rng, n, dtype) for n in sizes]
            a = np.concatenate(parts)
            bases = list(np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int) + 5)
            pred = threshold(dtype, p)
            got = cb.compact_many(
                [cupy.asarray(q) for q in parts], pred, output, stable, algorithm, bases
            )
            if stable:
                check(a, pred, output, got, True, index_base=5)
            else:  # unordered within a chunk only: compare each chunk's segment
                vals, idx = (
                    got
                    if output == "both"
                    else ((got, None) if output == "values" else (None, got))
                )
                off = 0
                for q, base in zip(parts, bases):
                    k = int(pred.mask(q).sum())
                    seg = lambda z, o=off, k=k: None if z is None else z[o : o + k]  # noqa: E731
                    sub = (seg(vals), seg(idx)) if output == "both" else seg(got)
                    check(q, pred, output, sub, False, index_base=base)
                    off += k


def test_compact_many_mask_path_and_dispatch() -> None:
    """An untraceable predicate (mask path) and the dispatch entry used by the graph."""
    from dask_compact.chunk import compact_blocks
    from dask_compact.predicate import as_predicate

    rng = np.random.default_rng(9)
    parts = [rng.random(n) for n in (100, 0, 4099)]
    a = np.concatenate(parts)
    fn = lambda v: (v * 7 % 1) < 0.3  # noqa: E731
    pred = Predicate(None, (), fn, "untraceable", "test")  # the mask path, as an untraced callable
    assert pred.path == "mask"
    got = compact_blocks(
        [cupy.asarray(q) for q in parts], pred, "both", True, "auto", [0, 100, 100], True
    )
    m = fn(a)
    np.testing.assert_array_equal(cupy.asnumpy(got[0]), a[m])
    np.testing.assert_array_equal(cupy.asnumpy(got[1]), np.flatnonzero(m))
    v, i, n_in = compact_blocks(
        [cupy.asarray(q) for q in parts],
        as_predicate("x > 0.5"),
        "values",
        True,
        "auto",
        [0, 100, 100],
        False,
    )
    assert i is None and n_in == a.size
    np.testing.assert_array_equal(cupy.asnumpy(v), a[a > 0.5])


@pytest.fixture
def compiled_sources(monkeypatch, tmp_path) -> list[str]:
    """The source of every module CuPy compiles (or loads from its cache) in the test, from
    an empty cache: cold, so whatever is built runs NVRTC."""
    import cupy.cuda.compiler as compiler

    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    sources: list[str] = []
    real = compiler._compile_module_with_cache

    def counting(source, *args, **kwargs):
        sources.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(compiler, "_compile_module_with_cache", counting)
    return sources


def test_threads_meeting_a_new_module_compile_it_once(compiled_sources) -> None:
    # A RawModule compiles at its first get_function, unguarded: a batch job's threads that
    # reached a new predicate's module together each ran NVRTC on it (9 compiles, 5 s, in a
    # cold CuPy cache on the H100). The module is now compiled in its cache's one build.
    import threading

    import dask_compact

    sources = compiled_sources
    rng = np.random.default_rng(7)
    host = rng.random(100_003).astype(np.float32)
    # a structure no other test compiles, so its module is new to this process
    # (constants exact in float32: the same test in any precision)
    pred = "((x > 0.125) & (x < 0.8125)) | (x == 0.4375) | (abs(x - 0.03125) < 0.0078125)"
    expect = host[((host > 0.125) & (host < 0.8125)) | (host == 0.4375)
                  | (np.abs(host - np.float32(0.03125)) < np.float32(0.0078125))]
    barrier = threading.Barrier(8)
    results: list = [None] * 8

    def one(i: int) -> None:
        a = cupy.asarray(host)
        barrier.wait()
        results[i] = cupy.asnumpy(dask_compact.compact_array(a, pred))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in results:
        np.testing.assert_array_equal(r, expect)
    assert sources, "no module was compiled: the structure was not new"
    assert len(sources) == len(set(sources)), "a module was compiled by several threads"
    # and only the kernels the call uses: values' compact group (not every output's), a
    # module per kernel; those that take the predicate from its source, the tile scan and
    # the copy from the one without it (built here unless this process already holds them)
    ours = [s for s in sources if "dask_compact: generated module source" in s]
    own = [s for s in ours if "// kernels: output values, group compact\n// kernel: " in s]
    roles = sorted(s.rstrip().rsplit("// kernel: ", 1)[1] for s in own)
    assert roles == ["count", "main"], roles
    shared = sorted(s.rstrip().rsplit("// kernel: ", 1)[1] for s in ours if s not in own)
    assert all(k.startswith(("dcx_tile_scan<", "dcx_copy_out<")) for k in shared), shared
    assert not any("dcx_pred_" in s for s in ours if s not in own)


def test_a_new_predicate_compiles_only_the_kernels_that_take_it(compiled_sources,
                                                                 monkeypatch) -> None:
    """After one predicate, a new one (records and values) compiles only its own kernels:
    the records path its flags kernel (of six), a values compaction its count and main
    kernels (of four: the prefix mode's scatter is a group of its own); the results are
    exact."""
    import dask_compact

    sources = compiled_sources
    rng = np.random.default_rng(11)
    n = 70_001
    host = {"a": rng.random(n).astype(np.float32), "b": rng.integers(0, 9, n),
            "c": rng.random((n, 3))}
    fields = {k: cupy.asarray(v) for k, v in host.items()}

    def records(text: str, mask: np.ndarray) -> list[str]:
        sources.clear()
        got = dask_compact.compact_records(fields, text)
        for k, v in host.items():
            np.testing.assert_array_equal(cupy.asnumpy(got[k]), v[mask])
        return [s.rstrip().rsplit("// kernel: ", 1)[1] for s in sources
                if "dask_compact: generated module source" in s]

    a, b = host["a"], host["b"]
    # structures no other test uses (new to this process)
    records("((a > 0.3125) & (b != 5)) | (a < 0.0625)", ((a > 0.3125) & (b != 5)) | (a < 0.0625))
    built = records("((b == 2) | (a > 0.6875)) & (a != 0.5)",
                    ((b == 2) | (a > 0.6875)) & (a != 0.5))
    assert built == ["flags"], built

    def values(text: str, mask: np.ndarray) -> list[str]:
        sources.clear()
        np.testing.assert_array_equal(
            cupy.asnumpy(dask_compact.compact_array(fields["a"], text)), a[mask])
        return sorted(s.rstrip().rsplit("// kernel: ", 1)[1] for s in sources
                      if "dask_compact: generated module source" in s)

    # (constants exact in float32)
    values("(x > 0.15625) & (x < 0.90625) & (x != 0.5)", (a > 0.15625) & (a < 0.90625) & (a != 0.5))
    built = values("(x < 0.21875) | ((x > 0.46875) & (x < 0.53125))",
                   (a < 0.21875) | ((a > 0.46875) & (a < 0.53125)))
    assert built == ["count", "main"], built
    # exact_mode "prefix" (not the default) scatters with a kernel of its own group, built at
    # that mode's first count-first call: a new structure's first call (no fraction learned,
    # and no call reads once by its size alone here) builds the compact group's two and the
    # prefix group's one
    from dask_compact.predicate import as_predicate

    monkeypatch.setattr(cupy_tuning, "ONE_READ_ALWAYS_BYTES", 0)
    sources.clear()
    text = "(x > 0.96875) | ((x < 0.34375) & (x != 0.28125))"
    got = cb.compact(fields["a"], as_predicate(text), "values", True, "single-pass", 0,
                     exact_mode="prefix")
    np.testing.assert_array_equal(cupy.asnumpy(got),
                                  a[(a > 0.96875) | ((a < 0.34375) & (a != 0.28125))])
    built = sorted(s.rstrip().rsplit("// kernel: ", 1)[1] for s in sources
                   if "dask_compact: generated module source" in s)
    assert built == ["count", "main", "prefix"], built


@pytest.mark.parametrize("algorithm", ["single-pass", "three-pass", "hybrid", "scan"])
def test_comparisons_outside_the_dtype_run_the_fused_kernel(algorithm, monkeypatch) -> None:
    """A Python int outside the integer dtype it is compared with (NumPy 2 answers by value:
    uint8 != -1 is all True) is folded into a boolean constant, so the fused kernel runs,
    not CuPy's ufuncs on the mask path (refused here)."""
    from dask_compact import compact_array

    def refuse(*args, **kwargs):
        raise AssertionError("the mask path ran")

    monkeypatch.setattr(Predicate, "mask", refuse)
    rng = np.random.default_rng(11)
    for dtype, text, f in [
        ("uint8", "(x != -1) & (x > 3)", lambda v: (v != -1) & (v > 3)),
        ("int8", "(x > 200) | (x < 5)", lambda v: (v > 200) | (v < 5)),
        ("int64", "(x < 2**64) & (x % 3 == 0)", lambda v: (v < 2**64) & (v % 3 == 0)),
        ("uint64", "(-1 == x) | (x > 90)", lambda v: (-1 == v) | (v > 90)),
    ]:
        a_np = make_data(rng, 4099, dtype)
        got = compact_array(cupy.asarray(a_np), text, output="indices", algorithm=algorithm,
                            stable=algorithm != "hybrid")
        np.testing.assert_array_equal(np.sort(cupy.asnumpy(got)), np.flatnonzero(f(a_np)))
