"""fsspec's caches in a chained URL (``simplecache::s3://b/in.zarr``), looked through to the
file system they read from: what INPUT is now (:func:`.inputs.uncached`), where INPUT and
OUTPUT lie for the overlap check (:mod:`.output`), and which part of a chained URL takes the
path (:func:`.inputs.member_url`). Its own module so that the input and the output side share
these under public names, neither importing the other's private ones. fsspec is imported
where a function needs it, not with the module, as in :mod:`.inputs`."""

from __future__ import annotations

from typing import Any

__all__ = ["CACHE_PROTOCOLS", "chained_base", "looked_past", "resolved"]

# fsspec's caches, which read through to the file system after them in a chained URL
# (``cached`` is ``blockcache``'s other name)
CACHE_PROTOCOLS = ("simplecache", "filecache", "blockcache", "cached")


def chained_base() -> type:
    """fsspec's base of the file systems that take their path from the next part of a chained
    URL (``ChainedFileSystem`` since 2025; before it, the caches)."""
    try:
        from fsspec.implementations.chained import ChainedFileSystem
    except ImportError:
        from fsspec.implementations.cached import CachingFileSystem as ChainedFileSystem
    return ChainedFileSystem


def resolved(url: str) -> tuple[Any, str]:
    """(the file system ``url`` reads and writes, fsspec's caches looked through; its path)."""
    import fsspec

    fs, stripped = fsspec.core.url_to_fs(url)
    return looked_past(fs), stripped


def looked_past(fs: Any) -> Any:
    """The file system that fsspec's caches in front of ``fs`` (if any) read and write: a
    ``simplecache::file://...`` URL names that file system's path (its protocol, "simplecache",
    made INPUT and OUTPUT look like two file systems, and a probe's ``--overwrite`` replaced
    its own INPUT)."""
    while isinstance(fs, chained_base()) and (inner := getattr(fs, "fs", None)) is not None:
        fs = inner
    return fs
