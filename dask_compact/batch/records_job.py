"""The batch job on a Zarr group: ``dask compact GROUP OUTPUT --where EXPR [--fields a,b]``.

The group's arrays (its direct children) that share the number of rows (axis 0) are the
fields of a record; ``--where`` is an expression over their names, and
:func:`dask_compact.compact_records` selects the same rows of every field. The output group
holds each written field's selected rows (same dtype in native byte order, same trailing
shape) and, with ``--output both|indices``, ``indices``: the selected rows' int64 indices.

Which arrays are fields: the number of rows is that of the arrays ``--where`` and
``--fields`` name (they must agree), or, when they name none, that of most of the group's
arrays. Arrays that do not fit (another number of rows, 0-d, a dtype without a fixed size) are not
fields; naming one in ``--where`` or ``--fields`` is an error. Those without the record's rows
(0-d, or another length: a coordinate along another dimension, a calibration table) are copied
into the output unchanged, as xarray's Dataset keeps a variable without the dimension it
selects along (with ``--fields``, only those a written field names as one of its dimensions or
coordinates); the rest are left out and listed in the summary.

The job streams as the one-array job does (:mod:`.stream`): blocks of rows are read, the
rows selected by the record predicate (:func:`.record_tasks.read_compact_records`, the
in-memory backend of :func:`dask_compact.compact_records`, on the CPU or the worker's GPU),
and each output chunk written at its offset, with at most the memory budget in flight; the
same resume manifest, progress bar and summary. An element of the streaming job is one row of
the record. The output commits exactly as the one-array job's does (:class:`.output.Target`):
a hidden temporary group, moved into place only when complete.
"""

from __future__ import annotations

import keyword
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np

from .. import settings
from .cf import FILL_ATTRS, Decoding, decoding, fill_compared
from .inputs import (
    check_chunks_stored,
    dimension_names,
    is_url,
    local,
    member_url,
    refuse_unknown_chain,
    refuse_unsafe_cache,
    uncached,
    user_attributes,
    xarray_encodings,
)
from .job import writes_chunk_files
from .manifest import Manifest, made_files
from .output import Target, job_identity, where_key
from .plan import INDEX_BYTES, Layout, row_bytes, task_rows, writes_per_task
from .reader import Reader, ZarrRows, chunk_files_reader, zarr_fingerprint
from .record_tasks import INDICES, RecordReader, read_compact_records
from .runner import Runner
from .stream import Job
from .tasks import OutputArrays

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
    kept: dict[str, Any]  # not fields, copied unchanged
    row_chunk: int | None  # --chunks: rows per input chunk of every field
    allow_missing: bool = False  # --allow-missing-chunks: a missing chunk reads as fill value
    attrs: dict[str, Any] = field(default_factory=dict)  # the group's own attributes
    dim: str | None = None  # the record's dimension, where its arrays name theirs
    # the fields --where reads as xarray decodes them (CF), and how (see .cf)
    decoded: dict[str, Decoding] = field(default_factory=dict)
    # the fields --where reads as stored although xarray decodes them: encodings -> why
    not_decoded: dict[str, str] = field(default_factory=dict)
    # the time fields --where reads under --raw, as their stored int64 counts (also in
    # decoded, as the int64 they are read as): name -> what they count
    counted: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays.values())

    @property
    def url(self) -> str | None:
        """An fsspec INPUT's URL (for the INPUT/OUTPUT overlap check), None for a local one."""
        return None if self.local_path is not None else self.path


def open_group_input(path: str) -> Any | None:
    """INPUT opened as a Zarr group, or None if it is not one (an array, a .npy file, nothing:
    :func:`.inputs.open_input` then opens it or says what is wrong)."""
    import zarr

    refuse_unknown_chain(path, "INPUT")
    refuse_unsafe_cache(path)
    if path.endswith(".npy") or (not is_url(path) and not os.path.isdir(local(path))):
        return None
    try:
        # Each array's own metadata, not the group's consolidated copy: that copy is not
        # updated when an array is resized or added later (a new-user probe: 30,007 rows
        # read of 35,007 on disk, an added field missing, and the job said it was complete)
        return zarr.open_group(store=path if is_url(path) else local(path), mode="r",
                               use_consolidated=False)
    except Exception:  # noqa: BLE001 -- an array, not Zarr, unreadable: open_input's part
        return None


def _holds_arrays(group: Any) -> bool:
    """Whether a Zarr group holds an array, at any depth."""
    return (next(group.arrays(), None) is not None
            or any(_holds_arrays(g) for _, g in group.groups()))


def prepare(group: Any, path: str, where: str, field_list: str | None, mode: str,
            chunks: int | None, allow_missing_chunks: bool, raw: bool = False) -> GroupInput:
    """The fields of ``group`` the job reads and writes, checked: every refusal names the
    argument at fault (click's exit code 2), before any cluster starts. ``raw``: the
    predicate compares the stored values (``--raw``), else those xarray decodes
    (:func:`predicate_decoding`)."""
    arrays = {name: a for name, a in sorted(group.arrays())}
    if not arrays:
        # its groups named: until 2026-12-01 (a new-user probe) a group holding its arrays in
        # a subgroup was refused without a word of where they are
        subgroups = sorted(group.groups(), key=lambda t: t[0])
        groups = [name for name, _ in subgroups]
        # the example one that holds arrays (the first by name could be empty, and its own
        # refusal then named nothing: until 2026-12-01, thirteenth session), else one that
        # holds them deeper (whose refusal names its own subgroups; until 2026-12-01,
        # fourteenth session, the first by name, empty)
        example = next((name for name, g in subgroups if next(g.arrays(), None) is not None),
                       None)
        if example is None:
            example = next((name for name, g in subgroups if _holds_arrays(g)),
                           groups[0] if groups else None)
        hint = (f" (its groups: {', '.join(groups)}; give one as INPUT, e.g. "
                f"{member_url(path, example)})" if example is not None else "")
        raise click.BadParameter(f"{path!r} is a Zarr group with no arrays{hint}: nothing to "
                                 f"compact", param_hint="INPUT")
    wanted = parse_field_list(field_list)
    if wanted is not None and mode == "indices":
        raise click.UsageError("--fields picks the fields to write, and --output indices "
                               "writes none of them; use --output both to write both")
    held = {name for name, _ in group.groups()}  # the subgroups
    for name in wanted or ():
        if name not in arrays:
            # a subgroup, or an array in it by path: its arrays are no fields of this record
            # (until 2026-12-02, seventeenth session, a new-user probe, not a word of it)
            sub = name.split("/")[0]
            hint = (f"; {sub!r} is a subgroup, whose arrays are not fields of this record: "
                    f"give it as INPUT to compact its own, e.g. {member_url(path, sub)}"
                    if sub in held else "")
            raise click.BadParameter(
                f"{name!r} is not an array of the Zarr group {path!r} (its arrays: "
                f"{', '.join(arrays)}){hint}", param_hint="--fields")
    pred_fields = _parse(where, list(arrays), path)
    named = {**{n: "--where" for n in pred_fields}, **{n: "--fields" for n in wanted or ()}}
    rows = _rows(arrays, named, path)
    lead = _record_dimension(arrays, named, rows, path)
    ignored: dict[str, str] = {name: "a group: not read" for name, _ in sorted(group.groups())}
    fields = []
    for name, a in arrays.items():
        why = _not_a_field(a, rows, lead)
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
    if wanted is None:
        written = [] if mode == "indices" else fields
    else:  # the coordinates of the fields picked come with them, as xarray's ds[[...]] keeps
        written = wanted + [n for n in _coordinates(arrays, wanted)
                            if n in fields and n not in wanted and n not in pred_fields
                            and n != INDICES]
    if mode != "values" and INDICES in pred_fields:
        raise click.BadParameter(
            f"--where reads the group's array {INDICES!r}, the name of the row indices that "
            f"--output {mode} writes; use --output values, or rename the array",
            param_hint="--where")
    if mode != "values" and INDICES in written:
        raise click.BadParameter(
            f"the group has an array named {INDICES!r}, the name of the row indices that "
            f"--output {mode} writes; leave it out with --fields, or use --output values",
            param_hint="--fields")
    kept = _kept(arrays, ignored, rows, lead, wanted, written, mode)
    for name in kept:
        del ignored[name]
    used = {n: arrays[n] for n in written}
    used.update({n: arrays[n] for n in pred_fields if n not in used})
    if not used:  # only indices, by a predicate that reads no field: a field gives the rows
        used[fields[0]] = arrays[fields[0]]
    _refuse_rows_of_many_values(pred_fields, arrays, fields)
    counted = _time_counts(pred_fields, used, raw)
    decoded, not_decoded = predicate_decoding(
        used, tuple(n for n in pred_fields if n not in counted), raw)
    decoded.update({n: Decoding((), None, None, None, np.dtype(np.int64), ()) for n in counted})
    _check_types(where, used, decoded)
    _refuse_fill_values(where, decoded)
    if not allow_missing_chunks:
        for name, a in {**used, **kept}.items():
            check_chunks_stored(a, member_url(path, name))  # a URL that opens it
    return GroupInput(path, None if is_url(path) else local(path), rows, used, written,
                      list(pred_fields), ignored, kept, chunks, allow_missing_chunks,
                      dict(group.attrs), lead, decoded, not_decoded, counted)


_UNIT_WORDS = {"Y": "years", "M": "months", "W": "weeks", "D": "days", "h": "hours",
               "m": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
               "ns": "nanoseconds", "ps": "picoseconds", "fs": "femtoseconds",
               "as": "attoseconds"}
NAT = int(np.iinfo(np.int64).min)  # NaT's int64, as stored


def _time_counts(pred_fields: tuple[str, ...], arrays: dict[str, Any], raw: bool
                 ) -> dict[str, str]:
    """The datetime64/timedelta64 fields ``--where`` reads, each with what its stored int64
    counts (``seconds since 1970-01-01T00:00:00``): under ``--raw`` the predicate compares
    those counts (the values as stored; the record loop compares numbers, not times). Without
    it, refused saying so, with the count of an example time. Until 2026-12-02 (seventeenth
    session, the sixteenth's leftover) the refusal was compact_records', "datetime64 and
    timedelta64 arrays are taken by map_compact, compact, ...", no way out on the command
    line."""
    counted: dict[str, str] = {}
    for name in pred_fields:
        dtype = np.dtype(arrays[name].dtype).newbyteorder("=")
        if dtype.kind not in "mM":
            if not raw:
                _refuse_cf_time(name, arrays[name])
            continue
        unit, step = np.datetime_data(dtype)
        what = _UNIT_WORDS.get(unit, unit) if step == 1 else f"steps of {step} {unit}"
        if dtype.kind == "M":
            what += " since 1970-01-01T00:00:00"
            example = np.datetime64("2020-01-01").astype(dtype)
            rows = "after"
        else:
            example = np.timedelta64(3, "h").astype(dtype)
            if example.astype("m8[h]") != np.timedelta64(3, "h"):  # a coarser unit
                example = np.ones(1, np.int64).view(dtype)[0]  # one of its unit
            rows = "longer than"
        counted[name] = what
        if not raw:
            count = int(example.astype(np.int64))
            raise click.BadParameter(
                f"it reads {name!r}, of dtype {dtype}: --where compares numbers, not times. "
                f"With --raw it compares {name}'s stored int64 counts of {what} (NaT stored "
                f"as {NAT}), e.g. --raw --where \"{name} > {count}\" for the rows {rows} "
                f"{example}; a < or <= comparison keeps the NaT rows unless it adds "
                f"& ({name} != {NAT}). --raw compares every field --where reads as stored",
                param_hint="--where")
    return counted


def _refuse_cf_time(name: str, z: Any) -> None:
    """Refuse, without ``--raw``, a ``--where`` on a field that xarray decodes to times from
    its CF attributes (``units: "days since 2000-01-01"``, or a time unit with ``dtype:
    "timedelta64[ns]"``: how xarray writes every datetime64 and timedelta64 variable), as a
    datetime64 field is refused (:func:`_time_counts`), naming the stored count of an example.
    Until 2026-12-07 (forty-seventh session, a new-user probe) such a field was compared as
    its stored counts with a note only: ``time2 > 1577836800`` (seconds since 1970) selected
    nothing from counts of days since 2000, and ``time > 1577836800`` on xarray's default
    microseconds since 1970 everything."""
    from .cf import cf_time

    attrs = dict(z.attrs)
    time = cf_time(attrs)
    if time is None:
        return
    nat = attrs.get("_FillValue", NAT)
    example: Any
    at: Any
    if time.kind == "M":
        what = (f"stored as counts of {time.units!r} (its CF units, which xr.open_zarr "
                "decodes to datetime64)")
        example, at, rows = np.datetime64("2020-01-01", "ns"), time.epoch, "after 2020-01-01"
    else:
        what = (f"stored as counts of {time.units} (units and dtype {attrs.get('dtype')!r} in "
                "its attributes, which xr.open_zarr decodes to timedelta64)")
        example, at, rows = np.timedelta64(3, "h"), np.timedelta64(0, "h"), "longer than 3 hours"
    hint = ""
    if time.unit is not None and at is not None:
        count = (example - at) / np.timedelta64(1, time.unit)  # type: ignore[call-overload]
        shown = int(count) if float(count).is_integer() else float(count)
        hint = f", e.g. --raw --where \"{name} > {shown}\" for the rows {rows}"
    raise click.BadParameter(
        f"it reads {name!r}, {what}: --where compares numbers, not times. With --raw it "
        f"compares {name}'s stored counts{hint}; NaT is stored as {nat}, which a < or <= "
        f"comparison keeps unless it adds & ({name} != {nat}). --raw compares every field "
        "--where reads as stored", param_hint="--where")


def predicate_decoding(arrays: dict[str, Any], pred_fields: tuple[str, ...], raw: bool
                       ) -> tuple[dict[str, Decoding], dict[str, str]]:
    """The fields the predicate reads that it sees decoded as ``xr.open_zarr`` decodes them
    (:func:`.cf.decoding`: fill values as NaN, ``scale_factor``/``add_offset`` applied), and
    those it compares as stored although xarray decodes them, with why (the summary's note):
    all of them under ``raw``. A user's ``t > 300`` on a packed temperature meant the
    degrees: the packed integers were compared (docs/design.md, CF-encoded fields)."""
    decoded: dict[str, Decoding] = {}
    not_decoded: dict[str, str] = {}
    for name in pred_fields:
        how = decoding(arrays[name])
        if how is None:
            continue
        if raw:
            not_decoded[name] = "--raw"
        elif isinstance(how, str):
            not_decoded[name] = how
        else:
            decoded[name] = how
    return decoded, not_decoded


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
    rows = _agreed(lengths, named, "have the same number of rows (axis 0)")
    if rows is not None:
        return int(rows)
    if all(a.ndim == 0 for a in arrays.values()):
        raise click.BadParameter(f"{path!r}: every array of the group is 0-d; nothing to "
                                 "compact", param_hint="INPUT")
    return int(_most_common([int(a.shape[0]) for a in arrays.values() if a.ndim > 0], path,
                            lambda a, b: f"have {a:,} or {b:,} rows"))


def _record_dimension(arrays: dict[str, Any], named: dict[str, str], rows: int,
                      path: str) -> str | None:
    """The name of the record's dimension, where the arrays have dimension names (xarray's):
    the leading one of the arrays ``--where`` and ``--fields`` name, else the most common
    leading one of the arrays of ``rows`` rows; None where none is named. Two dimensions of
    one length (100 events and 100 channels) are then told apart: a probe's channel
    coordinate was cut along its axis 0 as if it were an event field."""
    leads = {n: d[0] for n in named if (d := dimension_names(arrays[n]))}
    lead = _agreed(leads, named, "lie along one dimension (their first)")
    if leads:
        return lead
    return _most_common([d[0] for a in arrays.values() if a.ndim and int(a.shape[0]) == rows
                         and (d := dimension_names(a))], path,
                        lambda a, b: f"with {rows:,} rows lie along {a!r} or {b!r}")


def _agreed(values: dict[str, Any], named: dict[str, str], must: str) -> Any:
    """The value every array named by --where and --fields has (``values``: name -> value),
    None where none is named; UsageError listing them where they differ (``must``: what
    fields of one record share)."""
    if len(set(values.values())) > 1:
        listed = ", ".join(f"{n} ({named[n]}): {v:,}" if isinstance(v, int) else
                           f"{n} ({named[n]}): {v!r}" for n, v in values.items())
        raise click.UsageError(f"the arrays named by --where and --fields must {must} to be "
                               f"fields of one record; got {listed}")
    return next(iter(values.values()), None)


def _most_common(values: list, path: str, either: Callable[[Any, Any], str]) -> Any:
    """The most common of ``values`` (None if there are none); UsageError where two are as
    common (``either(a, b)`` says what the arrays of ``path`` then are)."""
    counts = Counter(values).most_common()
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        raise click.UsageError(f"the arrays of {path!r} {either(counts[0][0], counts[1][0])}, "
                               "as many of each: name the fields to write with --fields")
    return counts[0][0] if counts else None


def _coordinates(arrays: dict[str, Any], names: list[str]) -> list[str]:
    """The arrays the arrays ``names`` name as a dimension or in xarray's ``coordinates``
    attribute (a Dataset's coordinates), in the group's order."""
    named: set[str] = set()
    for n in names:
        named.update(dimension_names(arrays[n]) or ())
        coords = arrays[n].attrs.get("coordinates")
        named.update(coords.split() if isinstance(coords, str) else ())
    return [n for n in arrays if n in named]


def _not_a_field(a: Any, rows: int, lead: str | None) -> str:
    """Why the array ``a`` is not a field of a record of ``rows`` rows along the dimension
    ``lead`` (None: not named) ("" if it is one)."""
    if a.ndim == 0:
        return "0-d"
    dims = dimension_names(a)
    if lead is not None and dims is not None and dims[0] != lead:
        if lead in dims:
            return (f"{lead!r} is its axis {dims.index(lead)}, not its first: rows are selected "
                    "along axis 0 only")
        return f"along {dims[0]!r}, not {lead!r}"
    if int(a.shape[0]) != rows:
        return f"{int(a.shape[0]):,} rows, not {rows:,}"
    dt = a.dtype
    if not isinstance(dt, np.dtype) or dt.hasobject or dt.kind == "T":
        return f"dtype {dt} (not a fixed-size type)"
    return ""


def _kept(arrays: dict[str, Any], ignored: dict[str, str], rows: int, lead: str | None,
          wanted: list[str] | None, written: list[str], mode: str) -> dict[str, Any]:
    """The arrays that are not fields and go to the output unchanged: those not along the
    record's dimension (0-d, or without ``lead`` among their dimension names; without names,
    another length along axis 0), with ``--fields`` only those the written fields name as a
    dimension or in xarray's ``coordinates`` attribute; none with ``--output indices``. One
    named ``indices`` stays out where the job writes its own (the summary says so)."""
    if mode == "indices":
        return {}
    names = [n for n in ignored if n in arrays and _off_the_record(arrays[n], rows, lead)]
    if wanted is not None:
        coordinates = set(_coordinates(arrays, written))
        names = [n for n in names if n in coordinates]
    if mode != "values" and INDICES in names:
        names.remove(INDICES)
        ignored[INDICES] += f"; not copied: --output {mode} writes the row indices there"
    return {n: arrays[n] for n in names}


def _off_the_record(a: Any, rows: int, lead: str | None) -> bool:
    """Whether ``a`` has no axis along the record's rows, so that the selected record keeps it
    as it is."""
    if a.ndim == 0:
        return True
    dims = dimension_names(a)
    if lead is not None and dims is not None:
        return lead not in dims
    return int(a.shape[0]) != rows


# ---------------------------------------------------------------------------------------------
# The predicate


def _parse(where: str, names: list[str], path: str) -> tuple[str, ...]:
    """The fields the predicate reads (parsed over every array name of the group)."""
    from ..predicate.fields import record_predicate

    try:
        p = record_predicate(where, tuple(names))
    except (ValueError, TypeError, SyntaxError) as e:
        odd = [n for n in names if not n.isidentifier() or keyword.iskeyword(n)]
        note = (f"; {', '.join(map(repr, odd))} cannot be named in it (not a Python name), "
                "but can be written with --fields" if odd else "")
        raise click.BadParameter(
            f"{e} (INPUT is a Zarr group: the predicate is over its arrays' names{note})",
            param_hint="--where") from None
    return p.fields


def _refuse_rows_of_many_values(pred_fields: tuple[str, ...], arrays: dict[str, Any],
                                fields: list[str]) -> None:
    """Refuse a predicate that reads a field of more than one value per row, with what a user
    of the command can do. (compact_records' own refusal suggests Python, ``fields['vel_0'] =
    vel[:, 0]``, which a command line cannot do: a docs probe, 2026-11-30.)"""
    for name in pred_fields:
        a = arrays[name]
        if a.ndim == 1:
            continue
        usable = [n for n in fields if arrays[n].ndim == 1]
        listed = f"this group's: {', '.join(usable)}" if usable else "this group has none"
        raise click.BadParameter(
            f"{name!r} has shape {tuple(a.shape)}, more than one value per row: --where reads "
            f"only 1-D fields ({listed}). To select on a column of {name!r}, store that column "
            f"in the group as a 1-D array of its own first; {name!r} itself can still be "
            "written (--fields), only not read by --where", param_hint="--where")


def _refuse_fill_values(where: str, decoded: dict[str, Decoding]) -> None:
    """Refuse a predicate that compares a decoded field with one of its fill values
    (:func:`.cf.fill_compared`): written on the stored numbers, as the command advised
    before it decoded ("x != -999 for a fill value"), it now reads NaN there and selects
    other rows, exit 0 (a review's ``ffl != -999``: 8 rows before, 10 after). The one-array
    job refuses the same way (cli._refuse_decoded_array)."""
    for name, how in decoded.items():
        value = fill_compared(where, name, how)
        if value is None:
            continue
        attrs = ", ".join(a for a in how.applied if a in FILL_ATTRS)
        raise click.BadParameter(
            f"it compares {name!r} with {value:g}, a fill value of {name!r} ({attrs}): "
            f"--where reads {name!r} decoded, as xr.open_zarr gives it, where fill values "
            f"are NaN and no row is {value:g}; write isnan({name}) or ~isnan({name}) for the "
            "rows with or without a value, or pass --raw to compare the stored numbers",
            param_hint="--where")


def _check_types(where: str, fields: dict[str, Any],
                 decoded: dict[str, Decoding] | None = None) -> None:
    """compact_records' own checks of the predicate against the fields' dtypes and shapes,
    a decoded field's dtype the decoded one (``isnan(t)`` of a packed int16 is allowed)."""
    from ..records_check import check_record_predicate

    seen = dict(fields)
    for name, how in (decoded or {}).items():
        seen[name] = np.empty((0, *fields[name].shape[1:]), how.dtype)
    try:
        check_record_predicate(where, seen)
    except (ValueError, TypeError) as e:
        # "t & 1" of a packed int16: the predicate reads it decoded, a float
        listed = ", ".join(f"{n} as {how.dtype} (stored {np.dtype(fields[n].dtype)})"
                           for n, how in (decoded or {}).items())
        note = (f" (--where reads {listed}, decoded as xarray decodes it; --raw compares "
                "the stored values)" if listed else "")
        raise click.BadParameter(f"{e}{note}", param_hint="--where") from None


# ---------------------------------------------------------------------------------------------
# The job


def record_reader(inp: GroupInput) -> RecordReader:
    """A reader of every field the job uses: zstd chunk files read directly where the field's
    layout allows (:func:`.reader.chunk_files_reader`), else through zarr."""
    fields: dict[str, Reader] = {}
    for name, z in inp.arrays.items():
        url = _array_url(inp, name)
        fingerprint = zarr_fingerprint(z, url)
        fast, _ = chunk_files_reader(z, url, fingerprint, inp.allow_missing)
        fields[name] = fast or ZarrRows(url, z.shape, z.dtype, fingerprint)
    return RecordReader(fields, tuple(inp.written), dict(inp.decoded))


def _array_url(inp: GroupInput, name: str) -> str:
    return (member_url(inp.path, name) if is_url(inp.path)
            else os.path.join(local(inp.path), name))


def copied_fingerprint(inp: GroupInput) -> str:
    """What identifies the parts of the input the job copies as they are: the group's
    attributes and the arrays kept unchanged (as :func:`.reader.zarr_fingerprint` identifies a
    field). A resumed job copies neither again (its temporary group got them when it was
    made): a probe changed a kept array and a group attribute between a kill and
    ``--resume``, and the resumed output had the old ones."""
    import json

    from dask.base import tokenize

    attrs = json.dumps(inp.attrs, sort_keys=True, default=repr)
    return tokenize(attrs, *[(name, zarr_fingerprint(z, _array_url(inp, name)))
                             for name, z in inp.kept.items()])


def identity_now(inp: GroupInput) -> tuple[dict[str, str], str]:
    """(:class:`.record_tasks.RecordReader`'s fingerprint, :func:`copied_fingerprint`) of the
    group as it is now, opened again (its arrays' metadata, not the copies read at the
    start, nor a cache's in front: :func:`.inputs.uncached`); an array gone or no longer a
    Zarr array gives a fingerprint that differs."""
    import dataclasses

    import zarr

    group = zarr.open_group(store=uncached(inp.path) if is_url(inp.path) else local(inp.path),
                            mode="r", use_consolidated=False)

    def now(name: str) -> Any:
        try:
            return group[name]
        except KeyError:
            return None

    fields = {name: "" if (z := now(name)) is None else zarr_fingerprint(z, _array_url(inp, name))
              for name in inp.arrays}
    kept = {name: now(name) for name in inp.kept}
    if any(z is None for z in kept.values()):
        return fields, ""
    return fields, copied_fingerprint(dataclasses.replace(inp, kept=kept,
                                                          attrs=dict(group.attrs)))


def row_chunk(inp: GroupInput) -> int:
    """Rows per input chunk: ``--chunks``, else whole multiples of the longest Zarr chunk (along
    axis 0) of the fields read (one, or several small ones: :func:`.plan.task_rows`), so that
    each chunk of every field is decoded once, or twice where it straddles two input chunks
    (fields chunked alike, the usual case, are read chunk by chunk)."""
    if inp.row_chunk:
        return inp.row_chunk
    rows = longest_chunk(inp)
    # several such chunks a task where they are small (.plan.task_rows), by the bytes of a
    # row of every field read
    return task_rows(rows, sum(row_bytes(a.shape, a.dtype) for a in inp.arrays.values()),
                     inp.rows,
                     settings.get("batch.task-bytes"))


def longest_chunk(inp: GroupInput) -> int:
    """The longest Zarr chunk along the rows of the fields read."""
    return max(1, max(int(z.chunks[0]) for z in inp.arrays.values()))


def out_chunk_rows(inp: GroupInput, output_chunks: int | None) -> int:
    """Rows per output chunk: ``--output-chunks``, else ``--chunks``, else the Zarr chunks of
    the first field the predicate reads (as :func:`dask_compact.compact_records` aligns a
    record), else of the first field."""
    if output_chunks or inp.row_chunk:
        rows = int(output_chunks or inp.row_chunk)  # type: ignore[arg-type]
    else:
        lead = next((n for n in inp.arrays if n in inp.read), next(iter(inp.arrays)))
        rows = int(inp.arrays[lead].chunks[0])
    # never longer than the input, as Layout.make caps it: the job's description says what
    # is written
    return max(1, min(rows, inp.rows))


def output_names(inp: GroupInput, mode: str) -> tuple[str, ...]:
    return tuple((inp.written if mode != "indices" else []) + ([INDICES] if mode != "values"
                                                               else []))


def layout_of(inp: GroupInput, mode: str, output_chunks: int | None) -> Layout:
    """The job's geometry in rows: an element of :class:`.plan.Layout` is one row here. A
    chunk's cost before its count is known is its rows of every field read, plus the selection
    of every written field at its worst (all rows), plus the indices."""
    read = sum(row_bytes(a.shape, a.dtype) for a in inp.arrays.values())
    written = (sum(row_bytes(inp.arrays[n].shape, inp.arrays[n].dtype) for n in inp.written)
               if mode != "indices" else 0)
    out = written + (INDEX_BYTES if mode != "values" else 0)
    return Layout.make((inp.rows,), read, row_chunk(inp), out_chunk_rows(inp, output_chunks),
                       out_elem_bytes=out)


def describe(inp: GroupInput, where: str, mode: str, output_chunks: int | None,
             reader: RecordReader | None = None) -> dict[str, Any]:
    """What a resumed job must share with the interrupted one (see :mod:`.manifest`);
    ``reader``: the job's, if made already (its fingerprints stat every field)."""
    import dask_compact

    return {
        "input": (reader or record_reader(inp)).fingerprint,
        "rows": inp.rows,
        "fields": list(inp.written),
        "kept": list(inp.kept),
        "copied": copied_fingerprint(inp),  # the kept arrays and the group's attributes
        "where": where_key(where),
        "output": mode,
        "row_chunk": row_chunk(inp),
        "out_chunk": out_chunk_rows(inp, output_chunks),
        "version": dask_compact.__version__,
        # how the predicate's fields decode changes the selection (only where one does: the
        # identity of a job on fields without CF encodings stays what it was)
        # (the time fields' int64 counts are what --raw reads: no earlier job read them
        # otherwise, see cli._earlier_group_job)
        **({"decoded": {n: repr(d) for n, d in inp.decoded.items() if n not in inp.counted}}
           if set(inp.decoded) - set(inp.counted) else {}),
    }


def run_records_job(runner: Runner, inp: GroupInput, target: Target, where: str, mode: str,
                    output_chunks: int | None, input_path: str, overwrite: bool = False,
                    show: bool = False, budget: int | None = None,
                    resume: Manifest | None = None) -> dict[str, Any]:
    """Stream the record's rows through the job (:mod:`.stream`) into ``target``'s temporary
    group and commit it; the summary dict. ``resume``: the manifest of the interrupted job
    whose group ``target.tmp`` now names."""
    import dask_compact

    from .job import (
        continued,
        input_unchanged,
        process_age,
        stream_and_commit,
        stream_summary,
        task_device,
    )
    from .runner import memory_budget

    layout = layout_of(inp, mode, output_chunks)
    names = output_names(inp, mode)
    reader = record_reader(inp)
    job_desc = describe(inp, where, mode, output_chunks, reader)
    attrs = {
        "complete": False,
        "input": input_path,
        "where": where,
        "output": mode,
        "fields": inp.written,
        "input_rows": inp.rows,
        "version": dask_compact.__version__,
        "job": job_identity(job_desc),  # see cli._finished_already
    }
    if not budget:
        budget = memory_budget(runner)
    t0 = time.perf_counter()

    def make_job() -> Job:
        if resume is None:
            create_group(target.tmp, inp, names, layout.out_chunk, attrs)
            manifest = Manifest(job_desc, made={} if target.url else made_files(target.tmp),
                                lengths=dict.fromkeys(names, layout.n))
        else:
            manifest = continued(resume, layout)
        direct = writes_chunk_files(target.tmp, names)
        return Job(
            reader=reader, layout=layout, where=where, mode=mode, device=task_device(runner),
            dest=OutputArrays(target.tmp, names, layout.out_chunk, direct), budget=budget,
            manifest=manifest, manifest_dir=None if target.url else target.tmp,
            task=read_compact_records,
            writes_per_task=writes_per_task(layout, mode, settings.get("batch.task-bytes")),
        )

    before = (reader.fingerprint, job_desc["copied"])
    job, selected, threads = stream_and_commit(
        runner, target, make_job, names, show, inp.bytes, attrs, overwrite,
        input_unchanged(before, lambda: identity_now(inp)), inp.local_path)
    seconds = time.perf_counter() - t0
    return {
        "input": input_path,
        "input_kind": "zarr group",
        "output": target.output,
        "where": where,
        "rows": inp.rows,
        "bytes": inp.bytes,
        # the longest field chunks along the rows (--chunks: its blocks), and the tasks that
        # read them (several small chunks a task, .plan.task_rows)
        "input_chunks": layout.nchunks if inp.row_chunk else -(-inp.rows // longest_chunk(inp)),
        "tasks": layout.nchunks,
        "selected": selected,
        "fraction": selected / inp.rows if inp.rows else 0.0,
        "fields": list(inp.written),
        "arrays": list(names),
        "read": list(inp.read),
        "ignored": dict(inp.ignored),
        "kept": list(inp.kept),
        "encoded": {n: e for n in inp.not_decoded if (e := xarray_encodings(user_attributes(
            inp.arrays[n])))},
        "not_decoded": dict(inp.not_decoded),
        "decoded": {n: list(d.applied) for n, d in inp.decoded.items()
                    if n not in inp.counted},
        "counted": dict(inp.counted),
        "seconds": seconds,
        "process_seconds": process_age(),
        "gb_per_s": inp.bytes / 1e9 / seconds if seconds > 0 else 0.0,
        **stream_summary(job, runner, threads),
        "resumed_from_chunk": job.stats.resumed_from_chunk if resume is not None else None,
    }


def create_group(store: str, inp: GroupInput, names: tuple[str, ...], out_chunk: int,
                 attrs: dict[str, Any]) -> None:
    """The temporary output group with its arrays at the input's rows (cut to the selection's
    at the end), chunked ``out_chunk`` rows along axis 0 and whole along trailing axes, with
    zarr's default codecs (as the one-array job's)."""
    import zarr

    from ..validate import native

    # The input's attributes and dimension names go with the fields (xarray's Datasets need
    # them: xr.open_zarr refused an output without; a new-user probe), the group's with it
    group = zarr.open_group(store=store, mode="w-",
                            attributes={**inp.attrs, "dask_compact": attrs})
    for name in names:
        if name == INDICES and name not in inp.written:
            tail: tuple[int, ...] = ()
            dtype = np.dtype(np.int64)
            meta: dict[str, Any] = {"dimension_names": (inp.dim,)} if inp.dim else {}
        else:
            z = inp.arrays[name]
            tail, dtype = tuple(z.shape[1:]), native(z.dtype)
            meta = {"attributes": user_attributes(z)}
            if dims := dimension_names(z):
                meta["dimension_names"] = dims
        group.create_array(name, shape=(inp.rows, *tail), dtype=dtype,
                           chunks=(max(1, out_chunk), *[max(1, s) for s in tail]), **meta)
    for name, z in inp.kept.items():
        _copy_array(group, name, z)


def _copy_array(group: Any, name: str, z: Any) -> None:
    """The Zarr array ``z`` copied into ``group`` as it is (dtype, chunks, fill value,
    attributes, dimension names), a block of its chunks along axis 0 at a time."""
    import warnings

    dims = dimension_names(z)
    with warnings.catch_warnings():
        if z.metadata.zarr_format == 3:
            # zarr's warning that a dtype (fixed-length strings: xarray's coordinate labels)
            # has no format 3 specification: the input was written with it already
            warnings.filterwarnings("ignore", "The data type .* does not have a Zarr V3")
        out = group.create_array(name, shape=z.shape, dtype=z.dtype, chunks=z.chunks,
                                 fill_value=z.fill_value, attributes=user_attributes(z),
                                 **({"dimension_names": dims} if dims else {}))
    if z.ndim == 0:
        out[...] = z[...]
        return
    step = max(1, int(z.chunks[0]))
    for start in range(0, int(z.shape[0]), step):
        out[start:start + step] = z[start:start + step]
