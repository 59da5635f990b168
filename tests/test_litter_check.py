"""The session check in conftest.py fails a test run that leaves our files in the temporary
directory (a killed job's output, a cache folder, dask's scratch space)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

pytest_plugins = ["pytester"]


def test_a_session_that_leaves_litter_fails(pytester):
    shutil.copy(Path(__file__).with_name("conftest.py"), pytester.path / "conftest.py")
    pytester.makepyfile(
        test_litter="""
        import os, tempfile
        def test_leaves_a_folder():
            os.mkdir(os.path.join(tempfile.gettempdir(), "dask-compact-litter-probe"))
        """
    )
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
        assert result.ret == 1
        result.stdout.fnmatch_lines(["*tests left 1 entries in*dask-compact-litter-probe*"])
    finally:
        shutil.rmtree(Path(tempfile.gettempdir()) / "dask-compact-litter-probe",
                      ignore_errors=True)


def test_a_clean_session_passes(pytester):
    shutil.copy(Path(__file__).with_name("conftest.py"), pytester.path / "conftest.py")
    pytester.makepyfile(test_clean="def test_nothing():\n    assert True\n")
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").ret == 0


def test_session_variables_read_by_dask_without_a_warning():
    """dask parses each ``DASK_*`` variable with ``ast.literal_eval``; the session folder's name
    in them must not make Python warn (a digit before a keyword, as in ``-0inyrtoq``), or
    every process that imports dask prints it and the CLI tests' one-line stderr breaks."""
    import ast
    import os
    import warnings

    import conftest

    names = [conftest._make_session_dir() for _ in range(200)]
    try:
        assert all(not any(c.isdigit() for c in Path(n).name) for n in names)
    finally:
        for n in names:
            Path(n).rmdir()
    values = [v for k, v in os.environ.items() if k.startswith("DASK_")]
    # the controller's session folder under pytest-xdist (its workers inherit the variables
    # and make folders of their own, which no DASK_ variable names)
    session = os.path.dirname(os.environ["DASK_COMPACT_CACHE_DIR"])
    assert session == conftest._SESSION_DIR or "PYTEST_XDIST_WORKER" in os.environ
    # dask's own variable (DASK_COMPACT_CACHE_DIR, which gave ``session``, is the library's)
    assert os.path.dirname(os.environ["DASK_TEMPORARY_DIRECTORY"]) == session
    for value in [*values, "/tmp/dask-compact-tests-0inyrtoq"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ast.literal_eval(value)
            except (SyntaxError, ValueError):
                pass
        syntax = [w for w in caught if issubclass(w.category, SyntaxWarning)]
        assert not syntax or value.endswith("0inyrtoq"), (value, syntax)
        if value.endswith("0inyrtoq"):  # the check itself sees the CI run's name
            assert syntax
