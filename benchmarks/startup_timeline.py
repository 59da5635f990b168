"""Timeline of one batch command in this process: when each step of the main thread, the GPU
warm-up and the first chunk tasks began and ended, in seconds since the process was created.

    python -P benchmarks/startup_timeline.py INPUT OUTPUT --where EXPR [dask compact options]

A diagnostic (the measurements behind docs/design.md's start-up notes), not a benchmark. The
process's start comes from the batch job's ``process_age`` (the kernel's clocks, 10 ms); the
H100 runs quoted in design.md used psutil's ``create_time``, whose boot time is cut to whole
seconds, and were corrected against a wall clock taken when the command started.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from dask_compact.batch.job import process_age

T0 = time.time() - process_age()
EVENTS: list[tuple[float, str, str]] = []


def mark(what: str) -> None:
    EVENTS.append((time.time() - T0, threading.current_thread().name, what))


mark("interpreter and the batch job's modules")
import dask_compact.cli as cli  # noqa: E402

mark("dask_compact.cli imported")
import dask_compact.batch.inputs as inputs  # noqa: E402
import dask_compact.batch.job as job  # noqa: E402
import dask_compact.batch.output as output  # noqa: E402
import dask_compact.batch.runner as runner  # noqa: E402
import dask_compact.batch.staging as staging  # noqa: E402
import dask_compact.batch.tasks as tasks  # noqa: E402
import dask_compact.batch.warmup as warmup  # noqa: E402


def wrap(owner: Any, name: str, label: str | None = None, first: int | None = None) -> None:
    """Mark the start and end of ``owner.name`` (its first ``first`` calls only, if given)."""
    real = getattr(owner, name)
    label = label or name
    calls = [0]

    def timed(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        show = first is None or calls[0] <= first
        if show:
            mark(label + " >")
        try:
            return real(*args, **kwargs)
        finally:
            if show:
                mark(label + " <")

    setattr(owner, name, timed)


# The command imports these inside its function, at call time: the wrapped ones are what it gets
wrap(inputs, "open_input")
wrap(output, "check_overlap")
wrap(runner, "start")
for n in ("run_job", "create_group", "writes_chunk_files", "run_stream", "cut", "peak_memory",
          "executor_for"):
    wrap(job, n)
wrap(output.Target, "commit")
wrap(warmup.GpuWarmup, "_run", "warm-up")
wrap(warmup, "_prepare")
wrap(staging, "StagingRing", "staging ring")
for n in ("read_compact", "write_chunk", "thread_pinned", "_thread_stream", "_compact",
          "_to_host", "_read_into"):
    wrap(tasks, n, first=2)

real_exit = os._exit


def exit_with_timeline(code: int) -> None:
    mark("os._exit")
    sys.stdout.flush()
    print("TIMELINE", file=sys.stderr)
    for t, thread, what in EVENTS:
        print(f"  {t:7.3f} {thread[:24]:24s} {what}", file=sys.stderr)
    print(f"T0 {T0:.3f}", file=sys.stderr)
    sys.stderr.flush()
    real_exit(code)


os._exit = exit_with_timeline  # type: ignore[assignment]  # cli.script ends with os._exit
cli.script()
