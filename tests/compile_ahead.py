"""nvcc runs for the kernel compile tests, started ahead of the tests in a background thread.

The compile tests (tests/test_kernels_compile.py) are a quarter of CI's time, nvcc on both of
its two cores; the rest of the suite is mostly single-threaded Python that leaves one core idle.
So the compile tests run last (conftest.py orders them so), and once collection is done the
session hands their jobs to :data:`AHEAD` (``pytest_collection_finish``), which compiles them
one at a time
under ``nice -n 19`` (the suite's own processes keep their share of the CPU), and a compile
test takes each job's result from there: done, waited for, or, where the background thread has
not started it yet, compiled by the test itself. A job is its exact source text, target and
name, so a test always checks the result of compiling exactly what it built.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Job", "CompileAhead", "AHEAD"]


@dataclass(frozen=True)
class Job:
    """One nvcc run: ``command(source_path, object_path)`` gives the command line."""

    source: str
    arch: str
    name: str
    # NVVM and ptxas at -O0 even on the architecture checked for spills: kernels whose
    # registers their optimised siblings' report stands for (tests/test_kernels_compile.py)
    unoptimised: bool = False

    def key(self) -> tuple[str, str, str]:
        opt = "-O0" if self.unoptimised else ""
        return (self.arch + opt, self.name, hashlib.sha1(self.source.encode()).hexdigest())


Command = Callable[[Job, Path], list[str]]


class CompileAhead:
    """Jobs compiled once each, by whoever claims them first: the background thread (niced)
    or a test (:meth:`compile`). Results are (returncode, stderr)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str, str], Future] = {}
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        self._env: dict[str, str] | None = None

    def _claim(self, job: Job) -> tuple[Future, bool]:
        """The job's future, and whether the caller claimed it (and must run it)."""
        with self._lock:
            fut = self._jobs.get(job.key())
            if fut is not None:
                return fut, False
            fut = Future()
            self._jobs[job.key()] = fut
            return fut, True

    def _run(self, job: Job, command: Command, workdir: Path, niced: bool) -> tuple[int, str]:
        cmd = command(job, workdir)
        nice = shutil.which("nice") if niced else None
        if nice:
            cmd = [nice, "-n", "19", *cmd]
        # The background thread passes the environment copied when it started: without one,
        # the child (vfork) reads the process's environ array while a test in the main thread
        # may be setting a variable (monkeypatch.setenv reallocates it): CI saw execve fail
        # with EFAULT ("Bad address: '/usr/bin/nice'") once, on 2026-11-30
        env = self._env if niced else None
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        if niced:
            self._proc = proc
        _, err = proc.communicate()
        return proc.returncode, err

    def compile(self, job: Job, command: Command, workdir: Path) -> tuple[int, str]:
        """The job's (returncode, stderr): from the background thread if it has it or is on
        it, else compiled here at the test's own priority."""
        fut, mine = self._claim(job)
        if mine:
            try:
                fut.set_result(self._run(job, command, workdir, niced=False))
            except BaseException as e:  # the test reports it; a waiter sees the same
                fut.set_exception(e)
        return fut.result()

    def start(self, jobs: Iterable[Callable[[], list[Job]]], command: Command,
              after: Callable[[], object] | None = None) -> None:
        """Compile, in a background thread, the jobs each builder gives, in order. A builder
        that fails is skipped: its test builds (and reports) the same thing itself. ``after``,
        where given, is waited for first (other work ahead that earlier tests need)."""
        if self._thread is not None:
            return
        self._dir = tempfile.TemporaryDirectory(prefix="nvcc-ahead-")
        workdir = Path(self._dir.name)
        self._env = dict(os.environ)  # here, in the main thread (see _run)

        def work() -> None:
            if after is not None:
                after()
            for build in jobs:
                try:
                    batch = build()
                except Exception:  # noqa: BLE001 -- the test itself will fail the same way
                    continue
                for job in batch:
                    if self._stop.is_set():
                        return
                    fut, mine = self._claim(job)
                    if not mine:
                        continue
                    try:
                        fut.set_result(self._run(job, command, workdir, niced=True))
                    except BaseException as e:  # noqa: BLE001 -- handed to the test
                        fut.set_exception(e)

        self._thread = threading.Thread(target=work, name="compile-ahead", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the background thread (its nvcc killed) and remove its folder."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._dir is not None:
            self._dir.cleanup()


AHEAD = CompileAhead()
