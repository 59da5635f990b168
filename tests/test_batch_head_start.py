"""The batch command's head start (dask_compact/batch/head_start.py) under dask's CLI: begun as
dask's CLI imports the `compact` plugin for a `dask compact` command line, adopted by the
command when its parameters are the same, left alone for any other command line; and the
process's fast exit after a successful `dask compact`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import dask.cli  # noqa: F401 -- start_for_dask_cli acts only where dask's CLI is loaded
import numpy as np
import pytest
import zarr

from dask_compact import cli
from dask_compact.batch import early_read, head_start

CHUNK = 1000


@pytest.fixture
def zin(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a = np.random.default_rng(5).random(10 * CHUNK + 77).astype(np.float32)
    z = zarr.create_array(store=str(tmp_path / "in.zarr"), shape=a.shape, dtype=a.dtype,
                          chunks=(CHUNK,))
    z[:] = a
    return tmp_path / "in.zarr", a


@pytest.fixture(autouse=True)
def nothing_pending():
    yield
    pending, head_start._pending = head_start._pending, None
    if pending is not None:
        pending.close()
    early_read.end()


def argv(path: Path, *extra: str) -> list[str]:
    return ["/usr/bin/dask", "compact", str(path), str(path.parent / "o.zarr"),
            "--where", "x < 0.5", "--device", "cpu", *extra]


def test_begun_for_a_dask_compact_command_line_and_adopted_by_the_same_parameters(zin):
    path, _ = zin
    head = head_start.start_for_dask_cli(cli.main, cli._parse_budget, argv(path))
    assert head is not None and head_start._pending is head
    assert head.early is not None and early_read.active() is head.early
    assert head.warmup is None  # --device cpu: no GPU warm-up
    head.early.join(timeout=60)
    # The command's own parse gives the same parameters: it adopts what was begun.
    ctx = cli.main.make_context("compact", argv(path)[2:])
    assert head_start.adopt_or_start(dict(ctx.params), None) is head
    assert head_start._pending is None
    head.close()
    assert early_read.active() is None


def test_other_parameters_close_what_was_begun_and_start_afresh(zin):
    path, _ = zin
    head = head_start.start_for_dask_cli(cli.main, cli._parse_budget, argv(path))
    first = head.early
    ctx = cli.main.make_context("compact", argv(path, "--read-ahead-threads", "2")[2:])
    other = head_start.adopt_or_start(dict(ctx.params), None)
    assert other is not head and other.early is not first
    assert early_read.active() is other.early
    first.join(timeout=60)
    assert first._stopped and not first._chunks  # closed: nothing kept
    other.close()
    # A different budget is a different head start too.
    head = head_start.start_for_dask_cli(cli.main, cli._parse_budget,
                                         argv(path, "--memory-budget", "1MiB"))
    assert head.budget == 2**20
    ctx = cli.main.make_context("compact", argv(path)[2:])
    fresh = head_start.adopt_or_start(dict(ctx.params), None)
    assert fresh is not head and fresh.budget is None
    fresh.close()


@pytest.mark.parametrize("line", [
    ["python", "compact"],  # not dask's CLI
    ["/usr/bin/dask", "scheduler"],
    ["/usr/bin/dask", "compact"],
    ["/usr/bin/dask", "compact", "IN", "OUT"],  # no --where: the command reports it
    ["/usr/bin/dask", "compact", "IN", "OUT", "-w", "x < 1", "--help"],
    ["/usr/bin/dask", "compact", "IN", "OUT", "-w", "x < 1", "--version"],
    ["/usr/bin/dask", "compact", "IN", "OUT", "-w", "x < 1", "--memory-budget", "lots"],
    ["/usr/bin/dask", "compact", "IN", "OUT", "-w", "x < 1", "--bogus"],
])
def test_nothing_begun_for_other_command_lines(zin, line):
    path, _ = zin
    line = [str(path) if t == "IN" else str(path.parent / "o") if t == "OUT" else t
            for t in line]
    assert head_start.start_for_dask_cli(cli.main, cli._parse_budget, line) is None
    assert head_start._pending is None and early_read.active() is None


def test_a_failed_start_leaves_nothing_started(zin, monkeypatch):
    """The entry-point scan it entered is undone, and the command line is left to the
    command."""
    import importlib.metadata as metadata

    path, _ = zin
    original = metadata.entry_points

    def fail(*args):
        raise OSError("no threads")

    monkeypatch.setattr(early_read, "begin", fail)
    assert head_start.start_for_dask_cli(cli.main, cli._parse_budget, argv(path)) is None
    assert metadata.entry_points is original and head_start._pending is None


def test_python_dash_m_dask_is_dask_cli():
    assert head_start._is_dask_cli("/env/lib/python3.11/site-packages/dask/__main__.py")
    assert head_start._is_dask_cli("/env/bin/dask")
    assert not head_start._is_dask_cli("/env/bin/dask-compact")
    assert not head_start._is_dask_cli("/env/bin/python")


# The plugin's import under dask's CLI, as `dask compact ...` does it, in a process of its own:
# every early read started is reported on stderr, and so is an ordinary (slow) exit.
DRIVER = textwrap.dedent("""
    import atexit, sys
    sys.argv = ["dask", *sys.argv[1:]]
    import dask.cli
    from dask_compact.batch import early_read
    original = early_read.EarlyRead.__init__
    def init(self, *args, **kw):
        print("early read started", file=sys.stderr, flush=True)
        original(self, *args, **kw)
    early_read.EarlyRead.__init__ = init
    atexit.register(lambda: print("ordinary exit", file=sys.stderr, flush=True))
    dask.cli.run_cli()
""")


def dask_compact(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER, "compact", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_dask_compact_reads_early_from_the_plugin_import_and_exits_at_once(zin, tmp_path):
    path, a = zin
    out = tmp_path / "out.zarr"
    proc = dask_compact(path, out, "--where", "x >= 0.5", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("early read started") == 1, proc.stderr  # begun once, adopted
    assert "ordinary exit" not in proc.stderr  # the fast exit after success
    summary = json.loads(proc.stdout)  # flushed before the exit
    assert summary["read_ahead"]["chunks"] >= 1
    assert summary["chunks_read"] == 11
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], a[a >= 0.5])
    # A failing command exits the ordinary way, with its code and message.
    proc = dask_compact(path, out, "--where", "x >= 0.5", "--device", "cpu")
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr and "ordinary exit" in proc.stderr
    # Arguments the command parses differently from the head start: started again, exact.
    proc = dask_compact(path, out, "--where", "x < 0.25", "--device", "cpu", "--overwrite",
                        "--read-ahead-threads", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], a[a < 0.25])
