"""CF decoding of the fields ``--where`` reads: the values xarray's ``xr.open_zarr`` gives.

A Zarr store written by xarray may hold a field packed (``encoding={"t": {"dtype": "int16",
"scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -32768}}``) or with its missing
values stored as a number (``_FillValue``, ``missing_value``). xarray decodes as it reads: the
fill values become NaN and the packed numbers ``stored * scale_factor + add_offset``, in a
float dtype it chooses. A user writing ``--where "t > 300"`` means the decoded ``t`` (what
``ds.where(ds.t > 300, drop=True)`` selects), so the job decodes each field the predicate reads
before the predicate sees it (the written fields stay as stored, see docs/design.md).

:func:`decoding` reads a Zarr array's attributes as xarray's Zarr backend does and
:meth:`Decoding.apply` repeats the NumPy operations of xarray's ``CFMaskCoder`` and
``CFScaleOffsetCoder`` (as of xarray 2026.9, which the tests compare with: the same dtypes,
the same constants of the same Python or NumPy types, the same order), so every decoded value
is bit for bit xarray's and the predicate's comparisons are exact at the boundaries.
xarray is not needed: it is an optional dependency, and the job's workers may not have it.

Not decoded (the values stay as stored, and the summary's note names the field): time-like
``units`` (xarray makes datetimes or timedeltas, which a predicate cannot compare), the
``_Unsigned`` attribute, and encodings whose decoded dtype is not a float of a real dtype
(an integer ``scale_factor`` alone, complex or boolean fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# What xarray decodes on reading (mask_and_scale), in the order of its attribute names
SCALE_ATTRS = ("scale_factor", "add_offset")
FILL_ATTRS = ("missing_value", "_FillValue")  # the order of xarray's _check_fill_values
# Attributes under which xarray decodes otherwise, which the job does not follow
NOT_FOLLOWED = ("_Unsigned",)
_TIME_UNITS = ("days", "hours", "minutes", "seconds", "milliseconds", "microseconds",
               "nanoseconds")


@dataclass(frozen=True)
class Decoding:
    """How one field's stored values decode (picklable: it travels to the tasks).

    ``fills``: the stored values that decode to NaN, as xarray holds them (NumPy scalars of
    ``np.ravel`` of the attribute: their types decide the dtype of the comparison);
    ``mask_dtype``: the dtype the stored values are cast to before the fill values are
    compared (None: no mask); ``scale_factor``/``add_offset`` as read from the attributes (None
    where absent), applied in ``dtype``, the decoded dtype."""

    fills: tuple[Any, ...]
    mask_dtype: np.dtype | None
    scale_factor: Any
    add_offset: Any
    dtype: np.dtype
    applied: tuple[str, ...]  # the attribute names decoded, for the summary

    def apply(self, stored: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The decoded values of ``stored`` (NumPy), into ``out`` (of ``self.dtype`` and
        ``stored``'s shape) where given: xarray's operations, in its order, so every value is
        bit for bit xarray's (``data.astype(dtype)``, ``data == fv`` per fill value,
        ``data *= scale_factor``, ``data += add_offset``)."""
        data = np.empty(stored.shape, self.dtype) if out is None else out
        np.copyto(data, stored, casting="unsafe")  # astype's conversion (copy=True)
        masked = None
        if self.mask_dtype is not None:
            # xarray compares after its cast to the mask's dtype, which is the decoded one
            # (a packed field masks in the float dtype it scales in): the same values
            masked = np.zeros(stored.shape, bool)
            for fv in self.fills:
                masked |= data == fv
        if self.scale_factor is not None:
            data *= self.scale_factor
        if self.add_offset is not None:
            data += self.add_offset
        if masked is not None:
            # NaN before or after the scaling is the same NaN
            data[masked] = np.nan
        return data


def selects_alike(where: str, how: Decoding, dtype: np.dtype) -> bool:
    """Whether the one-array predicate ``where`` selects the same elements of an array of
    ``dtype`` (the stored one) whether it reads the stored or the decoded values: only where
    decoding changes nothing but the fill values, of a float array (same dtype, same other
    values), and the predicate gives each stored fill value (and its negative zero) what it
    gives NaN. A predicate that fails on them does not select alike."""
    # in native byte order: a big-endian input's stored dtype is >f4, the array's src.dtype
    # (and the dtype the predicate reads) the native f4, the same values
    if (how.scale_factor is not None or how.add_offset is not None or dtype.kind != "f"
            or how.dtype.newbyteorder("=") != dtype.newbyteorder("=")):
        return False
    from ..predicate import as_predicate

    stored = np.array(how.fills, dtype=np.float64)
    # the stored values xarray masks: equal to a fill value under NumPy's promotion
    values = np.array([*stored, *(-stored[stored == 0])], dtype=dtype)
    values = values[np.isin(values, stored) | (values == 0)]
    try:
        with np.errstate(all="ignore"):
            p = as_predicate(where)
            got = np.asarray(p.mask(values))
            nan = np.asarray(p.mask(np.array([np.nan], dtype=dtype)))
    except Exception:  # noqa: BLE001 -- the job says what is wrong with the predicate
        return False
    return bool((got == nan[0]).all())


def fill_compared(where: str, name: str, how: Decoding) -> float | None:
    """A number that the predicate ``where`` compares field ``name`` with and that is one of
    the field's fill values, as stored (``ffl != -999``, ``-999 < ffl``, ``t != -32768`` of a
    packed int16) or decoded as a number would be (``stored * scale_factor + add_offset``);
    None where there is none.

    The field is read decoded, its fill values as NaN, so no row equals that number: such a
    condition was written on the stored numbers (the command's advice before it decoded, "x
    != -999 for a fill value"), and read decoded it selects other rows (``ffl != -999``
    keeps the fill rows, NaN != -999), exit 0. Found on the predicate's syntax tree (every
    comparison that reads the field, numbers with their signs), not on its text."""
    import ast

    try:
        tree = ast.parse(where.strip(), mode="eval")
    except SyntaxError:
        return None  # the predicate's own parse says what is wrong
    fills = _fill_numbers(how)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if not any(isinstance(n, ast.Name) and n.id == name
                   for op in operands for n in ast.walk(op)):
            continue
        for value in (v for op in operands for v in _numbers(op)):
            if any(_close(value, fv) for fv in fills):
                return value
    return None


def _fill_numbers(how: Decoding) -> list[float]:
    """The field's fill values as stored and as they would decode were they not masked."""
    out: list[float] = []
    for fv in how.fills:
        stored = float(fv)
        decoded = np.asarray(fv).astype(how.dtype)
        with np.errstate(all="ignore"):
            if how.scale_factor is not None:
                decoded = decoded * how.scale_factor
            if how.add_offset is not None:
                decoded = decoded + how.add_offset
        out.extend((stored, float(decoded)))
    return out


def _close(a: float, b: float) -> bool:
    """Equal as a number written in a predicate means a stored one (a float32 fill value of
    1e20 is 1.0000000200408773e20): to a part in 10^6."""
    import math

    return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)


def _numbers(node: Any) -> list[float]:
    """The numbers written in the expression ``node``, each with its sign (``-999``: one
    number, not 999)."""
    import ast

    value = _number(node)
    if value is not None:
        return [value]
    return [v for child in ast.iter_child_nodes(node) for v in _numbers(child)]


def _number(node: Any) -> float | None:
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _number(node.operand)
        if inner is not None:
            return -inner if isinstance(node.op, ast.USub) else inner
    return None


def decoding(z: Any) -> Decoding | str | None:
    """How the Zarr array ``z`` decodes under ``xr.open_zarr`` (its defaults: mask_and_scale;
    a format 2 array's fill value is a fill value, a format 3 array's ``_FillValue`` attribute
    is), None where nothing changes its values, or a string saying why the job does not
    decode it (see the module's docstring)."""
    attrs = dict(z.attrs)
    fill_attrs = _fill_attributes(z, attrs)
    scaled = {k: attrs[k] for k in SCALE_ATTRS if k in attrs}
    if not fill_attrs and not scaled:
        # xarray makes datetimes of "<unit> since <date>" counts with no fill value too (its
        # default for a time coordinate): None had let the stored counts be compared with no
        # note (until 2026-12-02, seventeenth session, a new-user probe)
        return time_units(attrs)
    dtype = np.dtype(z.dtype)
    if any(k in attrs for k in NOT_FOLLOWED):
        return f"{', '.join(k for k in NOT_FOLLOWED if k in attrs)} is not followed"
    if _time_like(attrs.get("units")):
        return f"time-like units {attrs['units']!r} (xarray decodes datetimes)"
    if dtype.kind not in "iuf":
        return f"dtype {dtype} is not decoded"
    raw_fills: dict[str, Any] = {}
    fills: list[Any] = []
    for name, value in fill_attrs.items():
        kept = [fv for fv in np.ravel(value) if not _isnull(fv)]
        if not kept and dtype.kind in "iu":
            continue  # xarray drops a NaN fill value of integers, with a warning
        raw_fills[name] = value
        fills.extend(fv for fv in kept if not any(_same(fv, f) for f in fills))
    scale_factor = _scalar(scaled.get("scale_factor"))
    add_offset = _scalar(scaled.get("add_offset"))
    mask_dtype = None
    data_dtype = dtype
    if fills:  # CFMaskCoder
        mask_dtype = (_choose_float_dtype(dtype, scaled) if scaled
                      else np.dtype(np.float32 if dtype.kind in "iu" and dtype.itemsize <= 2
                                    else np.float64 if dtype.kind in "iu" else dtype))
        data_dtype = mask_dtype
    if scaled and not raw_fills:  # CFScaleOffsetCoder: the mask's dtype where it has one
        data_dtype = _choose_float_dtype(data_dtype, scaled)
    if not fills and not scaled:
        return None  # only NaN fill values of floats: nothing changes
    if data_dtype.kind != "f":
        return f"decodes to {data_dtype} (not a float)"
    applied = tuple(k for k in (*FILL_ATTRS, *SCALE_ATTRS)
                    if k in raw_fills or k in scaled)
    if scaled and not fills:
        applied = tuple(k for k in applied if k in SCALE_ATTRS)
    return Decoding(tuple(fills), mask_dtype, scale_factor, add_offset, data_dtype, applied)


def _fill_attributes(z: Any, attrs: dict[str, Any]) -> dict[str, Any]:
    """The fill values xarray's Zarr backend gives the array's variable, by attribute name:
    ``missing_value`` as stored; ``_FillValue``: a format 2 array's Zarr fill value (xarray's
    ``use_zarr_fill_value_as_mask``, its default for format 2), a format 3 array's attribute
    (floats as the base64 of a little-endian double: xarray's ``FillValueCoder``).

    A format 2 array's Zarr fill value counts only where xarray wrote the array (it has
    ``_ARRAY_DIMENSIONS``, without which ``xr.open_zarr`` refuses it), as
    :func:`.inputs.user_attributes` carries it: zarr gives every array a fill value (0 for
    a plain ``zarr.create_array``), and a group zarr wrote must not lose its zeros."""
    from .inputs import V2_DIMENSIONS

    out = {k: attrs[k] for k in ("missing_value",) if k in attrs}
    if getattr(z.metadata, "zarr_format", 3) == 2:
        if z.fill_value is not None and V2_DIMENSIONS in attrs:
            out["_FillValue"] = z.fill_value
    elif "_FillValue" in attrs:
        out["_FillValue"] = _decode_v3_fill(attrs["_FillValue"], np.dtype(z.dtype))
    return out


def _decode_v3_fill(value: Any, dtype: np.dtype) -> Any:
    """A format 3 ``_FillValue`` attribute as xarray's ``FillValueCoder.decode`` reads it."""
    import base64
    import struct

    if dtype.kind == "f" and isinstance(value, (str, bytes)):
        return struct.unpack("<d", base64.standard_b64decode(value))[0]
    if dtype.kind in "iu" and isinstance(value, (int, float, np.integer, np.floating)):
        return int(value)
    return value


def _choose_float_dtype(dtype: np.dtype, scaled: dict[str, Any]) -> np.dtype:
    """xarray's ``_choose_float_dtype`` where ``scale_factor`` or ``add_offset`` is given: the
    attributes' own types decide (a JSON number reads as a Python float: float64)."""
    scale_factor, add_offset = scaled.get("scale_factor"), scaled.get("add_offset")
    scale_type = np.dtype(type(scale_factor)) if scale_factor is not None else None
    offset_type = np.dtype(type(add_offset)) if add_offset is not None else None
    if (scale_type is not None and offset_type is not None and offset_type == scale_type
            and scale_type in (np.float32, np.float64)):
        if dtype.itemsize == 4 and dtype.kind in "iu":
            return np.dtype(np.float64)
        return scale_type
    if add_offset is not None:
        return np.dtype(np.float64)
    assert scale_type is not None
    return scale_type


def _scalar(value: Any) -> Any:
    """An attribute given as a one-element list as xarray takes it (``.item()``)."""
    if value is not None and np.ndim(value) > 0:
        return np.asarray(value).item()
    return value


def _isnull(value: Any) -> bool:
    try:
        return bool(np.isnan(value))
    except TypeError:
        return value is None


def _same(a: Any, b: Any) -> bool:
    """Whether xarray's set of fill values holds ``a`` and ``b`` once (equal values)."""
    return bool(a == b)


def time_units(attrs: dict[str, Any]) -> str | None:
    """Why a field of ``attrs`` with datetime units ("days since 2000-01-01", which xarray
    decodes to datetimes whatever else the field has) or timedelta units (a time unit with
    the ``dtype`` attribute xarray writes for a timedelta64 variable, ``"timedelta64[ns]"``)
    is compared as stored; None for others. A bare time unit ("seconds") alone is left out:
    xarray 2026.9 keeps such a float a float. The timedelta form was left out too until
    2026-12-07 (forty-seventh session, a new-user probe): `d > 3` ran on the stored hours
    with no note."""
    time = cf_time(attrs)
    if time is None:
        return None
    if time.kind == "M":
        return f"time-like units {time.units!r} (xarray decodes datetimes)"
    return (f"time units {time.units!r} with dtype {attrs.get('dtype')!r} (xarray decodes "
            "timedeltas)")


@dataclass(frozen=True)
class CFTime:
    """A field that xarray decodes to times: ``kind`` "M" (datetime64: "<unit> since
    <epoch>") or "m" (timedelta64), its ``units`` attribute, the NumPy unit of its counts
    (None where not one of CF's plain ones) and its epoch (None where not read: no epoch, an
    unparsed one, or a calendar other than the standard one)."""

    kind: str
    units: str
    unit: str | None
    epoch: np.datetime64 | None


_NUMPY_UNITS = {"days": "D", "hours": "h", "minutes": "m", "seconds": "s",
                "milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}
_STANDARD_CALENDARS = (None, "standard", "gregorian", "proleptic_gregorian")


def cf_time(attrs: dict[str, Any]) -> CFTime | None:
    """The CF time encoding of a field's ``attrs`` (:class:`CFTime`), None for none."""
    units = attrs.get("units")
    if units is None:
        return None
    units = str(units)
    if "since" in units:
        word, _, ref = units.partition("since")
        word = word.strip().lower()
        unit = _NUMPY_UNITS.get(word if word.endswith("s") else word + "s")
        epoch = None
        if attrs.get("calendar") in _STANDARD_CALENDARS:
            text = ref.strip().removesuffix("Z").removesuffix("UTC").strip().replace(" ", "T", 1)
            try:
                epoch = np.datetime64(text, "ns")
            except ValueError:
                pass  # not an epoch NumPy reads: no example count
        return CFTime("M", units, unit, epoch)
    if units in _TIME_UNITS and str(attrs.get("dtype", "")).startswith("timedelta64"):
        return CFTime("m", units, _NUMPY_UNITS[units], None)
    return None


def _time_like(units: Any) -> bool:
    """xarray's ``_is_time_like``: "<unit> since <date>" or a bare time unit."""
    if units is None:
        return False
    units = str(units)
    if "since" in units:
        return True
    return units in _TIME_UNITS
