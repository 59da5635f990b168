"""The ``compact`` accessor of xarray Datasets and DataArrays: ``ds.compact.where(cond, dim)``.

:func:`dask_compact.compact_records` on the variables of a Dataset: every variable along the
dimension is a field, so one pass per chunk evaluates the condition and writes out every
variable's selected rows, and the result's dimension has a **known** length (what xarray needs
of every dimension). ``import dask_compact`` registers the accessor when xarray is imported,
in either order (:mod:`.accessor`); ``import dask_compact.xarray_accessor`` registers it at once.

This module imports only xarray at the top: it may be imported while ``dask.array`` itself is
being imported (``dask.array`` imports xarray, whose import registers the accessor).
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Hashable
from typing import Any

import xarray as xr

from .validate import check_chunk_type, is_dask_array

__all__ = ["CompactDatasetAccessor", "CompactDataArrayAccessor", "register"]

NAME = "compact"  # ds.compact, da.compact


class CompactDatasetAccessor:
    """``ds.compact``: stream compaction of a Dataset along one dimension."""

    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def where(
        self,
        cond: Any,
        dim: Hashable | None = None,
        *,
        indices: str | None = None,
        chunks: None | int | str = None,
    ) -> xr.Dataset:
        """The Dataset's rows along ``dim`` where ``cond`` holds; ``dim`` gets a known length.

        What ``ds.where(cond, drop=True)`` (or ``ds.isel({dim: np.flatnonzero(cond)})``) gives,
        in one pass over the data on dask-backed Datasets (NumPy or CuPy chunks): the condition
        is evaluated chunk by chunk, every variable along ``dim`` is compacted where its chunk
        lives, and only the counts come back, so the result's chunk sizes along ``dim`` are
        known and identical across variables. Unlike ``ds.where(cond, drop=True)``, integer and
        boolean variables keep their dtype (no NaN fill is needed: only whole rows are
        dropped), variables without ``dim`` are kept as they are (not broadcast against the
        condition), and nothing is computed twice.

        Parameters
        ----------
        cond : str, callable or boolean DataArray
            A string over the Dataset's variable names, ``"(energy > 5) & (abs(eta) < 2.5)"``,
            or a callable taking variables by parameter name, ``lambda energy, eta: ...``, as in
            :func:`dask_compact.compact_records`. The variables it reads (data variables or
            coordinates) must be 1-D along ``dim``. Or a 1-D boolean DataArray along ``dim``,
            what ``ds.where(cond, drop=True)`` takes (``ds.energy > 5``, lazy or computed),
            of the Dataset's length and index along ``dim``: evaluated chunk by chunk in the
            pass that compacts.
        dim : hashable, optional
            The dimension to compact. Default: the one dimension the variables ``cond`` reads
            share (an error if they share none or several), or the mask's.
        indices : str, optional
            Also add the selected rows' positions along ``dim`` in ``ds`` (int64) as a
            coordinate of this name.
        chunks : int, "auto" or str, optional
            Dask-backed Datasets only: rebalance the result into uniform chunks of this many
            rows along ``dim`` (as :func:`dask_compact.map_compact`'s: -1, ``"auto"`` or a
            byte size such as ``"64MiB"`` too).

        Returns
        -------
        xarray.Dataset
            The same variables, coordinates and attributes: every variable along ``dim``
            holds its selected rows, dimension order unchanged, its encoding kept but for
            the keys of the input's chunk layout (``chunks``, ``preferred_chunks``,
            ``shards``, ``chunksizes``, ``original_shape``: ``isel`` keeps them, which
            ``to_zarr`` would hold the new chunks to); the others are kept, with their
            encodings, as is the Dataset's own. Dask-backed variables come back as dask
            arrays, persisted, with known chunks along ``dim`` (the input's along the other
            dimensions; one empty chunk where nothing is selected); an in-memory Dataset
            comes back in memory, a lazy mask condition computed. To write the result with
            ``to_zarr``, pass ``chunks=`` (xarray's ``to_zarr`` takes uniform chunks).

        Raises
        ------
        ValueError
            ``dim`` not a dimension of the Dataset, ``cond`` naming no variable, or reading one
            that is not 1-D along ``dim``, no ``dim`` given where the variables read share
            several dimensions or none, a mask DataArray not 1-D along ``dim`` or of another
            length or index, ``indices`` naming an existing variable, ``chunks`` with an
            in-memory Dataset.
        TypeError
            ``cond`` does not give booleans (a mask DataArray of another dtype included),
            reads a variable of an unsupported dtype, is a Dataset, or the Dataset mixes NumPy
            and CuPy variables along ``dim`` (index coordinates aside).

        Notes
        -----
        Which variable takes which route:

        * Variables along ``dim`` (data variables and non-index coordinates; ``dim`` need not
          come first, variables are transposed for the call and back after) are fields of
          one :func:`~dask_compact.compact_records` call. In-memory ones in a dask-backed
          Dataset (a NumPy coordinate) are wrapped with ``dask.array.from_array``, chunked
          along ``dim`` like the first dask variable the condition reads, so they are
          compacted in the same pass. A dask variable in several chunks along its other
          dimensions is one field per column of those blocks, joined again after: its
          blocks stay as large as they were, and its chunks there are the input's.
        * Index coordinates (which xarray holds in memory, as pandas indexes), variables of
          object dtype and other non-NumPy data (pandas extension arrays), and variables
          with ``dim`` on two axes, are indexed with the selected positions (``isel``), so
          xarray rebuilds the indexes (string, datetime and multi-indexes included).
        * Variables without ``dim`` are kept unchanged.

        Examples
        --------
        >>> import numpy as np, xarray as xr, dask_compact
        >>> ds = xr.Dataset(
        ...     {"energy": ("event", np.array([1.0, 7.0, 9.0, 3.0, 6.0])),
        ...      "eta": ("event", np.array([0.1, 3.0, -1.0, 0.0, 2.0])),
        ...      "hits": (("layer", "event"), np.arange(10).reshape(2, 5))},
        ...     coords={"event": [10, 11, 12, 13, 14]}, attrs={"run": 7}).chunk(event=2)
        >>> out = ds.compact.where("(energy > 5) & (abs(eta) < 2.5)", dim="event")
        >>> out.sizes["event"], out.energy.chunks
        (2, ((1, 1),))
        >>> out.event.values, out.hits.values, out.attrs
        (array([12, 14]), array([[2, 4],
               [7, 9]]), {'run': 7})

        What xarray users write today (xarray refuses a dask condition with ``drop=True``, so
        it is computed first; the integers come back as floats):

        >>> cond = ((ds.energy > 5) & (abs(ds.eta) < 2.5)).compute()
        >>> ds.where(cond, drop=True).hits.values
        array([[2., 4.],
               [7., 9.]])

        The same mask, lazy or computed, as the condition here:

        >>> ds.compact.where((ds.energy > 5) & (abs(ds.eta) < 2.5)).hits.values
        array([[2, 4],
               [7, 9]])
        """
        return compact_dataset(self._ds, cond, dim, indices, chunks)


class CompactDataArrayAccessor:
    """``arr.compact``: stream compaction of a DataArray along one dimension."""

    def __init__(self, arr: xr.DataArray) -> None:
        self._arr = arr

    def where(
        self,
        cond: Any,
        dim: Hashable | None = None,
        *,
        indices: str | None = None,
        chunks: None | int | str = None,
    ) -> xr.DataArray:
        """The DataArray's rows along ``dim`` where ``cond`` holds (see
        :meth:`CompactDatasetAccessor.where`); ``cond`` reads the array as ``x`` or by its
        name, and its coordinates by theirs.

        Examples
        --------
        >>> import numpy as np, xarray as xr, dask_compact
        >>> arr = xr.DataArray(np.array([3.0, 8.0, 1.0, 9.0]), dims="t", name="v",
        ...                    coords={"t": [0.0, 0.5, 1.0, 1.5]}).chunk(t=2)
        >>> arr.compact.where("x > 2").values
        array([3., 8., 9.])
        >>> arr.compact.where(lambda v, t: (v > 2) & (t > 0)).t.values
        array([0.5, 1.5])
        """
        return compact_dataarray(self._arr, cond, dim, indices, chunks)


def compact_dataset(
    ds: xr.Dataset, cond: Any, dim: Hashable | None, indices: str | None,
    chunks: None | int | str, call: str = "ds.compact.where", array: str | None = None,
) -> xr.Dataset:  # fmt: skip
    """:meth:`CompactDatasetAccessor.where`: the routes of its Notes, then one Dataset.
    ``call``: the accessor call as the refusals name it; ``array``: the variable that is
    the DataArray of ``arr.compact.where`` (named so in them)."""
    import numpy as np

    from .records import records_call
    from .records_check import INDICES

    if dim is not None and not isinstance(dim, Hashable):
        # a list, as xarray's reductions take: "unhashable type: 'list'" until 2026-12-01
        # (fifteenth session; an xarray probe)
        raise TypeError(
            f"dim= names the one dimension to compact (dim='event'), not a "
            f"{type(dim).__name__} ({dim!r}); {call} compacts along one dimension"
        )
    mask = None
    if isinstance(cond, xr.DataArray):
        if cond.ndim == 1:  # the mask's length is compared with the Dataset's: both known
            _known_rows(ds, cond.dims[0], call, array, cond)
        ds, mask, dim = _with_mask(ds, cond, dim, indices)
        cond = mask
    # parsed (or traced) once; the Predicate goes on to compact_records as it is
    p = _predicate(cond, tuple(n for n in ds.variables if isinstance(n, str) and n), dim,
                   call)
    dim = _the_dim(ds, p.fields, dim, call, array)
    _known_rows(ds, dim, call, array)
    for f in p.fields:
        dims = ds.variables[f].dims
        if dims != (dim,):
            raise ValueError(
                f"cond reads {f!r}, of dimensions {dims}: the variables cond reads must be "
                f"1-D along {dim!r} (one value per row)"
            )
        dtype = ds.variables[f].dtype
        # the variable as the caller holds it, in the advice: arr itself, a coordinate of
        # arr, or one of ds (until 2026-12-02, seventeenth session, arr.compact.where was
        # told a ds.compact.where(ds['x'] ...) form, of a ds the caller does not have)
        it = "arr" if f == array else f"{call.split('.')[0]}[{f!r}]"
        if not isinstance(dtype, np.dtype):
            # a DataFrame's nullable column (from_dataframe): the record call's refusal named
            # compact_records and a field (until 2026-12-01, fifteenth session; an xarray
            # probe)
            converted = f"{it}.astype('float64')"
            convert = (f"ds[{f!r}] = {converted}" if call.startswith("ds.")
                       else "arr = arr.astype('float64')" if f == array
                       else f"arr = arr.assign_coords({{{f!r}: {converted}}})")
            raise TypeError(
                f"{call}: cond reads {f!r}, a pandas {dtype} array (a DataFrame's nullable "
                f"or categorical column, missing values pd.NA); a string or callable cond "
                f"reads NumPy arrays: convert it first, {convert} (pd.NA becoming NaN), or "
                f"pass the condition as a boolean DataArray: "
                f"{call}(({it} > 2).fillna(False).astype(bool))"
            )
        dates = _cftime_dates(ds.variables[f]) if dtype.kind == "O" else None
        if dates is not None:
            # cftime dates (xarray's use_cftime=True) were told the `== value` advice below
            # (until 2026-12-02, seventeenth session, the sixteenth's leftover): a comparison
            # with a date of their calendar, which cftime orders, is what works; the date in
            # a 0-d array, as a dask array compares with no bare cftime date ("'>' not
            # supported between instances of 'Array' and 'cftime._cftime.DatetimeNoLeap'")
            calendar, example = dates
            raise TypeError(
                f"{call}: cond reads {f!r}, of dtype object, cftime dates of calendar "
                f"{calendar!r}: a string or callable cond compares numbers, not times; pass "
                "the condition as a boolean DataArray, evaluated chunk by chunk in the same "
                "pass, comparing with a date of that calendar (in np.array, which dask "
                f"compares with): {call}({it} > np.array({example}))"
            )
        if dtype.kind in "OUSVT":
            # objects, strings (NumPy's StringDType too), bytes, structured rows: "field 'o'
            # has dtype object", "field 's' has dtype StringDType()" or "the
            # predicate reads 's': dask_compact compacts arrays of ..." until 2026-12-01
            # (fifteenth session; an xarray probe), not what works here
            raise TypeError(
                f"{call}: cond reads {f!r}, of dtype {dtype}: a string or callable cond "
                "compares numbers (booleans, integers, floats, complex); pass the condition "
                "as a boolean DataArray, evaluated chunk by chunk in the same pass: "
                f"{call}({it} == value)"
            )
        if dtype.kind in "mM":
            # compact_records' own refusal named map_compact and gathered fields, not what
            # works here (until 2026-12-01; a record probe); a timedelta's example is a
            # timedelta (until 2026-12-02, sixteenth session, a refusal probe, a datetime64,
            # which NumPy does not compare with it)
            example = ("np.datetime64('2020-01-01')" if dtype.kind == "M"
                       else "np.timedelta64(3, 'h')")
            raise TypeError(
                f"{call}: cond reads {f!r}, of dtype {dtype}: a string or callable cond "
                "compares numbers, not times; pass the condition as a boolean DataArray, "
                f"evaluated chunk by chunk in the same pass: {call}({it} > {example})"
            )
    # "" too: xarray keeps a variable of that name, which no attribute, to_zarr or netCDF
    # writer takes (accepted until 2026-12-07, a new-user probe)
    if indices is not None and (not isinstance(indices, str) or not indices
                                or indices in ds.variables):
        raise ValueError(
            f"indices= names the coordinate the row positions are added as: a new name, not "
            f"{indices!r}"
        )
    _not_another_dimension(indices, ds.dims, dim)
    along = [n for n, v in ds.variables.items() if dim in v.dims]
    # xarray rebuilds an index from its coordinates' rows: those take the isel route
    indexed = {n for n in ds.xindexes if n in along}
    read = [n for n in along if n in p.fields]  # the Dataset's order, not the predicate's
    chunked = [n for n in along if ds.variables[n].chunks is not None]
    lead = next((n for n in read if n in chunked), chunked[0] if chunked else None)
    if lead is not None:
        first = _rows_first(ds.variables[lead], dim)
        if not is_dask_array(first):
            raise TypeError(
                f"variable {lead!r} is a chunked array of type {type(first).__name__}; "
                "ds.compact.where takes dask-backed (or in-memory) Datasets"
            )
        like: Any = first
    else:
        like = _rows_first(ds.variables[read[0]], dim) if read else None

    fields: dict[str, Any] = {}
    keys: dict[Hashable, list[str]] = {}  # a variable's field keys: one per block, see _split
    blocks: dict[Hashable, tuple[int, ...]] = {}  # its number of blocks along the other axes
    gathered: list[Hashable] = []  # variables whose rows compact_records writes out
    order = ([lead] if lead is not None else []) + [n for n in along if n != lead]
    taken = {n for n in along if isinstance(n, str)}
    # the names so far and each variable's place, kept as they grow: a set made and a list
    # searched per variable were time quadratic in the variables (until 2026-12-02,
    # sixteenth session, issue 11)
    used = set(taken)
    place = {n: i for i, n in enumerate(along)}
    for name in order:  # the lead first: compact_records aligns every field on it
        v = ds.variables[name]
        if name not in p.fields and (name in indexed or not _fieldable(v, like)
                                     or v.dims.count(dim) > 1):
            # dim on two axes (a (t, t) matrix): isel selects along both, where a field's
            # rows keep every column (until 2026-12-01 xarray's error; a record probe)
            continue
        key = _key(name, place[name], name in p.fields, INDICES, taken)
        data = _rows_first(v, dim)
        if lead is not None and not is_dask_array(data):
            data = _from_array(data, like)
        parts = _split(key, data, used)
        fields.update(parts)
        used.update(parts)
        keys[name] = list(parts)
        blocks[name] = tuple(len(c) for c in data.chunks[1:]) if len(parts) > 1 else ()
        if name not in indexed:
            gathered.append(name)
    written = set(gathered)
    isel = [n for n in along if n not in written]
    want_indices = indices is not None or bool(isel)
    positions = INDICES  # the key the selected rows' positions come back under
    if want_indices and INDICES in p.fields:
        # cond reads a variable of that name, whose field has the key: the positions are
        # one more field, the rows' numbers, gathered as the others (until 2026-12-01 this
        # was refused, "rename it first"; a record probe)
        positions = _new_name(f"<{INDICES}>", taken | set(fields))
        rows = ds.sizes[dim]
        if lead is not None:
            fields[positions] = _from_array(np.arange(rows, dtype=np.int64), like)
        elif _module(like) == "cupy":
            import cupy

            fields[positions] = cupy.arange(rows, dtype=np.int64)
        else:
            fields[positions] = np.arange(rows, dtype=np.int64)
    if chunks is not None and lead is None:
        raise ValueError(
            f"chunks= rebalances the chunks of a dask-backed Dataset's result; this one is in "
            f"memory along {dim!r} and comes back in memory: leave chunks= out, or chunk it "
            f"first (ds.chunk({{{dim!r}: n}}))"
        )
    # nothing selected: one empty chunk along dim (compact_records' rule), as isel gives and
    # as xarray's chunk() makes of a dask variable of the isel route
    # the refusals of a chunk (its shape, its dtype, its type) name the accessor and what
    # the caller calls each field: "compact_records: chunk 0 of field 'cond'" until
    # 2026-12-01 (the eleventh session's chunk-shape probe)
    labels = {positions: "the row numbers"}
    for name, ks in keys.items():
        label = ("cond" if name == mask else "the DataArray" if name == array
                 else f"variable {name!r}")
        labels.update(dict.fromkeys(ks, label))
    out = records_call(fields, p, want_indices and positions == INDICES, False, True, chunks,
                       call, labels)

    new: dict[Hashable, xr.Variable] = {}
    for name in gathered:
        v = ds.variables[name]
        rows_first = (dim, *[d for d in v.dims if d != dim])
        data = _joined([out[k] for k in keys[name]], blocks[name])
        new[name] = xr.Variable(rows_first, data, attrs=v.attrs).transpose(*v.dims)
    rest = ds.drop_vars(gathered)
    if isel:
        rest = rest.isel({dim: _host(out[positions])})
    variables = {n: new[n] if n in new else rest.variables[n] for n in ds.variables}
    if lead is not None:
        # a dask variable of the isel route (objects) comes back with dask's own chunks.
        # Rechunked by dask: xarray's chunk() of cftime dates takes their present chunks for
        # a store's, and warned at every call "The specified chunks separate the stored
        # chunks ... consider rechunking after loading", reading the first chunk to tell
        # (until 2026-12-02, seventeenth session, a cftime probe)
        sizes = out[next(iter(fields))].chunks[0]
        for n in isel:
            v = variables[n]
            if v.chunks is not None and v.chunks[v.dims.index(dim)] != sizes:
                axes = {i: sizes for i, d in enumerate(v.dims) if d == dim}
                variables[n] = v.copy(deep=False, data=v.data.rechunk(axes))
    coords = xr.Coordinates({n: variables[n] for n in ds.coords}, indexes=dict(rest.xindexes))
    result = xr.Dataset({n: variables[n] for n in ds.data_vars}, coords=coords, attrs=ds.attrs)
    if indices is not None:
        result = result.assign_coords({indices: xr.Variable((dim,), out[positions])})
    if mask is not None:
        result = result.drop_vars(mask)
    # the keys of the encodings of the variables along dim that describe the input's chunks
    # and shape (Zarr's chunks, preferred_chunks and shards, which to_zarr would hold the new
    # chunks to; netCDF's chunksizes and original_shape) go; the rest (dtype, scale_factor,
    # _FillValue, units, compressors) is kept as isel keeps it. Until 2026-12-01 (fifteenth
    # session, an xarray probe) the whole encoding went: a packed int16 variable written
    # back was float64 without its scale_factor, fill value or time units. The variables
    # without dim are unchanged, and keep theirs; and the Dataset its own. drop_encoding()
    # copies the variables: the input's are not touched.
    result = result.drop_encoding()
    for n, v in result.variables.items():
        if n in ds.variables:
            v.encoding = {k: e for k, e in ds.variables[n].encoding.items()
                          if dim not in v.dims or k not in _LAYOUT}
    result.encoding = dict(ds.encoding)
    return result


# the encoding keys that describe a variable's chunks and shape in its store: dropped from the
# variables along dim, whose rows and chunks are the result's
_LAYOUT = frozenset({"chunks", "preferred_chunks", "shards", "chunksizes", "original_shape"})


def compact_dataarray(
    arr: xr.DataArray, cond: Any, dim: Hashable | None, indices: str | None,
    chunks: None | int | str,
) -> xr.DataArray:  # fmt: skip
    """:meth:`CompactDataArrayAccessor.where`: the array as a one-variable Dataset, named
    as ``cond`` reads it (``x`` or its own name), then the DataArray again."""
    coord_names = tuple(n for n in arr.coords if isinstance(n, str) and n)
    own = arr.name if isinstance(arr.name, str) and arr.name else None
    aliases = [a for a in (own, "x") if a is not None and a not in coord_names]
    aliases = list(dict.fromkeys(aliases))
    used: list[str] = []
    p = cond  # a mask DataArray: compact_dataset adds it as a variable
    if not isinstance(cond, xr.DataArray):
        p = _predicate(cond, (*aliases, *coord_names), dim, "arr.compact.where",
                       tuple(aliases))
        used = [a for a in aliases if a in p.fields]
        if len(used) > 1:
            raise ValueError(f"cond reads the array both as 'x' and as {own!r}; use one name")
    if indices is not None and (not isinstance(indices, str) or not indices
                                or indices in arr.coords or indices == arr.name):
        raise ValueError(
            f"indices= names the coordinate the row positions are added as: a name that is "
            f"neither the DataArray's nor one of its coordinates', not {indices!r}"
        )
    # a name cond does not read is one of our own, clashing with no coordinate
    key = used[0] if used else _new_name("<the DataArray>", set(arr.coords))
    # the alias is no name of the user's: indices= may take it (an unnamed array read as x)
    at = None if indices is None else _new_name("<indices>", {*arr.coords, key})
    # the array as a coordinate without an index: as a data variable, an array named like
    # one of its dimensions (name="t", dims="t") would become that dimension's index
    # coordinate (in memory, and a coordinate of the result)
    ds = xr.Dataset(coords=arr.coords).assign_coords(
        xr.Coordinates({key: arr.variable}, indexes={}))
    out = compact_dataset(ds, p, dim, at, chunks, "arr.compact.where", key)
    rest = out.drop_vars(key)
    if at is not None and indices is not None:
        # the compacted dimension is the positions' (known only now where cond chose it)
        _not_another_dimension(indices, arr.dims, out.variables[at].dims[0])
        rest = rest.rename_vars({at: indices})
    result = xr.DataArray(out.variables[key], coords=rest.coords, name=arr.name)
    # DataArray(variable) leaves the variable's encoding behind (isel keeps the array's)
    result.encoding = dict(out.variables[key].encoding)
    return result


def _not_another_dimension(indices: str | None, dims: Any, dim: Hashable | None) -> None:
    """Refuse ``indices=`` naming a dimension other than ``dim``: the positions came back
    as a coordinate of that name along ``dim`` (``layer (event)`` beside the ``layer``
    dimension), until 2026-12-01 (fifteenth session; an xarray probe)."""
    if indices is not None and indices in dims and indices != dim:
        raise ValueError(
            f"indices= names the coordinate the row positions are added as, along the "
            f"compacted dimension: not {indices!r}, which is another dimension"
        )


def _known_rows(ds: xr.Dataset, dim: Hashable, call: str, array: str | None,
                cond: xr.DataArray | None = None) -> None:
    """Refuse a variable along ``dim`` (or the mask ``cond``) of an unknown length along it,
    a dask array indexed by a dask mask put in a Dataset: "field(s) y have unknown chunk
    sizes" (compact_records' words) or "cond has nan rows along 'e', the Dataset nan" until
    2026-12-01 (fifteenth session; an xarray probe). Variables without ``dim`` are kept as
    they are, known or not, as isel keeps them."""
    import math

    checked = [("the DataArray" if n == array else f"variable {n!r}", v)
               for n, v in ds.variables.items() if dim in v.dims]
    if cond is not None:
        checked.append(("cond", cond.variable))
    for what, v in checked:
        n = v.shape[v.dims.index(dim)]
        if isinstance(n, float) and math.isnan(n):
            raise ValueError(
                f"{call}: {what} has an unknown length along {dim!r} (a dask array indexed "
                "by a dask mask: its chunk sizes are unknown), which xarray can neither "
                "align nor index; call compute_chunk_sizes() on the dask array before "
                f"making it a DataArray, or keep the unfiltered array and filter with {call}"
            )


def _new_name(base: str, taken: set[Hashable]) -> str:
    """``base``, or ``base`` in more brackets: a name not in ``taken``."""
    while base in taken:
        base = f"<{base}>"
    return base


def _predicate(cond: Any, names: tuple[str, ...], dim: Hashable | None,
               call: str = "ds.compact.where", array: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """The record Predicate of ``cond`` over the variables ``names`` (``call``: the
    accessor's call, as its refusals say it; ``array``: the names of arr.compact.where's
    DataArray among them)."""
    from .predicate.core import Predicate
    from .predicate.fields import record_predicate

    if isinstance(cond, xr.Dataset):
        raise TypeError(
            "cond is an xarray Dataset; compact.where takes the condition as a string over "
            "the variable names, a callable taking them by name (\"energy > 5\" or lambda "
            "energy: energy > 5), or a boolean DataArray along the dimension (ds.energy > 5)"
        )
    if not isinstance(cond, (str, Predicate)) and not callable(cond):
        # a NumPy, dask or pandas mask, a list: xarray's own where takes those only as
        # DataArrays too (it needs the dimension they run along)
        along = repr(dim) if dim is not None else '"event"'
        raise TypeError(
            f"cond is a {type(cond).__name__}; compact.where takes a string over the variable "
            "names (\"energy > 5\"), a callable taking them by name (lambda energy: energy > "
            "5) or a boolean DataArray along the dimension (ds.energy > 5); wrap a mask of "
            f"the rows as one: xr.DataArray(mask, dims={along})"
        )
    try:
        return record_predicate(cond, names)
    except (ValueError, TypeError) as e:  # NotElementwise is a ValueError
        raise in_accessor_words(e, call, array) from None


# The record refusals' names for what the accessor calls a condition and its variables
_WORDS = (
    ("the record predicate", "cond"), ("a record predicate", "cond"),
    ("which is not a field", "which is not a variable"),
    ("which are not fields", "which are not variables"), ("(fields: ", "(variables: "),
    ("of the field ", "of the variable "), ("of the fields ", "of the variables "),
    ("the whole field", "the whole variable"), ("a dask field", "a dask-backed variable"),
    ("none of the fields", "none of the variables"), ("the fields are ", "the variables are "),
    ("record predicate ", "cond "), ("one chunk of each field", "one chunk of each variable"),
    # a variable named True or False, a constant cond, a callable taking values by position
    # (np.isnan) (2026-12-01, fifteenth session; an xarray probe)
    ("never the field named", "never the variable named"),
    ("rename that field to use it in a predicate", "rename that variable to use it in cond, "
     "or pass the condition as a boolean DataArray"),
    ("for no field (a constant)", "for no variable (a constant)"),
    ("fields are passed by name", "variables are passed by name"),
    ("to read field names from", "to read variable names from"),
    ("whose parameters are field names", "whose parameters are variable names"),
)
# the record refusal's advice for a cumulative sum, made a condition as the accessor takes it
_CUMULATIVE_ADVICE = re.compile(
    r"Compute the condition first as a field of its own \(e\.g\. fields\['keep'\] = "
    r"da\.cumsum\((.+?)\) > 0\) and select by it, compact_records\(fields, 'keep'\)\.")
# and its advice for a value per row of a field with trailing axes (a reduction's refusal)
_PER_ROW_ADVICE = re.compile(
    r"A value per row of a field with trailing axes \(a row's sum, `(.+?)\.sum\(axis=1\)`\) "
    r"goes in as a field of its own: `compact_records\(.*?\)`\.")

# and its advice for a mask of all the rows read from outside (fields._rows_advice): until
# 2026-12-01 (fourteenth session, a regression review) the accessor's caller was told
# compact_records({**fields, "keep": mask}, "keep"), a call they never made
_ROW_MASK_ADVICE = re.compile(
    r"A boolean mask of the rows goes in as a field the predicate reads: compact_records\(.*?"
    r"\), or, with conditions on other fields, a predicate such as lambda keep, b: keep & "
    r"\(b > 3\)")


def _held(name: str, call: str, array: tuple[str, ...] = ()) -> str:
    """Variable ``name`` as the caller of ``call`` holds it: ``ds['v']``, or for
    ``arr.compact.where`` ``arr`` (``name`` one of the names ``array`` it is read by) or its
    coordinate ``arr['c']``. Until 2026-12-02 (seventeenth session) arr.compact.where's
    refusals gave ``ds.compact.where(ds['x'] ...)``, of a Dataset it does not have."""
    if not call.startswith("arr."):
        return f"ds[{name!r}]"
    return "arr" if name in array else f"arr[{name!r}]"


def in_accessor_words(e: Exception, call: str, array: tuple[str, ...] = ()) -> Exception:
    """A refusal of the record machinery (the predicate's trace, its typing) as the accessor
    says it: ``call`` first, cond and variables for the record predicate and its fields.
    Until 2026-12-01 they spoke of a record predicate and fields, a call the caller never
    made (the eleventh session's record probe). ``array``: the names cond reads the
    DataArray of ``arr.compact.where`` by (its advice says ``arr`` for them)."""
    said = str(e)
    for words, ours in _WORDS:
        said = said.replace(words, ours)
    said = _CUMULATIVE_ADVICE.sub(
        lambda m: "Compute the condition first as a boolean DataArray and pass it as cond, "
        f"e.g. {call}({_held(m[1], call, array)}.cumsum(dim) > 0).", said)
    said = _PER_ROW_ADVICE.sub(
        lambda m: "A value per row of a variable with other dimensions (a row's sum) goes in "
        f"as a condition on it: {call}({_held(m[1], call, array)}.sum(OTHER_DIM) > t, dim).",
        said)
    other = _held("b", call)
    said = _ROW_MASK_ADVICE.sub(
        "A boolean mask of the rows goes in as cond itself, a DataArray along the dimension: "
        f"{call}(xr.DataArray(mask, dims=dim), dim), or, with conditions on other "
        f"variables, {call}(xr.DataArray(mask, dims=dim) & ({other} > 3), dim)", said)
    try:
        return type(e)(f"{call}: {said}")
    except Exception:  # noqa: BLE001 - an exception class of other arguments: as it was
        return e


def _with_mask(
    ds: xr.Dataset, cond: xr.DataArray, dim: Hashable | None, avoid: str | None
) -> tuple[xr.Dataset, str, Hashable]:
    """``ds`` with the boolean DataArray ``cond`` added as a variable, its new name (the
    predicate that reads it) and the dimension it runs along.

    What ``ds.where(cond, drop=True)`` users pass. As a variable of the Dataset the mask is a
    field of the same compact_records call: a mask built from the Dataset's own dask variables
    (``ds.energy > 5``) is computed chunk by chunk in the pass that compacts, from the chunks
    the pass reads anyway, not beforehand. The name is none of the Dataset's nor ``avoid``
    (the ``indices=`` coordinate's)."""
    if str(cond.dtype) == "boolean":
        # pandas' nullable boolean (ds.k > 2 of a DataFrame's Int64 column): "of dtype
        # boolean; takes a boolean one" until 2026-12-01 (fifteenth session; an xarray probe)
        raise TypeError(
            "cond is a DataArray of pandas' nullable boolean dtype (missing values pd.NA, "
            "from a DataFrame's nullable column); compact.where takes NumPy booleans: "
            "cond.fillna(False).astype(bool), the rows ds.where(cond, drop=True) keeps"
        )
    if cond.dtype != bool:
        raise TypeError(
            f"cond is a DataArray of dtype {cond.dtype}; compact.where takes a boolean one "
            "(ds.energy > 5), a string or a callable"
        )
    # refused here in its own name: as the field it becomes, the refusal named
    # "compact_records (field 'cond')", a call and a name the caller never gave
    lazy = is_dask_array(cond.data)
    check_chunk_type(cond.data._meta if lazy else cond.data, "compact.where (cond)",
                     in_memory=not lazy)
    if cond.ndim != 1 or (dim is not None and cond.dims != (dim,)):
        along = f"along {dim!r}" if dim is not None else "along one dimension"
        raise ValueError(
            f"cond is a DataArray of dimensions {cond.dims}: a mask of the rows is 1-D "
            f"{along} (one value per row)"
        )
    (dim,) = cond.dims
    if dim not in ds.dims:
        raise ValueError(
            f"cond runs along {dim!r}, which is not a dimension of the Dataset (dimensions: "
            f"{', '.join(map(repr, ds.dims))})"
        )
    if cond.sizes[dim] != ds.sizes[dim]:
        raise ValueError(
            f"cond has {cond.sizes[dim]} rows along {dim!r}, the Dataset {ds.sizes[dim]}"
        )
    try:  # the same rows in the same order, or no answer: never a silent reindex
        xr.align(ds, cond, join="exact", copy=False)
    except ValueError as e:
        raise ValueError(
            f"cond's index along {dim!r} differs from the Dataset's ({e}); align them first "
            "(xr.align, .reindex_like)"
        ) from None
    if cond.chunks is not None and not any(
            v.chunks is not None for v in ds.variables.values() if dim in v.dims):
        # an in-memory Dataset comes back in memory, as its isel does: a dask mask as the
        # lead field would have made every variable a dask array
        cond = cond.compute()
    name, i = "cond", 0
    while name in ds.variables or name == avoid:
        i += 1
        name = f"cond_{i}"
    return ds.assign({name: cond.variable}), name, dim


def _the_dim(ds: xr.Dataset, read: tuple[str, ...], dim: Hashable | None,
             call: str = "ds.compact.where", array: str | None = None) -> Hashable:
    """The dimension to compact: ``dim``, or the one the variables ``read`` share (``call``
    and ``array`` as in :func:`compact_dataset`, for the refusal's example)."""
    if dim is not None:
        if dim not in ds.dims:
            raise ValueError(
                f"dim={dim!r} is not a dimension of the Dataset (dimensions: "
                f"{', '.join(map(repr, ds.dims))})"
            )
        return dim
    shared = set(ds.dims)
    for name in read:
        shared &= set(ds.variables[name].dims)
    if len(shared) != 1 and not read:
        # a constant cond: "the variables cond reads () share ..." until 2026-12-01 (a record
        # probe)
        raise ValueError(
            f"cond reads no variable (a constant) and the Dataset has {len(shared)} "
            f"dimensions ({', '.join(map(repr, ds.dims))}); pass dim= to say which one to "
            "compact"
        )
    if len(shared) != 1:
        # the variables read are not all 1-D along one dimension, which the check after this
        # refuses whatever dim is: until 2026-12-01 (fifteenth session, an xarray probe) this
        # said "pass dim=", which then gave that refusal
        which = f"{', '.join(map(repr, sorted(shared, key=str)))}" if shared else "no dimension"
        wide = next((f for f in read if len(ds.variables[f].dims) > 1), None)
        it = _held(wide, call, (array,) if array else ()) if wide is not None else ""
        advice = "" if wide is None else (
            f"; a condition on {'the DataArray' if wide == array else repr(wide)} goes in "
            f"reduced to one value per row, a boolean DataArray along the dimension to "
            f"compact: {call}(({it} > 0).any(OTHER_DIM))")
        raise ValueError(
            f"the variables cond reads ({', '.join(read)}) share {which}: cond reads "
            f"variables 1-D along the dimension to compact (one value per row), and these "
            f"are {', '.join(f'{f!r} {ds.variables[f].dims}' for f in read)}, whatever "
            f"dim= says{advice}"
        )
    return shared.pop()


def _cftime_dates(v: xr.Variable) -> tuple[str, str] | None:
    """For a 1-D object variable of cftime dates (xarray's ``use_cftime=True``), its calendar
    and a date of it as code that makes one (its middle row's day, ``cftime.DatetimeNoLeap(
    2000, 1, 1)``: on a sorted or reversed time axis the example selects about half the
    rows, where the first row's selected all or none); None for other objects, an empty
    variable, or without cftime. Reads that row only (of a dask variable, its chunk), as
    xarray's ``.dt`` reads one to tell."""
    try:
        import cftime
    except ImportError:
        return None
    if v.ndim != 1 or v.size == 0:
        return None
    try:
        first = v[v.size // 2:v.size // 2 + 1].values[0]
    except Exception:  # noqa: BLE001 - a row that cannot be read: the generic advice
        return None
    if not isinstance(first, cftime.datetime):
        return None
    calendar = str(first.calendar)
    day = f"{first.year}, {first.month}, {first.day}"
    kind = type(first).__name__
    if kind != "datetime" and getattr(cftime, kind, None) is type(first):
        return calendar, f"cftime.{kind}({day})"
    return calendar, f"cftime.datetime({day}, calendar={calendar!r})"


def _rows_first(v: xr.Variable, dim: Hashable) -> Any:
    """The variable's data with ``dim`` as axis 0 (a view or a lazy transpose)."""
    return v.data if v.dims[0] == dim else v.transpose(dim, ...).data


def _module(a: Any) -> str:
    if is_dask_array(a):
        a = a._meta
    return type(a).__module__.split(".")[0]


def _fieldable(v: xr.Variable, like: Any) -> bool:
    """Whether compact_records can take the variable as a field next to ``like`` (the lead
    variable's rows): an array of a NumPy dtype other than object, dask or in memory, with
    chunks (or, in memory, an array type) like the lead's."""
    import numpy as np

    if not isinstance(v.dtype, np.dtype) or v.dtype.hasobject:
        return False
    if v.chunks is not None:
        return is_dask_array(v.data) and (like is None or _module(v.data) == _module(like))
    data = v.data
    if not (isinstance(data, np.ndarray) or _module(data) == "cupy"):
        return False  # pandas extension arrays and other duck arrays: isel
    return like is None or _module(data) == _module(like)


def _key(name: Hashable, i: int, read: bool, reserved: str, taken: set[str]) -> str:
    """The field key of a variable: its name (what cond calls it), or for a name that is not
    a string or is ``reserved``, one cond cannot write (only a variable it reads needs its
    own name) and no other variable is called (``taken``: the string names): two variables
    under one key would both come back with the data of one of them."""
    if read or (isinstance(name, str) and name and name != reserved):
        return str(name)
    key = f"<variable {i}>"
    while key in taken:
        key = f"<{key}>"
    return key


def _split(key: str, data: Any, taken: set[str]) -> dict[str, Any]:
    """The fields of a variable (rows first): itself, or, for a dask one in several chunks
    along its other axes, one field per column of blocks. compact_records puts a field's
    trailing axes in one chunk: that merged the blocks (blocks as many times larger, and
    chunks unlike the input's, which isel keeps and the Dataset's other variables share)."""
    if not is_dask_array(data) or all(len(c) == 1 for c in data.chunks[1:]):
        return {key: data}
    parts: dict[str, Any] = {}
    for at in itertools.product(*(range(len(c)) for c in data.chunks[1:])):
        name = _new_name(f"{key} <block {', '.join(map(str, at))}>", taken | set(parts))
        parts[name] = data.blocks[(slice(None), *at)]
    return parts


def _joined(parts: list[Any], blocks: tuple[int, ...]) -> Any:
    """The compacted columns of blocks of :func:`_split` as one array again (dask's
    concatenation takes the blocks as they are: no task copies them)."""
    if not blocks:
        (data,) = parts
        return data
    import dask.array as da

    def nested(items: list[Any], counts: tuple[int, ...]) -> Any:
        if not counts:
            return items[0]
        step = len(items) // counts[0]
        return [nested(items[i * step:(i + 1) * step], counts[1:]) for i in range(counts[0])]

    return da.block([nested(parts, blocks)])


def _from_array(data: Any, like: Any) -> Any:
    """In-memory rows as a dask array chunked along axis 0 like ``like`` (the lead dask
    variable), on the lead's array type, so that one compact_records pass takes them."""
    import dask.array as da

    a = da.from_array(data, chunks=(like.chunks[0], *((s,) for s in data.shape[1:])))
    if _module(like) == "cupy" and _module(data) != "cupy":
        import cupy

        a = a.map_blocks(cupy.asarray, dtype=a.dtype, meta=cupy.empty((0,) * a.ndim, a.dtype))
    return a


def _host(a: Any) -> Any:
    """Row positions as a NumPy array (computed, and copied from the GPU where they are)."""
    import numpy as np

    if is_dask_array(a):
        a = a.compute()
    return a.get() if _module(a) == "cupy" else np.asarray(a)


def register() -> None:
    """Register ``compact`` on Dataset and DataArray; warn and leave an accessor of that name
    that another package registered (as :func:`dask_compact.accessor.register` does)."""
    for cls, accessor, reg in (
        (xr.Dataset, CompactDatasetAccessor, xr.register_dataset_accessor),
        (xr.DataArray, CompactDataArrayAccessor, xr.register_dataarray_accessor),
    ):
        existing = getattr(cls, NAME, None)
        if existing is accessor:
            continue
        if existing is not None and not getattr(existing, "_dask_compact", False):
            warnings.warn(
                f"xarray.{cls.__name__}.{NAME} is already defined by another package; "
                "dask_compact leaves it as it is: call dask_compact.compact_records instead",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        with warnings.catch_warnings():
            # xarray warns of any accessor it replaces; our own (a reloaded module's) is no news
            warnings.simplefilter("ignore")
            reg(NAME)(accessor)


for _cls in (CompactDatasetAccessor, CompactDataArrayAccessor):
    setattr(_cls, "_dask_compact", True)  # noqa: B010 - the mark register() looks for

register()
