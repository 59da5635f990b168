"""What a batch command starts in the background before its imports.

Three things overlap the command's single-threaded start (imports, the input's opening, the
output group's creation): one shared scan of the installed entry points
(:mod:`.entry_points`), the early read of the input's first chunks (:mod:`.early_read`) and
the GPU contexts and kernels (:mod:`.warmup`). :class:`HeadStart` starts them from the
command's parameters, as soon as they are parsed, and closes them when the command ends.
Under dask's CLI the command runs as dask imports its plugin (:mod:`dask_compact.dask_plugin`),
so the head start begins there too.
"""

from __future__ import annotations

import contextlib
from typing import Any


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
