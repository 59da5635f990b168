"""Signals in a batch job: SIGTERM unwinds like Ctrl-C, Ctrl-C waits during file-system
clean-up, and local worker processes are started deaf to the terminal's Ctrl-C. Also, outside
the batch job, :func:`deferred`: Ctrl-C held over numba's import and compiles
(:mod:`..codegen.numba_loop`), which an interrupt would leave half done for the process."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

EXIT_SIGINT = 128 + signal.SIGINT  # the shell's convention: 130
EXIT_SIGTERM = 128 + signal.SIGTERM  # 143


class Reported(SystemExit):
    """An exit (130 or 143) whose one line on stderr has been written already."""


# The interrupt the command received (SIGINT or SIGTERM), None if none: kept by the handlers
# of :func:`terminate_as_exit`, as the exception they raise can be lost (see there)
_received: int | None = None
_depth = 0  # terminate_as_exit()s entered: the outermost one forgets an earlier command's


def _on_interrupt(signum: int, frame: Any) -> None:
    """Record ``signum``, then unwind: Ctrl-C as KeyboardInterrupt, SIGTERM as SystemExit."""
    global _received
    _received = signum
    raise_if_interrupted()


def raise_if_interrupted() -> None:
    """Raise what the handler raised where an interrupt came and its exception was lost.

    Python runs a signal's handler in the main thread wherever that is, a finalizer
    (``__del__``, a weakref callback) included, and an exception raised there is printed
    ("Exception ignored in ...") and dropped: a probe's Ctrl-C landed in a pooled buffer's
    ``__del__`` (.host_buffers), and the job ran on and committed with exit 0 (2 in about 120
    runs). The stream's loop and the commit call this, so such an interrupt still stops the
    job before anything is committed, with the exit status of the signal."""
    if _received == signal.SIGINT:
        raise KeyboardInterrupt
    if _received is not None:
        raise SystemExit(128 + _received)


def _quiet_if_ours(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``hook`` (``sys.unraisablehook``) but for what :func:`_on_interrupt` raised in a
    finalizer: recorded, it stops the job later (:func:`raise_if_interrupted`), and Python's
    "Exception ignored in" with its traceback above the command's one line said otherwise
    (until 2026-12-01: a new-user probe's Ctrl-C of one of two jobs on one cluster). What
    any other finalizer drops is passed on."""

    def unraisable(u: Any) -> None:
        tb = u.exc_traceback
        while tb is not None and tb.tb_frame.f_code is not _on_interrupt.__code__:
            tb = tb.tb_next
        if tb is None or not isinstance(u.exc_value, (KeyboardInterrupt, SystemExit)):
            hook(u)

    return unraisable


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``docker stop``, a batch system's kill) unwinds like Ctrl-C: cleanup runs. Both
    are recorded as they come (:func:`raise_if_interrupted`)."""
    global _received, _depth
    try:
        previous = [(s, signal.signal(s, _on_interrupt)) for s in (signal.SIGINT, signal.SIGTERM)]
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    if _depth == 0:
        _received = None
    _depth += 1
    unraisable = sys.unraisablehook
    sys.unraisablehook = _quiet_if_ours(unraisable)
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            _received = None
        sys.unraisablehook = unraisable
        for s, handler in reversed(previous):
            # None: a handler not installed from Python; the default is the nearest
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def ignored(*signums: int) -> Iterator[None]:
    """The given signals ignored for the duration (main thread only; elsewhere a no-op).

    Two uses: a clean-up of the file system that Ctrl-C must not cut short, and starting
    local worker processes: a spawned process inherits an ignored disposition (CPython keeps
    an inherited SIG_IGN for SIGINT), so Ctrl-C in the terminal, or a batch system's SIGTERM,
    which signal the whole process group, reach only the job, which then stops the workers
    itself (distributed closes them, or kills them past a timeout) instead of each of them
    dying with a traceback mid-write. (Blocking the signals instead does not reach the
    workers: they are spawned with a fresh signal mask.) The price: a Ctrl-C during the few
    seconds a local cluster takes to start is not seen.
    """
    try:
        previous = [(s, signal.signal(s, signal.SIG_IGN)) for s in signums]
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for s, handler in reversed(previous):
            signal.signal(s, handler)


# The signals each :func:`deferred` block now open holds, innermost last (main thread only)
_held: list[list[int]] = []


def held_signal() -> bool:
    """Whether a :func:`deferred` block holds a signal that came: a wait inside one (for
    another process's compile, ``numba_loop.one_compile_at_a_time``) ends on it, as the
    interrupt is delivered only when the block ends."""
    return any(_held)


@contextlib.contextmanager
def deferred(*signums: int) -> Iterator[None]:
    """The given signals held for the duration and delivered right after, to the handlers
    that were in place (main thread only; elsewhere a no-op, as only the main thread can set
    handlers, and only it runs them). A handler the user installed runs late, not never: a
    Ctrl-C during the block raises ``KeyboardInterrupt`` as it ends (a wait in the block
    asks :func:`held_signal` to end early)."""
    pending: list[int] = []
    try:
        previous = [(s, signal.signal(s, lambda signum, frame: pending.append(signum)))
                    for s in signums]
    except ValueError:  # not the main thread
        yield
        return
    _held.append(pending)
    try:
        yield
    finally:
        del _held[next(i for i, p in enumerate(_held) if p is pending)]  # not by ==
        for s, handler in reversed(previous):
            # None: a handler not installed from Python; the default is the nearest
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for s in dict.fromkeys(pending):  # each once, in the order they came
            signal.raise_signal(s)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Ctrl-C ignored and SIGTERM held for the duration, SIGTERM delivered right after (main
    thread only; elsewhere a no-op): the renames that put a new output in place, which an
    interrupt must not split from the record that they were done. (SIGTERM had unwound the
    commit of an ``--overwrite`` after the swap, and the job said OUTPUT was not written.)

    Also the clean-up of the file system (a temporary output removed, and the wait for the
    job's threads before it): until 2026-12-06 that held Ctrl-C alone, and a probe's three
    SIGTERMs 0.3 s apart (a batch system repeating its request) cut the removal short,
    leaving 11,604 files of the group beside OUTPUT; the first SIGTERM had already started
    the clean-up and set the exit status."""
    with deferred(signal.SIGTERM), ignored(signal.SIGINT):
        yield
