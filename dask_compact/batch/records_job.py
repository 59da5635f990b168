"""The batch job on a Zarr group: ``dask compact GROUP OUTPUT --where EXPR [--fields a,b]``.

The group's arrays (its direct children) that share the number of rows (axis 0) are the
fields of a record; ``--where`` is an expression over their names, and
:func:`dask_compact.compact_records` selects the same rows of every field. The output group
holds each written field's selected rows (same dtype in native byte order, same trailing
shape) and, with ``--output both|indices``, ``indices``: the selected rows' int64 indices.

Which arrays are fields: the number of rows is that of the arrays ``--where`` and
``--fields`` name (they must agree), or, when they name none, that of most of the group's
arrays. Arrays that do not fit (another number of rows, 0-d, a dtype without a fixed size)
are left out and listed in the summary; naming one in ``--where`` or ``--fields`` is an error.

Unlike the one-array job (:mod:`.job`), this job does not stream under a memory budget:
compact_records persists the selected rows of every field it reads in the memory of the
cluster (of this process, on the threaded scheduler), and the output is written from there.
The output commits exactly as the one-array job's does (:class:`.output.Target`): a hidden
temporary group, moved into place only when complete.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import click
import numpy as np

from .inputs import check_chunks_stored, is_url, local
from .output import Target, marker
from .runner import Runner

INDICES = "indices"


# ---------------------------------------------------------------------------------------------
# The input


@dataclass
class GroupInput:
    """The fields of a Zarr group INPUT the job reads, and what it writes."""

    path: str
    local_path: str | None  # for the INPUT/OUTPUT overlap check
    rows: int
    arrays: dict[str, Any]  # name -> zarr.Array: the written fields, then the others read
    written: list[str]
    read: list[str]  # the fields the predicate reads
    ignored: dict[str, str]  # arrays of the group that are not fields, and why
    row_chunk: int | None  # --chunks: rows per input chunk of every field

    @property
    def bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())


def open_group_input(path: str) -> Any | None:
    """INPUT opened as a Zarr group, or None if it is not one (an array, a .npy file, nothing:
    :func:`.inputs.open_input` then opens it or says what is wrong)."""
    import zarr

    if path.endswith(".npy") or (not is_url(path) and not os.path.isdir(local(path))):
        return None
    try:
        node = zarr.open(store=path, mode="r")
    except Exception:  # noqa: BLE001 -- not Zarr, unreadable: open_input reports it
        return None
    return node if isinstance(node, zarr.Group) else None


def prepare(group: Any, path: str, where: str, field_list: str | None, mode: str,
            chunks: int | None, allow_missing_chunks: bool) -> GroupInput:
    """The fields of ``group`` the job reads and writes, checked: every refusal names the
    argument at fault (click's exit code 2), before any cluster starts."""
    arrays = {name: a for name, a in sorted(group.arrays())}
    if not arrays:
        raise click.BadParameter(f"{path!r} is a Zarr group with no arrays: nothing to compact",
                                 param_hint="INPUT")
    wanted = parse_field_list(field_list)
    if wanted is not None and mode == "indices":
        raise click.UsageError("--fields picks the fields to write, and --output indices "
                               "writes none of them; use --output both to write both")
    for name in wanted or ():
        if name not in arrays:
            raise click.BadParameter(
                f"{name!r} is not an array of the Zarr group {path!r} (its arrays: "
                f"{', '.join(arrays)})", param_hint="--fields")
    pred_fields = _parse(where, list(arrays), path)
    named = {**{n: "--where" for n in pred_fields}, **{n: "--fields" for n in wanted or ()}}
    rows = _rows(arrays, named, path)
    ignored: dict[str, str] = {}
    fields = []
    for name, a in arrays.items():
        why = _not_a_field(a, rows)
        if not why:
            fields.append(name)
        elif name in named:
            raise click.BadParameter(f"{name!r} cannot be a field of this record: {why}",
                                     param_hint=named[name])
        else:
            ignored[name] = why
    if not fields:
        why = "; ".join(f"{n}: {w}" for n, w in ignored.items())
        raise click.BadParameter(f"{path!r}: no array of the group can be a field ({why})",
                                 param_hint="INPUT")
    written = wanted if wanted is not None else ([] if mode == "indices" else fields)
    if mode != "values" and INDICES in written:
        raise click.BadParameter(
            f"the group has an array named {INDICES!r}, the name of the row indices that "
            f"--output {mode} writes; leave it out with --fields, or use --output values",
            param_hint="--fields")
    used = {n: arrays[n] for n in written}
    used.update({n: arrays[n] for n in pred_fields if n not in used})
    if not used:  # only indices, by a predicate that reads no field: a field gives the rows
        used[fields[0]] = arrays[fields[0]]
    _check_types(where, used)
    if not allow_missing_chunks:
        for name, a in used.items():
            check_chunks_stored(a, f"{path.rstrip('/')}/{name}")
    return GroupInput(path, None if is_url(path) else local(path), rows, used, written,
                      list(pred_fields), ignored, chunks)


def parse_field_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise click.BadParameter(f"{text!r}: empty field name (give names separated by commas, "
                                 "e.g. x,y,mass)", param_hint="--fields")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise click.BadParameter(f"{', '.join(twice)} named twice", param_hint="--fields")
    return names


def _rows(arrays: dict[str, Any], named: dict[str, str], path: str) -> int:
    """The record's number of rows: the named arrays', else most arrays'."""
    for name, option in named.items():
        if arrays[name].ndim == 0:
            raise click.BadParameter(f"{name!r} is 0-d (a scalar), not a field with rows",
                                     param_hint=option)
    lengths = {n: int(arrays[n].shape[0]) for n in named}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{n} ({named[n]}): {k:,}" for n, k in lengths.items())
        raise click.UsageError(
            f"the arrays named by --where and --fields must have the same number of rows "
            f"(axis 0) to be fields of one record; got {listed}")
    if lengths:
        return next(iter(lengths.values()))
    counts = Counter(int(a.shape[0]) for a in arrays.values() if a.ndim > 0).most_common()
    if not counts:
        raise click.BadParameter(f"{path!r}: every array of the group is 0-d; nothing to "
                                 "compact", param_hint="INPUT")
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        raise click.UsageError(
            f"the arrays of {path!r} have {counts[0][0]:,} or {counts[1][0]:,} rows, as many "
            "of each: name the fields to write with --fields")
    return counts[0][0]


def _not_a_field(a: Any, rows: int) -> str:
    """Why the array ``a`` is not a field of a record of ``rows`` rows ("" if it is one)."""
    if a.ndim == 0:
        return "0-d"
    if int(a.shape[0]) != rows:
        return f"{int(a.shape[0]):,} rows, not {rows:,}"
    dt = a.dtype
    if not isinstance(dt, np.dtype) or dt.hasobject or dt.kind == "T":
        return f"dtype {dt} (not a fixed-size type)"
    return ""


# ---------------------------------------------------------------------------------------------
# The predicate


def _parse(where: str, names: list[str], path: str) -> tuple[str, ...]:
    """The fields the predicate reads (parsed over every array name of the group)."""
    from ..predicate.fields import record_predicate

    try:
        p = record_predicate(where, tuple(names))
    except (ValueError, TypeError, SyntaxError) as e:
        raise click.BadParameter(
            f"{e} (INPUT is a Zarr group: the predicate is over its arrays' names)",
            param_hint="--where") from None
    return p.fields


def _check_types(where: str, fields: dict[str, Any]) -> None:
    """compact_records' own checks of the predicate against the fields' dtypes and shapes."""
    from ..records_check import check_record_predicate

    try:
        check_record_predicate(where, fields)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e), param_hint="--where") from None


# ---------------------------------------------------------------------------------------------
# The job


def run_records_job(runner: Runner, inp: GroupInput, target: Target, where: str, mode: str,
                    output_chunks: int | None, input_path: str,
                    overwrite: bool = False) -> dict[str, Any]:
    """Compact the fields, write them to ``target``'s temporary group and commit it; the
    summary dict."""
    import dask_compact

    from .job import process_age

    attrs = {
        "complete": False,
        "input": input_path,
        "where": where,
        "output": mode,
        "fields": inp.written,
        "input_rows": inp.rows,
        "version": dask_compact.__version__,
    }
    t0 = time.perf_counter()
    selected, results = compact(inp, where, mode)
    target.prepare()
    try:  # from here on, a failure removes the temporary group
        sources, targets = create_group(target.tmp, inp, results, selected, output_chunks, attrs)
        if selected:
            store(runner, sources, targets)
        target.commit(marker({**attrs, "selected": selected}), overwrite)
    except BaseException:
        target.discard()
        raise
    seconds = time.perf_counter() - t0
    return {
        "input": input_path,
        "input_kind": "zarr group",
        "output": target.output,
        "where": where,
        "rows": inp.rows,
        "bytes": inp.bytes,
        "selected": selected,
        "fraction": selected / inp.rows if inp.rows else 0.0,
        "fields": list(inp.written),
        "arrays": list(results),
        "read": list(inp.read),
        "ignored": dict(inp.ignored),
        "seconds": seconds,
        "process_seconds": process_age(),
        "gb_per_s": inp.bytes / 1e9 / seconds if seconds > 0 else 0.0,
        "threads": threads(runner),
        "scheduler": runner.description,
        "gpu": False,
    }


def compact(inp: GroupInput, where: str, mode: str) -> tuple[int, dict[str, Any]]:
    """The selected rows of every field to write (+ indices) as dask arrays with known chunks,
    persisted on the current scheduler; (number selected, name -> array in output order).
    With no rows, nothing runs and the arrays are None."""
    names = (inp.written if mode != "indices" else []) + ([INDICES] if mode != "values" else [])
    if inp.rows == 0:
        return 0, dict.fromkeys(names)
    import dask.array as da

    from ..records import compact_records
    from ..validate import native

    fields = {}
    for name, z in inp.arrays.items():
        chunks = z.chunks if inp.row_chunk is None else (inp.row_chunk, *z.shape[1:])
        a = da.from_zarr(z, chunks=chunks)
        if not a.dtype.isnative:  # big-endian (Zarr v2): the output is written in native order
            a = a.astype(native(a.dtype))
        fields[name] = a
    out = compact_records(fields, where, indices=mode != "values")
    result = {name: out[name] for name in names}
    return int(next(iter(out.values())).shape[0]), result


def create_group(store: str, inp: GroupInput, results: dict[str, Any], selected: int,
                 output_chunks: int | None,
                 attrs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The temporary output group with its arrays at their final shapes (zarr's default codecs,
    as the one-array job's); the dask arrays to store and the Zarr arrays they go to."""
    import zarr

    from ..validate import native

    group = zarr.open_group(store=store, mode="w-", attributes={"dask_compact": attrs})
    lead = next((n for n in inp.arrays if n in inp.read), next(iter(inp.arrays), None))
    sources, targets = [], []
    for name, a in results.items():
        z = inp.arrays.get(name)
        if z is None:  # the indices: chunked like the rows the predicate reads
            tail: tuple[int, ...] = ()
            dtype = np.dtype(np.int64)
            z = inp.arrays.get(lead) if lead is not None else None
        else:
            tail, dtype = tuple(z.shape[1:]), native(z.dtype)
        rows = output_chunks or inp.row_chunk or (int(z.chunks[0]) if z is not None else 1)
        target = group.create_array(name, shape=(selected, *tail), dtype=dtype,
                                    chunks=(max(1, rows), *[max(1, s) for s in tail]))
        if selected:
            sources.append(a.rechunk({0: max(1, rows)}))
            targets.append(target)
    return sources, targets


def store(runner: Runner, sources: list[Any], targets: list[Any]) -> None:
    """Write the arrays; returns (or raises) only once no write of theirs still runs, so that
    a failed job's late write cannot recreate its removed temporary group."""
    import dask
    import dask.array as da

    stored = da.store(sources, targets, lock=False, compute=False)
    if runner.client is None:
        from concurrent.futures import ThreadPoolExecutor

        from dask.system import CPU_COUNT

        pool = ThreadPoolExecutor(CPU_COUNT)
        try:
            with dask.config.set(pool=pool):
                dask.compute(stored, scheduler="threads")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return
    from .runner import drain

    parts = list(stored) if isinstance(stored, (tuple, list)) else [stored]
    futures = runner.client.compute(parts, optimize_graph=False)
    try:
        runner.client.gather(futures)
    except BaseException:
        runner.client.cancel(futures)
        keys = {k for part in parts for k in part.__dask_graph__().keys()}
        drain(runner.client, keys, 60.0)
        raise


def threads(runner: Runner) -> int:
    if runner.client is None:
        from dask.system import CPU_COUNT

        return int(CPU_COUNT)
    return sum(w["nthreads"] for w in runner.client.scheduler_info()["workers"].values())
