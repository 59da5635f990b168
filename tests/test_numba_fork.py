"""A process forked while another thread is inside numba's compile builds its own loops.

numba compiles under one process-wide lock (``global_compiler_lock``) with no at-fork hook:
until 2026-12-02 (nineteenth session) a child forked while another thread of the parent held
it (a fork-started ``multiprocessing.Pool()`` created while a dask thread compiled a loop)
waited for ever at its first build. :mod:`dask_compact.codegen.numba_fork` makes the fork
wait for the compile. Each case runs in a subprocess with a hard deadline: a hang fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types

import pytest

from dask_compact.codegen import numba_fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")

# Reports "exit <child's status>" or "hung"; the child also checks that it built the fused
# loop (not the mask path, where numba refused: "compiler re-entrant" from the parent's
# half-done compile on numba's call stack) and that its result is NumPy's.
_CHILD_AND_WAIT = r"""
def child_builds(text, expected):
    import faulthandler

    faulthandler.dump_traceback_later(40, exit=True)  # a hang: its stack, exit status 1
    got = dask_compact.compact_array(a, text)
    info = numba_loop.cache_info()
    ok = np.array_equal(got, expected) and info["unsupported"] == 0
    os.write(2, f"child {info}\n".encode())  # one write, on stderr: stdout is the parent's
    os._exit(0 if ok else 3)


def wait_for(child):
    deadline = time.monotonic() + 60  # a build takes a second or two
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return f"exit {os.waitstatus_to_exitcode(status)}"
        time.sleep(0.05)
    os.kill(child, 9)
    os.waitpid(child, 0)
    return "hung"
"""

_FORKED_IN_NUMBAS_COMPILE = r"""
import os, sys, threading, time

import numpy as np

import dask_compact
from dask_compact.codegen import numba_loop

window, built = sys.argv[1], sys.argv[2]
a = np.random.default_rng(0).standard_normal(1001) * 3
np.testing.assert_array_equal(dask_compact.compact_array(a, "x > 0"), a[a > 0])  # numba set up
from numba.core import caching, typeinfer
from numba.core.compiler_lock import global_compiler_lock

inside = threading.Event()


def widened(cls, name):  # thread A sleeps 2 s inside numba's compile (or cache load), once
    real = getattr(cls, name)

    def slow(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and not inside.is_set():
            inside.set()
            time.sleep(2)
        return real(*args, **kwargs)

    setattr(cls, name, slow)


if window == "compile":  # in the type inference: numba's typing call stack held too
    widened(typeinfer.TypeInferer, "propagate")
else:  # a load from numba's disk cache (the loop compiled by an earlier process)
    widened(caching.Cache, "_load_overload")
text_a, expected_a = "(x > 0.5) | (x < -1)", a[(a > 0.5) | (a < -1)]
got_a = []
thread = threading.Thread(target=lambda: got_a.append(dask_compact.compact_array(a, text_a)))
thread.start()
assert inside.wait(60)
assert not global_compiler_lock._lock.acquire(blocking=False)  # A holds numba's own lock
child = os.fork()  # the main thread's fork inside A's compile (a fork-started pool's worker)
if child == 0:
    if built == "same":  # the loop A was building
        child_builds(text_a, expected_a)
    child_builds("(x > 0.25) & (x < 2) | (x == 1)", a[(a > 0.25) & (a < 2) | (a == 1)])
thread.join()
assert np.array_equal(got_a[0], expected_a)
print(wait_for(child))
"""

_WARM = r"""
import numpy as np, dask_compact
dask_compact.compact_array(np.arange(5.0), "(x > 0.5) | (x < -1)")
"""


def _run(script: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DASK_COMPACT_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", script, *args], env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize(("window", "built"), [("compile", "other"), ("compile", "same"),
                                               ("load", "same")])
def test_a_process_forked_inside_numbas_compile_builds_its_own(tmp_path, window, built):
    """The main thread forks while thread A is inside numba's compile of a new loop (its
    type inference, widened by a sleep there: numba's compiler lock and its typing call
    stack's lock held) or inside a load of its loop from numba's disk cache (compiler lock
    held). The child then builds another new loop, or A's: until 2026-12-02 (nineteenth
    session) it waited for ever at numba's compiler lock. Now the fork waits for A's compile;
    the child builds the fused loop (no mask path) and its result is NumPy's, and so is A's
    in the parent."""
    if window == "load":
        warm = _run(_WARM, tmp_path)
        assert warm.returncode == 0, warm.stderr
    res = _run(_CHILD_AND_WAIT + _FORKED_IN_NUMBAS_COMPILE, tmp_path, window, built)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[-2:] == ["exit", "0"], (res.stdout, res.stderr)


_FORKED_WHILE_A_THREAD_HOLDS_THE_LOCK = r"""
import logging, os, threading, time

import numpy as np

import dask_compact
from dask_compact.codegen import numba_fork, numba_loop
from numba.core.compiler_lock import global_compiler_lock

a = np.random.default_rng(0).standard_normal(1001) * 3
np.testing.assert_array_equal(dask_compact.compact_array(a, "x > 0"), a[a > 0])
warned = []
logging.getLogger("dask_compact").addHandler(logging.Handler())
logging.getLogger("dask_compact").handlers[-1].emit = warned.append
numba_fork.FORK_WAIT_S = 0.5
holding, go = threading.Event(), threading.Event()


def holder():  # holds numba's lock until the main thread, past its fork, lets it go
    with global_compiler_lock:
        holding.set()
        go.wait()


thread = threading.Thread(target=holder)
thread.start()
assert holding.wait(60)
t0 = time.monotonic()
child = os.fork()
if child == 0:
    child_builds("(x > 0.25) & (x < 2) | (x == 1)", a[(a > 0.25) & (a < 2) | (a == 1)])
waited = time.monotonic() - t0
go.set()
thread.join()
# the parent's lock was left as it was: its next compile goes on
np.testing.assert_array_equal(dask_compact.compact_array(a, "(x < 0.75) & (x > -2)"),
                              a[(a < 0.75) & (a > -2)])
print("waited", round(waited, 2), "warned", len(warned))
print(wait_for(child))
"""


def test_a_fork_gives_up_waiting_for_a_lock_held_for_long_and_the_child_still_builds(
        tmp_path):
    """A thread holding numba's compiler lock for longer than ``FORK_WAIT_S`` (set to
    0.5 s here; a thread waiting for the forking thread would hold it for ever): the fork
    goes on after that wait, with a warning, and the child takes a fresh lock, builds a new
    loop and gets NumPy's result. Until 2026-12-02 (nineteenth session) the child waited for
    ever."""
    res = _run(_CHILD_AND_WAIT + _FORKED_WHILE_A_THREAD_HOLDS_THE_LOCK, tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout.split()
    assert out[-2:] == ["exit", "0"], (res.stdout, res.stderr)
    waited = float(out[out.index("waited") + 1])
    assert 0.4 < waited < 10, res.stdout
    assert out[out.index("warned") + 1] == "1", res.stdout


def test_the_fork_hooks_take_and_release_the_locks_and_leave_others_alone(monkeypatch):
    """The hooks themselves, in this process (no fork): an RLock free is taken before the
    fork and released after it in the parent; one held by another thread is waited for up
    to ``FORK_WAIT_S``, and in the child replaced by a fresh one; a holder without ``_lock``
    (another numba version) or with a lock of another type is left alone."""
    free = types.SimpleNamespace(_lock=threading.RLock())
    busy = types.SimpleNamespace(_lock=threading.RLock())
    other_type = types.SimpleNamespace(_lock=threading.Lock())
    monkeypatch.setattr(numba_fork, "_holders", [object(), free, busy, other_type])
    monkeypatch.setattr(numba_fork, "FORK_WAIT_S", 0.2)
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with busy._lock:
            taken.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(30)
        old_busy = busy._lock
        numba_fork._before()
        assert free._lock._is_owned()
        numba_fork._after_in_parent()
        assert not free._lock._is_owned() and busy._lock is old_busy
        numba_fork._before()
        numba_fork._after_in_child()  # as in a child: the busy lock anew, free released
        assert not free._lock._is_owned()
        assert busy._lock is not old_busy and busy._lock.acquire(blocking=False)
        busy._lock.release()
        assert not other_type._lock.locked() and not numba_fork._held
    finally:
        done.set()
        thread.join()


def test_numba_ready_installs_the_hooks_once():
    """Importing numba through the library registers the hooks, on numba's compiler lock
    and llvmlite's lock; a second install adds nothing."""
    from llvmlite.binding import ffi
    from numba.core.compiler_lock import global_compiler_lock

    import dask_compact.codegen.numba_ready  # noqa: F401

    assert numba_fork._holders[0] is global_compiler_lock
    assert numba_fork._holders[1:] == [ffi.lib._lock]
    numba_fork.install()
    assert len(numba_fork._holders) == 2
