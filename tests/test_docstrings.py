"""The runnable examples in the public docstrings run and print what they show."""

from __future__ import annotations

import doctest

import pytest

import dask_compact
from dask_compact import api, chunk, latency, placement, scan, stable_split


@pytest.mark.parametrize("module", [api, chunk, stable_split, scan, latency, placement,
                                    dask_compact],
                         ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, tried = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0
    assert failures == 0
