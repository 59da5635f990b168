"""numba's compiler lock and llvmlite's lock across a fork: a forked child can compile.

numba compiles under one process-wide lock (``numba.core.compiler_lock.global_compiler_lock``,
an object around an RLock, ``_lock``), held through every compile and every load from numba's
disk cache (0.1-1.5 s for one of our loops), and llvmlite calls LLVM under another
(``llvmlite.binding.ffi.lib._lock``, around an RLock too), held through each LLVM call.
Neither has an at-fork hook. A process forked while another thread of the parent held one
(a fork-started ``multiprocessing.Pool()``, Linux's default in Python 3.11, created while a
dask thread compiled a loop) inherits it held by a thread it does not have, and its first
compile waits for ever. Until 2026-12-02 (nineteenth session, a fork review) that was every
such child's first build of a loop.

A fresh lock in the child alone is not enough: the child also inherits the half-done compile
(measured: 7 children of 10 forked at random moments of another thread's compile still hung,
on numba's typing call stack's lock, the lock of a ``functools.cached_property`` or
llvmlite's lock; a child that compiled the same loop met that compile's frame on numba's
call stack, "compiler re-entrant", and took the mask path). So the fork waits for the compile
instead, as CPython's logging module does for its own lock: before a fork
(``os.register_at_fork(before=...)``) the forking thread takes both locks, in numba's order
(the compiler's, then LLVM's), so that no thread is inside a compile or an LLVM call as the
process is copied; the parent and the child release them after it. A fork thus waits for a
compile under way in another thread, a second or so, at most :data:`FORK_WAIT_S`; past that
(a compile that long, or a thread holding the lock that waits for the forking thread) the
fork goes on with a warning, and the child takes a fresh lock in place of the one it could not
take (it can compile, unless it meets the other thread's half-done compile).

The cost: two uncontended lock operations before and after each ``os.fork()`` of the process
(``subprocess`` runs fork hooks only with a ``preexec_fn``). Where numba or llvmlite lacks
the attribute (other versions), that lock is left alone: nothing is done for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

__all__ = ["FORK_WAIT_S", "install"]

logger = logging.getLogger("dask_compact")

# How long a fork waits for another thread's compile (numba's lock held) before it goes on.
FORK_WAIT_S = 60.0

_RLOCK = type(threading.RLock())

# The objects whose ``_lock`` attribute is the RLock to take, in the order they are taken;
# filled by install().
_holders: list[Any] = []
# Per forking thread: (holder, the lock, whether the before-fork hook took it).
_held: dict[int, list[tuple[Any, Any, bool]]] = {}


def _before() -> None:
    taken = _held[threading.get_ident()] = []
    deadline = time.monotonic() + FORK_WAIT_S
    for holder in _holders:
        lock = getattr(holder, "_lock", None)
        if not isinstance(lock, _RLOCK):  # another version's lock: left alone
            continue
        got = lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        if not got:
            logger.warning(
                "dask_compact: a fork waited %.0f s for another thread's numba compile "
                "(%s held) and goes on; the child takes a fresh lock",
                FORK_WAIT_S, type(holder).__name__,
            )
        taken.append((holder, lock, got))


def _after_in_parent() -> None:
    for _, lock, got in reversed(_held.pop(threading.get_ident(), [])):
        if got:
            lock.release()


def _after_in_child() -> None:
    taken = _held.pop(threading.get_ident(), [])
    _held.clear()  # other threads' entries: those threads are not in the child
    for holder, lock, got in reversed(taken):
        if got:
            lock.release()  # the forking thread's: the only thread here
        else:  # held by a thread the child does not have: no one would release it
            holder._lock = threading.RLock()


def install() -> None:
    """Register the fork hooks (once per process; numba imported: :mod:`.numba_ready`)."""
    if _holders or not hasattr(os, "register_at_fork"):  # done, or no fork (Windows)
        return
    from numba.core.compiler_lock import global_compiler_lock

    _holders.append(global_compiler_lock)
    try:
        from llvmlite.binding import ffi

        llvm_lock = getattr(ffi.lib, "_lock", None)  # a plain CDLL in old llvmlite: none
    except Exception:  # noqa: BLE001 - another llvmlite: its lock left alone
        llvm_lock = None
    if llvm_lock is not None:
        _holders.append(llvm_lock)
    os.register_at_fork(
        before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child
    )
