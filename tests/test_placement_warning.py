"""The warning for an input whose chunks one worker holds far more of than its share
(placement.warn_if_uneven): each chunk is compacted where it is held, so such a call runs at
that worker's pace."""

from __future__ import annotations

import warnings

import pytest
from dask.array.core import PerformanceWarning

from dask_compact.placement import warn_if_uneven


def _quiet(holders: list, nthreads: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_uneven(holders, nthreads)


def test_the_placement_a_new_gpu_cluster_gave_is_warned_about():
    holders = ["a"] * 56 + ["b"] * 3 + ["c"] * 3 + ["d"] * 2  # 4x H200, 2026-11-28
    with pytest.warns(PerformanceWarning, match=r"56 of the input's 64 chunks .* \(a\), "
                                                r"where an even spread would give it 16"):
        warn_if_uneven(holders, dict.fromkeys("abcd", 1))


@pytest.mark.parametrize("holders,nthreads", [
    (["a"] * 17 + ["b"] * 16 + ["c"] * 16 + ["d"] * 15, dict.fromkeys("abcd", 1)),  # Dask's usual
    (["a"] * 31 + ["b"] * 1, {"a": 1, "b": 1}),  # just under twice its share (16)
    (["a"] * 32 + ["b"] * 8, {"a": 4, "b": 1}),  # a's share is 32: it has 4 threads
    (["a"] * 3, {"a": 1, "b": 1}),  # fewer than two chunks per worker
    (["a"] * 40, {"a": 1}),  # one worker: nobody else to hold them
    ([None] * 30 + ["a", "b"], {"a": 1, "b": 1}),  # holders unknown are not counted
])
def test_no_warning_where_the_placement_is_fair_enough_or_says_nothing(holders, nthreads):
    _quiet(holders, nthreads)


def test_a_worker_with_more_threads_is_weighed_by_them():
    """32 chunks on a 1-thread worker beside a 4-thread one: its share is 8 of 40."""
    with pytest.warns(PerformanceWarning, match="32 of the input's 40 chunks .* give it 8"):
        warn_if_uneven(["b"] * 32 + ["a"] * 8, {"a": 4, "b": 1})
