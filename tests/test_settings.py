"""dask-compact's settings read through dask's configuration, whatever happened to its
section: a ``dask.config.set`` block around a module's first import removed the defaults
that import registered (a new-user probe: every later ``sort`` raised ``KeyError: 'sort'``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pytest

import dask_compact
from dask_compact import settings


def test_a_block_around_the_first_sort_leaves_later_sorts_working():
    # the user's steps, in a fresh process: the first sort (its module's first import) runs
    # inside a block that sets one of its keys
    code = textwrap.dedent("""
        import dask, dask.array as da, numpy as np, dask_compact
        x = da.from_array(np.arange(10.0)[::-1], chunks=3)
        with dask.config.set({"dask-compact.sort.min-bucket": 4}):
            assert dask_compact.sort(x).compute().tolist() == sorted(range(10))
        assert dask_compact.sort(x).compute().tolist() == sorted(range(10))
        assert dask_compact.argsort(x).compute().tolist() == list(range(9, -1, -1))
        with dask.config.set({"dask-compact.cache.memory-entries": 3}):
            assert dask_compact.cache.memory_entries() == 3
        assert dask_compact.cache.memory_entries() == 64
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_every_setting_has_its_default_without_the_section(monkeypatch):
    monkeypatch.delitem(dask.config.config, "dask-compact", raising=False)
    assert settings.get("sort.min-bucket") == 2**16
    assert settings.get("sort.max-pieces") == 2**14
    assert settings.get("sort.exchange") == "auto"
    assert settings.get("direct") is True
    assert settings.get("cache.memory-entries") == 64
    assert settings.get("cache.disk-bytes") == 256 * 2**20
    rng = np.random.default_rng(5)
    a = rng.random(1001)
    x = da.from_array(a, chunks=97)
    assert np.array_equal(dask_compact.sort(x).compute(), np.sort(a))
    assert np.array_equal(x.map_compact("x > 0.5").compute(), a[a > 0.5])


def test_a_set_value_wins_and_an_unknown_key_is_a_key_error():
    with dask.config.set({"dask-compact.sort.min-bucket": 5}):
        assert settings.get("sort.min-bucket") == 5
    assert settings.get("sort.min-bucket") == 2**16
    with pytest.raises(KeyError):
        settings.get("sort.no-such-key")
