"""Ctrl-C during the first call of a process: numba's import and first compile are held
(``numba_loop.numba_held``), and an error from numba's half-imported modules is not taken for a
damaged cache file. 2026-11-30, a new-user probe: an interrupt there left every later
compiled-loop call of the process failing, and removed sound cache files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dask_compact.batch.signals import deferred

# The interrupt lands at the n-th import of a numba module, from inside (an import finder),
# rather than after a delay: the same moment on a loaded machine. About 150 numba modules are
# imported before the first compile and some 70 more during it (numba's CPU target).
_DRIVER = r"""
import json, os, signal, sys, warnings
from pathlib import Path

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
at = int(sys.argv[1])
seen = [0]


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "numba" or name.startswith("numba."):
            seen[0] += 1
            if seen[0] == at:
                signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C
        return None


import numpy as np
import dask_compact

assert dask_compact.__file__.startswith(sys.argv[2]), dask_compact.__file__
rng = np.random.default_rng(at)
a = rng.standard_normal(5001)
pycache = Path(os.environ["DASK_COMPACT_CACHE_DIR"]) / "__pycache__"
sys.meta_path.insert(0, Interrupt())
report = {"imports": 0}
try:
    if sys.argv[3] == "scan":  # numba's import by the NumPy scan kernels, then their compile
        dask_compact.scan_array(a)
    else:  # by the fused loop's build
        dask_compact.compact_array(a, "x > 0.5")
    report["interrupted"] = False
except KeyboardInterrupt:
    report["interrupted"] = True
sys.meta_path.pop(0)
report["imports"] = seen[0]
files = sorted(str(f) for f in pycache.glob("*.nb[ic]"))
warnings.simplefilter("error")  # a "damaged cache" warning fails the run
for pred, want in [("x > 0.5", a[a > 0.5]), (lambda v: v < -0.2, a[a < -0.2]),
                   ("(x > 0.1) & (x < 0.3)", a[(a > 0.1) & (a < 0.3)])]:
    got = dask_compact.compact_array(a, pred)
    assert np.array_equal(got, want), pred
i = rng.integers(-1000, 1000, 3001)
assert np.array_equal(dask_compact.scan_array(i, exclusive=False), np.cumsum(i))
report["kept"] = all(Path(f).exists() for f in files)
report["files"] = len(files)
print(json.dumps(report))
"""

ROOT = str(Path(__file__).resolve().parents[1])


def _run(at: int, cache: Path, entry: str = "fused") -> dict:
    env = {**os.environ, "DASK_COMPACT_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(at), ROOT, entry], env=env, capture_output=True,
        text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entry, warm", [
    ("fused", False), ("fused", True), ("scan", False),
])
def test_ctrl_c_in_the_first_call_leaves_the_process_working(tmp_path, entry, warm):
    """At each moment (numba's first module, its middle, the compile's own imports, the
    compile's end) the first call raises KeyboardInterrupt, or finishes where the interrupt
    came too late to be its; the calls after equal NumPy and no cache file is removed.
    Before the fix: AttributeError (`module 'numba' has no attribute 'core'`), `partially
    initialized module`, or `No definition for lowering` on every later call; in a warm cache
    the sound files were removed as "damaged". "scan": numba imported by the NumPy backend's
    kernels (`numba_ready`), not by a fused loop's build."""
    cache = tmp_path / "cache"
    if warm:
        _run(10**6, cache, entry)  # an interrupt that never comes: fills the cache
        assert list((cache / "__pycache__").glob("*.nbc"))
    for at in (1, 40, 120, 165, 210):
        report = _run(at, cache, entry)
        assert report["interrupted"] == (at <= report["imports"]), report
        assert report["kept"], report


def test_deferred_runs_the_users_handler_after():
    """The handler in place runs after the block, once, and not during it."""
    calls: list[str] = []

    def handler(signum, frame):
        calls.append("handler")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with deferred(signal.SIGINT):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            calls.append("block")
        assert calls == ["block", "handler"]
        assert signal.getsignal(signal.SIGINT) is handler
        with pytest.raises(KeyboardInterrupt):  # the default: Ctrl-C raised as it ends
            signal.signal(signal.SIGINT, signal.default_int_handler)
            with deferred(signal.SIGINT):
                signal.raise_signal(signal.SIGINT)
                calls.append("second block")
        assert calls[-1] == "second block"
    finally:
        signal.signal(signal.SIGINT, previous)


def test_deferred_is_a_no_op_outside_the_main_thread():
    ran: list[bool] = []

    def body() -> None:
        with deferred(signal.SIGINT):
            ran.append(True)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert ran == [True]


@pytest.mark.parametrize("error", [
    AttributeError("partially initialized module 'numba.core.types' has no attribute 'misc' "
                   "(most likely due to a circular import)"),
    AttributeError("module 'numba' has no attribute 'core'"),
    ImportError("cannot import name 'types' from partially initialized module 'numba.core'"),
])
def test_an_error_of_the_process_is_not_a_damaged_cache(tmp_path, monkeypatch, error):
    """An error raised through numba's caching.py that is about this process's modules (numba
    half imported after an interrupt), not the file's bytes, goes to the caller as it is; the
    sound cache files stay. Before the fix they were removed as "damaged" (and the compile
    again failed all the same)."""
    import pickle

    import numba.core.caching
    import numpy as np

    import dask_compact
    from dask_compact.codegen import numba_loop

    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "cache"))
    numba_loop.clear_cache()
    a = np.random.default_rng(7).standard_normal(3001)
    pred = "(x > 0.25) | (x < -1.5)"
    want = a[(a > 0.25) | (a < -1.5)]
    np.testing.assert_array_equal(dask_compact.compact_array(a, pred), want)
    files = sorted((tmp_path / "cache" / "__pycache__").glob("*.nb[ic]"))
    assert files

    class Broken:  # numba's pickle.loads, as its modules were half imported
        def __getattr__(self, name):
            return getattr(pickle, name)

        def loads(self, data):
            raise error

    numba_loop.clear_cache()
    numba_loop._sweep()  # as a new process would: the loop's module imported again
    with monkeypatch.context() as m:
        m.setattr(numba.core.caching, "pickle", Broken())
        with pytest.raises(type(error), match="numba"):
            dask_compact.compact_array(a, pred)
    assert all(f.exists() for f in files)
    numba_loop.clear_cache()
    numba_loop._sweep()
    np.testing.assert_array_equal(dask_compact.compact_array(a, pred), want)
