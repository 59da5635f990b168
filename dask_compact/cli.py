"""Batch job: ``dask compact INPUT OUTPUT --where EXPR`` (also ``python -m dask_compact``).

Reads a Zarr array (local path or fsspec URL) or a ``.npy`` file (memory-mapped, read block by
block on the workers), compacts it with :func:`dask_compact.map_compact`, and writes the
selected values and/or their global int64 flat indices as arrays ``values`` / ``indices`` of
the Zarr group OUTPUT. N-D input is taken in C order, exactly like ``x.ravel()``: ``values``
is ``x[mask]`` and ``indices`` is ``np.flatnonzero(mask)``.

The output is complete or absent: everything is written to a hidden sibling of OUTPUT, and the
group is moved into place (one ``rename`` on a local file system) only once the last chunk has
been written and the group attribute ``dask_compact.complete`` is true.  A failed or interrupted
job removes its temporary group; an existing OUTPUT is replaced only with ``--overwrite``.

Registered as a ``dask`` subcommand through the ``dask_cli`` entry point, which ``dask``'s CLI
loads by adding the click command named ``compact`` (see ``dask.cli.run_cli``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import click
import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

SEPARATOR = "://"


# ---------------------------------------------------------------------------------------------
# Input


class NpyBlocks:
    """A ``.npy`` file that dask slices block by block.

    Each process that reads a block memory-maps the file itself; the object pickles as its
    path, shape and dtype only, so a distributed graph never carries the data (a plain
    ``np.memmap`` handed to ``da.from_array`` would be pickled whole into every task).
    """

    def __init__(self, path: str) -> None:
        mm = np.load(path, mmap_mode="r")
        self.path = path
        self.shape: tuple[int, ...] = tuple(mm.shape)
        self.dtype = mm.dtype
        self.ndim = mm.ndim
        self._mm: np.memmap | None = None

    def __getitem__(self, index: Any) -> np.ndarray:
        if self._mm is None:
            self._mm = np.load(self.path, mmap_mode="r")
        # A copy: a memmap slice would keep the file open inside the chunk (and pickle badly).
        return np.array(self._mm[index])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shape": self.shape, "dtype": self.dtype, "ndim": self.ndim}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mm = None


@dataclass
class Source:
    array: da.Array
    kind: str  # "npy" or "zarr"
    local_path: str | None  # for the INPUT/OUTPUT overlap check


def is_url(path: str) -> bool:
    return SEPARATOR in path and not path.startswith("file://")


def local(path: str) -> str:
    return os.path.abspath(path.removeprefix("file://"))


def leading_axis_chunks(ndim: int, n: int | str) -> tuple[Any, ...]:
    """Chunks split along axis 0 only: each chunk is then a contiguous run of the C order."""
    return (n,) + (-1,) * (ndim - 1)


def open_input(path: str, chunks: int | None) -> Source:
    if not is_url(path) and not os.path.exists(local(path)):
        raise click.BadParameter(f"{path!r} does not exist", param_hint="INPUT")
    if path.endswith(".npy"):
        return open_npy(path, chunks)
    if not is_url(path) and os.path.isfile(local(path)):
        raise click.BadParameter(
            f"{path!r} is a file but not a .npy file; INPUT must be a Zarr array or a .npy file",
            param_hint="INPUT",
        )
    return open_zarr(path, chunks)


def open_npy(path: str, chunks: int | None) -> Source:
    if is_url(path):
        raise click.BadParameter(
            ".npy input must be a local file (it is memory-mapped); convert it to Zarr for "
            "remote storage",
            param_hint="INPUT",
        )
    p = local(path)
    try:
        blocks = NpyBlocks(p)
    except ValueError as e:  # object dtype: "Array can't be memory-mapped"; a bad header
        raise click.BadParameter(f"cannot memory-map {path!r}: {e}", param_hint="INPUT") from None
    check_shape_dtype(blocks.shape, blocks.dtype, path)
    st = os.stat(p)
    name = "npy-" + tokenize(p, st.st_mtime_ns, st.st_size)
    x = da.from_array(
        blocks,
        chunks=leading_axis_chunks(blocks.ndim, chunks or "auto"),
        name=name,
        meta=np.empty((0,) * blocks.ndim, dtype=blocks.dtype),
        inline_array=True,
    )
    return Source(x, "npy", p)


def open_zarr(path: str, chunks: int | None) -> Source:
    import zarr

    try:
        node = zarr.open(store=path, mode="r")
    except Exception as e:  # noqa: BLE001 -- zarr raises several types for "missing", "not zarr"
        raise click.BadParameter(
            f"cannot open {path!r} as a Zarr array: {type(e).__name__}: {e}", param_hint="INPUT"
        ) from None
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        hint = f"; it holds the arrays {', '.join(names)}" if names else " with no arrays"
        raise click.BadParameter(
            f"{path!r} is a Zarr group, not an array: name the array, e.g. {path.rstrip('/')}/"
            f"{names[0] if names else 'NAME'}{hint}",
            param_hint="INPUT",
        )
    check_shape_dtype(node.shape, node.dtype, path)
    x = da.from_zarr(node)
    if chunks is not None:
        x = x.rechunk(leading_axis_chunks(x.ndim, chunks))
    return Source(x, "zarr", None if is_url(path) else local(path))


def check_shape_dtype(shape: tuple[int, ...], dtype: Any, path: str) -> None:
    from .validate import DTYPES

    if len(shape) == 0:
        raise click.BadParameter(
            f"{path!r} holds a 0-d array (a scalar): nothing to compact", param_hint="INPUT"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError:  # zarr v3 data types without a NumPy equivalent
        dt = None
    if dt not in DTYPES:
        raise click.BadParameter(
            f"{path!r} has dtype {dtype}; supported: {', '.join(d.name for d in DTYPES)}",
            param_hint="INPUT",
        )


# ---------------------------------------------------------------------------------------------
# Where the work runs


@dataclass
class Runner:
    """The scheduler the job runs on; closing it stops what this command started."""

    description: str
    client: Any = None  # distributed.Client, or None for the threaded scheduler
    gpu: bool = False
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self._stack.close()


def gpu_present() -> bool:
    """CuPy, dask-cuda and at least one CUDA device: what LocalCUDACluster needs."""
    try:
        import cupy
        import dask_cuda  # noqa: F401 -- only whether it imports

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 -- ImportError, or CUDARuntimeError without a driver
        return False


def client_has_cupy() -> bool:
    """CuPy chunks need CuPy here too: the graph's chunk metadata are CuPy arrays."""
    try:
        import cupy  # noqa: F401 -- only whether it imports
    except ImportError:
        return False
    return True


def worker_has_gpu() -> bool:
    """Run on each worker (``client.run``) to decide whether chunks should become CuPy."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 -- no CuPy, or no driver: not a GPU worker
        return False


def connect(address: str | None, scheduler_file: str | None, timeout: float) -> Any:
    from distributed import Client

    target = address or scheduler_file
    previous = dask.config.get("scheduler", None)
    try:
        if scheduler_file is not None:
            client = Client(scheduler_file=scheduler_file, timeout=timeout)
        else:
            client = Client(address, timeout=timeout)
    except (OSError, ValueError, TypeError, TimeoutError) as e:
        # A Client that fails in __init__ has already made itself the default scheduler in the
        # dask config and never undoes it; later computations in this process would look for it.
        if previous is None:
            dask.config.config.pop("scheduler", None)
        else:
            dask.config.set(scheduler=previous)
        # OSError: refused / timed out / TLS handshake failed; ValueError: unknown scheme or a
        # tls:// address without certificates in the dask config.
        raise click.ClickException(
            f"cannot connect to the scheduler at {target}: {type(e).__name__}: {e}"
        ) from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (TimeoutError, OSError):
        client.close()
        raise click.ClickException(
            f"the scheduler at {target} has no workers (waited {timeout:g} s)"
        ) from None
    return client


def start(
    address: str | None,
    scheduler_file: str | None,
    local_cluster: str,
    device: str,
    timeout: float,
    n_workers: int | None,
) -> Runner:
    if address or scheduler_file:
        client = connect(address, scheduler_file, timeout)
        if device == "auto":
            # A remote cluster decides by its workers: CuPy chunks only if every worker has a GPU.
            gpu = client_has_cupy() and all(client.run(worker_has_gpu).values())
        else:
            gpu = device == "gpu"
        runner = Runner(f"distributed scheduler {client.scheduler.address}", client, gpu)
        runner._stack.callback(client.close)
        return runner

    kind = local_cluster
    if kind == "auto":
        # Where the GPU stack is present the job runs there; on a CPU the threaded scheduler
        # compacts the chunks with no serialisation between processes (the CPU loop releases
        # the GIL), so it is the fastest local choice. `--local processes` starts a
        # distributed.LocalCluster instead (dashboard, spilling, one process per worker).
        kind = "cuda" if device != "cpu" and gpu_present() else "threads"
    if device == "gpu" and kind != "cuda":
        raise click.UsageError("--device gpu needs --local cuda (or auto) or a --scheduler")
    if kind == "cuda" and not gpu_present():
        raise click.UsageError("--local cuda needs cupy, dask-cuda and a CUDA device")

    runner = Runner("threaded scheduler", gpu=False)
    if kind == "threads":
        runner._stack.enter_context(dask.config.set(scheduler="threads"))
        return runner

    try:
        start_local_cluster(runner, kind, device, n_workers)
    except BaseException:
        runner.close()  # a cluster that started but whose client failed must not linger
        raise
    return runner


def start_local_cluster(runner: Runner, kind: str, device: str, n_workers: int | None) -> None:
    from distributed import Client

    if kind == "cuda":
        from dask_cuda import LocalCUDACluster

        cluster = runner._stack.enter_context(LocalCUDACluster(n_workers=n_workers))
        runner.description = f"LocalCUDACluster ({len(cluster.workers)} GPU workers)"
        runner.gpu = device != "cpu"
    else:
        from distributed import LocalCluster

        cluster = runner._stack.enter_context(
            LocalCluster(n_workers=n_workers, dashboard_address=":0")
        )
        runner.description = f"LocalCluster ({len(cluster.workers)} worker processes)"
    runner.client = runner._stack.enter_context(Client(cluster))


def on_gpu(x: da.Array) -> da.Array:
    import cupy

    return x.map_blocks(cupy.asarray, dtype=x.dtype, meta=cupy.empty((0,) * x.ndim, x.dtype))


def to_host(block: Any) -> np.ndarray:
    """CuPy chunk back to NumPy for the Zarr writer (no-op for NumPy chunks)."""
    return block.get() if hasattr(block, "get") else np.asarray(block)


@contextlib.contextmanager
def progress(runner: Runner, enabled: bool) -> Iterator[None]:
    """Progress of computations run by the local scheduler (both phases)."""
    if enabled and runner.client is None:
        from dask.diagnostics import ProgressBar

        with ProgressBar(out=sys.stderr, dt=0.2):
            yield
    else:
        yield


def compute(runner: Runner, work: Any, enabled: bool, drain_timeout: float = 60.0) -> None:
    """Compute the write graph; if it fails, return only once no task of it still runs.

    A failed task makes the compute raise while other chunk writes are still in flight; were
    the temporary group removed then, a late write would recreate part of it. So the threaded
    scheduler gets its own pool, shut down (waiting) before we return, and on a cluster the
    remaining tasks are cancelled and awaited.
    """
    if runner.client is None:
        from concurrent.futures import ThreadPoolExecutor

        from dask.system import CPU_COUNT

        with ThreadPoolExecutor(max_workers=CPU_COUNT) as pool, progress(runner, enabled):
            dask.compute(work, pool=pool)
        return
    from distributed import futures_of, wait

    client = runner.client
    # da.store(compute=False) gives one array per source (a tuple for several) whose blocks
    # are the chunk writes; persisting it gives one future per chunk write.
    works = list(work) if isinstance(work, (tuple, list)) else [work]
    futures = futures_of(client.persist(works))
    try:
        if enabled:
            from distributed import progress as dprogress

            with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the summary
                dprogress(futures)
        # The writes do not depend on each other: a failed one leaves the others running, so
        # wait for all of them to end (finished or failed) before reporting the first error.
        wait(futures)
        for f in futures:
            if f.status == "error":
                f.result()  # raises the task's exception here
    except BaseException:
        client.cancel(futures)
        drain(client, {f.key for f in futures}, drain_timeout)
        raise


def running_keys(dask_worker: Any) -> list[Any]:
    """Run on each worker: keys of the tasks still executing, cancelled ones included."""
    return [ts.key for ts in dask_worker.state.all_running_tasks]


def drain(client: Any, keys: set[Any], timeout: float) -> None:
    """Wait until no worker still executes one of ``keys`` (bounded). A cancelled task is
    forgotten by the scheduler at once, but its thread runs on until the write returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = client.run(running_keys)
        if not any(k in keys for ks in running.values() for k in ks):
            return
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# Output: a temporary sibling, moved into place when complete


class Target:
    """OUTPUT and its temporary sibling; local paths are renamed, URLs moved with fsspec."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.url = is_url(output)
        tag = f".dask-compact-tmp-{uuid.uuid4().hex[:12]}"
        if self.url:
            import fsspec

            self.fs, self.path = fsspec.core.url_to_fs(output)
            self.path = self.path.rstrip("/")
            parent, base = os.path.split(self.path)
            self.tmp_path = f"{parent}/.{base}{tag}" if parent else f".{base}{tag}"
            self.tmp = self.fs.unstrip_protocol(self.tmp_path)
        else:
            self.path = local(output)
            parent, base = os.path.split(self.path)
            self.tmp_path = self.tmp = os.path.join(parent, f".{base}{tag}")

    def exists(self) -> bool:
        return self.fs.exists(self.path) if self.url else os.path.lexists(self.path)

    def prepare(self) -> None:
        if not self.url:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def discard(self) -> None:
        """Remove the temporary group (a failed or interrupted job)."""
        if self.url:
            if self.fs.exists(self.tmp_path):
                self.fs.rm(self.tmp_path, recursive=True)
        else:
            shutil.rmtree(self.tmp_path, ignore_errors=True)

    def commit(self, mark_complete: Any) -> None:
        """Put the finished group at OUTPUT (replacing an existing one: --overwrite checked)."""
        if self.url:
            # Object stores have no atomic rename: move first, and only then mark the group
            # complete, so a move cut short leaves a group that does not say it is finished.
            if self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=True)
            self.fs.mv(self.tmp_path, self.path, recursive=True)
            mark_complete(self.output)
            return
        mark_complete(self.tmp)
        if not os.path.lexists(self.path):
            os.rename(self.tmp, self.path)
            return
        # rename() cannot replace a non-empty directory: move the old one aside first, so
        # OUTPUT is at every moment either the old complete group or the new one.
        old = self.tmp + "-old"
        os.rename(self.path, old)
        os.rename(self.tmp, self.path)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old)
        else:
            os.remove(old)


def check_overlap(src: Source, target: Target) -> None:
    if src.local_path is None or target.url:
        return
    a, b = os.path.realpath(src.local_path), os.path.realpath(target.path)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise click.BadParameter("OUTPUT must not be INPUT or contain it", param_hint="OUTPUT")


def write_group(
    store: str, arrays: dict[str, da.Array], attrs: dict[str, Any], chunk: int
) -> tuple[Any, list[da.Array], list[Any]]:
    """Create the group and its (empty) arrays; return the sources and targets to store."""
    import zarr

    group = zarr.open_group(store=store, mode="w-", attributes={"dask_compact": attrs})
    sources, targets = [], []
    for name, a in arrays.items():
        z = group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(max(1, chunk),))
        if a.size:
            sources.append(a)
            targets.append(z)
    return group, sources, targets


def marker(attrs: dict[str, Any]) -> Any:
    def mark_complete(store: str) -> None:
        import zarr

        group = zarr.open_group(store=store, mode="r+")
        group.attrs.update({"dask_compact": {**attrs, "complete": True}})

    return mark_complete


# ---------------------------------------------------------------------------------------------
# The command


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM (``docker stop``, a batch system's kill) unwinds like Ctrl-C: cleanup runs."""

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError("unreachable")


@click.command(name="compact", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("input_path", metavar="INPUT")
@click.argument("output_path", metavar="OUTPUT")
@click.option(
    "--where", "-w", "where", required=True, metavar="EXPR",
    help='Predicate, an expression in x, e.g. "x > 0.5" or "(x > 0.2) & ~isnan(x)".',
)
@click.option(
    "--output", "-o", "mode", type=click.Choice(["values", "indices", "both"]),
    default="values", show_default=True,
    help="Write the selected values, their global int64 flat indices (C order), or both.",
)
@click.option(
    "--scheduler", "address", metavar="ADDRESS",
    help="Address of a running dask scheduler (tcp://, tls:// with the TLS settings of the "
    "dask config or DASK_DISTRIBUTED__COMM__TLS__* variables). Default: a local cluster.",
)
@click.option("--scheduler-file", type=click.Path(exists=True, dir_okay=False),
              help="Scheduler file of a running cluster (instead of --scheduler).")
@click.option(
    "--local", "local_cluster", type=click.Choice(["auto", "threads", "processes", "cuda"]),
    default="auto", show_default=True,
    help="Local cluster without --scheduler: auto is cuda (LocalCUDACluster) where CuPy, "
    "dask-cuda and a GPU are present, else the threaded scheduler.",
)
@click.option("--workers", "n_workers", type=click.IntRange(min=1),
              help="Workers of a local processes/cuda cluster (default: per core / per GPU).")
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
    help="gpu: CuPy chunks (each worker moves its own chunks to its GPU). auto: gpu where "
    "every worker has one.",
)
@click.option("--chunks", type=click.IntRange(min=1), metavar="N",
              help="Input chunk length along the first axis (default: the Zarr chunks; "
              "about 128 MiB for .npy).")
@click.option("--output-chunks", type=click.IntRange(min=1), metavar="N",
              help="Zarr chunk length of the output arrays (default: the input chunk size).")
@click.option("--overwrite", is_flag=True, help="Replace an existing OUTPUT.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for the scheduler and its first worker.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of short error messages.")
def compact_command(
    input_path: str,
    output_path: str,
    where: str,
    mode: str,
    address: str | None,
    scheduler_file: str | None,
    local_cluster: str,
    n_workers: int | None,
    device: str,
    chunks: int | None,
    output_chunks: int | None,
    overwrite: bool,
    timeout: float,
    progress: bool | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Compact INPUT (a Zarr array or a .npy file) into the Zarr group OUTPUT.

    Writes the arrays `values` and/or `indices` (known length, int64 global flat indices
    in C order: N-D input is taken as x.ravel()). OUTPUT appears only when complete.

    \b
    Example:
      dask compact data.zarr selected.zarr --where "x > 0.5" --output both
    """
    if address and scheduler_file:
        raise click.UsageError("give --scheduler or --scheduler-file, not both")
    show = sys.stderr.isatty() if progress is None else progress
    target = Target(output_path)
    if target.exists() and not overwrite:
        raise click.UsageError(f"OUTPUT {output_path!r} exists; pass --overwrite to replace it")
    src = open_input(input_path, chunks)
    check_overlap(src, target)

    import dask_compact

    # Parse and type the predicate before any cluster starts: a bad --where costs nothing.
    try:
        dask_compact.trace(where).check(src.array.dtype)
    except (ValueError, TypeError, SyntaxError) as e:
        raise click.BadParameter(str(e), param_hint="--where") from None

    with terminate_as_exit():
        runner = start(address, scheduler_file, local_cluster, device, timeout, n_workers)
        try:
            summary = run_job(runner, src, target, where, mode, output_chunks, show, input_path)
        except (click.ClickException, click.Abort):
            raise
        except Exception as e:
            if debug:
                raise
            raise click.ClickException(f"job failed: {type(e).__name__}: {e}") from None
        finally:
            runner.close()

    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(
        f"read      {summary['elements']:,} elements of {summary['dtype']} "
        f"({fmt_bytes(summary['bytes'])}), shape {tuple(summary['shape'])}, "
        f"{summary['input_chunks']} chunks, from {input_path}\n"
        f"where     {where}\n"
        f"selected  {summary['selected']:,} ({summary['fraction']:.2%})\n"
        f"wrote     {', '.join(summary['arrays'])} to {output_path}\n"
        f"time      {summary['seconds']:.2f} s (compact {summary['compact_seconds']:.2f} s, "
        f"write {summary['write_seconds']:.2f} s), {summary['gb_per_s']:.3f} GB/s of input\n"
        f"ran on    {summary['scheduler']}"
    )


def run_job(
    runner: Runner,
    src: Source,
    target: Target,
    where: str,
    mode: str,
    output_chunks: int | None,
    show: bool,
    input_path: str,
) -> dict[str, Any]:
    import dask_compact

    x = src.array
    flat_chunk = int(max(x.chunks[0]) * np.prod(x.shape[1:], dtype=np.int64))
    chunk = output_chunks or max(1, flat_chunk)
    xin = on_gpu(x) if runner.gpu else x

    t0 = time.perf_counter()
    if show and runner.client is not None:
        click.echo(f"compacting {x.npartitions} chunks on {runner.description} ...", err=True)
    with progress(runner, show):
        # chunks=: uniform output chunks, aligned with the Zarr chunks, so that concurrent
        # chunk writes never share a Zarr chunk.
        result = dask_compact.map_compact(xin, where, output=mode, chunks=chunk)
    arrays = dict(zip(("values", "indices"), result)) if mode == "both" else {mode: result}
    arrays = {
        k: a.map_blocks(to_host, dtype=a.dtype, meta=np.empty((0,), a.dtype)) if runner.gpu else a
        for k, a in arrays.items()
    }
    selected = int(next(iter(arrays.values())).shape[0])
    t1 = time.perf_counter()

    attrs = {
        "complete": False,
        "input": input_path,
        "where": where,
        "output": mode,
        "input_shape": list(x.shape),
        "input_dtype": str(x.dtype),
        "selected": selected,
        "version": dask_compact.__version__,
    }
    target.prepare()
    try:
        _, sources, targets = write_group(target.tmp, arrays, attrs, chunk)
        if sources:
            compute(runner, da.store(sources, targets, lock=False, compute=False), show)
        target.commit(marker(attrs))
    except BaseException:
        target.discard()
        raise
    t2 = time.perf_counter()

    seconds = t2 - t0
    return {
        "input": input_path,
        "output": target.output,
        "where": where,
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "elements": int(x.size),
        "bytes": int(x.nbytes),
        "input_chunks": int(x.npartitions),
        "selected": selected,
        "fraction": selected / x.size if x.size else 0.0,
        "arrays": list(arrays),
        "seconds": seconds,
        "compact_seconds": t1 - t0,
        "write_seconds": t2 - t1,
        "gb_per_s": x.nbytes / 1e9 / seconds if seconds > 0 else 0.0,
        "scheduler": runner.description,
        "gpu": runner.gpu,
    }


main = compact_command
