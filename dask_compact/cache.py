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
under ``XDG_CACHE_HOME``; ``~`` expanded, a relative path made absolute at its first use);
:func:`clear_cache` empties the memory caches and, with ``disk=True``, removes the library's
files there. Trimming and clearing touch only the library's own files (:func:`own_files`:
generated sources, numba's cache files of them, also under ``NUMBA_CACHE_DIR``), never a
user's files in a shared directory. CuPy keeps its own compiled kernels in ``~/.cupy/kernel_cache``
(``CUPY_CACHE_DIR``), which CuPy manages.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, TypeVar

from . import settings

__all__ = ["BoundedCache", "cache_dir", "clear_cache", "disk_bytes", "memory_entries", "own_files",
           "trim"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def memory_entries() -> int:
    """Entries each in-process cache keeps (at least 1)."""
    return max(1, settings.get("cache.memory-entries"))


def disk_bytes() -> int:
    """Bytes the disk cache is trimmed to."""
    return settings.get("cache.disk-bytes")


def cache_dir() -> Path:
    """Where generated sources (and numba's cache of them) live: an absolute path, ``~``
    expanded, a relative one taken from the working directory of its first use."""
    env = os.environ.get("DASK_COMPACT_CACHE_DIR")
    if env:
        return _resolved(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return _resolved(os.path.join(base, "dask_compact"))


# Each setting's absolute path, fixed at its first use: a relative DASK_COMPACT_CACHE_DIR
# followed the working directory, so a chdir between a write and the import lost the file,
# and a quoted '~' (DASK_COMPACT_CACHE_DIR='~/c', which the shell leaves alone) made a
# directory named '~' (2026-11-30, a new-user probe).
_absolute: dict[str, Path] = {}


def _resolved(setting: str) -> Path:
    path = _absolute.get(setting)
    if path is None:
        path = _absolute[setting] = Path(os.path.abspath(os.path.expanduser(setting)))
    return path


# What the library writes in its cache directory; trim and clear_cache touch nothing else.
# Until 2026-11-30 they removed every file there (trim, oldest first) or the whole directory
# (clear_cache), and a DASK_COMPACT_CACHE_DIR pointed at ~/.cache, $TMPDIR or a data folder
# lost the user's files (a new-user probe). Ours: the generated sources ``loop_<digest>.py``
# and their temporary files while written (``loop_<digest>.<random>.tmp``) in the directory,
# and the lock one process compiles a loop under (``loop_<digest>.lock``, since 2026-12-02);
# under ``__pycache__`` (or numba's NUMBA_CACHE_DIR, :func:`_numba_dirs`) every file named
# after a source: numba's index ``.nbi`` and data ``.nbc`` files, theirs while written
# (``.nbi.tmp.<uid>``), Python's bytecode ``.pyc`` of the import and its temporary file.
_SOURCE = re.compile(r"loop_[0-9a-f]{24}(\.py|\.lock|\.[a-z0-9_]+\.tmp)\Z")
_DERIVED = re.compile(r"loop_[0-9a-f]{24}\.")


def _numba_dirs(directory: Path) -> list[Path]:
    """Where numba keeps its cache files of the sources in ``directory``: ``__pycache__``
    beside them, or with NUMBA_CACHE_DIR set, the folder numba names after the directory
    there (numba's ``UserProvidedCacheLocator``)."""
    dirs = [directory / "__pycache__"]
    config = sys.modules.get("numba.core.config")
    numba_cache = getattr(config, "CACHE_DIR", None) if config else None
    numba_cache = numba_cache or os.environ.get("NUMBA_CACHE_DIR")
    if numba_cache:
        from hashlib import sha1

        # numba's _CacheLocator.get_suitable_cache_subpath of a file in ``directory``
        where = os.path.abspath(directory)
        sub = f"{os.path.basename(where)}_{sha1(where.encode()).hexdigest()}"
        dirs.append(Path(numba_cache) / sub)
    return dirs


def own_files(directory: Path) -> list[Path]:
    """The files the library wrote under ``directory`` (see ``_SOURCE``): no other file, and
    no other folder's, is ever listed, so none is ever removed."""
    found = []
    for folder, pattern in [(directory, _SOURCE)] + [(d, _DERIVED) for d in _numba_dirs(directory)]:
        try:
            names = os.listdir(folder)
        except OSError:  # not there (yet), or gone meanwhile
            continue
        found += [folder / name for name in names if pattern.match(name)]
    return found


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
        # read first: a bad setting raises before anything is stored (read after, it raised
        # once and the entry stayed, so the next call ran with the setting unchecked)
        limit = memory_entries()
        with self.lock:
            self._items[key] = value
            self._items.move_to_end(key)
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
                if entry[1] == 0 and self._building.get(key) is entry:  # (a fork's child:
                    del self._building[key]  # its entries went: _fresh_locks)

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


def _fresh_locks() -> None:
    """In a forked child: every cache's lock and per-key build locks anew. A lock another
    thread of the parent held at the fork stays held in the child, by a thread it does not
    have: until 2026-12-02 (eighteenth session, a lock review) a process forked while another
    thread built a record loop (its key's lock held for the whole build, seconds) waited for
    ever at its own build of that loop, and one forked inside a put or lookup, at every call.
    No thread of the child builds yet (the forking thread's own build, if any, ends on the
    locks it took)."""
    for cache in BoundedCache._all:
        cache.lock = threading.RLock()
        cache._building = {}


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_fresh_locks)


def trim(directory: Path, max_bytes: int, group: Callable[[str], str]) -> int:
    """Remove whole groups of the library's files under ``directory`` (:func:`own_files`,
    never others), least recently written first, until they take at most ``max_bytes``;
    returns the bytes removed.

    ``group(file_name)`` names the group a file belongs to (a loop's source and numba's index
    and data files for it go together). Files that vanish meanwhile (another process trimming
    the same directory) are skipped; a process that loses a file recompiles.
    """
    groups: dict[str, list[tuple[Path, int, float]]] = {}
    for path in own_files(directory):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        groups.setdefault(group(path.name), []).append((path, st.st_size, st.st_mtime))
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
    also remove the disk cache's files (:func:`own_files` in :func:`cache_dir`: other files
    there stay) and its folders left empty. Other processes (dask workers) keep theirs: run it
    there with ``client.run(dask_compact.clear_cache)``."""
    from .predicate.function_shape import forget as forget_shapes

    for cache in list(BoundedCache._all):
        cache.clear()
    forget_shapes()  # the functions' learned shapes (their trees and the codes they hold)
    if disk:
        directory = cache_dir()
        for path in own_files(directory):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for folder in [*_numba_dirs(directory), directory]:
            with contextlib.suppress(OSError):  # not empty (a user's files), or not there
                folder.rmdir()
