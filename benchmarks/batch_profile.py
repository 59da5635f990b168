"""Where a batch job's time goes, in one process: cold and warm runs of the same job, each
task's interval and its thread and CPU time per phase, and the pool's busy threads over time.

The measurements behind the batch job's design notes (docs/design.md: the warm-up, the
registered pinned buffers, the idle threads' encode of the last chunks) come from this script
on the GPU host. It is a diagnostic, not a peer comparison: `batch_io.py` is the benchmark.

    python benchmarks/batch_profile.py --log2n 31 --chunk-log2 25
        [--mode default|cpu|gpu-decode|gpu-codec] [--threads N] [--output-chunks N] [--runs 2]

(``gpu-decode``: nvCOMP decodes the input; ``gpu-codec``: and encodes the output.)

The first run in the process is the cold one (what every command pays: CUDA's start, kernel
loading, pinned buffers); the next ones are warm. For each run: wall time, process CPU time,
per phase (decode, compaction, copy back, zstd encode, whole read and write tasks) the summed
wall and CPU seconds of the pool's threads and the longest single call, and the pool's busy
threads per 50 ms (reads and writes / reads only), where a tail of idle threads shows.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from batch_io import make_input  # noqa: E402 -- the same generated input as the benchmark
from step_recorder import Recorder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--log2n", type=int, default=26)
    ap.add_argument("--chunk-log2", type=int, default=22)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--mode", choices=["default", "cpu", "gpu-decode", "gpu-codec"],
                    default="default")
    ap.add_argument("--threads", type=int, help="threads of the job's pool (default: cores)")
    ap.add_argument("--output-chunks", type=int)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--work", help="directory for the data (default: a temporary one)")
    args = ap.parse_args()

    import numcodecs

    from dask_compact.batch import executor, job, reader, tasks
    from dask_compact.cli import main as cli

    work = Path(args.work or tempfile.mkdtemp(prefix="batch_profile_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "in.zarr"
    if not src.exists():
        make_input(src, 1 << args.log2n, 1 << args.chunk_log2, "zstd")
    rec = Recorder()
    rec.wrap(reader.ZarrChunkFiles, "read", "decode")
    rec.wrap(tasks, "_compact", "compaction")
    rec.wrap(tasks, "_to_host", "copy back to host")
    rec.wrap(tasks, "zstd_encode", "zstd encode")
    rec.wrap(tasks, "read_compact", "read task")
    rec.wrap(tasks, "thread_pinned", "thread's pinned buffer")
    rec.wrap(tasks, "pin_in_place", "pin an early chunk")
    rec.wrap(tasks.early_read, "take", "take an early chunk")
    rec.wrap(tasks, "write_chunk", "write task")
    from dask_compact.batch import gpu_zstd, nvcomp_capi, staging

    rec.wrap(reader.ZarrChunkFiles, "read_device", "read on the device (nvCOMP)")
    rec.wrap(gpu_zstd, "decode_host", "frames to the device, decoded")
    rec.wrap(nvcomp_capi, "decode_into", "one nvCOMP decode batch")
    rec.wrap(nvcomp_capi, "encode", "one nvCOMP encode batch")
    rec.wrap(staging.StagingRing, "to_device", "ring: copy to the device")
    rec.wrap(staging.StagingRing, "to_host", "ring: copy to the host")
    rec.wrap(numcodecs.Zstd, "encode", "numcodecs encode")
    if args.threads:
        job.executor_for = lambda runner, _job: executor.ThreadExecutor(args.threads)
    flags = {"cpu": ["--local", "threads", "--device", "cpu"],
             "gpu-decode": ["--decode", "gpu"],
             "gpu-codec": ["--decode", "gpu", "--encode", "gpu"]}.get(args.mode, [])
    if args.output_chunks:
        flags += ["--output-chunks", str(args.output_chunks)]
    for k in range(args.runs):
        out = work / "out.zarr"
        shutil.rmtree(out, ignore_errors=True)
        rec.calls.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        try:
            cli([str(src), str(out), "--where", f"x < {args.p}", "--no-progress", *flags],
                standalone_mode=False)
        except SystemExit:
            pass
        wall = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        print(f"## run {k} ({'cold' if k == 0 else 'warm'}), mode {args.mode}: wall {wall:.2f} s,"
              f" process CPU {cpu:.1f} s (system {r1.ru_stime - r0.ru_stime:.1f} s)")
        print("\n".join(rec.report()), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
