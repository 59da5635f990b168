"""Bounded caches of compiled code: in memory (one LRU per kind) and on disk (a size cap).

Every new predicate *structure* (not a new threshold: constants are parameters) compiles a
numba loop on the CPU or a CuPy module on the GPU, about 2 MB of process memory each and a few
hundred kB of numba's files on disk. A long-lived worker that sees many structures would keep
them all; so each in-process cache keeps the ``memory-entries`` most recently used and the
disk cache is trimmed, oldest first, to ``disk-bytes`` whenever a new loop is written. That
bounds entries, not memory: numba never unloads machine code, so an evicted CPU loop leaves
its code behind, and a CPU loop built again after its eviction is kept for the process's life
(:data:`dask_compact.codegen.numba_loop._kept`: building it at every call grew without bound).

Limits come from dask's configuration (``dask.config.set`` or ``~/.config/dask/*.yaml``, or
the environment, e.g. ``DASK_DASK_COMPACT__CACHE__MEMORY_ENTRIES=16``)::

    dask-compact:
      cache:
        memory-entries: 64        # per cache and process (CPU loops; GPU modules per device)
        disk-bytes: 268435456     # 256 MiB of generated sources and numba's cache files

The disk cache lives in ``DASK_COMPACT_CACHE_DIR`` (default ``~/.cache/dask_compact``, or
under ``XDG_CACHE_HOME``); :func:`clear_cache` empties the memory caches and, with
``disk=True``, that directory. CuPy keeps its own compiled kernels in ``~/.cupy/kernel_cache``
(``CUPY_CACHE_DIR``), which CuPy manages.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

from . import settings

__all__ = ["BoundedCache", "cache_dir", "clear_cache", "disk_bytes", "memory_entries", "trim"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def memory_entries() -> int:
    """Entries each in-process cache keeps (at least 1)."""
    return max(1, settings.get("cache.memory-entries"))


def disk_bytes() -> int:
    """Bytes the disk cache is trimmed to."""
    return settings.get("cache.disk-bytes")


def cache_dir() -> Path:
    """Where generated sources (and numba's cache of them) live."""
    env = os.environ.get("DASK_COMPACT_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dask_compact"


class BoundedCache(Generic[K, V]):
    """A thread-safe LRU of at most :func:`memory_entries` values (read at each insertion, so
    a changed limit applies from the next new entry). ``on_evict(key, value)`` runs for each
    value dropped, e.g. to let go of a module that holds compiled code; ``on_clear()`` first
    at each :meth:`clear`, for what its owner keeps beside the cache."""

    _all: list[BoundedCache[Any, Any]] = []

    def __init__(self, name: str, on_evict: Callable[[K, V], None] | None = None,
                 on_clear: Callable[[], None] | None = None) -> None:
        self.name = name
        self._items: OrderedDict[K, V] = OrderedDict()
        self._on_evict = on_evict
        self._on_clear = on_clear
        self.lock = threading.RLock()  # guards the entries (and callers' own builds under it)
        # key -> [lock, waiters]: one build per key at a time, while hits and other keys' builds
        # go on (a GPU module's build is an NVRTC compile of seconds)
        self._building: dict[K, list[Any]] = {}
        self.evictions = 0
        BoundedCache._all.append(self)

    def get(self, key: K) -> V | None:
        with self.lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self.lock:
            self._items[key] = value
            self._items.move_to_end(key)
            limit = memory_entries()
            while len(self._items) > limit:
                old_key, old = self._items.popitem(last=False)
                self.evictions += 1
                if self._on_evict is not None:
                    self._on_evict(old_key, old)

    def pop(self, key: K) -> V | None:
        """Drop ``key``'s value (not an eviction: ``on_evict`` does not run); it, or None."""
        with self.lock:
            return self._items.pop(key, None)

    def pop_if(self, key: K, test: Callable[[V], bool]) -> V | None:
        """Drop ``key``'s value if ``test(value)`` (not an eviction); it, or None."""
        with self.lock:
            value = self._items.get(key)
            if value is None or not test(value):
                return None
            return self._items.pop(key)

    def get_or_build(self, key: K, build: Callable[[], V]) -> V:
        """The cached value, or ``build()`` stored under ``key``. Built once: threads asking
        for the same key while it is built wait for that build (a failed build is tried
        again by the next); other keys are looked up and built meanwhile."""
        hit = self.get(key)
        if hit is not None:
            return hit
        with self.lock:
            entry = self._building.get(key)
            if entry is None:
                entry = self._building[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                hit = self.get(key)
                if hit is None:
                    hit = build()
                    self.put(key, hit)
                return hit
        finally:
            with self.lock:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._building[key]

    def values(self) -> list[V]:
        with self.lock:
            return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        with self.lock:
            if self._on_clear is not None:
                self._on_clear()
            while self._items:
                key, value = self._items.popitem(last=False)
                if self._on_evict is not None:
                    self._on_evict(key, value)


def trim(directory: Path, max_bytes: int, group: Callable[[str], str]) -> int:
    """Remove whole groups of files under ``directory``, least recently written first, until
    what is left takes at most ``max_bytes``; returns the bytes removed.

    ``group(file_name)`` names the group a file belongs to (a loop's source and numba's index
    and data files for it go together). Files that vanish meanwhile (another process trimming
    the same directory) are skipped; a process that loses a file recompiles.
    """
    groups: dict[str, list[tuple[Path, int, float]]] = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            groups.setdefault(group(name), []).append((path, st.st_size, st.st_mtime))
    total = sum(size for files in groups.values() for _, size, _ in files)
    removed = 0
    for _, files in sorted(groups.items(), key=lambda kv: max(m for _, _, m in kv[1])):
        if total - removed <= max_bytes:
            break
        for path, size, _ in files:
            try:
                path.unlink()
                removed += size
            except FileNotFoundError:
                pass
    return removed


def clear_cache(disk: bool = False) -> None:
    """Drop every compiled loop and kernel module held by this process; with ``disk=True``
    also remove the disk cache directory (:func:`cache_dir`). Other processes (dask workers)
    keep theirs: run it there with ``client.run(dask_compact.clear_cache)``."""
    for cache in list(BoundedCache._all):
        cache.clear()
    if disk:
        shutil.rmtree(cache_dir(), ignore_errors=True)
