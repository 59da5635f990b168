"""tests/compile_ahead.py, which runs the kernel compile tests' nvcc jobs in the background: each
job runs once whoever asks first, a test gets exactly its job's result, and stop() leaves
nothing behind. A small Python program stands in for nvcc. And tests/numba_ahead.py, which
builds the predicate tests' numba loops into the session's cache before those tests run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from compile_ahead import CompileAhead, Job

# "nvcc": appends its job's name to a log (how many times each job ran), sleeps a little,
# reports on stderr, and fails for a source that says so
_FAKE = (
    "import sys, time, pathlib; log, name, src = sys.argv[1:4]; "
    "open(log, 'a').write(name + '\\n'); time.sleep(0.2); "
    "sys.stderr.write('report of ' + name); "
    "sys.exit(3 if 'fail' in pathlib.Path(src).read_text() else 0)"
)


def _command_for(log: Path):
    def command(job: Job, workdir: Path) -> list[str]:
        src = workdir / f"{job.name}_{job.arch}.cu"
        src.write_text(job.source)
        return [sys.executable, "-c", _FAKE, str(log), job.name, str(src)]

    return command


def test_each_job_runs_once_and_a_test_gets_its_own_result(tmp_path: Path) -> None:
    log = tmp_path / "runs.log"
    command = _command_for(log)
    jobs = [Job(f"source {k}", "sm_90", f"unit{k}") for k in range(4)]
    failing = Job("fail here", "sm_80", "bad")
    ahead = CompileAhead()
    ahead.start([lambda: jobs[:2], lambda: 1 / 0, lambda: [*jobs[2:], failing]], command)
    try:
        time.sleep(0.3)  # the background thread is on its first job or later
        results = {job.name: ahead.compile(job, command, tmp_path) for job in [*jobs, failing]}
        # the same name with another source is another job: compiled here, not taken
        other = ahead.compile(Job("source 9", "sm_90", "unit0"), command, tmp_path)
    finally:
        ahead.stop()
    for job in jobs:
        assert results[job.name] == (0, f"report of {job.name}")
    assert results["bad"] == (3, "report of bad")
    assert other == (0, "report of unit0")
    runs = log.read_text().split()
    assert sorted(runs) == sorted(["unit0", "unit1", "unit2", "unit3", "bad", "unit0"])
    assert ahead._dir is not None and not Path(ahead._dir.name).exists()


def test_stop_ends_the_background_run_at_once(tmp_path: Path) -> None:
    ahead = CompileAhead()
    slow = [Job(f"s{k}", "sm_90", f"slow{k}") for k in range(3)]

    def command(job: Job, workdir: Path) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(30)"]

    ahead.start([lambda: slow], command)
    time.sleep(0.5)
    t = time.monotonic()
    ahead.stop()
    assert time.monotonic() - t < 10
    assert ahead._thread is not None and not ahead._thread.is_alive()


def test_the_nvcc_jobs_wait_for_what_comes_first(tmp_path: Path) -> None:
    import threading

    log = tmp_path / "runs.log"
    gate = threading.Event()
    ahead = CompileAhead()
    ahead.start([lambda: [Job("source", "sm_90", "unit")]], _command_for(log), after=gate.wait)
    try:
        time.sleep(0.5)
        assert not log.exists()  # nothing compiled while the work before it runs
        gate.set()
        assert ahead.compile(Job("source", "sm_90", "unit"), _command_for(log), tmp_path)[0] == 0
        assert log.read_text().split() == ["unit"]
    finally:
        ahead.stop()


# tests/numba_ahead.py: a test module that offers its loops; one test's builder fails, one
# loop is refused (no CPU float16 in numba), the last one is built
_LOOPS_MODULE = '''
import numpy as np
from dask_compact.predicate import as_predicate


def numba_ahead_loops(test_name, params):
    if test_name == "test_broken":
        raise RuntimeError("a builder that fails")
    return [(as_predicate("x > 1").typed(np.dtype("float16")), "values"),
            (as_predicate(params["text"]).typed(np.dtype(params["dtype"])), "indices")]
'''


def test_numba_loops_are_built_ahead_into_the_session_cache(tmp_path: Path, monkeypatch) -> None:
    """The background process builds the offered loops into the cache folder it inherits, so
    that the test's own build of the same loop loads numba's cache instead of compiling; a
    failing builder or a refused loop skips only itself."""
    import os

    import numpy as np
    from numba_ahead import NumbaAhead

    import dask_compact
    from dask_compact.codegen import numba_loop
    from dask_compact.predicate import as_predicate

    (tmp_path / "ahead_loops_module.py").write_text(_LOOPS_MODULE)
    cache = tmp_path / "cache"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    text = "(x % 7 == 3) | (x < -40)"  # a structure no other test builds
    ahead = NumbaAhead()
    ahead.start([("ahead_loops_module", "test_broken", {}),
                 ("ahead_loops_module", "test_ok", {"text": text, "dtype": "int16"})])
    try:
        assert ahead.wait(timeout=120)
    finally:
        ahead.stop()
    built = list((cache / "__pycache__").glob("*.compact_loop-*.nbi"))
    assert len(built) == 1, built  # numba's index of the one loop built
    numba_loop.clear_cache()
    loop = numba_loop.fused_loop(as_predicate(text).typed(np.dtype("int16")), "indices")
    assert loop.path is not None and Path(loop.path).parent == cache
    stats = loop.func.stats  # numba's: loaded from its cache, not compiled here
    assert sum(stats.cache_hits.values()) == 1 and not stats.cache_misses
    a = np.arange(-60, 60, dtype=np.int16)
    got = dask_compact.compact_array(a, text, output="indices")
    np.testing.assert_array_equal(got, np.flatnonzero((a % 7 == 3) | (a < -40)))
