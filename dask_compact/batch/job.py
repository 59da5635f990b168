"""One batch job from start to commit: the output group, the streaming run, the summary.

The CLI (:mod:`dask_compact.cli`) parses arguments and maps failures to exit codes; this
module owns what happens between the lock being taken and released.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import settings
from . import early_read
from .executor import ClientExecutor, Executor, NoWorkers, ThreadExecutor
from .host_buffers import pool_for_job
from .inputs import Source, xarray_encodings
from .manifest import Manifest, made_files
from .output import Target, job_identity, marker, where_key
from .plan import Layout, row_bytes, writes_per_task
from .runner import Runner
from .shared import check_chunks_written, check_workers_read, check_workers_see
from .signals import held
from .stream import Job, charge_threads, run_stream
from .tasks import OutputArrays, peak_rss

NAMES = {"values": ("values",), "indices": ("indices",), "both": ("values", "indices")}


def describe(src: Source, where: str, mode: str, output_chunks: int | None) -> dict[str, Any]:
    """What a resumed job must share with the interrupted one (see :mod:`.manifest`)."""
    import dask_compact

    layout = layout_of(src, output_chunks)
    return {
        "input": src.reader.fingerprint,
        "shape": list(src.shape),
        "dtype": str(src.dtype),
        "rows": src.row_chunk,
        "where": where_key(where),
        "output": mode,
        "out_chunk": layout.out_chunk,
        "version": dask_compact.__version__,
    }


def layout_of(src: Source, output_chunks: int | None) -> Layout:
    if output_chunks is None and src.out_rows:
        row_elems = int(np.prod(src.shape[1:], dtype=np.int64)) if len(src.shape) > 1 else 1
        output_chunks = src.out_rows * row_elems
    return Layout.make(src.shape, src.dtype.itemsize, src.row_chunk, output_chunks)


def executor_for(runner: Runner, job: Job) -> Executor:
    """The cluster's client, or a thread per core in this process, and where nvCOMP decodes
    or encodes on this process's GPUs as many more threads as tasks should wait on it
    (:func:`.gpu_zstd.decode_threads`)."""
    if runner.client is not None:
        return ClientExecutor(runner.client, runner.no_workers_timeout)
    from dask.system import CPU_COUNT

    threads = CPU_COUNT
    if job.decode == "gpu" or job.encode == "gpu":
        import cupy

        from .gpu_zstd import decode_threads

        threads += decode_threads(cupy.cuda.runtime.getDeviceCount())
    return ThreadExecutor(threads)


def create_group(store: str, layout: Layout, src: Source, mode: str,
                 attrs: dict[str, Any]) -> None:
    """The output group with its arrays at the input's length (cut to the result at the end).

    ``values`` keeps the input array's attributes (units, a description: what the selected
    elements are), and both arrays the name of a 1-D input's dimension (the flat result of N-D
    input has none of the input's dimensions)."""
    import zarr

    group = zarr.open_group(store=store, mode="w-", attributes={"dask_compact": attrs})
    dtypes = {"values": src.dtype, "indices": np.dtype(np.int64)}
    dims = src.dims if src.dims and len(src.shape) == 1 else None
    for name in NAMES[mode]:
        group.create_array(name, shape=(layout.n,), dtype=dtypes[name],
                           chunks=(max(1, layout.out_chunk),),
                           attributes=src.attrs if name == "values" else {},
                           dimension_names=dims)


def writes_chunk_files(store: str, names: tuple[str, ...]) -> bool:
    """Whether the output's chunks can be written as files (see :class:`.tasks.OutputArrays`):
    a local group whose arrays have exactly the codecs and chunk keys that direct writes
    produce (zarr's defaults, checked rather than assumed), chunked along axis 0 only."""
    import zarr
    from zarr.codecs import BytesCodec, ZstdCodec

    if "://" in store:
        return False
    for name in names:
        z = zarr.open_array(store=store, path=name, mode="r")
        meta = z.metadata
        codecs = tuple(getattr(meta, "codecs", ()))
        tail = len(z.shape) - 1
        ok = (
            getattr(meta, "zarr_format", None) == 3
            and len(codecs) == 2
            and isinstance(codecs[0], BytesCodec)
            and (z.dtype.itemsize == 1 or getattr(codecs[0].endian, "value", "") == "little")
            and isinstance(codecs[1], ZstdCodec)
            and codecs[1].level == 0
            and not codecs[1].checksum
            and tuple(z.chunks[1:]) == tuple(z.shape[1:])
            and meta.encode_chunk_key((7, *[0] * tail)) == "/".join(["c", "7", *"0" * tail])
            and not z.fill_value
        )
        if not ok:
            return False
        os.makedirs(os.path.join(store, name, "c"), exist_ok=True)
    return True


def cut(store: str, names: tuple[str, ...], total: int) -> None:
    """Set the arrays' length (rows) to the selection's: a metadata write; the chunks beyond
    it were never written, so none needs deleting."""
    import zarr
    from zarr.core.sync import sync

    for name in names:
        a = zarr.open_array(store=store, path=name, mode="r+")
        resize = a.async_array.resize((total, *a.shape[1:]), delete_outside_chunks=False)
        sync(resize)


def continued(resume: Manifest, layout: Layout) -> Manifest:
    """The manifest a resumed job continues from: ``resume``, or where its counts or written
    chunks cannot be those of this job's chunks (:meth:`.manifest.Manifest.inconsistency`:
    a count beyond its chunk, negative...), a fresh one for the same group, said on stderr:
    every chunk is then computed and written again. The manifest's checksum (see
    :mod:`.manifest`) refuses a hand's edit first; this stops anything else that would place
    the chunks after the resume point wrongly (the twelfth session's probe got an output of
    wrong values, exit 0, from a count edited by hand)."""
    why = resume.inconsistency(layout.nchunks, layout.size, layout.out_chunk)
    if not why:
        return resume
    import click

    click.echo(f"dask compact: --resume: the manifest of the interrupted job does not fit "
               f"its input ({why}): starting over, every chunk computed again", err=True)
    return Manifest(resume.job, made=resume.made, lengths=resume.lengths)


def task_device(runner: Runner) -> str:
    """Where the chunk tasks compact (see :func:`.tasks.read_compact`): "cpu", "gpu" (a
    cluster worker's own device) or "gpu-all" (this process's devices, chunk i on i mod n)."""
    if not runner.gpu:
        return "cpu"
    return "gpu" if runner.client is not None else "gpu-all"


def input_unchanged(before: Any, now: Callable[[], Any]) -> Callable[[], None]:
    """A check that the input's fingerprint ``now()`` is still ``before`` (what the job read
    from), refusing to commit otherwise.

    A probe replaced chunk files of the input while a job read it and got an output mixing
    old and new values, marked complete, exit 0. The fingerprint (:func:`.reader.
    zarr_fingerprint`) sees a local Zarr array's metadata and every file under it by path,
    size and modification time (so chunks rewritten, added or removed during the job), and a
    .npy file's device, inode, size and modification time; for an fsspec URL only the
    metadata. It cannot see a rewrite that keeps a file's size within the file system's
    timestamp resolution, nor a change undone before the check. Cost: one listing of the
    input's files (~80 ms for 10,000 chunk files on the 2-core machine)."""
    import click

    def check() -> None:
        if now() != before:
            raise click.ClickException(
                "INPUT changed while the job read it (its files or metadata differ from when "
                "the job started), so the selection may mix old and new values: OUTPUT was "
                "not written. Run the job again once nothing writes to INPUT")

    return check


def stream_and_commit(runner: Runner, target: Target, make_job: Callable[[], Job],
                      names: tuple[str, ...], show: bool, total_bytes: int,
                      attrs: dict[str, Any], overwrite: bool,
                      check_input: Callable[[], None] | None = None,
                      input_path: str | None = None) -> tuple[Job, int, int]:
    """Run a streaming job into ``target``'s temporary group and commit it: ``make_job()``
    creates (or, resuming, reopens) the group and returns the job; the arrays ``names`` are
    cut to the selection; ``check_input()`` (:func:`input_unchanged`) runs before the commit;
    ``(job, selected, threads)``. Any failure or interrupt stops the tasks, removes the
    temporary group and raises. On a cluster, a local OUTPUT must be seen by every worker
    before anything runs (:func:`.shared.check_workers_see`: a refusal removes nothing, not
    even a resumed job's group), and every chunk the job wrote must be in the temporary group
    before the commit (:func:`.shared.check_chunks_written`); and the workers must see the
    files this process sees at a local INPUT ``input_path`` (:func:`.shared.
    check_workers_read`)."""
    target.prepare()
    if runner.client is not None:
        check_workers_read(runner.client, input_path)
    if runner.client is not None and not target.url:
        check_workers_see(runner.client, target.tmp)
    ex: Executor | None = None
    try:  # from here on, a failure removes the temporary group (and drains running tasks)
        job = make_job()
        ex = executor_for(runner, job)
        # Selections in this process reuse pooled buffers (.host_buffers); worker processes
        # of a cluster allocate theirs.
        marks = job.stats.marks  # the steps after the last write, for the summary's timeline
        with progress_bar(show, total_bytes) as bar:
            # idle buffers are kept within what the budget leaves beside the threads' own
            keep = max(0, job.budget - charge_threads(ex, job)) if runner.client is None else 0
            with pool_for_job(keep) as pool:
                total = run_stream(ex, job, bar)
                job.stats.pool_peak = pool.peak
                marks["stream_returned"] = time.perf_counter()
            marks["pool_emptied"] = time.perf_counter()
        marks["streamed"] = time.perf_counter()
        ex.close()
        marks["threads_joined"] = time.perf_counter()
        threads = ex.threads
        if check_input is not None:
            check_input()
            marks["input_checked"] = time.perf_counter()
        if not target.url and job.dest.direct:
            check_chunks_written(target.tmp, names, total, job.layout.out_chunk, target.output)
            marks["chunks_checked"] = time.perf_counter()
        cut(target.tmp, names, total)
        if job.manifest_dir is not None:  # saved at the job's first write, if it wrote any
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(job.manifest_dir, "dask-compact-manifest.json"))
        target.commit(marker({**attrs, "selected": total}), overwrite)
        marks["committed"] = time.perf_counter()
    except BaseException as e:
        # A cluster left without workers past --no-workers-timeout: the stream saved its
        # manifest, and the group is kept for --resume (a local OUTPUT's)
        keep = isinstance(e, NoWorkers) and not target.url
        # A second Ctrl-C or SIGTERM while the tasks end must not cut it short: the threads
        # of a job without a cluster wrote on into the group after its removal (a probe's
        # three SIGTERMs 0.3 s apart left 295 files of it beside OUTPUT).
        with held():
            try:
                if ex is not None:
                    ex.stop()
            finally:
                if not keep:
                    target.discard()
        if isinstance(e, NoWorkers):
            import click

            raise click.ClickException(
                f"{e}: {target.output} was not written; " + (
                    f"what the job wrote is kept in {target.tmp}: run the same command with "
                    "--resume once the cluster has workers (kept for --resume)" if keep else
                    "nothing is kept (an fsspec URL OUTPUT cannot be resumed)")) from None
        raise
    if target.old_error:
        import click

        click.echo(f"dask compact: wrote {target.output}, but the old output it replaced "
                   f"could not be removed ({target.old_error}); it is left at "
                   f"{target.old_left}: remove it yourself (a later job on OUTPUT refuses "
                   "to run while it cannot remove it)", err=True)
    return job, total, threads


def stream_summary(job: Job, runner: Runner, threads: int) -> dict[str, Any]:
    """The summary's fields that every streaming job reports: task time, memory, where it
    ran."""
    st = job.stats
    return {
        "task_seconds": {"read": st.read_s, "compact": st.compact_s, "write": st.write_s},
        "threads": threads,
        "memory_budget": job.budget,
        "peak_reserved": st.peak_reserved,
        "in_flight": st.in_flight,
        "job_minimum": st.minimum,
        "peak_memory": peak_memory(runner),
        "gpu_chunks": st.gpu_chunks,
        "chunks_read": st.chunks,
        "write_tasks": st.write_tasks,
        "scheduler": runner.description,
        "gpu": runner.gpu,
    }


def run_job(
    runner: Runner,
    src: Source,
    target: Target,
    where: str,
    mode: str,
    output_chunks: int | None,
    show: bool,
    input_path: str,
    overwrite: bool = False,
    budget: int | None = None,
    resume: Manifest | None = None,
    decode: str = "cpu",
    encode: str = "cpu",
) -> dict[str, Any]:
    """Run the job into ``target``'s temporary group and commit it; the summary dict.

    ``resume``: the manifest of the interrupted job whose group ``target.tmp`` now names.
    """
    import dask_compact

    from .runner import memory_budget

    layout = layout_of(src, output_chunks)
    job_desc = describe(src, where, mode, output_chunks)
    attrs = {
        "complete": False,
        "input": input_path,
        "where": where,
        "output": mode,
        "input_shape": list(src.shape),
        "input_dtype": str(src.dtype),
        "version": dask_compact.__version__,
        "job": job_identity(job_desc),  # see cli._finished_already
    }
    # Every refusal before the temporary group exists: nothing to remove afterwards.
    decode = choose_decode(runner, src, decode)
    # auto: each chunk compacted on a GPU goes to the encoder expected to be done sooner
    share = encode == "auto"
    encode = choose_encode(runner, target, encode)
    share = share and encode == "gpu"
    if not budget:
        budget = memory_budget(runner)
        if encode == "gpu":  # the selections wait for their writes in device memory
            budget = min(budget, device_budget(runner))
    from . import encoder_choice
    from .gpu_zstd import decode_batches

    encoder_choice.forget()  # this job's rates, measured anew (threads: this process encodes)
    batches_before = decode_batches()  # this process's decoders (the threaded scheduler's)
    t0 = time.perf_counter()
    started = process_age()
    names = NAMES[mode]

    def make_job() -> Job:
        nonlocal encode, share
        if resume is None:
            create_group(target.tmp, layout, src, mode, attrs)
            manifest = Manifest(job_desc, made={} if target.url else made_files(target.tmp),
                                lengths=dict.fromkeys(names, layout.n))
        else:
            manifest = continued(resume, layout)
        direct = writes_chunk_files(target.tmp, names)
        if not direct:  # zarr writes the chunks: it encodes them on the CPU
            encode, share = "cpu", False
        return Job(
            reader=src.reader, layout=layout, where=where, mode=mode, device=task_device(runner),
            dest=OutputArrays(target.tmp, names, layout.out_chunk, direct, share),
            budget=budget, manifest=manifest, manifest_dir=None if target.url else target.tmp,
            decode=decode, encode=encode,
            writes_per_task=writes_per_task(layout, mode, settings.get("batch.task-bytes")),
        )

    check = (input_unchanged(src.reader.fingerprint, src.fingerprint_now)
             if src.fingerprint_now is not None else None)
    job, total, threads = stream_and_commit(runner, target, make_job, names, show,
                                            int(layout.n * layout.itemsize), attrs, overwrite,
                                            check, src.local_path)
    seconds = time.perf_counter() - t0
    ahead = early_read.end()  # chunks the tasks took from the command's early read, if any
    st = job.stats
    return {
        "input": input_path,
        "output": target.output,
        "where": where,
        "shape": list(src.shape),
        "dtype": str(src.dtype),
        "elements": int(layout.n),
        "bytes": int(layout.n * layout.itemsize),
        # the input's chunks along axis 0 (--chunks or .npy: the job's blocks), and the tasks
        # that read them (several small Zarr chunks a task, .plan.task_rows)
        "input_chunks": (-(-src.shape[0] // src.out_rows) if src.out_rows and src.shape
                         else layout.nchunks),
        "tasks": layout.nchunks,
        "selected": total,
        "fraction": total / layout.n if layout.n else 0.0,
        "arrays": list(names),
        # where xarray's decoding changes the values (.cf; --raw let it through, see cli)
        "encoded": {"x": e} if src.cf is not None and (e := xarray_encodings(src.attrs)) else {},
        # why they are compared as stored where .cf does not decode them (time units)
        "not_decoded": {"x": src.cf} if isinstance(src.cf, str) else {},
        "seconds": seconds,
        # the whole command so far: interpreter start, imports, cluster start, the job
        "process_seconds": process_age(),
        "gb_per_s": layout.n * layout.itemsize / 1e9 / seconds if seconds > 0 else 0.0,
        **stream_summary(job, runner, threads),
        "gpu_decode": st.gpu_decoded > 0,
        # nvCOMP calls of this process's decoders, and the tasks whose chunks they decoded
        "gpu_decode_batches": dict(zip(("batches", "tasks"), (
            a - b for a, b in zip(decode_batches(), batches_before)))),
        "decode": decode,
        "encode": encode,
        "gpu_encoded": st.gpu_encoded,
        # --encode auto on GPUs: the rates (bytes/s) of the two paths that chose each chunk's
        # encoder, and the chunks that left a GPU's queue for the CPU (see .encoder_choice)
        "encode_shared": share,
        "encode_rates": encoder_choice.rates() if share else {},
        "encode_moved": encoder_choice.chosen()["moved"] if share else 0,
        "resumed_from_chunk": st.resumed_from_chunk if resume is not None else None,
        "read_ahead": ahead,
        # seconds since the process started: the job's start, then its loop's events
        "timeline": {"job": started, **{k: started + v - t0 for k, v in st.marks.items()},
                     "end": started + seconds, **st.durations},
    }


# ``--decode auto`` decodes on the GPUs only chunks of at least this many decoded bytes. One
# H100 host (16 cores), float32 zstd chunks of 2^16 to 2^25 elements, the threaded scheduler
# on the GPU, nvCOMP decode against the CPUs', two rounds each (2026-12-05, e476137,
# benchmarks/results/2026-12-05_h100_e476137_gpu_decode_by_chunk_size.md): whole commands
# 1.71-1.75 / 1.15-1.16 s at 256 KiB chunks, 1.19-1.20 / 0.88-0.94 at 1 MiB, 1.06-1.07 / 0.84
# at 4 MiB, 0.93-0.94 / 0.83-0.90 at 16 MiB, 1.24-1.26 / 1.03-1.07 at 64 MiB, 1.16-1.18 /
# 1.12-1.13 at 128 MiB: nvCOMP's fixed cost per batch and per frame is not paid back below
# 128 MiB, where the 8 GiB job of the README decoded faster on the GPU (2026-11-27/28).
# Measured again with a task's frames packed (e902486, 2026-12-05_h100_e902486_packed_gpu_decode
# .md): 1.70-1.77 / 1.39-1.48 s at 256 KiB, 1.25-1.26 / 1.06-1.09 at 1 MiB, 1.17-1.18 /
# 1.01-1.02 at 4 MiB: still the CPUs below 128 MiB on this barely compressible input.
GPU_DECODE_FROM_BYTES = 128 << 20


def choose_decode(runner: Runner, src: Source, requested: str) -> str:
    """Where the chunks are decoded: "cpu", or "gpu" (nvCOMP on the device) where that is
    possible: the chunks go to GPUs, the input is zstd chunk files and every worker has
    nvCOMP; ``auto`` only for chunks of GPU_DECODE_FROM_BYTES or more. A ``--decode gpu``
    that is not possible falls back to the CPU with one line on stderr saying why (the
    summary's ``decode`` says where decoding ran)."""
    if requested == "auto" and chunk_bytes(src) < GPU_DECODE_FROM_BYTES:
        return "cpu"
    return _on_gpu_if_possible(runner, requested, "decode", src.no_gpu_decode)


def chunk_bytes(src: Source) -> int:
    """Decoded bytes of one of the input's own chunks (a task may read several; the chunk-file
    reader, the one nvCOMP decodes for, knows their rows)."""
    rows = getattr(src.reader, "chunk_rows", None) or src.row_chunk
    return rows * row_bytes(src.shape, src.dtype)


def choose_encode(runner: Runner, target: Target, requested: str) -> str:
    """Where output chunks are encoded: "cpu", or "gpu" (nvCOMP; the selections then leave
    the device only as compressed bytes) where that is possible: the chunks are compacted on
    GPUs, the output is a local group and every worker has nvCOMP. A ``--encode gpu`` that is
    not possible falls back to the CPU with one line on stderr saying why. Where ``auto``
    gives "gpu", the job shares: each chunk goes to nvCOMP or to its writer's CPU thread, by
    the rates measured as the job runs (:mod:`.encoder_choice`; ``--encode gpu`` sends every
    chunk to nvCOMP)."""
    return _on_gpu_if_possible(runner, requested, "encode",
                               "the output is not a local directory" if target.url else "")


def _on_gpu_if_possible(runner: Runner, requested: str, what: str, why_not: str) -> str:
    """"gpu" if requested and possible (GPU compaction, no ``why_not`` of the caller's, nvCOMP
    in this process or on every worker), else "cpu", saying why on stderr when "gpu" was
    requested. ``requested="auto"``: "gpu" where it is possible and this process drives the
    GPUs (the threaded scheduler: one decoder and one encoder per device batch every task's
    frames, see .gpu_zstd), else "cpu", silently. Measured on one H200 host (8 GiB, 16
    cores): the job decoding and encoding on the GPU 1.48-1.50 s against 2.30 s on the
    CPUs, with 7.7-8.0 against 31.2 s of CPU time. On one H100's LocalCUDACluster the GPU
    codec gained 0.15 and 0.58 s of 6.5-6.7 s in two rounds: too little measured to make it
    the default on a cluster's workers."""
    import click

    from . import gpu_zstd

    if requested == "cpu":
        return "cpu"
    if requested == "auto":
        possible = runner.gpu and runner.client is None and not why_not
        return "gpu" if possible and not gpu_zstd.unavailable() else "cpu"
    why = ""
    if not runner.gpu:
        why = "the chunks are compacted on CPUs"
    elif why_not:
        why = why_not
    elif runner.client is not None:
        reasons = {r for r in runner.client.run(gpu_zstd.unavailable).values() if r}
        why = "; ".join(sorted(reasons))
    else:
        why = gpu_zstd.unavailable()
    if why:
        doing = {"decode": "decoding", "encode": "encoding"}[what]
        click.echo(f"dask compact: GPU {what} is not possible ({why}); {doing} on the CPU",
                   err=True)
        return "cpu"
    return "gpu"


def device_budget(runner: Runner) -> int:
    """Half of the free memory of the GPUs that hold the selections (of each worker's own
    device on a cluster)."""
    from .gpu_zstd import free_device_memory

    if runner.client is None:
        return sum(free_device_memory(all_devices=True)) // 2
    return sum(sum(v) for v in runner.client.run(free_device_memory).values()) // 2


def process_age() -> float:
    """Seconds since this process started.

    On Linux from the kernel's own clocks, both counted from boot (``/proc/uptime`` and the
    process's start in ``/proc/self/stat``, 10 ms resolution). psutil's ``create_time`` adds
    the start to the boot time as a whole number of seconds (``btime``), so an age computed
    from it against the wall clock was up to a second too long (0.14-0.96 s on the H100
    host's runs)."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        with open("/proc/self/stat") as f:
            stat = f.read()
        # the fields after the command name (which may hold spaces or parentheses)
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()


def peak_memory(runner: Runner) -> dict[str, int]:
    """Peak resident memory of each process that ran tasks (the workers, or this one)."""
    if runner.client is None:
        return {"local": peak_rss()}
    try:
        return {str(k): int(v) for k, v in runner.client.run(peak_rss).items()}
    except Exception:  # noqa: BLE001 -- a summary field is not worth failing a finished job
        return {}


class progress_bar:
    """A tqdm bar over the input's ``total`` bytes on stderr (a no-op when not shown)."""

    def __init__(self, show: bool, total: int) -> None:
        self.show = show
        self.total = total
        self.bar: Any = None

    def __enter__(self) -> Any:
        if not self.show:
            return None
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, unit="B", unit_scale=True, file=sys.stderr,
                        desc="dask compact", leave=False, dynamic_ncols=True)
        return self.bar.update

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()
