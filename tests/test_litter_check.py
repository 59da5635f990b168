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
