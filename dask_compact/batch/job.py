"""One batch job from start to commit: the output group, the streaming run, the summary.

The CLI (:mod:`dask_compact.cli`) parses arguments and maps failures to exit codes; this
module owns what happens between the lock being taken and released.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from .executor import ClientExecutor, Executor, ThreadExecutor
from .host_buffers import pool_for_job
from .inputs import Source
from .manifest import Manifest
from .output import Target, marker
from .plan import Layout
from .runner import Runner
from .stream import Job, run_stream
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
        "where": where,
        "output": mode,
        "out_chunk": layout.out_chunk,
        "version": dask_compact.__version__,
    }


def layout_of(src: Source, output_chunks: int | None) -> Layout:
    return Layout.make(src.shape, src.dtype.itemsize, src.row_chunk, output_chunks)


def executor_for(runner: Runner) -> Executor:
    if runner.client is not None:
        return ClientExecutor(runner.client)
    from dask.system import CPU_COUNT

    return ThreadExecutor(CPU_COUNT)


def create_group(store: str, layout: Layout, src: Source, mode: str,
                 attrs: dict[str, Any]) -> None:
    """The output group with its arrays at the input's length (cut to the result at the end)."""
    import zarr

    group = zarr.open_group(store=store, mode="w-", attributes={"dask_compact": attrs})
    dtypes = {"values": src.dtype, "indices": np.dtype(np.int64)}
    for name in NAMES[mode]:
        group.create_array(name, shape=(layout.n,), dtype=dtypes[name],
                           chunks=(max(1, layout.out_chunk),))


def writes_chunk_files(store: str, mode: str) -> bool:
    """Whether the output's chunks can be written as files (see :class:`.tasks.OutputArrays`):
    a local group whose arrays have exactly the codecs and chunk keys that direct writes
    produce (zarr's defaults, checked rather than assumed)."""
    import zarr
    from zarr.codecs import BytesCodec, ZstdCodec

    if "://" in store:
        return False
    for name in NAMES[mode]:
        z = zarr.open_array(store=store, path=name, mode="r")
        meta = z.metadata
        codecs = tuple(getattr(meta, "codecs", ()))
        ok = (
            getattr(meta, "zarr_format", None) == 3
            and len(codecs) == 2
            and isinstance(codecs[0], BytesCodec)
            and (z.dtype.itemsize == 1 or getattr(codecs[0].endian, "value", "") == "little")
            and isinstance(codecs[1], ZstdCodec)
            and codecs[1].level == 0
            and not codecs[1].checksum
            and meta.encode_chunk_key((7,)) == "c/7"
            and not z.fill_value
        )
        if not ok:
            return False
        os.makedirs(os.path.join(store, name, "c"), exist_ok=True)
    return True


def cut(store: str, mode: str, total: int) -> None:
    """Set the arrays' length to the selection's: a metadata write; the chunks beyond it were
    never written, so none needs deleting."""
    import zarr
    from zarr.core.sync import sync

    for name in NAMES[mode]:
        a = zarr.open_array(store=store, path=name, mode="r+")
        sync(a.async_array.resize((total,), delete_outside_chunks=False))


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
    }
    # Every refusal before the temporary group exists: nothing to remove afterwards.
    decode = choose_decode(runner, src, decode)
    encode = choose_encode(runner, target, encode)
    if not budget:
        budget = memory_budget(runner)
        if encode == "gpu":  # the selections wait for their writes in device memory
            budget = min(budget, device_budget(runner))
    t0 = time.perf_counter()
    device = "cpu"
    if runner.gpu:
        device = "gpu" if runner.client is not None else "gpu-all"
    target.prepare()
    ex: Executor | None = None
    try:  # from here on, a failure removes the temporary group (and drains running tasks)
        if resume is None:
            create_group(target.tmp, layout, src, mode, attrs)
            manifest = Manifest(job_desc)
        else:
            manifest = resume
        direct = writes_chunk_files(target.tmp, mode)
        if not direct:  # zarr writes the chunks: it encodes them on the CPU
            encode = "cpu"
        job = Job(
            reader=src.reader, layout=layout, where=where, mode=mode, device=device,
            dest=OutputArrays(target.tmp, NAMES[mode], layout.out_chunk, direct), budget=budget,
            manifest=manifest, manifest_dir=None if target.url else target.tmp, decode=decode,
            encode=encode,
        )
        ex = executor_for(runner)
        # Selections in this process reuse pooled buffers (.host_buffers); worker processes
        # of a cluster allocate theirs.
        with progress_bar(show, src) as bar, pool_for_job(budget if runner.client is None
                                                          else 0):
            total = run_stream(ex, job, bar)
        ex.close()
        cut(target.tmp, mode, total)
        if job.manifest_dir is not None:
            os.remove(os.path.join(job.manifest_dir, "dask-compact-manifest.json"))
        target.commit(marker({**attrs, "selected": total}), overwrite)
    except BaseException:
        if ex is not None:
            ex.stop()
        target.discard()
        raise
    seconds = time.perf_counter() - t0
    st = job.stats
    process_seconds = process_age()
    peaks = peak_memory(runner)
    return {
        "input": input_path,
        "output": target.output,
        "where": where,
        "shape": list(src.shape),
        "dtype": str(src.dtype),
        "elements": int(layout.n),
        "bytes": int(layout.n * layout.itemsize),
        "input_chunks": layout.nchunks,
        "chunks_read": st.chunks,
        "selected": total,
        "fraction": total / layout.n if layout.n else 0.0,
        "arrays": list(NAMES[mode]),
        "seconds": seconds,
        # the whole command so far: interpreter start, imports, cluster start, the job
        "process_seconds": process_seconds,
        "gb_per_s": layout.n * layout.itemsize / 1e9 / seconds if seconds > 0 else 0.0,
        "task_seconds": {"read": st.read_s, "compact": st.compact_s, "write": st.write_s},
        "threads": ex.threads,
        "memory_budget": budget,
        "peak_reserved": st.peak_reserved,
        "peak_memory": peaks,
        "gpu_chunks": st.gpu_chunks,
        "gpu_decode": st.gpu_decoded > 0,
        "decode": decode,
        "encode": encode,
        "gpu_encoded": st.gpu_encoded,
        "resumed_from_chunk": st.resumed_from_chunk if resume is not None else None,
        "scheduler": runner.description,
        "gpu": runner.gpu,
    }


def choose_decode(runner: Runner, src: Source, requested: str) -> str:
    """Where the chunks are decoded: "cpu", or "gpu" (nvCOMP on the device) where that is
    possible: the chunks go to GPUs, the input is zstd chunk files and every worker has
    nvCOMP. A ``--decode gpu`` that is not possible falls back to the CPU with one line on
    stderr saying why (the summary's ``decode`` says where decoding ran)."""
    return _on_gpu_if_possible(runner, requested, "decode", src.no_gpu_decode)


def choose_encode(runner: Runner, target: Target, requested: str) -> str:
    """Where output chunks are encoded: "cpu", or "gpu" (nvCOMP; the selections then leave
    the device only as compressed bytes) where that is possible: the chunks are compacted on
    GPUs, the output is a local group and every worker has nvCOMP. A ``--encode gpu`` that is
    not possible falls back to the CPU with one line on stderr saying why."""
    return _on_gpu_if_possible(runner, requested, "encode",
                               "the output is not a local directory" if target.url else "")


def _on_gpu_if_possible(runner: Runner, requested: str, what: str, why_not: str) -> str:
    """"gpu" if requested and possible (GPU compaction, no ``why_not`` of the caller's, nvCOMP
    in this process or on every worker), else "cpu", saying why on stderr when "gpu" was
    requested."""
    import click

    from . import gpu_zstd

    if requested == "cpu":
        return "cpu"
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
    """A tqdm bar over the input bytes on stderr (a no-op when not shown)."""

    def __init__(self, show: bool, src: Source) -> None:
        self.show = show
        self.total = int(np.prod(src.shape, dtype=np.int64)) * src.dtype.itemsize
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
