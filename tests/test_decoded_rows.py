"""How a task's rows are cut out of the buffer nvCOMP decodes its chunks into
(``reader.rows_of_decoded``, ``gpu_zstd.decode_host``'s layout), run here with NumPy arrays in
place of CuPy's: stored and missing chunks, edge chunks, N-D rows, every item size, and a view
with no copy where the chunks lie end to end. The GPU path itself runs in
tests/gpu/test_batch_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_compact.batch.gpu_zstd import OUT_ALIGN, _up
from dask_compact.batch.reader import chunk_spans, rows_of_decoded

DTYPES = ["int8", "int16", "float32", "float64", "complex128"]


def _decoded(a: np.ndarray, chunk_rows: int, spans, stored) -> tuple[np.ndarray, list[int]]:
    """The buffer decode_host makes: each stored chunk at full size (an edge chunk too), at
    starts rounded up to OUT_ALIGN, the padding garbage."""
    row_bytes = a[:1].nbytes if len(a) else a.itemsize * int(np.prod(a.shape[1:]))
    chunk_bytes = chunk_rows * row_bytes
    starts, at = [], 0
    for kept in stored:
        if kept:
            at = _up(at, OUT_ALIGN)
            starts.append(at)
            at += chunk_bytes
    buf = np.full(max(1, at), 0xA5, np.uint8)
    k = 0
    for (c, _, _), kept in zip(spans, stored):
        if not kept:
            continue
        rows = a[c * chunk_rows : (c + 1) * chunk_rows]
        raw = rows.tobytes()
        buf[starts[k] : starts[k] + len(raw)] = np.frombuffer(raw, np.uint8)
        k += 1
    return buf, starts


def _check(a, chunk_rows, r0, r1, missing, fill):
    spans = chunk_spans(chunk_rows, r0, r1)
    stored = [c not in missing for c, _, _ in spans]
    buf, starts = _decoded(a, chunk_rows, spans, stored)
    row = int(np.prod(a.shape[1:], dtype=np.int64))
    got = rows_of_decoded(np, buf, starts, spans, stored, row, a.dtype, fill,
                          (r1 - r0,) + a.shape[1:])
    want = a[r0:r1].copy()
    for c, first, rows in spans:
        if c in missing:
            lo = c * chunk_rows + first - r0
            want[lo : lo + rows] = fill
    assert got.dtype == a.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    return got, buf, stored


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 5)])
def test_every_stored_chunk_of_8_byte_multiples_is_a_view_of_the_buffer(dtype, trailing):
    rng = np.random.default_rng(5)
    a = (rng.random((100,) + trailing) * 100).astype(dtype)
    for chunk_rows, r0, r1 in [(8, 0, 100), (8, 3, 97), (16, 16, 48), (24, 5, 6), (8, 99, 100)]:
        got, buf, _ = _check(a, chunk_rows, r0, r1, set(), 0)
        if (chunk_rows * a[:1].nbytes) % OUT_ALIGN == 0:
            assert np.shares_memory(got, buf)  # no copy


@pytest.mark.parametrize("dtype", DTYPES)
def test_missing_chunks_read_as_the_fill_value_and_odd_chunk_bytes_are_copied(dtype):
    rng = np.random.default_rng(6)
    a = (rng.random((1023, 3)) * 100).astype(dtype)
    for chunk_rows in (1, 7, 31, 33, 1023, 1025):
        n_chunks = -(-len(a) // chunk_rows)
        for missing in (set(), {0}, {n_chunks - 1}, set(range(0, n_chunks, 2)),
                        set(range(n_chunks))):
            _check(a, chunk_rows, 0, len(a), missing, 7)
            _check(a, chunk_rows, len(a) // 3, len(a) - 5, missing, 7)


def test_no_rows_is_an_empty_array():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = rows_of_decoded(np, np.zeros(1, np.uint8), [], [], [], 3, a.dtype, 0, (0, 3))
    assert got.shape == (0, 3) and got.dtype == np.float32


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), chunk_rows=st.integers(1, 64), dtype=st.sampled_from(DTYPES),
       cut=st.tuples(st.floats(0, 1), st.floats(0, 1)), data=st.data())
def test_any_rows_of_any_chunks_match_numpy(n, chunk_rows, dtype, cut, data):
    a = (np.random.default_rng(n).random((n, 2)) * 50).astype(dtype)
    r0, r1 = sorted(int(f * n) for f in cut)
    r1 = max(r1, r0 + 1) if r0 < n else n
    r0 = min(r0, r1 - 1)
    n_chunks = -(-n // chunk_rows)
    missing = set(data.draw(st.lists(st.integers(0, n_chunks - 1), max_size=4)))
    _check(a, chunk_rows, r0, r1, missing, -1 if np.dtype(dtype).kind != "u" else 1)
