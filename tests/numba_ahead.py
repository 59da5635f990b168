"""The compiled loops of the heaviest predicate tests, built ahead in a background process.

Each new predicate structure, dtype and output is a numba compilation of 0.5-1.2 s on one of
CI's two cores; four tests (the API and special-values probes, the integer edges and the
float special values) compile about 310 of them, over three minutes of the suite. The suite
leaves a core idle much of the time, so once collection is done the session starts this file
as a process under ``nice -n 19`` (:meth:`NumbaAhead.start`), which imports the selected
tests' modules, asks each for the loops its test will build (``numba_ahead_loops(name,
params)``: pairs of a typed predicate and an output) and builds them with the package's own
:func:`~dask_compact.codegen.numba_loop.fused_loop`. That writes the generated source and
numba's cache of it into the session's cache folder (``DASK_COMPACT_CACHE_DIR``, which the
process inherits); the test then builds the same loop from the same source and numba loads
it from that cache (10-20 ms) instead of compiling it.

Nothing the tests check changes: they build every loop themselves, through the same code, and
a loop the background has not reached yet (or could not build) is compiled by the test as it
would have been. The background shares no state with the session's process (tracing there
would move the counters that tests of the caches read). The kernel compile tests' nvcc units
(tests/compile_ahead.py) start after this process ends: they are needed only at the end.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

__all__ = ["NumbaAhead", "NUMBA_AHEAD"]


class NumbaAhead:
    """One background process building the loops of the tests it is given, in order."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._done = threading.Event()
        self._done.set()  # nothing started: nothing to wait for

    def start(self, tests: list[tuple[str, str, dict]]) -> None:
        """Build, in a niced process, the loops of ``tests``: (module name, test name,
        params) of the selected tests whose module offers ``numba_ahead_loops``."""
        if self._proc is not None or not tests:
            return
        # a test with a parameter JSON cannot carry compiles its own loops
        payload = json.dumps([t for t in tests if _jsonable(t)])
        cmd = [sys.executable, str(Path(__file__).resolve())]
        nice = shutil.which("nice")
        if nice:
            cmd = [nice, "-n", "19", *cmd]
        self._done.clear()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, text=True)
        proc = self._proc

        def feed_and_wait() -> None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(payload)
                proc.stdin.close()
            except OSError:
                pass
            proc.wait()
            self._done.set()

        threading.Thread(target=feed_and_wait, name="numba-ahead", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the background process has ended (waiting up to ``timeout`` seconds)."""
        return self._done.wait(timeout)

    def stop(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._done.set()


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


NUMBA_AHEAD = NumbaAhead()


def _build_all(tests: list[tuple[str, str, dict]]) -> None:
    """In the background process: every listed test's loops, each built as the test will."""
    from dask_compact.codegen.numba_loop import fused_loop

    for module_name, test_name, params in tests:
        try:
            module = importlib.import_module(module_name)
            loops = module.numba_ahead_loops(test_name, params) or []
        except BaseException:  # noqa: BLE001 -- the test itself reports what fails here
            continue
        for typed, output in loops:
            try:
                fused_loop(typed, output)
            except Exception:  # noqa: BLE001, S112 -- refused or failed: the test sees it
                continue


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _build_all(json.load(sys.stdin))
