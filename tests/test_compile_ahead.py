"""tests/compile_ahead.py, which runs the kernel compile tests' nvcc jobs in the background: each
job runs once whoever asks first, a test gets exactly its job's result, and stop() leaves
nothing behind. A small Python program stands in for nvcc."""

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
