"""Where one batch command's time goes, step by step, in the command's own process.

Runs ``dask-compact ARGS`` (the script's entry, in this process, cold as a user's command is)
with the job's steps wrapped by timers, and prints on stderr, per 50 ms since the process
started, how many calls of each step were running, then each step's calls, total and longest
seconds. The wrapped modules are imported before the command begins, where the command
imports some of them later: its start-up is not quite a user's, the job's phases are. A
diagnostic of the command's phases (what overlaps what, where threads wait), not a peer
comparison: ``batch_io.py`` is the benchmark.

    python benchmarks/batch_trace.py IN.zarr OUT.zarr --where "x < 0.5" [more dask-compact flags]

Steps: ``read`` chunk tasks; ``cpudec`` chunks decoded by the CPUs (the early read's too);
``h2d`` / ``d2h`` copies through a device's staging ring; ``DEC`` / ``ENC`` nvCOMP decode and
encode batches; ``compact`` the compaction; ``write`` output chunk tasks; ``encwait`` writers
waiting for their frame from the device's encoder (and its copy back).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from step_recorder import Recorder  # noqa: E402

STEPS = ["read", "cpudec", "h2d", "DEC", "compact", "write", "encwait", "ENC", "d2h"]
BIN_S = 0.05


def report(calls: list[tuple[str, float, float, float]], age_at: float, pc_at: float
           ) -> list[str]:
    """The table of running calls per bin and the per-step totals (times as process ages)."""
    if not calls:
        return ["no step ran"]
    s0 = min(t for _, t, _, _ in calls)
    e1 = max(t for _, _, t, _ in calls)
    lines = ["t(age) " + " ".join(f"{s:>7s}" for s in STEPS)]
    for b in range(int((e1 - s0) / BIN_S) + 1):
        lo, hi = s0 + b * BIN_S, s0 + (b + 1) * BIN_S
        row = [sum(max(0.0, min(t1, hi) - max(t0, lo)) for k, t0, t1, _ in calls if k == s)
               / BIN_S for s in STEPS]
        lines.append(f"{age_at + lo - pc_at:6.2f} " + " ".join(f"{x:7.1f}" for x in row))
    for s in STEPS:
        spans = [t1 - t0 for k, t0, t1, _ in calls if k == s]
        if spans:
            lines.append(f"{s:8s} n={len(spans):3d} sum={sum(spans):6.2f} s "
                         f"longest={max(spans):.3f} s")
    return lines


def main() -> None:
    from dask_compact.batch.job import process_age

    age_at, pc_at = process_age(), time.perf_counter()
    from dask_compact import cli
    from dask_compact.batch import gpu_zstd, nvcomp_capi, reader, staging, tasks

    rec = Recorder()
    rec.wrap(tasks, "read_compact", "read")
    rec.wrap(tasks, "write_chunk", "write")
    rec.wrap(tasks, "_compact", "compact")
    rec.wrap(gpu_zstd, "encode", "encwait")
    rec.wrap(nvcomp_capi, "encode", "ENC")
    rec.wrap(nvcomp_capi, "decode_into", "DEC")
    rec.wrap(staging.StagingRing, "to_host", "d2h")
    rec.wrap(staging.StagingRing, "to_device", "h2d")
    rec.wrap(reader.ZarrChunkFiles, "read", "cpudec")
    end_process = cli._end_process

    def end(code: Any) -> None:
        returned = process_age()
        with rec.lock:
            calls = list(rec.calls)
        print("\n".join(report(calls, age_at, pc_at)), file=sys.stderr)
        print(f"command returned at age {returned:.3f} s", file=sys.stderr)
        end_process(code)

    cli._end_process = end  # the table once the command is done, before the process ends
    cli.script()


if __name__ == "__main__":
    main()
