"""The ``compact`` plugin of dask's CLI: ``dask compact ...`` runs :data:`command`.

``dask.cli.run_cli`` imports every installed ``dask_cli`` plugin, in the order
``importlib.metadata`` lists the installed packages, and only then parses the command line.
distributed's four plugins import its scheduler, worker, SSH and spec modules, dask-cuda's its
CUDA worker: 0.4-0.9 s of a batch command's start on the GPU host, for commands a ``dask
compact`` command line never runs (docs/design.md, Under dask's CLI).

So when dask's CLI imports this plugin for a ``dask compact`` command line, the plugin runs
dask's own command group at once, with the commands registered so far and this one: the
command line is parsed and dispatched exactly as ``run_cli`` would (same group, same options,
same program name, same exit codes), and the plugins listed after this one are never imported.
Imported any other way (``dask --help``, ``dask scheduler``, a program importing it), it only
defines :data:`command`. This module holds nothing else: while the command runs, this
module's import is not finished, and nothing may wait on it.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

from .cli import main as command

__all__ = ["command"]


def is_dask_cli(program: str) -> bool:
    """``dask`` (the console script, ``dask.exe`` on Windows) or ``python -m dask``."""
    name = os.path.basename(program).lower()
    return name in ("dask", "dask.exe", "dask-script.py") or program.endswith(
        os.path.join("dask", "__main__.py"))


def runs_compact(argv: list[str]) -> bool:
    """Whether ``argv`` is a ``dask compact ...`` command line."""
    return len(argv) >= 2 and argv[1] == command.name and is_dask_cli(argv[0])


def _imported_by_dask_cli(frame: FrameType | None) -> bool:
    """Whether ``dask.cli``'s code is on the stack: its plugin loader imports this module."""
    while frame is not None:
        if frame.f_globals.get("__name__") == "dask.cli":
            return True
        frame = frame.f_back
    return False


if (runs_compact(getattr(sys, "argv", [])) and "dask.cli" in sys.modules  # an embedding may
        and _imported_by_dask_cli(sys._getframe())):                        # set no argv
    import dask.cli

    dask.cli.cli.add_command(command)
    # click's standalone mode: exits (SystemExit) with the command's code, which dask's
    # plugin loader does not catch; a successful command ends the process (cli._end_process).
    try:
        dask.cli.cli()
    except Exception:
        # One that click passes on (--debug, or a failure outside the job): dask's loader would
        # take it for a failed import, warn, import the other plugins and run the command
        # again. End as an uncaught exception ends Python: its traceback, exit code 1.
        import traceback

        traceback.print_exc()
        sys.exit(1)
