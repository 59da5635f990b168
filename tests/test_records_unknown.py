"""compact_records on dask fields of unknown row chunk sizes (nan: ``x[m]`` of a dask mask, a
Dask DataFrame column's ``to_dask_array()``), against NumPy: the fields are paired chunk by
chunk, the result's chunk sizes are known (eager) from the counts, and the global indices'
chunk starts come from a task over every chunk's rows (refused until 2026-12-07)."""

from __future__ import annotations

import re

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import HeldChunks
from test_records import assert_same, reference

from dask_compact import compact_records

CHUNK = 97  # a prime: the selections' chunks are of odd, uneven sizes


def selection(arrays: dict, keep: np.ndarray, chunk: int = CHUNK) -> tuple[dict, dict]:
    """``arrays`` as dask fields selected by the dask mask of ``keep`` (``x[m]``: unknown
    row chunk sizes), and the NumPy rows those fields hold."""
    m = da.from_array(keep, chunks=chunk)
    fields = {k: da.from_array(v, chunks=(chunk, *v.shape[1:]))[m] for k, v in arrays.items()}
    return fields, {k: v[keep] for k, v in arrays.items()}


def assert_known_alike(out: dict) -> None:
    """Eager: every output has the same known row chunks."""
    rows = {v.chunks[0] for v in out.values()}
    assert len(rows) == 1 and not any(np.isnan(next(iter(rows))))


def record(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"a": rng.random(n), "b": rng.integers(-50, 50, n).astype(np.int8),
            "pos": rng.random((n, 3)).astype(np.float32)}


def task_names(out: dict) -> set[str]:
    """The names of every output's tasks."""
    return {k[0] if isinstance(k, tuple) else k for v in out.values() for k in v.__dask_graph__()}


@pytest.mark.parametrize("n", [0, 1, 31, 33, 1023, 1025, 2003, 4099])
@pytest.mark.parametrize("kept", [0.0, 0.6, 1.0], ids=["none-kept", "some-kept", "all-kept"])
@pytest.mark.parametrize("t", [-1.0, 0.5, 2.0], ids=["every", "half", "no"])
def test_odd_sizes_against_numpy(n: int, kept: float, t: float) -> None:
    """Every size, selections keeping no row, some or all of them, predicates selecting
    every row, half or none; the indices are np.flatnonzero of the predicate over the
    selected rows."""
    rng = np.random.default_rng(n)
    fields, rows = selection(record(n, n), rng.random(n) < kept)
    assert n == 0 or np.isnan(fields["a"].shape[0])
    out = compact_records(fields, f"a > {t}", indices=True)
    assert_known_alike(out)
    assert_same(out, reference(rows, rows["a"] > t, indices=True))
    assert_same(compact_records(fields, f"a > {t}"), reference(rows, rows["a"] > t))


def test_leading_and_trailing_empty_chunks() -> None:
    """Chunks the selection leaves empty at both ends, and predicates that select nothing in
    the first or the last chunks that hold rows."""
    n = 2003
    arrays = record(n, 1)
    i = np.arange(n)
    fields, rows = selection(arrays, (i > 400) & (i < 1500) & (arrays["a"] < 0.9))
    for pred, mask in (("a > 0.3", rows["a"] > 0.3),
                       (lambda b: b > 0, rows["b"] > 0)):  # fmt: skip
        assert_same(compact_records(fields, pred, indices=True),
                    reference(rows, mask, indices=True))
    late = np.arange(len(rows["a"])) > 700  # the first chunks holding rows select none
    with_late = {**fields, "late": da.from_array(late.astype(np.uint8),
                                                 chunks=(fields["a"].compute_chunk_sizes()
                                                         .chunks[0],))}
    got = compact_records(with_late, "late == 1", indices=True)
    assert_same(got, reference({**rows, "late": late.astype(np.uint8)}, late, indices=True))


@pytest.mark.parametrize("trailing", [(3,), (2, 1)], ids=["one-chunk", "two-chunks"])
def test_a_field_with_trailing_axes(trailing: tuple) -> None:
    """A (n, 3) field of unknown row sizes, its trailing axis in one chunk or in two (put in
    one by Dask's rechunk, which takes nan rows), and the predicate reading no field: the
    starts task then counts the rows of that 2-D first field."""
    n = 1025
    rng = np.random.default_rng(2)
    pos = rng.random((n, 3))
    keep = rng.random(n) < 0.5
    m = da.from_array(keep, chunks=CHUNK)
    p = da.from_array(pos, chunks=(CHUNK, trailing))[m]
    e = da.from_array(pos[:, 0], chunks=CHUNK)[m]
    assert p.chunks[1] == trailing and np.isnan(p.shape[0])
    out = compact_records({"pos": p, "e": e}, "e < 0.5", indices=True)
    assert out["pos"].chunks[1] == (3,)
    rows = {"pos": pos[keep], "e": pos[keep, 0]}
    assert_same(out, reference(rows, rows["e"] < 0.5, indices=True))
    assert_same(compact_records({"pos": p, "e": e}, "True", indices=True),
                reference(rows, np.ones(keep.sum(), bool), indices=True))


def test_mixed_dtypes() -> None:
    n = 3001
    rng = np.random.default_rng(3)
    arrays = {
        "i8": rng.integers(-128, 127, n).astype(np.int8),
        "f8": rng.standard_normal(n),
        "flag": rng.random(n) < 0.5,
        "z": (rng.random(n) + 1j * rng.random(n)).astype(np.complex128),
        "t": np.datetime64("2026-01-01T00:00:00", "ns") + rng.integers(0, 10**15, n)
        .astype("m8[ns]"),
        "xyz": rng.integers(0, 2**16, (n, 3)).astype(np.uint16),
    }
    fields, rows = selection(arrays, rng.random(n) < 0.7)
    out = compact_records(fields, "(i8 > 0) & (f8 < 0.5) & flag", indices=True)
    assert {k: v.dtype for k, v in out.items()} == {**{k: v.dtype for k, v in arrays.items()},
                                                     "indices": np.dtype(np.int64)}
    mask = (rows["i8"] > 0) & (rows["f8"] < 0.5) & rows["flag"]
    assert_same(out, reference(rows, mask, indices=True))


@pytest.mark.parametrize("indices", [False, True])
def test_lazy(indices: bool) -> None:
    n = 4099
    rng = np.random.default_rng(4)
    fields, rows = selection(record(n, 4), rng.random(n) < 0.5)
    out = compact_records(fields, "(a > 0.3) & (b < 10)", indices=indices, lazy=True)
    assert all(np.isnan(v.chunks[0]).all() for v in out.values())
    assert_same(out, reference(rows, (rows["a"] > 0.3) & (rows["b"] < 10), indices=indices))


@pytest.mark.parametrize("lazy", [False, True])
def test_the_starts_task_only_where_indices_need_it(lazy: bool) -> None:
    """A task over every chunk's rows and one starts task where the indices are asked of
    fields all of unknown sizes; none without indices, nor where a field of known row
    chunks (paired with the others) gives the starts."""
    n = 1025
    fields, rows = selection(record(n, 5), np.random.default_rng(5).random(n) < 0.5)
    starts = re.compile(r"compact-records-(size|starts)-")
    names = task_names(compact_records(fields, "a > 0.5", indices=True, lazy=True))
    assert {starts.match(k)[1] for k in names if starts.match(k)} == {"size", "starts"}
    assert not any(starts.match(k) for k in task_names(compact_records(fields, "a > 0.5",
                                                                       lazy=True)))
    sizes = fields["a"].compute_chunk_sizes().chunks[0]
    known = {**fields, "k": da.from_array(np.arange(len(rows["a"])), chunks=(sizes,))}
    got = compact_records(known, "a > 0.5", indices=True, lazy=lazy)
    if lazy:
        assert not any(starts.match(k) for k in task_names(got))
    want = reference({**rows, "k": np.arange(len(rows["a"]))}, rows["a"] > 0.5, indices=True)
    assert_same(got, want)


@pytest.mark.parametrize("pred", ["a > 0.5", "True"])
def test_no_chunk_waits_for_the_others_before_it_is_compacted(pred: str) -> None:
    """Indices of fields all of unknown sizes: each chunk's compaction depends on that chunk
    alone (its indices count from the chunk's start, which is added after), so each input
    chunk is released once compacted. Until 2026-12-07 every compaction waited for a
    starts task over every chunk's rows, and every input chunk was held until the last
    chunk had been read."""
    n = 2003
    fields, rows = selection(record(n, 8), np.random.default_rng(8).random(n) < 0.6)
    out = compact_records(fields, pred, indices=True, lazy=True)
    graph = dict(out["indices"].__dask_graph__())
    deps = {k: dask.core.get_dependencies(graph, k) for k in graph}
    phase1 = [k for k in graph
              if isinstance(k, tuple) and re.fullmatch(r"compact-records-[0-9a-f]+", k[0])]
    assert len(phase1) == fields["a"].numblocks[0] > 1
    for key in phase1:
        seen, todo = set(), [key]
        while todo:
            for d in deps[todo.pop()] - seen:
                seen.add(d)
                todo.append(d)
        assert {d[1] for d in seen if isinstance(d, tuple)} == {key[1]}, key
    want = reference(rows, rows["a"] > 0.5 if pred != "True" else np.ones(len(rows["a"]), bool),
                     indices=True)
    assert_same(out, want)
    seen = HeldChunks(fields["a"].name)
    with seen, dask.config.set(scheduler="sync"):
        assert_same(compact_records(fields, pred, indices=True), want)
    assert 1 <= seen.most <= 2  # all 21 chunks until then


@pytest.mark.parametrize("chunks", [7, 100, "auto"])
def test_rebalanced_output(chunks) -> None:
    n = 4099
    fields, rows = selection(record(n, 6), np.random.default_rng(6).random(n) < 0.8)
    out = compact_records(fields, "a < 0.6", indices=True, chunks=chunks)
    assert_known_alike(out)
    if chunks == 100:
        assert set(out["a"].chunks[0][:-1]) == {100}
    assert_same(out, reference(rows, rows["a"] < 0.6, indices=True))


def test_known_and_unknown_fields_of_the_same_number_of_chunks() -> None:
    """A field of known row chunks beside fields of unknown ones is paired with them chunk
    by chunk, first in the mapping or not, never rechunked."""
    n = 2003
    rng = np.random.default_rng(7)
    fields, rows = selection(record(n, 7), rng.random(n) < 0.4)
    sizes = fields["a"].compute_chunk_sizes().chunks[0]
    ids = rng.integers(0, 10**9, len(rows["a"]))
    known = da.from_array(ids, chunks=(sizes,))
    for mix in ({"id": known, **fields}, {**fields, "id": known}):
        out = compact_records(mix, "a > 0.25", indices=True)
        assert_known_alike(out)
        assert_same(out, reference({k: ({**rows, "id": ids})[k] for k in mix},
                                   rows["a"] > 0.25, indices=True))


@pytest.mark.parametrize("lazy", [False, True])
def test_known_fields_chunked_unlike_each_other_beside_unknown_ones_are_refused(
        lazy: bool) -> None:  # fmt: skip
    """Paired chunk by chunk with the unknown fields, known fields of one length cut at other
    rows would meet in some chunk with other rows: refused before anything runs."""
    u = da.from_array(np.arange(100.0), chunks=25)
    u = u[u > 20]  # 4 chunks of unknown sizes
    v = da.from_array(np.arange(79), chunks=20)
    w = da.from_array(np.arange(79), chunks=(19, 20, 20, 20))
    with pytest.raises(ValueError, match=r"fields of known sizes beside fields of unknown row "
                       r"chunk sizes .* chunked alike along their rows; got field 'v': "
                       r"\(20, 20, 20, 19\), field 'w': \(19, 20, 20, 20\)"):
        compact_records({"u": u, "v": v, "w": w}, "u > 50", lazy=lazy)


def test_a_dask_dataframe_s_columns() -> None:
    """Columns of a Dask DataFrame as arrays (``to_dask_array()``: unknown row sizes)."""
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    rng = np.random.default_rng(8)
    df = pd.DataFrame({"e": rng.random(1000), "run": np.arange(1000) % 13,
                       "t": pd.date_range("2026-01-01", periods=1000, freq="min")})
    ddf = dd.from_pandas(df, npartitions=7)
    fields = {c: ddf[c].to_dask_array() for c in df}
    assert np.isnan(fields["e"].shape[0])
    rows = {c: df[c].to_numpy() for c in df}
    assert_same(compact_records(fields, "(e > 0.5) & (run < 6)", indices=True),
                reference(rows, (rows["e"] > 0.5) & (rows["run"] < 6), indices=True))


def counted(x: da.Array, calls: list) -> da.Array:
    """``x`` whose chunks append to ``calls`` as they are made."""
    return x.map_blocks(lambda b: calls.append(1) or b, meta=x._meta)


@pytest.mark.parametrize("lazy", [False, True])
def test_different_numbers_of_row_chunks_are_refused_before_anything_runs(lazy: bool) -> None:
    calls: list = []
    a = counted(da.from_array(np.arange(100.0), chunks=10), calls)
    u = a[a > 20]  # 10 chunks of unknown sizes
    keep = da.ones(100, dtype=bool, chunks=25)
    others = (counted(da.from_array(np.arange(100), chunks=25), calls)[keep],
              da.from_array(np.arange(79), chunks=40))  # 4 chunks of unknown sizes; 2 known
    calls.clear()  # (any made while building)
    for other in others:
        got = re.escape(f"got field 'u': 10, field 'v': {other.numblocks[0]}")
        with pytest.raises(ValueError, match=r"field 'u'.* unknown row chunk sizes, so the "
                           r"fields are paired chunk by chunk.*same number of row chunks "
                           rf"in every field; {got}\. .*compute_chunk_sizes\(\)"):
            compact_records({"u": u, "v": other}, "u > 50", indices=True, lazy=lazy)
    assert not calls


@pytest.mark.parametrize("lazy", [False, True])
def test_rows_differing_inside_a_chunk_are_refused_naming_it(lazy: bool) -> None:
    """Two selections by different masks, of the same number of chunks: a chunk's fields
    hold different numbers of rows, found as its task runs (eager: in the call; lazy: when
    computed), naming the chunk and each field's rows (until 2026-12-07 a guard's words, "record
    chunk with rows of different lengths", unreachable then: such fields were refused)."""
    rng = np.random.default_rng(9)
    x = da.from_array(rng.random(1000), chunks=100)
    m1 = np.ones(1000, bool)
    m2 = m1.copy()
    m2[512] = False  # chunk 5 alone differs
    fields = {"x": x[da.from_array(m1, chunks=100)], "y": x[da.from_array(m2, chunks=100)]}
    said = re.escape("compact_records: chunk 5 of the fields holds different numbers of rows "
                     "(field 'x': 100, field 'y': 99). Fields of unknown chunk sizes are "
                     "paired chunk by chunk") + r".*one mask m.*compute_chunk_sizes\(\)"
    with pytest.raises(ValueError, match=said):
        out = compact_records(fields, "x > 0.5", lazy=lazy)
        dask.compute(*out.values())
    known = {"x": x, "y": fields["y"]}  # a known field paired with a shorter unknown chunk
    with pytest.raises(ValueError, match=r"chunk 5 of the fields .*\(field 'x': 100, field "
                                         r"'y': 99\)"):
        out = compact_records(known, "x > 0.5", indices=True, lazy=lazy)
        dask.compute(*out.values())


def test_a_trailing_axis_of_unknown_sizes_is_refused() -> None:
    """Only the rows may be of unknown sizes: Dask cannot put a trailing axis of unknown
    sizes in one chunk ("Chunks must be unchanging along dimensions with missing values")."""
    x = da.from_array(np.ones((10, 4)), chunks=(5, 2))
    cols = x[:, da.from_array(np.array([True, False, True, True]), chunks=2)]
    with pytest.raises(ValueError, match=re.escape("field 'q' has unknown sizes along axis 1 "
                                                   "(shape (10, nan))") + r".*q\.compute_chunk"):
        compact_records({"q": cols, "a": x[:, 0]}, "a > 0")


@pytest.mark.parametrize("lazy", [False, True])
def test_a_chunk_of_another_trailing_shape_is_refused_under_unknown_rows(lazy: bool) -> None:
    """The declared-shape check takes any rows where they are unknown and still checks the
    trailing axes: a map_blocks that drops a column is refused, not copied as it came."""
    x = da.from_array(np.arange(60.0).reshape(20, 3), chunks=(5, 3))
    u = x[x[:, 0] > 10]
    cols = u.map_blocks(lambda b: b[:, :2], dtype=u.dtype)  # declares (nan, 3) per chunk
    with pytest.raises(ValueError, match=r"chunk \d of field 'p' has shape \(\d+, 2\), but its "
                                         r"dask array declares shape \(nan, 3\)"):
        out = compact_records({"p": cols, "a": u[:, 0]}, "a > 20", lazy=lazy)
        dask.compute(*out.values())


def test_on_a_local_cluster_of_processes(process_client) -> None:
    n = 20_011
    rng = np.random.default_rng(10)
    arrays = record(n, 10)
    keep = rng.random(n) < 0.6
    m = da.from_array(keep, chunks=1_500).persist()
    held = {k: da.from_array(v, chunks=(1_500, *v.shape[1:])).persist()
            for k, v in arrays.items()}  # fmt: skip
    fields = {k: v[m] for k, v in held.items()}  # unknown sizes, on the workers
    rows = {k: v[keep] for k, v in arrays.items()}
    mask = (rows["a"] > 0.4) & (rows["b"] < 20)
    out = compact_records(fields, "(a > 0.4) & (b < 20)", indices=True)
    assert_known_alike(out)
    assert_same(out, reference(rows, mask, indices=True))
    lazy = compact_records(fields, lambda a, b: (a > 0.4) & (b < 20), indices=True, lazy=True)
    assert_same(lazy, reference(rows, mask, indices=True))
    assert_same(compact_records(fields, "a > 0.4", chunks=4096), reference(rows, rows["a"] > 0.4))
    # more outputs than one graph takes (ONE_GRAPH_OUTPUTS): phase 1 persisted alone, the
    # indices' starts then added by tasks over its futures
    many = {**fields, **{f"c{j}": fields["a"] * j for j in range(8)}}
    want = reference({**rows, **{f"c{j}": rows["a"] * j for j in range(8)}}, mask, indices=True)
    assert_same(compact_records(many, "(a > 0.4) & (b < 20)", indices=True), want)


def test_no_client_is_left_the_default() -> None:
    """After the cluster test, in the file's order (conftest.client_as_default)."""
    from conftest import assert_no_client_is_the_default

    assert_no_client_is_the_default()
