"""What a batch command starts in the background before its imports, and starting it earlier
under dask's CLI.

Three things overlap the command's single-threaded start (imports, the input's opening, the
output group's creation): one shared scan of the installed entry points
(:mod:`.entry_points`), the early read of the input's first chunks (:mod:`.early_read`) and
the GPU contexts and kernels (:mod:`.warmup`). :class:`HeadStart` starts them from the
command's parameters and closes them when the command ends.

``dask compact`` runs through dask's CLI, which imports every installed ``dask_cli`` plugin
before it runs any command: distributed's (0.23 s on the CI machine) and dask-cuda's. The
``dask-compact`` script starts the head start as its arguments are parsed; through dask's CLI
that moment comes only after those imports. So when dask's CLI imports this package's plugin
for a ``dask compact`` command line (:func:`start_for_dask_cli`, called as the command's
module is imported), the command's own parser parses the arguments then (parsing only: a
command line it refuses is left to the command to report), the head start begins, and the
plugins imported after ours overlap it; the command adopts it if its parameters are the same
(:func:`adopt_or_start`). Plugins imported before ours are not helped: dask imports them in
the order ``importlib.metadata`` lists them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

import click

# Options after which click prints something and exits without running the job.
_NO_JOB = frozenset({"--help", "-h", "--version"})


class HeadStart:
    """The shared entry-point scan, the early read (``early``) and the GPU warm-up
    (``warmup``) that the parameters ``params`` of a command call for, started at once."""

    def __init__(self, params: dict[str, Any], budget: int | None) -> None:
        self.params = params
        self.budget = budget
        self._stack = contextlib.ExitStack()
        self.early: Any = None
        self.warmup: Any = None
        try:
            self._start(params, budget)
        except BaseException:
            self._stack.close()  # nothing half-started is left behind (the scan restored)
            raise

    def _start(self, params: dict[str, Any], budget: int | None) -> None:
        from .entry_points import shared_scan

        # zarr and numcodecs each scan every installed package's entry points as they are
        # imported: once is enough (see .entry_points).
        self._stack.enter_context(shared_scan())
        if reads_early(params):
            from . import early_read

            self.early = early_read.begin(params["input_path"], params["mode"], budget,
                                          params["read_ahead_threads"])
            self._stack.callback(early_read.end)
        if in_process(params) and params["device"] in ("auto", "gpu"):
            from .warmup import GpuWarmup

            # nvCOMP's codec (auto or gpu) copies through the staging rings on one GPU too
            self.warmup = GpuWarmup(rings=params["decode"] != "cpu" or params["encode"] != "cpu")
            self._stack.callback(self.warmup.close, timeout=10.0)
            if self.early is not None:
                from .plan import Layout

                reader = self.early.reader  # the job's layout, as the early read plans it
                layout = Layout.make(reader.shape, reader.dtype.itemsize, reader.chunk_rows, None)
                self.warmup.prepare(params["where"], reader.dtype, params["mode"],
                                    chunks=layout.nchunks)

    def close(self) -> None:
        """End what was started (the warm-up's thread joined within 10 s)."""
        self._stack.close()


def in_process(params: dict[str, Any]) -> bool:
    """Whether the job runs on the threaded scheduler in the command's process."""
    return (params["address"] is None and params["scheduler_file"] is None
            and params["local_cluster"] in ("auto", "threads"))


def reads_early(params: dict[str, Any]) -> bool:
    """Whether the command reads its first chunks early: in this process, reading the
    chunks the early read plans for. Also where nvCOMP decodes the others: the cores are
    idle while CUDA starts, and a task copies a chunk read early to its device."""
    return bool(params["read_ahead"] and in_process(params) and not params["resume"]
                and params["chunks"] is None and params["field_list"] is None)


_pending: HeadStart | None = None


def adopt_or_start(params: dict[str, Any], budget: int | None) -> HeadStart:
    """The head start begun under dask's CLI if it was begun for these very parameters, else
    a new one (the other is closed first)."""
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        if pending.params == params and pending.budget == budget:
            return pending
        pending.close()
    return HeadStart(params, budget)


def start_for_dask_cli(command: click.Command, parse_budget: Callable[[str | None], int | None],
                       argv: list[str] | None = None) -> HeadStart | None:
    """Begin the head start of ``dask compact ARGS`` if ``argv`` (default ``sys.argv``) is such
    a command line and dask's CLI is what is loading ``command`` (its plugins are being
    imported); the head start begun, or None. Never raises: a command line it cannot use is
    left to the command, which reports it."""
    global _pending
    argv = getattr(sys, "argv", []) if argv is None else argv  # an embedding may set none
    if (len(argv) < 3 or argv[1] != command.name or "dask.cli" not in sys.modules
            or not _is_dask_cli(argv[0]) or _NO_JOB.intersection(argv[2:])):
        return None
    try:
        params = dict(command.make_context(command.name or "", list(argv[2:])).params)
        budget = parse_budget(params["memory_budget"])
        pending = HeadStart(params, budget)
    except Exception:  # noqa: BLE001 -- the command parses again and reports what is wrong
        return None
    if _pending is not None:
        _pending.close()
    _pending = pending
    return pending


def _is_dask_cli(program: str) -> bool:
    """``dask`` (the console script, ``dask.exe`` on Windows) or ``python -m dask``."""
    name = os.path.basename(program).lower()
    return name in ("dask", "dask.exe", "dask-script.py") or program.endswith(
        os.path.join("dask", "__main__.py"))
