"""dask-compact's settings in dask's configuration, their defaults and what each accepts, in
one place.

Set them with ``dask.config.set`` (also as a context manager), in ``~/.config/dask/*.yaml``,
or in the environment (``DASK_DASK_COMPACT__SORT__MIN_BUCKET=4096``)::

    dask-compact:
      cache:
        memory-entries: 64        # compiled loops/modules kept per cache and process
        disk-bytes: 256 MiB       # the disk cache's cap (an integer or a byte string)
      direct: true                # phase 1 over a persisted input asked of the workers
      sort:
        exchange: auto            # how a cluster sort cuts its exchange: auto/ipc/worker/bucket
        min-bucket: 65536         # elements a bucket at least, when buckets= is not given
        max-pieces: 16384         # exchange pieces (chunks x buckets) at most
        one-bucket-bytes: 16 MiB  # on CPU workers, smaller arrays are sorted as one bucket
      batch:
        gpu-frame-bytes: 16 MiB   # zstd frames of a GPU-encoded chunk (0: one a chunk)
        gpu-decode-wait: 0.5      # seconds (or "500ms") a GPU decode batch waits for more
        gpu-decode-tasks: 32      # chunk tasks beside the CPU threads, per GPU decoding
        task-bytes: 8 MiB         # a task reads whole Zarr chunks, this many bytes at least

Every read goes through :func:`get`, which falls back to the default here. Registering the
defaults alone (``dask.config.update_defaults`` when a module is first imported) was not
enough: a module first imported inside a ``dask.config.set`` block on one of its own keys put
its defaults into the section the block had just made, and the block's end removed that
section with them, so every later ``sort`` raised ``KeyError: 'sort'``.

:func:`get` also checks the value against the key's kind (:data:`KINDS`) and raises
:class:`SettingError` naming the key, the value and what it takes. Before (a new-user probe,
2026-11-30), each reader called ``int()`` on whatever was there: ``disk-bytes: "1 GiB"`` only
failed once a new structure compiled (``invalid literal for int()``), a bad
``memory-entries`` failed every ``map_compact`` from deep inside the predicate code, and
``direct: "no"`` counted as true. Every read and every public call also warns, once per process
and key, about a key under ``dask-compact`` that no reader knows (a misspelled key was silently
ignored) when it first finds it there (:func:`warn_unknown`).
"""

from __future__ import annotations

import difflib
import math
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import dask.config
from dask.utils import parse_bytes, parse_timedelta

__all__ = ["DEFAULTS", "KINDS", "SettingError", "check", "get", "warn_unknown"]

DEFAULTS: dict[str, Any] = {
    "cache": {"memory-entries": 64, "disk-bytes": 256 * 2**20},
    "direct": True,
    "sort": {"exchange": "auto", "min-bucket": 2**16, "max-pieces": 2**14,
             "one-bucket-bytes": 16 * 2**20},
    "batch": {"gpu-frame-bytes": 16 << 20, "gpu-decode-wait": 0.5, "gpu-decode-tasks": 32,
              "task-bytes": 8 << 20},
}


def _values_for_sections(section: Any, defaults: Mapping[str, Any],
                         name: str = "dask-compact") -> list[tuple[str, Any]]:  # fmt: skip
    """Each value that stands in ``section`` (dask's config at ``name``) where ``defaults``
    has a section of settings, as (its dotted name, the value); None counts as unset."""
    if section is None:
        return []
    if not isinstance(section, Mapping):
        return [(name, section)]
    out = []
    for key, default in defaults.items():
        if isinstance(default, Mapping):
            sub = section.get(key, section.get(key.replace("-", "_")))
            out.extend(_values_for_sections(sub, default, f"{name}.{key}"))
    return out


# A value where a section belongs (DASK_DASK_COMPACT=5, DASK_DASK_COMPACT__SORT=5), as the
# environment or a YAML file gave it: registering the defaults below replaces it with the
# defaults' section (dask.config.update), so it is read before and warned of at the first
# call (_UnknownKeys.check). Until 2026-12-01 (thirteenth session) it was silently ignored.
_GIVEN_FOR_SECTIONS = _values_for_sections(dask.config.get("dask-compact", default=None),
                                           DEFAULTS)
# shown by dask.config.get("dask-compact") and by dask's config tooling
dask.config.update_defaults({"dask-compact": DEFAULTS})


class SettingError(ValueError):
    """A ``dask-compact.*`` setting holds a value its reader cannot take."""


def _integer(value: Any) -> int | None:
    """``value`` as an int when it is one (an integral float, or a string of digits: what a
    YAML file or ``dask.config.set`` may hold), else None. A bool is not a number here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip().replace("_", ""))
        except ValueError:
            return None
    return None


def _count(value: Any) -> int | None:
    n = _integer(value)
    return n if n is not None and n >= 0 else None


def byte_string(text: str) -> int:
    """dask's ``parse_bytes`` of ``text`` ("1 GiB", "64 kiB"), refusing one without a digit
    (ValueError): it reads "" and " " as 1 byte and a bare unit as one of it ("kB": 1000).
    Until 2026-12-01 (a new-user probe) ``--memory-budget ""`` ran on a budget of 1 byte and
    an empty ``DASK_DASK_COMPACT__CACHE__DISK_BYTES`` left a disk cache of 1 byte. A number
    beyond a float ("1e999") is a ValueError too: parse_bytes' OverflowError went out of the
    refusals (a traceback from --memory-budget and from every call under such a setting)
    until 2026-12-01 (thirteenth session)."""
    if not any(c.isdigit() for c in text):
        raise ValueError(f"no number in {text!r}")
    try:
        return parse_bytes(text)
    except OverflowError:
        raise ValueError("too large a number") from None


def _bytes(value: Any) -> int | None:
    """A number of bytes: an integer, or a byte string as dask takes them ("1 GiB", "64 kiB")."""
    n = _integer(value)
    if n is None and isinstance(value, str):
        try:
            n = byte_string(value)
        except (ValueError, TypeError):
            return None
    return n if n is not None and n >= 0 else None


def _seconds(value: Any) -> float | None:
    """Seconds: a number, or a duration string as dask takes them ("500ms", "2s")."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        s = float(parse_timedelta(value, "s"))
    except (ValueError, TypeError, KeyError):
        return None
    return s if math.isfinite(s) and s >= 0 else None


def _bool(value: Any) -> bool | None:
    """True or False. From the environment dask reads ``True``/``False`` as bools (it
    ``literal_eval``s every value) and ``true``/``false`` as strings, so both are taken; any
    other string (``"no"``, ``"off"``) is refused rather than taken as true for being
    non-empty."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _choice(*choices: str) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        return value if isinstance(value, str) and value in choices else None
    parse.__doc__ = " / ".join(repr(c) for c in choices)
    return parse


# each key's parser (None: not accepted) and, for the message, what it takes
KINDS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "cache.memory-entries": (_count, "a whole number of entries (e.g. 64)"),
    "cache.disk-bytes": (_bytes, "a number of bytes: an integer >= 0 or a byte string such "
                                 "as '1 GiB'"),
    "direct": (_bool, "True or False"),
    "sort.exchange": (_choice("auto", "ipc", "worker", "bucket"),
                      "one of 'auto', 'ipc', 'worker', 'bucket'"),
    "sort.min-bucket": (_count, "a whole number of elements (e.g. 65536; a count, not bytes)"),
    "sort.max-pieces": (_count, "a whole number of exchange pieces (e.g. 16384)"),
    "sort.one-bucket-bytes": (_bytes, "a number of bytes: an integer >= 0 or a byte string "
                                      "such as '16 MiB' (0: the cluster's rule off)"),
    "batch.gpu-frame-bytes": (_bytes, "a number of bytes: an integer >= 0 or a byte string "
                                      "such as '16 MiB' (0: one frame per chunk)"),
    "batch.gpu-decode-wait": (_seconds, "seconds >= 0: a number or a duration such as '500ms'"),
    "batch.gpu-decode-tasks": (_count, "a whole number of tasks per GPU (e.g. 32)"),
    "batch.task-bytes": (_bytes, "a number of bytes: an integer >= 0 or a byte string such "
                                 "as '8 MiB' (0: one Zarr chunk per task)"),
}


def env_name(key: str) -> str:
    """The environment variable dask reads for ``dask-compact.<key>``."""
    parts = ["dask-compact", *key.split(".")]
    return "DASK_" + "__".join(p.replace("-", "_").upper() for p in parts)


def get(key: str) -> Any:
    """The setting ``dask-compact.<key>`` (e.g. ``"sort.min-bucket"``): the configured value,
    else its default, as its kind takes it (an int for a size given as ``"1 GiB"``); a value
    it cannot take raises :class:`SettingError` naming the key."""
    warn_unknown()
    default: Any = DEFAULTS
    for part in key.split("."):
        default = default[part]
    value = dask.config.get(f"dask-compact.{key}", default=default)
    parse, expected = KINDS[key]
    parsed = parse(value)
    if parsed is None:
        worker = _worker_here()
        where = (f" on the dask worker {worker}, which reads its own settings (the "
                 f"client's may differ)" if worker else "")
        there = " in that worker's process" if worker else ""
        raise SettingError(
            f"the setting dask-compact.{key} is {value!r}{where}; it takes {expected} "
            f"(default {default!r}). Change it where it is set{there}: dask.config.set, a "
            f"YAML file in ~/.config/dask, or the environment variable {env_name(key)}")
    return parsed


def _worker_here() -> str:
    """Which dask worker this process is (address, name and pid), or "" where none runs
    here: a setting is read where it is used, often on a worker, whose environment and
    config files are its own. Before (2026-11-30, a probe: ``DASK_DASK_COMPACT__CACHE__
    MEMORY_ENTRIES=abc`` in one worker's environment), the error told the user to change
    it "where it is set", and the client had no such setting."""
    workers = sys.modules.get("distributed.worker")  # no worker without it: nothing imported
    if workers is None:
        return ""
    clients = sys.modules.get("distributed.client")
    client = clients is not None and getattr(clients, "_get_global_client", lambda: None)()
    if client and client not in getattr(workers.Worker, "_initialized_clients", ()):
        # the client's own process (a threaded LocalCluster): its setting; a worker's own
        # client (get_client() in a task, our eager calls there) is the default client of the
        # worker's process too, and named no worker once made (the session's review)
        return ""
    try:
        worker = workers.get_worker()  # a task's worker
    except ValueError:  # a worker's event loop or executor outside a task, or no worker
        # a serving one (CI named a closed in-process worker of an earlier test, kept in
        # distributed's weak set, in the client's own error)
        from .compiler_room import serving_workers

        worker = next(iter(serving_workers()), None)
    if worker is None:
        return ""
    return f"{worker.address} (name {worker.name}, pid {os.getpid()})"


def check() -> None:
    """Read every setting once: raises :class:`SettingError` for the first bad one (the CLI
    calls this before a job, so a bad value stops it at the start, named)."""
    for key in KINDS:
        get(key)


def _flat(section: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for k, v in section.items():
        name = f"{prefix}{k}"
        keys.extend(_flat(v, name + ".") if isinstance(v, Mapping) else [name])
    return keys


def unknown_keys(section: Any = None) -> list[tuple[str, str | None]]:
    """Keys set under ``dask-compact`` (or in ``section``, a copy of it) that no reader knows,
    each with the closest known key."""
    if section is None:
        section = dask.config.get("dask-compact", default=None)
    if not isinstance(section, Mapping):
        return []
    return _unknown_among(_flat(section))


def _unknown_among(keys: list[str]) -> list[tuple[str, str | None]]:
    """Those of ``keys`` that no reader knows, each with the closest known key. dask reads
    ``memory_entries`` as ``memory-entries`` (its ``canonical_name`` tries both at every
    level, and the environment gives underscores), so those count as known."""
    out = []
    for key in keys:
        if key.replace("_", "-") in KINDS:
            continue
        close = difflib.get_close_matches(key.replace("_", "-"), list(KINDS), n=1, cutoff=0.6)
        out.append((key, close[0] if close else None))
    return out


def _get_in(section: Any, key: str) -> Any:
    """The value at the dotted ``key`` of the nested mappings ``section``."""
    for part in key.split("."):
        section = section[part]
    return section


def _skeleton(section: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``section``'s nested mappings holding the same leaf objects: it compares equal
    to ``section`` while no key was added or removed and no value replaced (a leaf left in place
    compares by identity, without calling its ``__eq__``)."""
    return {k: _skeleton(v) if isinstance(v, Mapping) else v for k, v in section.items()}


class _UnknownKeys:
    """Which keys under ``dask-compact`` were already looked at (known ones, and unknown ones
    warned about), and a skeleton of the section as last looked at.

    Every :func:`get` and public call runs :meth:`check`. It compares the section with its
    skeleton and walks the keys only when they differ (0.2-0.3 us a call: a ``get`` 0.60 ->
    0.91 us): ``dask.config.set`` adds a key inside the nested mappings in place, so
    neither the section object nor its own keys show it. (Before, only the keys present at a
    process's first read were checked: a misspelling set after any earlier call was
    silently ignored.)"""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.checked: set[str] = set()
        self.seen: Any = None
        self.stray_seen: Any = None  # the same two for the section compact
        self.stray_checked: set[str] = set()
        self.given = list(_GIVEN_FOR_SECTIONS)  # values given for sections, not yet warned of

    def check(self) -> None:
        stray = dask.config.config.get("compact")
        if stray is not None:  # one look-up where there is none: the common case
            self._check_stray(stray)
        # dask.config.get's own look-up (its canonical_name) only where the section is not
        # under this spelling: 0.07 against 0.28 us
        section = dask.config.config.get("dask-compact")
        if section is None:
            section = dask.config.get("dask-compact", default=None)
        try:
            if section == self.seen:
                return
        except Exception:  # noqa: BLE001 -- a value whose == raises (an array): walk the keys
            pass
        with self.lock:
            new: list[tuple[str, str | None]] = []
            given, self.given = self.given, []
            if isinstance(section, Mapping):
                keys = [k for k in _flat(section) if k not in self.checked]
                new = _unknown_among(keys)
                self.checked.update(keys)
                self.seen = _skeleton(section)
            else:
                if section is not None:  # set so since the import (dask.config.set)
                    given.append(("dask-compact", section))
                self.seen = section
        level = _user_level()
        sections = {key.rpartition(".")[0] for key in KINDS} - {""}
        given += [(f"dask-compact.{key}", _get_in(section, key)) for key, _ in new
                  if key.replace("_", "-") in sections]  # fmt: skip
        new = [(key, close) for key, close in new if key.replace("_", "-") not in sections]
        for name, value in given:
            within = name.partition(".")[2].replace("_", "-")
            keys = [k for k in KINDS if not within or k.startswith(within + ".")]
            example = "sort.min-bucket" if not within else keys[0]
            warnings.warn(f"setting {name} is {value!r}, a value where dask-compact takes a "
                          f"section of settings ({', '.join(keys)}): it is ignored, the "
                          f"defaults used. Set the keys under it, e.g. dask-compact.{example} "
                          f"(the environment variable {env_name(example)})", UserWarning,
                          stacklevel=level)  # fmt: skip
        for key, close in new:
            hint = f"; did you mean dask-compact.{close}?" if close else ""
            warnings.warn(f"unknown setting dask-compact.{key} is ignored{hint} (the settings "
                          f"are {', '.join(KINDS)})", UserWarning, stacklevel=level)

    def _check_stray(self, section: Any) -> None:
        """Warn about our keys under ``compact``, where ``DASK_COMPACT__SORT__MIN_BUCKET`` (the
        package's name with dask's separator, as ``DASK_COMPACT_CACHE_DIR`` suggests) puts
        them: dask reads ours from ``DASK_DASK_COMPACT__...``. Until 2026-12-01 (a new-user
        probe) such a setting was silently ignored. A section there without a key of ours
        is someone else's: nothing said."""
        try:
            if section == self.stray_seen:
                return
        except Exception:  # noqa: BLE001 -- a value whose == raises: walk the keys
            pass
        with self.lock:
            new = []
            if isinstance(section, Mapping):
                keys = [k for k in _flat(section) if k not in self.stray_checked]
                new = [k for k in keys if k.replace("_", "-") in KINDS]
                self.stray_checked.update(keys)
                self.stray_seen = _skeleton(section)
            else:
                self.stray_seen = section
        level = _user_level()
        for key in new:
            key = key.replace("_", "-")
            warnings.warn(f"setting compact.{key} is ignored: dask-compact's settings are under "
                          f"dask-compact (did you mean dask-compact.{key}, the environment "
                          f"variable {env_name(key)}?)", UserWarning, stacklevel=level)


_unknown = _UnknownKeys()
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning raised in the
    caller: the user's line, whichever of our functions (a public one, the accessor, a
    setting's reader) led there."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn_unknown() -> None:
    """Warn, once per process and key, about each key under ``dask-compact`` that no reader
    knows, when a call first finds it there (a misspelled key is otherwise silently ignored,
    its default used). :func:`get` and every public function call it: a setting is read only
    where it is used (``cache.memory-entries`` when a compiled loop is cached), so a
    misspelling set before a call that reads nothing would go unnoticed."""
    _unknown.check()
