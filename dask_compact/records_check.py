"""Argument checks of :func:`dask_compact.compact_records`: the fields, their alignment, and
the predicate over them, all before anything runs (docs/design.md, Records)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .predicate.core import NotElementwise, Predicate, check_sample
from .predicate.fields import record_mask, record_predicate
from .validate import (
    _module_of,
    check_apart,
    check_chunk_type,
    check_dask_input,
    check_dtype,
    check_stream,
    frame_object,
    in_memory,
    is_dask_array,
    native,
    other_order_dtype,
    overlaps,
    refuse_masked_out,
    xarray_object,
)

__all__ = ["checked_fields", "check_record_predicate", "check_into", "field_source",
           "field_label", "INDICES"]

logger = logging.getLogger("dask_compact")

INDICES = "indices"  # the key of the global row indices in the result


def checked_fields(fields: Any, indices: bool, fn: str = "compact_records",
                   labels: dict[str, str] | None = None
                   ) -> tuple[dict[str, Any], bool]:  # fmt: skip
    """The fields as a dict (mapping order kept) and whether they are dask arrays; ``fn``,
    the public call, names the call in the errors, ``labels`` the fields where the caller
    named them otherwise (:func:`field_label`).

    TypeError: not a mapping, names that are not strings, values that are not arrays, dask
    arrays mixed with in-memory ones, NumPy with CuPy, object dtypes, masked arrays.
    ValueError: no fields, 0-d fields, rows (axis 0) of different lengths, a field named
    ``indices`` when indices are asked for; dask fields of unknown row chunk sizes beside
    fields of another number of row chunks, or of unknown sizes along a trailing axis
    (:func:`_check_rows`).
    """
    if not isinstance(fields, Mapping):
        raise TypeError(
            "fields must be a mapping of name -> array (e.g. a dict), not "
            f"{frame_object(fields) or type(fields).__name__}"
        )
    out = dict(fields)
    if not out:
        raise ValueError(f"{fn} needs at least one field")
    for name in out:
        if not isinstance(name, str) or not name:
            raise TypeError(f"field names must be non-empty strings, not {name!r}")
    if indices and INDICES in out:
        raise ValueError(
            f"a field is named {INDICES!r}, the key the row indices are returned under; "
            "rename the field or pass indices=False"
        )
    for name, a in out.items():  # before the mix check, which would call it in-memory
        xarray = xarray_object(a)
        if xarray is not None:
            raise TypeError(f"compact_records (field {name!r}) takes arrays, not {xarray}")
    kinds = {is_dask_array(a) for a in out.values()}
    if len(kinds) > 1:
        raise TypeError(
            "fields mix dask arrays and in-memory arrays; wrap the in-memory ones with "
            "dask.array.from_array(...) (or compute the dask ones)"
        )
    lazy = kinds.pop()
    modules = set()
    for name, a in out.items():
        if isinstance(a, (bool, int, float, complex, np.generic)):
            # a single value: its conversion, np.asarray, gave a 0-d array, refused in turn
            # (until 2026-12-02, sixteenth session, a refusal probe)
            raise TypeError(f"field {name!r} is a single value ({type(a).__name__}), "
                            f"not an array of rows; {_one_value(name)}")
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            # the conversion named (until 2026-12-01, fourteenth session, only "not an
            # array": a new-user probe)
            raise TypeError(f"field {name!r} is a {type(a).__name__}, not an array; convert "
                            f"it first, e.g. np.asarray({field_source(name)})")
        if not lazy:
            a = out[name] = in_memory(a)
        label = field_label(name, labels)
        if lazy:
            check_dask_input(a, label)
        like = a._meta if lazy else a
        check_chunk_type(like, f"{fn} ({label})", in_memory=not lazy,
                         source=field_source(name))
        modules.add(_module_of(like))
        if a.dtype.kind == "T":
            raise TypeError(_variable_width_strings(name, a.dtype))
        if a.dtype.hasobject:
            raise TypeError(f"field {name!r} has dtype {a.dtype}: objects cannot be compacted")
        if a.ndim == 0:
            raise ValueError(f"field {name!r} is 0-d; every field has rows along axis 0: "
                             f"{_one_value(name)}")
    if len(modules) > 1:
        raise TypeError(
            "fields mix NumPy and CuPy arrays (or chunks); use one array type for a record"
        )
    _check_rows(out, labels)
    if not lazy and len(modules) == 1 and modules.pop() == "cupy":
        devices = {a.device.id for a in out.values()}
        if len(devices) > 1:
            raise ValueError(f"fields are on several devices ({sorted(devices)}); use one")
    return out, lazy


def _check_rows(fields: dict[str, Any], labels: dict[str, str] | None) -> None:
    """ValueError unless the fields' rows (axis 0) can be paired: fields of known lengths
    have the same length; where any dask field's row chunk sizes are unknown (nan: a boolean
    selection's, ``x[m]``, or a Dask DataFrame column's ``to_dask_array()``), every field
    has the same number of row chunks, since the fields are then paired chunk by chunk (no
    rechunk can move rows whose counts are unknown; each chunk's task checks that its
    fields' rows agree, ``records_graph.records_block``). A trailing axis must be of known
    size: it is put in one chunk (``records_graph.aligned``), which Dask refuses to do
    where it is not ("Chunks must be unchanging along dimensions with missing values")."""
    lengths = {name: a.shape[0] for name, a in fields.items()}
    for name, a in fields.items():
        axis = next((i for i, s in enumerate(a.shape[1:], 1) if math.isnan(s)), None)
        if axis is not None:
            raise ValueError(
                f"{field_label(name, labels)} has unknown sizes along axis {axis} (shape "
                f"{a.shape}): only a field's rows (axis 0) may be of unknown sizes, since its "
                f"other axes are put in one chunk; call {field_source(name)}"
                ".compute_chunk_sizes() first"
            )
    unknown = [name for name, n in lengths.items() if math.isnan(n)]
    known = {name: n for name, n in lengths.items() if not math.isnan(n)}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{k}: {'unknown' if k in unknown else v}"
                           for k, v in lengths.items())
        raise ValueError(f"fields must have the same number of rows (axis 0); got {listed}")
    blocks = {name: len(a.chunks[0]) for name, a in fields.items()} if unknown else {}
    if len(set(blocks.values())) > 1:
        listed = ", ".join(f"{field_label(k, labels)}: {v}" for k, v in blocks.items())
        raise ValueError(
            f"{' and '.join(field_label(k, labels) for k in unknown)} "
            f"{'has' if len(unknown) == 1 else 'have'} unknown row chunk sizes, so the fields "
            "are paired chunk by chunk (rows whose counts are unknown cannot be rechunked to "
            "align), which needs the same number of row chunks in every field; got "
            f"{listed}. Make the fields from one selection of arrays chunked alike (x[m] "
            "and y[m] with one mask m), or call compute_chunk_sizes() on them first"
        )
    rows = {name: fields[name].chunks[0] for name in known} if unknown else {}
    if len(set(rows.values())) > 1:  # paired chunk by chunk, they must cut the same rows
        listed = ", ".join(f"{field_label(k, labels)}: {v}" for k, v in rows.items())
        raise ValueError(
            "fields of known sizes beside fields of unknown row chunk sizes are paired with "
            "them chunk by chunk, so they must be chunked alike along their rows; got "
            f"{listed}. Rechunk them to one chunking, or call compute_chunk_sizes() on the "
            "others"
        )


def field_label(name: str, labels: dict[str, str] | None) -> str:
    """How a message names field ``name``: its label where the caller gave one (the xarray
    accessor: ``variable 'energy'``, ``cond``), else ``field 'name'``."""
    label = labels.get(name) if labels else None
    return label if label is not None else f"field {name!r}"


def _one_value(name: str) -> str:
    """What to do with a field of one value: a constant goes in the predicate; as a field,
    it is repeated for every row."""
    c = field_source(name)
    return (f"a constant goes in the predicate (`lambda b: b > {c}`), and a field of it "
            f"repeats it for every row (`np.full(n, {c})`, n the other fields' rows)")


def field_source(name: str) -> str:
    """A field as a message's advice names it: by its name where that is a Python name
    (the variable a caller likely holds it in, as :func:`_variable_width_strings` names
    it), else as the mapping's item."""
    return name if name.isidentifier() else f"fields[{name!r}]"


def _variable_width_strings(name: str, dtype: np.dtype) -> str:
    """The refusal of a ``StringDType`` field, with the two ways that work. Its elements are
    not fixed-size bits in the array (a long string lives in the array's own side
    allocation), so the gathers, which copy every other dtype's rows as bits, cannot move
    them, and CuPy has no such dtype; NumPy's ``s[m]`` does, in one call, from the indices."""
    return (
        f"field {name!r} has dtype {dtype}: variable-width strings are not gathered (their "
        "characters are not stored in the array's fixed-size elements). Cast it to a "
        f"fixed-width dtype of its longest string, {name}.astype(f\"U{{np.strings.str_len("
        f"{name}).max()}}\"), or select it with NumPy by the selected rows: pass indices=True "
        f"(leaving {name!r} out of the fields) and take {name}[out[\"indices\"]]"
    )


def check_record_predicate(pred: Any, fields: dict[str, Any],
                           call: str | None = None) -> Predicate:
    """The record predicate over ``fields``, checked: it reads 1-D fields of supported dtypes,
    NumPy types it to booleans with its constants, and a mask-path callable is elementwise
    (tried on 64 rows of a ramp, as map_compact tries a one-array callable). ``call``: the
    Python call checking it, whose way out a refusal names."""
    p = record_predicate(pred, tuple(fields))
    for name in p.fields:
        a = fields[name]
        if a.ndim != 1:
            raise ValueError(
                f"the predicate reads {name!r}, of shape {a.shape}: a field the predicate "
                "reads must be 1-D (one value per row); pass a column as its own field, e.g. "
                f"fields['{name}_0'] = {name}[:, 0]"
            )
        try:
            check_dtype(a.dtype)
        except TypeError as e:
            if a.dtype.kind in "mMUST" and call in ("compact_records", "compact_records_into"):
                # the comparison of times as a field of its own, which both calls take
                # (until 2026-12-02, sixteenth session, a refusal probe: told the calls that
                # take times, and that compact_records gathers them, not how to select)
                f = field_source(name)
                f = f if f.startswith("fields[") else f"fields[{name!r}]"
                out = ", out" if call == "compact_records_into" else ""
                # strings likewise (until 2026-12-06 told the numeric dtypes only; objects are
                # not gathered either: refused before, saying so)
                what = "times" if a.dtype.kind in "mM" else "strings"
                test = f"{f} > t" if what == "times" else f"{f} == v"
                raise TypeError(
                    f"the predicate reads {name!r}, of dtype {a.dtype}: a record predicate "
                    f"compares numbers, not {what} ({what[:-1]} fields are gathered as they "
                    "are); "
                    f"pass the comparison of {what} as a boolean field the predicate reads, "
                    f"`dask_compact.{call}({{**fields, 'keep': {test}}}, 'keep'{out})`, "
                    "or with conditions on other fields, a predicate such as lambda keep, b: "
                    "keep & (b > 3)") from None
            raise TypeError(f"the predicate reads {name!r}: {e}") from None
    dtypes = {name: native(fields[name].dtype) for name in p.fields}
    if p.expr is not None:
        p.check(dtypes)
        return p
    sample = {name: check_sample(dt) for name, dt in dtypes.items()}
    try:
        with np.errstate(all="ignore"):
            record_mask(p, sample, 64, np, every_row=True)
    except NotElementwise:
        raise
    except Exception as e:  # noqa: BLE001 - it may fail on made-up values only; the chunks tell
        logger.debug("record predicate %s failed on sample rows: %r", p.source, e)
    return p


def out_dtypes(dtype: np.dtype, kind: str) -> tuple[np.dtype, ...]:
    """The dtypes :func:`dask_compact.compact_records_into` takes for the ``out`` buffer of a
    field of ``dtype`` (or of the int64 indices) on ``kind``'s arrays ("numpy" or "cupy"),
    ``dtype`` first.

    NumPy: either byte order of a number's or a time's (``validate.other_order_view``: the
    call writes through a view of ``dtype`` and swaps what it wrote). CuPy: a field of the
    other byte order (a view of a swapped dtype) takes a native buffer too, since CuPy makes
    no array of that order (only views) and ``cupy.empty(n, "i8")`` is the buffer a user makes
    for a ``">i8"`` field (filled from a native copy, ``records._native_copies``); a native
    field takes a native buffer alone."""
    dtype = np.dtype(dtype)
    if kind == "cupy":
        return (dtype,) if dtype.isnative else (dtype, native(dtype))
    other = other_order_dtype(dtype)
    return (dtype,) if other is None else (dtype, other)


def check_out_dtype(name: str, got: np.dtype, dtype: np.dtype, kind: str) -> None:
    """TypeError unless the buffer ``out[name]``, of dtype ``got``, may receive a field of
    ``dtype`` (:func:`out_dtypes`), naming each dtype taken. Until 2026-12-02 (nineteenth
    session, left by the eighteenth) the refusal named the field's dtype alone, where the
    other byte order was taken too.

    A NumPy buffer of the other byte order comes here as a view of ``dtype`` already
    (``records._other_order_views``), so on NumPy only ``dtype`` itself passes: a buffer
    that is not such a view would receive native bytes."""
    taken = out_dtypes(dtype, kind)
    if got == dtype or (kind == "cupy" and got in taken):
        return
    named = " or ".join(str(d) for d in taken)
    either = " (either byte order)" if len(taken) > 1 else ""
    raise TypeError(f"out[{name!r}] must have dtype {named}{either}; got {got}")


def check_into(fields: dict[str, Any], out: Any, count: Any, stream: Any) -> dict[str, Any]:
    """The caller's buffers of :func:`dask_compact.compact_records_into`, checked: a mapping
    of field names (and ``indices``, the row numbers, unless a field has that name) to arrays
    of the fields' type and device, C-contiguous, writeable, with room for every row, the
    field's dtype and trailing shape (int64 and 1-D for indices), overlapping no field; a
    1-element int64 or uint64 ``count``; ``stream`` only for CuPy."""
    if not isinstance(out, Mapping) or not out:
        raise TypeError("out must be a non-empty mapping of field name -> buffer")
    first = next(iter(fields.values()))
    n = first.shape[0]
    kind = _module_of(first)
    checked = {}
    spans: dict[int, tuple[int, int]] = {}  # each array's byte span, computed once
    for name, buf in out.items():
        if name in fields:
            dtype, tail = fields[name].dtype, fields[name].shape[1:]
        elif name == INDICES:
            dtype, tail = np.dtype(np.int64), ()
        else:
            raise ValueError(
                f"out names {name!r}, which is not a field (fields: {', '.join(fields)}; "
                f"{INDICES!r} receives the row numbers)"
            )
        buf = in_memory(buf)
        refuse_masked_out(buf, f"out[{name!r}]")
        if not hasattr(buf, "dtype") or _module_of(buf) != kind or not hasattr(buf, "flags"):
            raise TypeError(f"out[{name!r}] must be a {kind} array like the fields")
        if kind == "cupy" and buf.device.id != first.device.id:
            raise ValueError(f"out[{name!r}] is on device {buf.device.id}, the fields on "
                             f"{first.device.id}")
        check_out_dtype(name, buf.dtype, dtype, kind)
        if buf.shape[1:] != tail or buf.ndim < 1 or buf.shape[0] < n:
            # printed as a shape: "(>= 5, *())" until 2026-12-01 (a record probe)
            want = f"(>= {n}{''.join(f', {d}' for d in tail) if tail else ','})"
            raise ValueError(f"out[{name!r}] must have shape {want} (every row may be "
                             f"selected); got {buf.shape}")
        if not buf.flags.c_contiguous or (kind == "numpy" and not buf.flags.writeable):
            raise ValueError(f"out[{name!r}] must be C-contiguous and writeable")
        for fname, a in fields.items():
            if overlaps(buf, a, spans):
                raise ValueError(f"out[{name!r}] overlaps the field {fname!r}")
        checked[name] = buf
    if count is not None:
        if getattr(count, "dtype", None) not in (np.dtype(np.int64), np.dtype(np.uint64)):
            raise TypeError("count must be a 1-element int64 or uint64 array")
        if _module_of(count) != kind or getattr(count, "size", 0) != 1 or count.ndim != 1:
            raise ValueError(f"count must be a 1-element, 1-D {kind} array like the fields")
        if kind == "numpy" and not count.flags.writeable:
            raise ValueError("count is read-only")
        for fname, a in fields.items():
            if overlaps(count, a, spans):
                raise ValueError(f"count overlaps the field {fname!r}")
    check_apart({**{f"out[{name!r}]": buf for name, buf in checked.items()}, "count": count},
                spans)
    check_stream(stream, kind == "cupy", "fields")
    return checked


