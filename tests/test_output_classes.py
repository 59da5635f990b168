"""Exact-size GPU outputs are allocated in size classes (backends/cupy_device.class_items):
the arithmetic, checked without a GPU; tests/gpu/test_one_read.py checks the arrays."""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from dask_compact.backends import cupy_device
from dask_compact.backends.cupy_device import OUTPUT_CLASS_MIN_BYTES, class_items

ROWS = st.sampled_from([1, 2, 4, 8, 16, 12, 24, 40])  # itemsizes and record rows


@given(n=st.integers(0, 1 << 40), row=ROWS)
def test_a_class_holds_the_output_and_wastes_under_1_in_128(n, row):
    got = class_items(n, row)
    if n * row < OUTPUT_CLASS_MIN_BYTES:
        assert got == n
    else:
        assert n <= got and (got - n) * row < n * row / 128 + row


@given(n=st.integers(OUTPUT_CLASS_MIN_BYTES // 4, 1 << 36), grow=st.integers(1, 1 << 12))
def test_outputs_a_little_larger_mostly_share_a_class(n, grow):
    """A run of outputs each a little larger than the last (a threshold raised a little each
    call) needs at most two classes while it grows by less than 1/256; classes never
    shrink as outputs grow."""
    sizes = [n + k * grow for k in range(64)]
    if sizes[-1] - n < n / 256:
        assert len({class_items(s, 4) for s in sizes}) <= 2
    got = [class_items(s, 4) for s in sizes]
    assert got == sorted(got)


def test_the_examples_in_its_docstring():
    failures, tried = doctest.testmod(cupy_device, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0 and failures == 0
