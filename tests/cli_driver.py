"""Run ``dask compact`` in a subprocess with a fault hook, for the signal and crash tests.

``python tests/cli_driver.py HOOK READY_FILE -- CLI ARGS...``. HOOK:

* ``slow-write``: every output chunk write sleeps 0.5 s on the worker that runs it, and READY
  is created once the writes have started: a signal then lands mid-write.
* ``pause-swap``: no renameat2 (the two-rename fallback), and READY is created between moving
  the old OUTPUT aside and moving the new one in, where the job then sleeps: SIGKILL there.
* ``slow-removal``: READY as the writes start; the removal of the temporary group creates
  READY.removing, then sleeps 1 s before it removes: a signal repeated mid-removal.
* ``hang-start``: a local cluster's start that never ends, after starting a child process
  (READY holds its pid), under a 2 s limit.
* ``pause-write``: READY is created as the writes start, then the job sleeps (SIGKILL there
  leaves a temporary group behind).
* ``pause-remove-old``: READY as the old output that ``--overwrite`` replaced starts being
  removed, where the job then sleeps: a signal there.
* ``pause-after-writes``: READY once the first ``$DRIVER_WRITES`` output chunks are written and
  in the resume manifest, then the job sleeps (SIGKILL there: a job to ``--resume``).
* ``pause-after-cut``: the manifest saved at every write (so it lists them all), and READY once
  the output arrays are cut to the selection's length, before the manifest's removal and the
  commit, where the job then sleeps (SIGKILL there: a finished job to ``--resume``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    # As in a terminal's foreground job, SIGINT raises KeyboardInterrupt here and in the
    # processes started from here. A shell starts a background job (a test run with `&`) with
    # SIGINT ignored, which this process and its workers would inherit: the signal tests
    # would then meet a job that ignores ^C (rc 0 instead of 130, seen in a CI run).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hook, ready = sys.argv[1], Path(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    from dask_compact import cli
    from dask_compact.batch import output, stream, tasks

    real_submit = stream._Stream.submit_write

    def slow_writes() -> None:
        """Every output chunk write sleeps 0.5 s; READY as the writes start."""
        real_write = tasks.write_chunk

        def slow(*args):  # a closure: distributed workers get it by value
            time.sleep(0.5)
            return real_write(*args)

        tasks.write_chunk = slow

        def submit_write(self, j, parts):
            ready.touch()
            return real_submit(self, j, parts)

        stream._Stream.submit_write = submit_write

    if hook == "slow-write":
        slow_writes()
    elif hook == "slow-removal":
        # READY as the writes start; the removal of the temporary group then first creates
        # READY.removing and sleeps 1 s: a signal repeated there (a batch system's second
        # SIGTERM) lands mid-removal
        import shutil

        real_rmtree = shutil.rmtree

        def slow_rmtree(path, *args, **kwargs):
            if output.TMP_MARK in str(path):
                ready.with_suffix(".removing").touch()
                time.sleep(1.0)
            return real_rmtree(path, *args, **kwargs)

        shutil.rmtree = slow_rmtree
        slow_writes()  # the job mid-write at the first signal
    elif hook == "hang-start":
        # a local cluster whose start never ends (as distributed's, where a nanny cannot start
        # its process): it starts a child process first, and the limit is 2 s; READY is the
        # child's pid
        import subprocess

        import distributed

        from dask_compact.batch import runner

        def hanging_cluster(*args, **kwargs):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            ready.write_text(str(child.pid))
            time.sleep(600)

        distributed.LocalCluster = hanging_cluster
        runner.LOCAL_START_LIMIT_S = 2.0
    elif hook == "pause-write":

        def submit_write(self, j, parts):
            ready.touch()
            time.sleep(120)
            return real_submit(self, j, parts)

        stream._Stream.submit_write = submit_write
    elif hook == "pause-after-writes":
        # READY once the first DRIVER_WRITES output chunks are written and the manifest says so;
        # then the job sleeps (SIGKILL there: an interrupted job to resume). The first ones: a
        # resume continues after the written prefix (Manifest.resume_point), and writers finish
        # out of order, so as many chunks written anywhere could leave a resume point early
        # (a CI run resumed 15 of 21 input chunks where the test expects at most 70%).
        real_done = stream._Stream.write_done
        wanted = int(os.environ["DRIVER_WRITES"])

        def write_done(self, j, seconds, chunks):
            real_done(self, j, seconds, chunks)
            written = self.job.manifest.written
            if all(k in written for k in range(wanted)):
                self.save_manifest(force=True)
                ready.touch()
                time.sleep(120)

        stream._Stream.write_done = write_done
    elif hook == "pause-after-cut":
        from dask_compact.batch import job

        stream.MANIFEST_EVERY_S = 0.0  # every write in the manifest (see _Stream.save_manifest)
        real_cut = job.cut

        def cut(*args):
            real_cut(*args)
            ready.touch()
            time.sleep(120)

        job.cut = cut
    elif hook == "pause-swap":
        output.rename2 = lambda src, dst, flags: False
        real_rename = os.rename
        calls = []

        def rename(src, dst):
            real_rename(src, dst)
            calls.append(dst)
            if str(dst).endswith(output.OLD_SUFFIX):
                ready.touch()
                time.sleep(120)

        output.os.rename = rename
    elif hook == "pause-remove-old":
        # READY as the old output of an --overwrite starts being removed (the new one is in
        # place), then the job sleeps there: a signal lands in that removal.
        real_remove = output._remove

        def remove(path):
            ready.touch()
            time.sleep(120)
            return real_remove(path)

        output._remove = remove
    else:
        raise SystemExit(f"unknown hook {hook}")
    cli.main(argv, prog_name="dask compact")


if __name__ == "__main__":
    main()
