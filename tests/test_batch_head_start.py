"""`dask compact` under dask's CLI: the plugin (dask_compact/dask_plugin.py) runs the command
as dask's CLI imports it, for a `dask compact` command line only, before the plugins listed
after it; the command's head start (dask_compact/batch/head_start.py) begins once; and the
process's fast exit after a successful `dask compact`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

from dask_compact import cli, dask_plugin
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
def nothing_left():
    yield
    early_read.end()


@pytest.mark.parametrize(("line", "runs"), [
    (["/usr/bin/dask", "compact", "IN", "OUT", "-w", "x < 1"], True),
    (["/usr/bin/dask", "compact"], True),  # the command reports what is missing
    (["/env/lib/python3.11/site-packages/dask/__main__.py", "compact", "--help"], True),
    (["python", "compact"], False),  # not dask's CLI
    (["/env/bin/dask-compact", "compact"], False),
    (["/usr/bin/dask", "scheduler"], False),
    (["/usr/bin/dask", "--help"], False),
    (["/usr/bin/dask"], False),
])
def test_which_command_lines_the_plugin_runs(line, runs):
    assert dask_plugin.runs_compact(line) is runs


def test_the_plugin_imported_outside_dask_cli_runs_nothing():
    """A program importing the plugin with a `dask compact` argv (dask.cli loaded) gets the
    command, not a run."""
    code = ("import sys; sys.argv = ['dask', 'compact']; import dask.cli; "
            "import dask_compact.dask_plugin as p; print(p.command.name)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout == "compact\n", proc.stderr


def test_a_failed_start_leaves_nothing_started(zin, monkeypatch):
    """The entry-point scan it entered is undone, and the command line is left to the
    command."""
    import importlib.metadata as metadata

    path, _ = zin
    original = metadata.entry_points

    def fail(*args):
        raise OSError("no threads")

    monkeypatch.setattr(early_read, "begin", fail)
    params = dict(cli.main.make_context("compact", [str(path), str(path.parent / "o.zarr"),
                                                    "--where", "x < 0.5"]).params)
    with pytest.raises(OSError, match="no threads"):
        head_start.HeadStart(params, None)
    assert metadata.entry_points is original and early_read.active() is None


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


# dask's CLI with two plugins: this package's, then a late one that reports its import.
LATE_DRIVER = textwrap.dedent("""
    import importlib.metadata as md, sys
    sys.argv = ["dask", *sys.argv[1:]]
    import dask.cli
    ours = [ep for ep in md.entry_points(group="dask_cli") if ep.value.startswith("dask_compact")]
    late = md.EntryPoint(name="late", value="late_plugin:command", group="dask_cli")
    real = md.entry_points
    def entry_points(**kw):
        return [*ours, late] if kw.get("group") == "dask_cli" else real(**kw)
    dask.cli.importlib_metadata.entry_points = entry_points
    dask.cli.run_cli()
""")
LATE_PLUGIN = textwrap.dedent("""
    import sys, click
    print("late plugin imported", file=sys.stderr, flush=True)
    command = click.Command("late", help="A late plugin.")
""")


def test_dask_compact_runs_before_the_plugins_listed_after_it(zin, tmp_path):
    """``dask compact`` runs as dask's CLI imports its plugin: the plugins listed after it
    are not imported (0.4-0.9 s of the GPU host's start), the command is dask's own."""
    path, a = zin
    (tmp_path / "late_plugin.py").write_text(LATE_PLUGIN)

    def dask_cli(*args: object) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", LATE_DRIVER, *map(str, args)],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                  [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])})

    proc = dask_cli("--help")  # the control: dask's CLI loads the late plugin
    assert proc.returncode == 0 and "late plugin imported" in proc.stderr, proc.stderr
    assert "compact" in proc.stdout and "A late plugin." in proc.stdout
    out = tmp_path / "out.zarr"
    proc = dask_cli("compact", path, out, "--where", "x < 0.3", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "late plugin imported" not in proc.stderr
    assert json.loads(proc.stdout)["selected"] == int((a < 0.3).sum())
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], a[a < 0.3])
    # Errors and help as dask's group gives them: its program name, exit code 2.
    proc = dask_cli("compact", path, out, "--where", "x < 0.3")
    assert proc.returncode == 2 and "late plugin imported" not in proc.stderr
    assert "Usage: dask compact" in proc.stderr and "--overwrite" in proc.stderr
    proc = dask_cli("compact", "-h")
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: dask compact")
    # Any other command line goes through every plugin, as before.
    proc = dask_cli("late", "--help")
    assert proc.returncode == 0 and "late plugin imported" in proc.stderr
    # An exception click passes on (--debug shows the job's own): its traceback and exit code
    # 1, once; not taken by dask's plugin loader for a failed import (a warning, then every
    # other plugin imported and the job run a second time).
    (path / "c" / "3").write_bytes(b"not zstd at all")
    proc = dask_cli("compact", path, tmp_path / "bad.zarr", "--where", "x < 0.3", "--device",
                    "cpu", "--no-read-ahead", "--debug")
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr
    assert "input chunk 3" in proc.stderr
    assert "While registering" not in proc.stderr and "late plugin imported" not in proc.stderr
    assert not (tmp_path / "bad.zarr").exists()
