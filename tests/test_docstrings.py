"""The runnable examples in the public docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import dask_compact

# every module whose docstrings hold examples (until 2026-12-01, fourteenth session, a list
# that left out records, sorting, sort_graph, the xarray accessor and two backends' helpers,
# whose 48 examples a new-user probe ran by hand)
_ROOT = Path(dask_compact.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(_ROOT).with_suffix("").parts
    return ".".join(("dask_compact", *(parts[:-1] if parts[-1] == "__init__" else parts)))


_WITH_EXAMPLES = sorted(_module(p) for p in _ROOT.rglob("*.py")
                        if ">>> " in p.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", _WITH_EXAMPLES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:  # the optional extras' modules: xarray, CuPy
        if e.name not in ("xarray", "cupy"):
            raise
        pytest.skip(f"{name} needs {e.name}")
    failures, tried = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0
    assert failures == 0


def test_the_examples_of_the_public_modules_are_found():
    assert {"dask_compact", "dask_compact.api", "dask_compact.chunk", "dask_compact.records",
            "dask_compact.scan", "dask_compact.sorting", "dask_compact.stable_split",
            "dask_compact.latency", "dask_compact.xarray_accessor"} <= set(_WITH_EXAMPLES)


def test_every_parameter_of_the_dask_calls_is_named_in_their_docstrings():
    """compact's ``output``, ``lazy`` and ``chunks`` and flatnonzero's ``lazy`` and ``chunks``
    were in their signatures and not described in their docstrings (a new-user probe read
    help() of each public name, 2026-12-01, fourteenth session)."""
    import inspect

    for name in ("map_compact", "compact", "flatnonzero", "compact_records", "partition",
                 "cumsum", "sort"):
        fn = getattr(dask_compact, name)
        doc = inspect.getdoc(fn) or ""
        for p in inspect.signature(fn).parameters:
            assert f"``{p}``" in doc or f"\n{p} :" in doc, f"{name}: {p} not in its docstring"
