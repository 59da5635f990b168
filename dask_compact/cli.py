"""Batch job: ``dask compact INPUT OUTPUT --where EXPR`` (also ``python -m dask_compact``).

Reads a Zarr array (local path or fsspec URL) or a ``.npy`` file (memory-mapped), block of rows
by block of rows where the tasks run, and writes the selected values and/or their global int64
flat indices as arrays ``values`` / ``indices`` of the Zarr group OUTPUT, streaming under a
memory budget (:mod:`.batch.stream`; :mod:`.batch.job` runs one job). N-D input is taken in C
order, exactly like ``x.ravel()``: ``values`` is ``x[mask]`` and ``indices`` is
``np.flatnonzero(mask)``. A killed job can be continued with ``--resume``.

The output is complete or absent: everything is written to a hidden sibling of OUTPUT, and the
group is moved into place (an atomic rename on a local file system) only once the last chunk
has been written and the group attribute ``dask_compact.complete`` is true. A failed or
interrupted job removes its temporary group (one killed outright leaves it to the next job on
that OUTPUT); an existing OUTPUT is replaced only with ``--overwrite``, and only if this tool
wrote it; two jobs never write one OUTPUT at once (see :mod:`.batch.output`). Ctrl-C exits
130 and SIGTERM 143, each after the cleanup, with one line on stderr.

INPUT may also be a Zarr group: its arrays that share the number of rows are the fields of a
record, ``--where`` is an expression over their names, and OUTPUT holds each field chosen with
``--fields`` (default: all), compacted to the selected rows, plus ``indices`` with ``--output
both`` (:mod:`.batch.records_job`, on the backend of :func:`dask_compact.compact_records`).
It streams under the memory budget as the one-array job does, resumes the same way, and its
output is complete or absent in the same way.

Registered as a ``dask`` subcommand through the ``dask_cli`` entry point
(:mod:`.dask_plugin`, which runs a ``dask compact`` command line as dask's CLI imports it).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from .batch.inputs import Source
    from .batch.output import Target
    from .batch.records_job import GroupInput
    from .batch.runner import Runner

# The job's modules (and through them zarr, dask, numba, CuPy) are imported inside the command,
# once the early read and the GPU warm-up have started: those overlap the imports.

# ---------------------------------------------------------------------------------------------
# The command


def fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _signal_exits(left: Callable[[], str]) -> Iterator[None]:
    """SIGTERM unwinding like Ctrl-C for the duration, and either one exiting 130 / 143 with
    one line on stderr ending with ``left()`` (what is left at OUTPUT); an exit already so
    reported by an inner one (:class:`.batch.signals.Reported`) passes as it is."""
    from .batch.signals import EXIT_SIGINT, EXIT_SIGTERM, Reported, terminate_as_exit

    try:
        with terminate_as_exit():
            yield
    except KeyboardInterrupt:
        click.echo(f"dask compact: interrupted; {left()}", err=True)
        raise Reported(EXIT_SIGINT) from None
    except SystemExit as e:
        if e.code == EXIT_SIGTERM and not isinstance(e, Reported):
            click.echo(f"dask compact: terminated; {left()}", err=True)
            raise Reported(EXIT_SIGTERM) from None
        raise


def _signals_as_in_the_job(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with Ctrl-C and SIGTERM before its job has begun (its imports, the input's
    checks, a cluster's start) exiting 130 and 143 with one line on stderr, as during the job
    (:func:`_locked`): otherwise click printed "Aborted!" and exited 1, and SIGTERM ended the
    process without a word. Nothing is written before the job."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        with _signal_exits(lambda: "nothing was written"):
            command(*args, **kwargs)

    return run


def _input_as_read(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """INPUT as the job reads it: through fsspec's caches alone to a local path, that path
    (:func:`.batch.inputs.looked_through`), before the early read plans from it.

    Its signals as the command's (:func:`_signals_as_in_the_job`): click parses the command
    line before the command runs, and this import (NumPy, zarr's reader) is ~0.2 s of the
    start. Until 2026-12-01 (a new-user probe) a Ctrl-C there gave click's "Aborted!" and exit
    1, and SIGTERM ended the process without a word."""
    with _signal_exits(lambda: "nothing was written"):
        from .batch.inputs import looked_through

        return looked_through(value)


class _Seconds(click.FloatRange):
    """``FloatRange`` that refuses NaN, which passes every comparison of the range: until
    2026-12-01 (a new-user probe) ``--timeout nan`` failed in distributed ("Invalid time unit"),
    exit 1, and ``--no-workers-timeout nan`` was never reached."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        n = super().convert(value, param, ctx)
        if n != n:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return n


@click.command(name="compact", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("input_path", metavar="INPUT", callback=_input_as_read)
@click.argument("output_path", metavar="OUTPUT")
@click.option(
    "--where", "-w", "where", required=True, metavar="EXPR",
    help='Predicate, an expression in x, e.g. "x > 0.5" or "(x > 0.2) & ~isnan(x)"; for a '
    'Zarr group INPUT, in the names of its arrays, e.g. "(mass > 5) & (r < 2)".',
)
@click.option(
    "--output", "-o", "mode", type=click.Choice(["values", "indices", "both"]),
    default="values", show_default=True,
    help="Write the selected values, their global int64 flat indices (C order), or both. "
    "Zarr group INPUT: values writes the selected rows of the fields, both adds their int64 "
    "row indices as the array indices, indices writes only those.",
)
@click.option(
    "--fields", "field_list", metavar="A,B,...",
    help="Zarr group INPUT only: the fields to write, comma-separated (default: every array "
    "with the record's number of rows). The fields --where reads need not be written.",
)
@click.option(
    "--raw", is_flag=True,
    help="--where compares the values as stored. Without it, a field of a Zarr group INPUT "
    "that xarray decodes (scale_factor, add_offset, _FillValue, missing_value) is compared "
    "decoded, as xr.open_zarr reads it (fill values as NaN), and an array INPUT with such "
    "encodings is refused where they could change the selection (its job compares stored "
    "values only). The written values stay as stored, with those attributes, either way. "
    "A datetime64/timedelta64 field of a Zarr group INPUT is compared, with it only, as its "
    "stored int64 counts of its unit (since 1970-01-01 for dates; NaT the least int64).",
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
    help="Local cluster without --scheduler: auto is the threaded scheduler (with the GPUs of "
    "this host where CuPy and a device are present: the fastest measured); cuda starts a "
    "LocalCUDACluster, processes a LocalCluster.",
)
@click.option("--workers", "n_workers", type=click.IntRange(min=1),
              help="Workers of a local processes/cuda cluster (default: per core / per GPU).")
@click.option(
    "--device", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
    help="gpu: CuPy chunks (each worker moves its own chunks to its GPU). auto: gpu where "
    "every worker has one.",
)
@click.option("--chunks", type=click.IntRange(min=1), metavar="N",
              help="Rows each task reads along the first axis (default: whole Zarr chunks, "
              "several a task where they are small, to about dask-compact.batch.task-bytes, "
              "8 MiB; about 128 MiB for .npy; a Zarr group: its fields' longest, so grouped).")
@click.option("--output-chunks", type=click.IntRange(min=1), metavar="N",
              help="Zarr chunk length of the output arrays, in elements, never more than the "
              "whole input. Default: what one input chunk holds (its rows, or --chunks N "
              "where given, times the row length). A Zarr group's arrays: in rows; "
              "default: --chunks, else the chunks of the first field the predicate reads.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing OUTPUT, if it is a complete output of dask compact "
              "that holds nothing else (an array, file or folder added in it is named and "
              "the job refused).")
@click.option("--allow-missing-chunks", is_flag=True,
              help="Accept a Zarr INPUT with chunks missing from its store (they read as the "
              "fill value). Without it such an input is refused as possibly incomplete.")
@click.option("--memory-budget", "memory_budget", metavar="SIZE",
              help="Bytes the job may hold at once over all workers (e.g. 2GiB): each thread's "
              "chunk buffers, the chunks being read and the selections waiting to be written. "
              "Default: half of each worker's memory limit less what it holds "
              "(threads: half of the available memory).")
@click.option(
    "--decode", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
    help="Where zstd chunks are decoded. gpu: nvCOMP on the device, for chunks compacted on "
    "GPUs (where it is not possible, a line on stderr says why and the CPU decodes); auto: "
    "gpu where this process drives the GPUs (the threaded scheduler) and nvCOMP is "
    "installed, else cpu (see the README for the measurements).",
)
@click.option(
    "--encode", type=click.Choice(["auto", "cpu", "gpu"]), default="auto", show_default=True,
    help="Where output chunks are zstd-encoded. gpu: nvCOMP on the device, for chunks "
    "compacted on GPUs (where it is not possible, a line on stderr says why and the CPU "
    "encodes); auto: where gpu would be chosen for --decode auto, each chunk goes to nvCOMP "
    "or to the writer's CPU thread, whichever the rates measured so far in the job expect to "
    "be done sooner; else cpu.",
)
@click.option("--read-ahead/--no-read-ahead", default=True, show_default=True,
              help="Decode the input's first chunks while the command starts (a local Zarr "
              "array of zarr's default codecs, chunks decoded and compacted in this process); "
              "within the memory budget.")
@click.option("--read-ahead-threads", type=click.IntRange(min=1), metavar="N",
              help="Threads of the early read (default: one per core but one, at most 8).")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted job on OUTPUT (same arguments) from its manifest "
              "of written chunks; starts afresh if there is none, and exits 0 if an "
              "identical job already completed OUTPUT.")
@click.option("--timeout", type=_Seconds(min=0.1), default=10.0, show_default=True,
              help="Seconds to wait for the scheduler and its first worker.")
@click.option("--no-workers-timeout", type=_Seconds(min=0.1), metavar="SECONDS",
              help="On a cluster (--scheduler, --local processes|cuda): fail the job once the "
              "cluster has had no workers for this long (exit 1, what was written kept for "
              "--resume), as distributed's setting scheduler.no-workers-timeout fails tasks. "
              "Default: wait for workers, saying so on stderr after 30 s.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of short error messages.")
@click.version_option(package_name="dask-compact", prog_name="dask compact")
@_signals_as_in_the_job
def compact_command(
    input_path: str,
    output_path: str,
    where: str,
    mode: str,
    field_list: str | None,
    raw: bool,
    address: str | None,
    scheduler_file: str | None,
    local_cluster: str,
    n_workers: int | None,
    device: str,
    chunks: int | None,
    output_chunks: int | None,
    overwrite: bool,
    allow_missing_chunks: bool,
    memory_budget: str | None,
    decode: str,
    encode: str,
    read_ahead: bool,
    read_ahead_threads: int | None,
    resume: bool,
    timeout: float,
    no_workers_timeout: float | None,
    progress: bool | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Compact INPUT (a Zarr array, a .npy file or a Zarr group) into the Zarr group OUTPUT.

    Writes the arrays `values` and/or `indices` (known length, int64 global flat indices
    in C order: N-D input is taken as x.ravel()). OUTPUT appears only when complete.

    INPUT may be a Zarr group: its arrays that share the number of rows (axis 0) are the
    fields of a record, --where is over their names, and OUTPUT gets the selected rows of
    each field (--fields picks which) plus `indices` with --output both. Arrays with another
    number of rows (coordinates along other dimensions) are copied unchanged. It streams,
    resumes and compacts on GPUs as an array's job does; its fields are decoded and encoded
    on CPUs.

    \b
    Examples:
      dask compact data.zarr selected.zarr --where "x > 0.5" --output both
      dask compact particles.zarr sel.zarr --where "(mass > 5) & (x < 0.3)" \\
          --fields x,y,z,id --output both
    """
    if address and scheduler_file:
        raise click.UsageError("give --scheduler or --scheduler-file, not both")
    _check_where_to_run(bool(address or scheduler_file), local_cluster, n_workers,
                        no_workers_timeout)
    # the budget read first: a bad one is said at once, not after the wait for the scheduler
    # file (up to --timeout; until 2026-12-01, thirteenth session, a review)
    budget = _parse_budget(memory_budget)
    if scheduler_file is not None:
        _check_scheduler_file(scheduler_file, timeout)
    ctx = click.get_current_context()
    # The entry-point scan, the early read of the first chunks and the GPU warm-up start now,
    # in the background, while the imports and the set-up below go on (see .batch.head_start).
    from .batch.head_start import HeadStart

    head = HeadStart(dict(ctx.params), budget)
    ctx.call_on_close(head.close)
    warmup = head.warmup
    try:
        import zarr  # noqa: F401 -- the output is always a Zarr group: fail before any work
    except ImportError as e:
        raise click.ClickException(_zarr_missing(e)) from None
    from .batch.output import end_zarr_io_at_exit

    end_zarr_io_at_exit()  # no traceback of zarr's at the exit, whatever the job's end
    from . import settings

    try:  # a bad dask-compact.* setting stops the job here, named, not in a chunk task
        settings.check()
    except settings.SettingError as e:
        raise click.ClickException(str(e)) from None
    from .batch.inputs import open_input
    from .batch.job import describe, layout_of
    from .batch.output import Target, check_overlap
    from .batch.records_job import describe as describe_records
    from .batch.records_job import open_group_input, prepare

    show = sys.stderr.isatty() if progress is None else progress
    where_to_run = (address, scheduler_file, local_cluster, device, timeout, n_workers,
                    no_workers_timeout)
    group = open_group_input(input_path)
    if group is not None:
        _refuse_for_groups(decode, encode)
        inp = prepare(group, input_path, where, field_list, mode, chunks, allow_missing_chunks,
                      raw)
        target = Target(output_path)
        check_overlap(inp, target)

        def group_job() -> dict[str, Any]:
            continued = _resumed(target, overwrite, resume, lambda: describe_records(
                inp, where, mode, output_chunks), _earlier_group_job)
            return run_group(target, inp, where, mode, output_chunks, show, input_path,
                             overwrite, debug, where_to_run, budget, continued)

        summary = _locked(target, overwrite, group_job)
        click.echo(json.dumps(summary) if as_json else _group_text(summary))
        _end_after_dask_cli(ctx)
        return
    # The cheap checks first, each naming the argument at fault: INPUT, then --where against
    # its dtype, then what is at OUTPUT (under its lock, so no other job can change that).
    src = open_input(input_path, chunks, allow_missing_chunks)
    if field_list is not None:
        raise click.UsageError("--fields applies to a Zarr group INPUT (the fields to write); "
                               f"{input_path!r} is an array")
    _refuse_decoded_array(src, input_path, where, raw)
    target = Target(output_path)
    check_overlap(src, target)

    import dask_compact

    # Parse and type the predicate before any cluster starts: a bad --where costs nothing.
    try:
        dask_compact.trace(where).check(src.dtype)
    except (ValueError, TypeError, SyntaxError) as e:
        raise click.BadParameter(str(e), param_hint="--where") from None
    if warmup is not None and src.size:
        warmup.prepare(where, src.dtype, mode, chunks=layout_of(src, None).nchunks)

    def job() -> dict[str, Any]:
        continued = _resumed(target, overwrite, resume,
                             lambda: describe(src, where, mode, output_chunks),
                             lambda job: _earlier_array_job(src, job))
        return run(target, src, where, mode, output_chunks, show, input_path, overwrite, debug,
                   where_to_run, budget, continued, decode, encode)

    summary = _locked(target, overwrite, job)
    if warmup is not None and "timeline" in summary:
        summary["timeline"].update(warmup.timeline())
    click.echo(json.dumps(summary) if as_json else _array_text(summary, input_path, where))
    _end_after_dask_cli(ctx)


def _chunks_words(summary: dict[str, Any]) -> str:
    """"N chunks", and the tasks that read them where a task reads several."""
    chunks, tasks = summary["input_chunks"], summary["tasks"]
    return f"{chunks:,} chunks" + (f" in {tasks:,} tasks" if tasks != chunks else "")


def _array_text(summary: dict[str, Any], input_path: str, where: str) -> str:
    return (
        f"read      {summary['elements']:,} elements of {summary['dtype']} "
        f"({fmt_bytes(summary['bytes'])}), shape {tuple(summary['shape'])}, "
        f"{_chunks_words(summary)}, from {input_path}\n"
        f"where     {where}\n"
        + _encoded_line(summary["encoded"], summary.get("not_decoded"))
        + _job_lines(summary, f", {'GPU' if summary['gpu_decode'] else 'CPU'} decode, "
                     f"{_encode_words(summary)} encode")
        + _ahead_line(summary.get("read_ahead"))
    )


def _encode_words(summary: dict[str, Any]) -> str:
    if summary["encode"] != "gpu":
        return "CPU"
    if not summary.get("encode_shared"):
        return "GPU"
    return f"GPU ({summary['gpu_encoded']} chunks) and CPU"


def _ahead_line(ahead: dict[str, Any] | None) -> str:
    if not ahead or not ahead["chunks"]:
        return ""
    return (f"\nahead     {ahead['chunks']} chunks ({fmt_bytes(ahead['bytes'])}) decoded while "
            "the command started")


def _locked(target: Target, overwrite: bool, job: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``job()`` under OUTPUT's lock, SIGTERM unwinding like Ctrl-C; an interrupt exits 130
    (143 for SIGTERM) with one line on stderr saying what was left at OUTPUT."""
    with _signal_exits(lambda: _left(target)):
        target.acquire()
        try:
            return job()
        finally:
            target.release()


Earlier = list[tuple[dict[str, Any], str]]


def _resumed(target: Target, overwrite: bool, resume: bool,
             describe_job: Callable[[], dict[str, Any]],
             earlier: Callable[[dict[str, Any]], Earlier] = lambda job: []) -> Any:
    """Under the lock: the manifest of the interrupted job to continue (``--resume``; None if
    there is none, said on stderr), then what killed jobs left cleaned and OUTPUT checked.
    ``earlier(job)``: the job as earlier versions described it, and what to say of an
    interrupted job of that form (:meth:`.batch.output.Target.resumable`)."""
    def say(line: str) -> None:
        click.echo(f"dask compact: {line}", err=True)

    job = describe_job() if resume else None
    continued = target.resumable(job, earlier(job), say) if job is not None else None
    target.clean_stale(say)
    if job is not None and continued is None and not overwrite and target.exists():
        _finished_already(target, job)
    target.check_replaceable(overwrite)
    if resume and continued is None and not target.started_over:
        click.echo(f"dask compact: no interrupted job on {target.output} to resume; starting "
                   "afresh", err=True)
    return continued


def _earlier_group_job(job: dict[str, Any]) -> Earlier:
    """A group job whose --where reads CF-encoded fields, as described before they were read
    decoded (2026-11-30: no "decoded"): that job compared the stored values, which --raw
    does, and gives the same identity."""
    if "decoded" not in job:
        return []
    listed = ", ".join(job["decoded"])
    return [({k: v for k, v in job.items() if k != "decoded"},
             f"compared the stored values of {listed} (it ran before --where read the fields "
             "that xarray decodes as xarray decodes them): add --raw to continue it as it "
             "ran, or run without --resume to start over comparing the decoded values")]


def _earlier_array_job(src: Source, job: dict[str, Any]) -> Earlier:
    """A .npy job as described before the file's device and inode were part of its identity
    (2026-11-30, .batch.reader.npy_fingerprint): it cannot be continued."""
    from .batch.reader import NpyRows, npy_fingerprint_before_inode

    if not isinstance(src.reader, NpyRows):
        return []
    try:
        before = npy_fingerprint_before_inode(src.reader.path)
    except OSError:
        return []
    return [({**job, "input": before},
             "was started by an earlier version, which identified a .npy INPUT without the "
             "file's inode (a file moved over it went unseen): it cannot be resumed; run "
             "without --resume to start over")]


def _finished_already(target: Target, job: dict[str, Any]) -> None:
    """``--resume`` with no interrupted job and OUTPUT there (a job killed after its commit,
    or run again by a script): exit 0 saying so where an identical job wrote OUTPUT (what
    the resume was for is done, and a script that repeats ``--resume`` until it succeeds
    ends), else the usual refusal, saying that OUTPUT is another job's. (It said "OUTPUT
    exists; pass --overwrite", as if the job had not run.)"""
    from .batch.output import finished_identity, job_identity

    if finished_identity(target.path) == job_identity(job):
        click.echo(f"dask compact: {target.output} is already complete: an identical job "
                   "finished it, and there is nothing to resume", err=True)
        raise click.exceptions.Exit(0)
    raise click.UsageError(
        f"OUTPUT {target.output!r} exists and there is no interrupted job on it to resume; "
        "it was written by another job (other arguments or input, or an earlier version): "
        "pass --overwrite to replace it")


def _refuse_decoded_array(src: Source, input_path: str, where: str, raw: bool) -> None:
    """Refuse an array INPUT whose values xarray decodes (.batch.cf: fill values as NaN,
    scale_factor/add_offset) unless --raw says that --where is over the stored numbers: the
    one-array job compares those only (decoding there is not done: its GPU decode, early read
    and compile-ahead paths take the stored values), and a user's "x > 300" on a packed
    temperature had compared the packed integers, with a note after the job. A group INPUT
    compares the decoded values. Not refused where the decoding cannot change the selection
    (.batch.cf.selects_alike: a float array's fill value that the condition treats as it
    treats NaN, e.g. "x > 0.3" of a fill value 0: the note stays)."""
    from .batch.cf import Decoding, selects_alike

    if raw or not isinstance(src.cf, Decoding) or selects_alike(where, src.cf, src.dtype):
        return
    group_form = ""
    if len(src.shape) == 1 and not is_url_like(input_path):
        parent, _, name = input_path.rstrip("/").rpartition("/")
        if parent and name.isidentifier():
            group_form = (f", or give its group as INPUT, whose job compares the values as "
                          f"xarray decodes them: dask compact {parent} OUTPUT --where "
                          f"'<condition on {name}>' --fields {name}")
    raise click.UsageError(
        f"{input_path!r} holds values that xarray decodes ({', '.join(src.cf.applied)}), and "
        "--where on an array INPUT compares the values as stored (packed numbers, fill "
        f"values as numbers): pass --raw to compare those{group_form}")


def is_url_like(path: str) -> bool:
    """Whether ``path`` is a URL (the group form of the hint above is for local paths)."""
    return "://" in path or "::" in path


def _refuse_for_groups(decode: str, encode: str) -> None:
    """The options of the one-array job that a Zarr group INPUT cannot honour: nvCOMP decodes
    and encodes one array's chunks on the device; a record's fields are decoded and encoded on
    CPUs (they may still be compacted on GPUs)."""
    refused = [option for option, given in (("--decode gpu", decode == "gpu"),
                                            ("--encode gpu", encode == "gpu")) if given]
    if refused:
        raise click.UsageError(
            f"{', '.join(refused)}: not supported for a Zarr group INPUT (its fields are "
            "decoded and encoded on CPUs); leave "
            f"{'it' if len(refused) == 1 else 'them'} out")


def _check_scheduler_file(path: str, timeout: float) -> None:
    """Refuse a scheduler file that holds no scheduler address within ``timeout`` (a starting
    scheduler opens the file before it writes it). Until 2026-12-01 (a new-user probe) one
    without (empty, not JSON, no "address") ended in distributed's bare ``AssertionError``, a
    traceback and exit 1: its Client reads the file for 0.1 s, then connects to None."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                if isinstance(json.load(f)["address"], str):
                    return
        except (ValueError, KeyError, TypeError, OSError):
            pass
        if time.monotonic() > deadline:
            raise click.BadParameter(
                f"{path!r} is not a scheduler file: no scheduler address in it after "
                f"{timeout:g} s (a JSON object with the scheduler's \"address\", as dask "
                f"scheduler --scheduler-file writes it)", param_hint="--scheduler-file")
        time.sleep(0.05)


def _check_where_to_run(running: bool, local_cluster: str, n_workers: int | None,
                        no_workers_timeout: float | None = None) -> None:
    """Refuse options that would be ignored (a probe's --workers 3 ran on the threaded
    scheduler without a word): --local and --workers start a local cluster, which a running
    one (--scheduler, --scheduler-file) replaces, --workers sizes only a processes or
    cuda cluster, and --no-workers-timeout watches a cluster's workers."""
    if no_workers_timeout is not None and not (running
                                               or local_cluster in ("processes", "cuda")):
        raise click.UsageError(f"--no-workers-timeout applies to a cluster's workers "
                               f"(--scheduler, --local processes or cuda); the job runs on "
                               f"--local {local_cluster} (threads)")
    if running and local_cluster != "auto":
        raise click.UsageError(f"--local {local_cluster} starts a local cluster, and "
                               "--scheduler/--scheduler-file names a running one: give one")
    if n_workers is not None and (running or local_cluster not in ("processes", "cuda")):
        where = "a running cluster" if running else f"--local {local_cluster} (threads)"
        raise click.UsageError(f"--workers sizes a local cluster of processes or GPUs "
                               f"(--local processes or cuda); the job runs on {where}")


def _group_text(summary: dict[str, Any]) -> str:
    used = len(set(summary["fields"]) | set(summary["read"]))
    ignored = ", ".join(f"{n} ({why})" for n, why in summary["ignored"].items())
    return (
        f"read      {summary['rows']:,} rows of {used} fields ({fmt_bytes(summary['bytes'])}), "
        f"{_chunks_words(summary)}, from the Zarr group {summary['input']}\n"
        + (f"ignored   {ignored}: not fields of the record\n" if ignored else "")
        + (f"kept      {', '.join(summary['kept'])}: copied unchanged (not along the "
           "record's rows)\n" if summary["kept"] else "")
        + f"where     {summary['where']}\n"
        + _decoded_line(summary["decoded"])
        + "".join(f"counted   {n}: --raw compares its stored int64 counts of {what}\n"
                  for n, what in summary.get("counted", {}).items())
        + _encoded_line(summary["encoded"], summary["not_decoded"])
        + _job_lines(summary, "")
    )


def _decoded_line(decoded: dict[str, list[str]]) -> str:
    """The fields --where compares decoded, as xarray reads them (see .batch.cf)."""
    if not decoded:
        return ""
    listed = ", ".join(f"{n} ({', '.join(e)})" for n, e in decoded.items())
    return (f"decoded   {listed}: --where compares the values as xarray decodes them (fill "
            "values as NaN); written as stored (--raw: compare the stored values)\n")


def _encoded_line(encoded: dict[str, list[str]], why: dict[str, str] | None = None) -> str:
    """A note where --where reads fields that xarray would decode and the job compares as
    stored (see .batch.inputs.xarray_encodings; ``why``: the reason per field, --raw or
    what .batch.cf does not decode)."""
    if not encoded:
        return ""
    why = why or {}
    listed = ", ".join(f"{n} ({', '.join(e)}{'; ' + why[n] if why.get(n) else ''})"
                       for n, e in encoded.items())
    return (f"note      --where compares the stored values, which xarray decodes for {listed}: "
            "write the condition on the stored numbers (e.g. x != -999 for a fill value)\n")


def _job_lines(summary: dict[str, Any], codecs: str) -> str:
    """The summary's lines from "selected" on, shared by both jobs (``codecs``: what the
    "ran on" line adds)."""
    return (
        f"selected  {summary['selected']:,} ({summary['fraction']:.2%})\n"
        f"wrote     {', '.join(summary['arrays'])} to {summary['output']}\n"
        f"time      {summary['seconds']:.2f} s, {summary['gb_per_s']:.3f} GB/s of input; "
        f"task time {_split_line(summary)}\n"
        f"memory    budget {fmt_bytes(summary['memory_budget'])}, at most "
        f"{fmt_bytes(summary['in_flight'])} in flight{_over_budget(summary)}; peak per process "
        f"{_peaks(summary['peak_memory'])}\n"
        f"ran on    {summary['scheduler']}, {summary['threads']} threads, "
        f"{'compacted on GPUs' if summary['gpu'] else 'compacted on CPUs'}{codecs}"
        + (f"\nresumed   from input chunk {summary['resumed_from_chunk']}"
           if summary["resumed_from_chunk"] is not None else "")
    )


def _over_budget(summary: dict[str, Any]) -> str:
    """Why the job held more than its budget: the budget is below the least it can run in
    (every thread's buffers, a chunk being read and the pieces of one output chunk). That
    least is given as the plan's estimate (``plan.job_minimum``), an upper one (it counts a
    waiting piece at up to 4x its selection), so it may exceed what the job held: the line
    says which number is which. (It said "at most 2.0 MB in flight (above the budget: this
    job needs at least 2.3 MB", the two read as contradicting each other: a docs probe,
    2026-11-30.)"""
    if summary["in_flight"] <= summary["memory_budget"]:
        return ""
    return (" (above the budget, which is below the least this job can run in: its threads' "
            "chunk buffers, a chunk's selection and the pieces of an output chunk, up to "
            f"{fmt_bytes(summary['job_minimum'])} by the plan's estimate; raise "
            "--memory-budget, or write smaller input or output chunks)")


def _split_line(summary: dict[str, Any]) -> str:
    t = summary["task_seconds"]
    return ", ".join(f"{k} {v:.2f} s" for k, v in t.items())


def _peaks(peaks: dict[str, int]) -> str:
    if not peaks:
        return "unknown"
    return ", ".join(fmt_bytes(v) for v in peaks.values())


def _zarr_missing(e: ImportError) -> str:
    """What to say when zarr cannot be imported: not installed, or installed but broken (zarr
    <= 3.1.3 imports crc32c, which nothing installs with numcodecs >= 0.16.4)."""
    import importlib.util

    if e.name == "zarr" or importlib.util.find_spec("zarr") is None:
        return f"dask compact writes Zarr and needs the zarr package ({e}); pip install zarr"
    return (f"dask compact writes Zarr, and the installed zarr package cannot be imported "
            f"({type(e).__name__}: {e}); pip install 'zarr>=3.1.4'")


def _parse_budget(text: str | None) -> int | None:
    if text is None:
        return None
    from .settings import byte_string

    try:
        n = byte_string(text)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(f"{text!r} is not a size ({e})",
                                 param_hint="--memory-budget") from None
    if n <= 0:
        raise click.BadParameter("must be positive", param_hint="--memory-budget")
    return int(n)


def _left(target: Target) -> str:
    if not target.committed:
        return f"{target.output} was not written"
    if target.old_left is not None:  # interrupted while removing the output it replaced
        return (f"{target.output} had been written completely; the old output it replaced "
                f"is left at {target.old_left} (the next job on OUTPUT removes it)")
    return f"{target.output} had been written completely"


def run(
    target: Target,
    src: Source,
    where: str,
    mode: str,
    output_chunks: int | None,
    show: bool,
    input_path: str,
    overwrite: bool,
    debug: bool,
    where_to_run: tuple[Any, ...],
    budget: int | None = None,
    continued: Any = None,
    decode: str = "cpu",
    encode: str = "cpu",
) -> dict[str, Any]:
    """Start the scheduler, run the job, stop what was started; short messages for failures."""
    from .batch.job import run_job
    from .batch.runner import Runner, start

    if src.size == 0:
        # Nothing to read or compact: no cluster, just the empty arrays.
        return run_job(Runner("no scheduler (empty input)"), src, target, where, mode,
                       output_chunks, False, input_path, overwrite, budget, continued, "cpu",
                       "cpu")
    return _on(start(*where_to_run), debug, lambda runner: run_job(
        runner, src, target, where, mode, output_chunks, show, input_path, overwrite, budget,
        continued, decode, encode))


def run_group(
    target: Target,
    inp: GroupInput,
    where: str,
    mode: str,
    output_chunks: int | None,
    show: bool,
    input_path: str,
    overwrite: bool,
    debug: bool,
    where_to_run: tuple[Any, ...],
    budget: int | None = None,
    continued: Any = None,
) -> dict[str, Any]:
    """The job on a Zarr group INPUT (:mod:`.batch.records_job`), as :func:`run` runs one on
    an array."""
    from .batch.records_job import run_records_job
    from .batch.runner import Runner, start

    if inp.rows == 0:
        return run_records_job(Runner("no scheduler (empty input)"), inp, target, where, mode,
                               output_chunks, input_path, overwrite, False, budget, continued)
    return _on(start(*where_to_run), debug, lambda r: run_records_job(
        r, inp, target, where, mode, output_chunks, input_path, overwrite, show, budget,
        continued))


def _on(runner: Runner, debug: bool, job: Callable[[Runner], dict[str, Any]]) -> dict[str, Any]:
    """``job(runner)``, then stop what the runner started; short messages for failures."""
    try:
        return job(runner)
    except (click.ClickException, click.Abort, KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        if debug:
            raise
        raise click.ClickException(f"job failed: {type(e).__name__}: {e}") from None
    finally:
        runner.close()


main = compact_command


def script(prog_name: str = "dask-compact") -> None:
    """The process entry of the ``dask-compact`` script and of ``python -m dask_compact``: the
    command, then the process ends at once with its exit code (:func:`_end_process`)."""
    try:
        main(prog_name=prog_name)  # click's standalone mode: ends by raising SystemExit
        code: Any = 0
    except SystemExit as e:
        code = e.code
    _end_process(code)
    sys.exit(code)  # a local cluster's processes still ending: the ordinary exit joins them


def _end_process(code: Any) -> None:
    """End the process at once with exit code ``code`` (``os._exit``), its output flushed;
    returns instead while a local cluster's processes are still ending.

    Everything the command does is finished by then: the output committed or removed, the
    cluster or thread pool stopped, the files closed. What an ordinary exit would add is the
    interpreter's teardown of every module and object (numba's and llvmlite's among them),
    which measured 0.22-0.25 s of a 2 s command on the 2-core CI machine."""
    import multiprocessing
    import os

    if multiprocessing.active_children():
        return
    _remove_cache_folders()
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _remove_cache_folders() -> None:
    """Remove the temporary folders of fsspec's caches in this process (``simplecache::`` and
    ``blockcache::`` in front of a remote INPUT keep there a full copy of what the job read),
    as fsspec's own finalizers would at the interpreter's exit, which ``os._exit`` skips: a
    probe found them left in the temporary directory after every such command. Only the
    folders fsspec made itself (``cache_storage="TMP"``, its default), by running the
    finalizers it registered for them; a cache folder that the user configured is kept."""
    import weakref

    cached = sys.modules.get("fsspec.implementations.cached")
    remove = getattr(getattr(cached, "CachingFileSystem", None), "_remove_tempdir", None)
    if remove is None:  # fsspec's caches never loaded (or no longer made this way)
        return
    _run_cache_finalizers(list(getattr(weakref.finalize, "_registry", {})), remove)


def _run_cache_finalizers(finalizers: list[Any], remove: Any) -> None:
    """Run those of ``finalizers`` (``weakref.finalize`` objects) that call fsspec's
    ``remove`` of a cache folder, and make sure each such folder is gone."""
    import os
    import shutil
    import time

    folders = []
    for finalizer in finalizers:
        registered = finalizer.peek()  # (object, function, args, kwargs); None once run
        if registered is not None and registered[1] is remove:
            folders.extend(registered[2][:1])
            finalizer()
    # fsspec's removal swallows its errors: a thread of the job still writing a block into
    # the folder (an early read, on a command refused as it ran) made it "not empty" and
    # left it (once in a CI run on the 2-core machine); so again until it is gone. Such a
    # thread (zarr's I/O still reading through the cache after the refusal of a
    # `blockcache::memory://` INPUT) can also write into it again just after: the folder was
    # left once more in a CI run of 2026-12-06. So the folders are watched until none has
    # come back for _QUIET seconds (at most _WATCH): only a command whose INPUT has such a
    # cache pays it.
    if not folders:
        return
    start = quiet_since = time.monotonic()
    while True:
        back = [f for f in folders if os.path.isdir(f)]
        for folder in back:
            shutil.rmtree(folder, ignore_errors=True)
        now = time.monotonic()
        if back:
            quiet_since = now
        elif now - quiet_since >= _QUIET or now - start >= _WATCH:
            return
        time.sleep(0.005)


# How long the cache folders removed at the command's end must stay gone, and the longest the
# command watches them (_run_cache_finalizers)
_QUIET = 0.05
_WATCH = 0.5


def _end_after_dask_cli(ctx: click.Context) -> None:
    """After a successful ``dask compact``, end the process as the script does, once dask's
    CLI has closed its contexts (the last thing it does: ``dask.cli.run_cli`` runs one
    command and its standalone mode then exits). Under any other caller (a test's runner, a
    program calling the command) nothing changes."""
    root = ctx.find_root()
    dask_cli = sys.modules.get("dask.cli")
    if root is not ctx and dask_cli is not None and root.command is getattr(dask_cli, "cli",
                                                                           None):
        root.call_on_close(lambda: _end_process(0))

