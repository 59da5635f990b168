"""Helpers shared by the batch CLI tests: run the command in-process, list what a job leaves
beside OUTPUT, and start / wait for a subprocess paused by tests/cli_driver.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from click.testing import CliRunner

from dask_compact import cli
from dask_compact.batch import output

DRIVER = Path(__file__).with_name("cli_driver.py")


def run(*args, code: int = 0):
    """``dask compact ARGS`` through click's runner; asserts the exit code and no traceback."""
    result = CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def litter(directory: Path) -> list[str]:
    """Temporary groups and lock files beside an OUTPUT in ``directory``."""
    return sorted(p.name for p in directory.iterdir()
                  if "dask-compact-tmp" in p.name or p.name.endswith(output.LOCK_SUFFIX))


def start(hook: str, ready: Path, *args, env: dict | None = None) -> subprocess.Popen:
    """The command in a subprocess (its own session) with a cli_driver.py fault hook."""
    return subprocess.Popen(
        [sys.executable, str(DRIVER), hook, str(ready), "--", *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def wait_for(ready: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the hook creates ``ready``; fails if the job ends first or never gets there."""
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"job ended early: {proc.stdout.read()} {proc.stderr.read()}")
        assert time.monotonic() < deadline, "job never reached the point under test"
        time.sleep(0.05)


def kill_halfway(tmp_path: Path, src, out: Path, *args, writes: int) -> None:
    """``dask compact SRC OUT ARGS`` SIGKILLed once its first ``writes`` output chunks are
    written and in its resume manifest: a temporary group for ``--resume`` is left, OUTPUT is
    not."""
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    proc = start("pause-after-writes", ready, src, out, *args,
                 env={"DRIVER_WRITES": str(writes)})
    wait_for(ready, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)  # closes its pipes
    assert not out.exists()
