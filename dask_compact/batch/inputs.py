"""Batch job input: a Zarr array (local or fsspec URL) or a memory-mapped .npy file: its shape,
dtype and a reader of row blocks (no dask array: the streaming job reads blocks itself, and
``dask.array`` costs a second of start-up on a host with CuPy, SciPy and xarray installed)."""

from __future__ import annotations

import base64
import contextlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np

from .caches import CACHE_PROTOCOLS, chained_base, resolved
from .plan import row_bytes, task_rows
from .reader import (
    NpyRows,
    Reader,
    ZarrRows,
    chunk_files_reader,
    npy_fingerprint,
    open_for_writing,
    walk_files,
    zarr_fingerprint,
)

AUTO_CHUNK_BYTES = 128 * 2**20  # .npy input: about this much per input chunk

SEPARATOR = "://"


# ---------------------------------------------------------------------------------------------
# Input


@dataclass
class Source:
    shape: tuple[int, ...]
    dtype: np.dtype  # native byte order: big-endian input is converted as it is read
    kind: str  # "npy" or "zarr"
    local_path: str | None  # for the INPUT/OUTPUT overlap check (a local INPUT)
    reader: Reader  # reads blocks of rows where a streaming task runs
    row_chunk: int  # rows per input chunk of the streaming job
    no_gpu_decode: str = ""  # why the reader cannot decode on a GPU ("" if it can)
    # the Zarr array's attributes and dimension names, which the output's arrays keep
    attrs: dict[str, Any] = field(default_factory=dict)
    dims: tuple[str, ...] | None = None
    url: str | None = None  # an fsspec INPUT: for the INPUT/OUTPUT overlap check
    # the input's fingerprint as it is now (reader.fingerprint: as it was when opened)
    fingerprint_now: Callable[[], str] | None = None
    # how xarray would decode its values (.cf.decoding: a Decoding, why not, or None)
    cf: Any = None
    # rows of the output's chunks unless --output-chunks says (0: row_chunk): a Zarr input's
    # own chunks, where a task reads several (plan.task_rows)
    out_rows: int = 0

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


# fsspec's names of the local file system: such a URL is a path here, so that it gets what a
# plain path gets (the lock, atomic renames, the overlap check, parent folders made: fsspec's
# local file system makes none, and a local:// OUTPUT failed on its own temporary group).
LOCAL_PROTOCOLS = ("file://", "local://")


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL of a file system other than the local one."""
    return SEPARATOR in path and not path.startswith(LOCAL_PROTOCOLS)


def local(path: str) -> str:
    for prefix in LOCAL_PROTOCOLS:
        path = path.removeprefix(prefix)
    return os.path.abspath(path)


def url_protocols(url: str) -> list[str]:
    """The protocol of each part of a chained fsspec URL (``zip::g.zip``: zip, then "" for
    the bare path)."""
    return [part.split("://")[0] if "://" in part or i < url.count("::") else ""
            for i, part in enumerate(url.split("::"))]


def refuse_unknown_chain(path: str, param_hint: str) -> None:
    """Refuse a name with ``::`` whose parts are no fsspec protocols: zarr opens any such
    name as a chained URL (``simplecache::s3://b/in.zarr``), so a local folder named
    ``sel::v1.zarr`` could not be written or read as one (until 2026-12-07, a new-user
    probe: an OUTPUT of that name failed after the job's start with a FileNotFoundError of a
    ``.sel`` folder; an INPUT with zarr's GroupNotFoundError naming a path cut at ``::``)."""
    if "::" not in path:
        return
    import fsspec

    known = set(fsspec.available_protocols())
    *chained, last = url_protocols(path)
    unknown = [p for p in chained if p not in known]
    if last and last not in known:
        unknown.append(last)
    if unknown:
        raise click.BadParameter(
            f"{path!r}: '::' chains fsspec URLs (simplecache::s3://bucket/in.zarr, "
            f"zip://in.zarr::data.zip), and {unknown[0]!r} is no protocol fsspec knows; zarr "
            "reads every name with '::' as such a chain, so a local path cannot hold '::' "
            "(rename it)", param_hint=param_hint)


def cached_local_path(path: str) -> str | None:
    """The local path that ``path`` reads through fsspec's caches alone
    (``filecache::/p/in.zarr``, ``simplecache::file:///p/in.zarr``), None for anything else.

    Such an INPUT is read as that path (:func:`looked_through`): a cache in front of the local
    file system copies local files to other local files, and through fsspec's ``filecache``
    a job's parallel reads failed (a ChunkError, exit 1: its record of cached files is not
    safe for several threads, fsspec issue #1126), while the path gets the checks, the early
    read and the input-change check of every file a path gets. A string test, no import:
    the early read plans from it while the command starts."""
    if "::" not in path:
        return None
    *caches, last = path.split("::")
    for part in caches:
        protocol, _, rest = part.partition("://")
        if protocol not in CACHE_PROTOCOLS or rest:
            return None
    if "://" in last and not last.startswith(LOCAL_PROTOCOLS):
        return None
    for prefix in LOCAL_PROTOCOLS:
        last = last.removeprefix(prefix)
    # fsspec reads ~ there (file://~/p too), and no shell expands it after "::"
    return local(os.path.expanduser(last))


def looked_through(path: str) -> str:
    """INPUT as the job reads it: :func:`cached_local_path` where it is one, else as given."""
    return cached_local_path(path) or path


def uncached(url: str) -> Any:
    """A Zarr store of ``url`` read past the fsspec caches at its front (the file system they
    read from), ``url`` itself where it has none: what the input is now, where the cache
    still holds what the job read. The commit's input-change check read ``zarr.json``
    through the cache, which answers from its copy: a change of INPUT during the job passed
    unseen."""
    if url_protocols(url)[0] not in CACHE_PROTOCOLS:
        return url
    from zarr.storage import FsspecStore

    fs, path = resolved(url)
    return FsspecStore.from_mapper(fs.get_mapper(path), read_only=True)


def refuse_unsafe_cache(path: str) -> None:
    """Refuse an INPUT read through fsspec's ``filecache`` from another file system than the
    local one (a local one is read as a path, :func:`looked_through`): its record of cached
    files is not safe for several threads (fsspec issue #1126), and a job's parallel reads
    through it failed ("TypeError: cannot unpack non-iterable bool object", a ChunkError,
    exit 1). Only a cache the chunks are read through: ``zip://x::filecache::s3://b/g.zip``
    opens one file through it."""
    import itertools

    front = itertools.takewhile(lambda p: p in CACHE_PROTOCOLS, url_protocols(path)[:-1])
    if "filecache" not in front:
        return
    raise click.BadParameter(
        f"{path!r} reads through fsspec's filecache, which fails when several threads read "
        "through it at once (as the job's tasks do): write simplecache:: in its place (the "
        "same whole-file cache), or the URL without a cache", param_hint="INPUT")


def member_url(url: str, name: str) -> str:
    """The fsspec URL of ``name`` inside the group at ``url``.

    In a chained URL the path belongs to the first part whose file system takes one (fsspec's
    ``_un_chain``: a cache in front, ``simplecache::s3://b/g``, takes its path from the part
    after it): ``zip://::g.zip`` holds ``x`` at ``zip://x::g.zip``. Appending ``/x`` to the
    whole URL named a path inside the zip file's own file system, and a probe's group job
    failed partway with NotADirectoryError."""
    if "::" not in url:
        return f"{url.rstrip('/')}/{name}"
    parts = url.split("::")
    for i, part in enumerate(parts[:-1]):
        part = part if "://" in part else f"{part}://"  # zip::g.zip is zip://::g.zip
        cls = _filesystem_class(part.split("://")[0])
        if cls is None or cls._strip_protocol(part) or not issubclass(cls, chained_base()):
            parts[i] = part + name if part.endswith("://") else f"{part.rstrip('/')}/{name}"
            return "::".join(parts)
    parts[-1] = f"{parts[-1].rstrip('/')}/{name}"
    return "::".join(parts)


def _filesystem_class(protocol: str) -> Any:
    import fsspec

    try:
        return fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError):  # unknown, or its package not installed: fsspec says so
        return None


def open_input(path: str, chunks: int | None, allow_missing_chunks: bool = False) -> Source:
    refuse_unknown_chain(path, "INPUT")
    refuse_unsafe_cache(path)
    if not is_url(path) and not os.path.exists(local(path)):
        raise click.BadParameter(f"{path!r} does not exist", param_hint="INPUT")
    if path.endswith(".npy"):
        return open_npy(path, chunks)
    if not is_url(path) and os.path.isfile(local(path)):
        raise click.BadParameter(
            f"{path!r} is a file but not a .npy file; INPUT must be a Zarr array or a .npy file"
            f"{zip_hint(local(path))}",
            param_hint="INPUT",
        )
    return open_zarr(path, chunks, allow_missing_chunks)


def _memory_hint(path: str) -> str:
    """For an INPUT on fsspec's in-memory file system that cannot be opened: why (it is this
    process's own, empty when the command starts). Until 2026-12-01 a new-user probe's
    ``memory://a3.zarr`` got zarr's "No group found in store StorePath(FsspecStore, ...)"
    alone."""
    if "memory" not in url_protocols(path):
        return ""
    return (". fsspec's in-memory file system (memory://) belongs to one process and is "
            "empty when this command starts: nothing another process wrote there can be "
            "read. Give a path or an object store's URL")


def zip_hint(path: str) -> str:
    """For a zip file given as a path: how to name a Zarr store in it (fsspec's URL form)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return ""
    return (f" (a Zarr store in a zip file is read through fsspec's zip URL: zip://::{path} "
            f"for the group at its root, zip://NAME::{path} for the array NAME in it)")


def open_npy(path: str, chunks: int | None) -> Source:
    if is_url(path):
        raise click.BadParameter(
            ".npy input must be a local file (it is memory-mapped); convert it to Zarr for "
            "remote storage",
            param_hint="INPUT",
        )
    p = local(path)
    # np.load calls any file without NumPy's header pickled data (a probe's 7 bytes of text
    # were refused as "pickled (object) data", 2026-12-06); an unreadable file is np.load's
    # to refuse below, as before
    with contextlib.suppress(OSError), open(p, "rb") as f:
        if f.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
            raise click.BadParameter(
                f"{path!r} is not a .npy file (it does not start with NumPy's header, "
                f"{np.lib.format.MAGIC_PREFIX!r}): give a .npy file written by np.save, or a "
                "Zarr array", param_hint="INPUT")
    try:
        mm = np.load(p, mmap_mode="r")
    except ValueError as e:  # object dtype: "Array can't be memory-mapped"; a bad header
        raise click.BadParameter(f"cannot memory-map {path!r}: {e}", param_hint="INPUT") from None
    shape, dtype = tuple(mm.shape), mm.dtype
    del mm
    check_shape_dtype(shape, dtype, path)
    # Blocks of rows along axis 0 (each a contiguous run of the C order) of about
    # AUTO_CHUNK_BYTES, or --chunks rows.
    row_chunk = chunks or max(1, AUTO_CHUNK_BYTES // max(1, row_bytes(shape, dtype)))
    if open_for_writing(p):
        raise click.BadParameter(
            f"{path!r} is open for writing by a program ({_WRITES_UNSEEN}); run the job once "
            "nothing has it open for writing (a writable memory map of it, np.load(..., "
            "mmap_mode='r+') or open_memmap, counts until it is deleted)", param_hint="INPUT")
    reader = NpyRows(p, shape, dtype, npy_fingerprint(p))
    return Source(shape, native_dtype(dtype), "npy", p, reader, row_chunk,
                  "the input is a .npy file (not compressed)",
                  fingerprint_now=lambda: _npy_fingerprint_now(p))


# Why a .npy INPUT open for writing is refused (reader.open_for_writing): until 2026-12-02
# (seventeenth session, a probe) a job started while a program wrote the file through a
# memory map committed an output mixing its versions, exit 0
_WRITES_UNSEEN = ("writes through a memory map change no modification time, so the job could "
                  "not tell whether the values it read are one version")


def _npy_fingerprint_now(path: str) -> str:
    """The .npy INPUT's fingerprint at the commit's check (:func:`.job.input_unchanged`),
    refusing the commit where a program has opened it for writing meanwhile."""
    if open_for_writing(path):
        raise click.ClickException(
            f"INPUT {path} was opened for writing while the job read it ({_WRITES_UNSEEN}): "
            "OUTPUT was not written. Run the job again once nothing writes to INPUT")
    return npy_fingerprint(path)


def open_zarr(path: str, chunks: int | None, allow_missing_chunks: bool = False) -> Source:
    import zarr

    try:
        node = zarr.open(store=path if is_url(path) else local(path), mode="r")
    except Exception as e:  # noqa: BLE001 -- zarr raises several types for "missing", "not zarr"
        raise click.BadParameter(
            f"cannot open {path!r} as a Zarr array: {type(e).__name__}: {e}"
            f"{_memory_hint(path)}", param_hint="INPUT"
        ) from None
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        hint = f"; it holds the arrays {', '.join(names)}" if names else " with no arrays"
        raise click.BadParameter(
            f"{path!r} is a Zarr group, not an array: name the array, e.g. "
            f"{member_url(path, names[0] if names else 'NAME')}{hint}",
            param_hint="INPUT",
        )
    check_shape_dtype(node.shape, node.dtype, path)
    if not allow_missing_chunks:
        check_chunks_stored(node, path)
    url = path if is_url(path) else local(path)
    fingerprint = zarr_fingerprint(node, url)
    check_cache_current(node, url)
    fast, why_not = chunk_files_reader(node, url, fingerprint, allow_missing_chunks)
    reader: Reader = fast or ZarrRows(url, node.shape, node.dtype, fingerprint)
    # Blocks of whole Zarr chunks along axis 0 (all trailing axes): each read decodes every
    # chunk it touches exactly once. A 0-d array's one chunk is its one row. A task reads
    # several small chunks (plan.task_rows); the output is chunked like the input all the same.
    from .. import settings

    own_rows = max(1, int(node.chunks[0]) if node.chunks else 1)
    row_chunk = chunks or task_rows(own_rows, row_bytes(node.shape, node.dtype),
                                    node.shape[0] if node.shape else 1,
                                    settings.get("batch.task-bytes"))
    from .cf import decoding

    return Source(tuple(node.shape), native_dtype(node.dtype), "zarr",
                  None if is_url(path) else local(path), reader, row_chunk, why_not,
                  user_attributes(node), dimension_names(node), path if is_url(path) else None,
                  lambda: zarr_fingerprint(zarr.open_array(store=uncached(url), mode="r"),
                                           url),
                  decoding(node), chunks or own_rows)


def check_cache_current(node: Any, url: str) -> None:
    """Refuse an INPUT whose cache in front (``simplecache::s3://...`` with a cache folder
    kept between jobs) holds other metadata than the store has now: the job would read the
    cache's older copies, and the commit's check (:func:`uncached`) would then refuse it as
    changed during the job. (Chunks cached older under unchanged metadata are not seen.)"""
    import zarr

    store = uncached(url)
    if store is url:
        return
    now = zarr.open_array(store=store, mode="r").metadata.to_dict()
    if now != node.metadata.to_dict():
        raise click.BadParameter(
            f"{url!r}: the cache in front of INPUT holds another copy of its metadata than "
            "the store has now (a cache folder kept from an earlier job): clear that cache, "
            "or read INPUT without it",
            param_hint="INPUT")


# How Zarr 2 arrays (and xarray on them) name their dimensions: an attribute
V2_DIMENSIONS = "_ARRAY_DIMENSIONS"


def dimension_names(z: Any) -> tuple[str, ...] | None:
    """The dimension names of the Zarr array ``z`` (format 3 metadata, or format 2's
    attribute), None where it has none or not one per axis."""
    dims = getattr(z.metadata, "dimension_names", None) or z.attrs.get(V2_DIMENSIONS)
    if not dims or len(dims) != len(z.shape) or not all(isinstance(d, str) for d in dims):
        return None
    return tuple(dims)


def user_attributes(z: Any) -> dict[str, Any]:
    """The attributes of the Zarr array or group ``z`` that an output (format 3) keeps: all
    but format 2's dimension names, which go to the output's own metadata
    (:func:`dimension_names`), plus, for a format 2 array that xarray wrote, its fill value as
    the ``_FillValue`` attribute.

    Why: xarray reads a format 2 array's fill value as its missing-value marker, and a format
    3 array's from that attribute alone (encoded as :func:`_xarray_fill_value` does), so the
    selected values of a probe's v2 Dataset came back as -9999 where the input read as NaN."""
    attrs = {k: v for k, v in z.attrs.items() if k != V2_DIMENSIONS}
    if (getattr(z.metadata, "zarr_format", 3) == 2 and V2_DIMENSIONS in z.attrs
            and z.fill_value is not None and "_FillValue" not in attrs):
        encoded = _xarray_fill_value(z.fill_value, np.dtype(z.dtype))
        if encoded is not None:
            attrs["_FillValue"] = encoded
    return attrs


# xarray's encodings, which it applies as it reads (CF conventions) and the job does not
XARRAY_ENCODINGS = ("_FillValue", "missing_value", "scale_factor", "add_offset")


def xarray_encodings(attrs: dict[str, Any]) -> list[str]:
    """The encodings in ``attrs`` (:func:`user_attributes`' result) that xarray would decode:
    ``--where`` compares the stored numbers, so where a field has them its condition means
    something else than on ``xr.open_zarr``'s values (a probe's ``isnan(ffl)`` selected no
    row of a float field whose NaNs are stored as -999)."""
    from .cf import time_units

    # datetime units, which xarray decodes with no other encoding (until 2026-12-02,
    # seventeenth session, a time coordinate xarray wrote was not named: see .cf.decoding)
    return [k for k in XARRAY_ENCODINGS if k in attrs] + (
        ["units"] if time_units(attrs) else [])


def _xarray_fill_value(value: Any, dtype: np.dtype) -> Any:
    """``value`` as xarray writes a format 3 array's ``_FillValue`` attribute (its
    ``FillValueCoder``: floats as the base64 of a little-endian double, complex as two of
    them), None for a dtype it has no encoding for."""
    def b64(x: float) -> str:
        return base64.standard_b64encode(struct.pack("<d", x)).decode()

    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    if dtype.kind == "f":
        return b64(float(value))
    if dtype.kind == "c":
        return [b64(float(np.real(value))), b64(float(np.imag(value)))]
    if dtype.kind == "U":
        return str(value)
    return None


def check_chunks_stored(node: Any, path: str) -> None:
    """Refuse an array with chunks missing from its store: they would read as the fill value.

    One listing of the store (what ``nchunks_initialized`` does), never a chunk read; for a
    sharded array also each stored shard's index (:func:`inner_chunks_stored`). Zarr itself
    skips chunks that equal the fill value when ``write_empty_chunks`` is off, so a missing
    chunk may be intended: ``--allow-missing-chunks`` says so.
    """
    total = int(node.nchunks)
    sharding = sharding_codec(node)
    keys = stored_keys(path)
    # nchunks_initialized counts a stored shard as all its chunks: a probe's shard with two of
    # its three chunks never written was accepted, and they read as NaN
    if sharding is not None:
        try:
            stored = inner_chunks_stored(node, sharding, keys)
        except ShardIndexError as e:
            raise click.BadParameter(f"{path!r}: {e}", param_hint="INPUT") from None
    elif keys is None:
        stored = int(node.nchunks_initialized)
    else:
        stored = sum(node.metadata.encode_chunk_key(c) in keys
                     for c in np.ndindex(*node.cdata_shape))
    if stored < total:
        raise click.BadParameter(
            f"{path!r}: {total - stored} of its {total} chunks are not in the store, and a "
            f"missing chunk reads as the fill value ({node.fill_value}): the input may be "
            "incomplete (an interrupted write, a lost object). If the missing chunks are meant "
            "to be fill values (Zarr skips writing chunks that equal the fill value), pass "
            "--allow-missing-chunks",
            param_hint="INPUT",
        )


def stored_keys(path: str) -> set[str] | None:
    """The keys stored under the local Zarr array at ``path``, linked folders followed
    (:func:`.reader.walk_files`); None for a URL, whose store zarr lists. zarr's local
    listing (``Path.rglob``) does not follow a linked folder that its reads go through: an
    INPUT whose ``c`` was a link to another disk was refused as missing every chunk
    (2026-12-01, a probe)."""
    if is_url(path) or not os.path.isdir(local(path)):
        return None
    return {rel for rel, _ in walk_files(local(path))}


def sharding_codec(node: Any) -> Any:
    """The sharding codec of the Zarr v3 array ``node`` (its first codec), None if it has
    none, or if zarr does not take the array as sharded (``node.shards`` None): a sharding
    codec followed by a bytes-to-bytes codec (a checksum, a compressor of the whole shard) is
    a valid array whose shards zarr reads whole, as chunks. Its inner chunks are not counted
    then (their index is inside the encoded shard, read only with all of it): the stored
    shards are. Until 2026-12-06 such an input was a traceback (``zip(None, ...)`` in
    :func:`inner_chunks_stored`; a probe)."""
    from zarr.codecs import ShardingCodec

    codecs = getattr(node.metadata, "codecs", ())
    if getattr(node, "shards", None) is None:
        return None
    return codecs[0] if codecs and isinstance(codecs[0], ShardingCodec) else None


class ShardIndexError(ValueError):
    """A stored shard's index could not be read or decoded (:func:`inner_chunks_stored`).
    Until 2026-12-06 (forty-fourth session, a probe: one byte of a shard's index flipped)
    zarr's checksum error came out of the up-front check as a traceback, where a damaged
    chunk read later is one line naming it."""


def inner_chunks_stored(node: Any, codec: Any, keys: set[str] | None = None) -> int:
    """How many chunks of the sharded array ``node`` are stored: the chunks that each stored
    shard's index gives a place (a chunk never written has offset and length 2^64-1 there),
    counting only chunks inside the array (an edge shard's index has room for chunks past the
    array's end).

    Cost: one listing of the store, then one read of each stored shard's index (16 bytes a
    chunk plus a checksum, at the shard's end or start: a ranged read, never the chunks' data),
    at most zarr's ``async.concurrency`` of them at a time. Uses the sharding codec's own index
    reader (zarr-python's private ``_load_shard_index_maybe``) so that any index codecs and
    either index location read as zarr reads them. A sharded chunk's own inner shards (nested
    sharding) are not looked into. ``keys``: the store's keys where they are listed already
    (a local array, :func:`stored_keys`)."""
    import zarr
    from zarr.core.common import concurrent_map
    from zarr.core.sync import sync

    arr = node._async_array
    per_shard = tuple(s // c for s, c in zip(node.shards, node.chunks, strict=True))
    grid = tuple(node.cdata_shape)  # chunks along each axis, in the whole array

    async def listing() -> set[str]:
        prefix = f"{arr.store_path.path}/" if arr.store_path.path else ""
        return {key.removeprefix(prefix)
                async for key in arr.store_path.store.list_prefix(prefix)}

    if keys is None:
        keys = sync(listing())
    shards = [coords for coords in np.ndindex(*node._shard_grid_shape)
              if node.metadata.encode_chunk_key(coords) in keys]

    async def count(coords: tuple[int, ...]) -> int:
        key = node.metadata.encode_chunk_key(coords)
        try:
            index = await codec._load_shard_index_maybe(arr.store_path / key, per_shard)
        except Exception as e:  # noqa: BLE001 -- said with the shard's key, see ShardIndexError
            raise ShardIndexError(
                f"the index of its shard {key} cannot be read ({type(e).__name__}: {e}): the "
                "store may be damaged (a checksum that does not match is a changed or "
                "truncated file)"
            ) from e
        if index is None:  # gone since the listing
            return 0
        inside = tuple(slice(0, min(n, g - c * n))
                       for n, g, c in zip(per_shard, grid, coords, strict=True))
        return int(index.get_full_chunk_map()[inside].sum())

    limit = int(zarr.config.get("async.concurrency") or 10)
    return sum(sync(concurrent_map([(c,) for c in shards], count, limit)))


def native_dtype(dtype: Any) -> np.dtype:
    """The dtype of the blocks as the job sees them: big-endian input (a ``>f8`` Zarr v2 array
    or ``.npy`` file) is converted to native order as it is read."""
    from ..validate import native

    return native(np.dtype(dtype))


def check_shape_dtype(shape: tuple[int, ...], dtype: Any, path: str) -> None:
    from ..validate import DTYPES, native

    # A 0-d array is taken, as one row of one element (x.ravel(), as compact_array takes a
    # 0-d array): until 2026-12-02 (nineteenth session, a probe) it was refused here.
    try:
        dt = native(np.dtype(dtype))
    except TypeError:  # zarr v3 data types without a NumPy equivalent
        dt = None
    if dt not in DTYPES:
        # the library compacts times; this command does not: until 2026-12-01 (fourteenth
        # session) the refusal left the list alone (a new-user probe)
        times = ("; datetime64 and timedelta64 arrays are compacted by the library: "
                 "dask_compact.compact(x, x > t0, chunks=N).to_zarr(OUTPUT) of x = "
                 "dask.array.from_zarr(INPUT) (a .npy file: "
                 "dask.array.from_array(np.load(INPUT)))"
                 if dt is not None and dt.kind in "mM" else "")
        raise click.BadParameter(
            f"{path!r} has dtype {dtype}; supported: {', '.join(d.name for d in DTYPES)}{times}",
            param_hint="INPUT",
        )
