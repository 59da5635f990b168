"""Batch job output: a Zarr group written under a hidden sibling name and moved into place only
when complete, under a lock that keeps two jobs off one OUTPUT.

Guarantees for a local OUTPUT (see :class:`Target`):

* OUTPUT is at every moment absent, the old complete group, or the new complete group. A new
  group is moved in with ``renameat2(RENAME_NOREPLACE)``, a replaced one swapped with
  ``renameat2(RENAME_EXCHANGE)`` (Linux); elsewhere the old group is moved aside first and a
  later run puts it back if the job died between the two renames.
* One job at a time per OUTPUT: an ``flock`` on ``.OUTPUT.dask-compact.lock`` beside it, held
  for the whole job and released by the kernel if the process dies. A second job refuses.
* ``--overwrite`` replaces only a complete output of this tool (its completion marker) that
  can then be removed (no write-protected folder); anything else at OUTPUT is refused. The
  commit is recorded (``committed``) as soon as the new group is in place, interrupts held
  for the renames; the old group is removed after that, or left beside OUTPUT for the next
  job if that is interrupted or fails.
* OUTPUT is never INPUT, inside it or around it (:func:`check_overlap`), for paths and URLs.
* Temporary groups left by a killed job are removed by the next job on the same OUTPUT.

For an fsspec URL (object stores) there is no lock nor atomic rename: the group is moved, then
marked complete, so a group without the marker is never taken for finished; concurrent jobs on
one URL are not detected.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import click

from . import manifest as manifest_io
from .caches import CACHE_PROTOCOLS, looked_past, resolved
from .inputs import is_url, local, refuse_unknown_chain, url_protocols
from .manifest import Manifest
from .shared import SHARED_CHECK
from .signals import held, raise_if_interrupted

TMP_MARK = ".dask-compact-tmp-"
OLD_SUFFIX = "-old"
LOCK_SUFFIX = ".dask-compact.lock"

# ---------------------------------------------------------------------------------------------
# Atomic renames (Linux renameat2; None elsewhere)

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _load_renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc >= 2.28 / not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def rename2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True if done, False if this system or file system lacks
    it (the caller falls back); OSError for a real failure (EEXIST for RENAME_NOREPLACE)."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), src, None, dst)


def where_key(where: str) -> str:
    """``--where`` as a job's description keeps it: Python's own form of the expression, so
    that spacing and redundant parentheses (``x<0.5``, ``(x < 0.5)``) are one job for
    ``--resume`` (a probe, 2026-12-06: they were refused as another job's). The text as typed
    where it does not parse as Python (the parser's refusal comes first anyway)."""
    import ast

    try:
        return ast.unparse(ast.parse(where.strip(), mode="eval"))
    except (SyntaxError, ValueError, RecursionError):
        return where


def job_identity(job: dict[str, Any]) -> str:
    """A short token of a job's description (:func:`.job.describe`, what a resume must
    share), kept in the output's marker: a ``--resume`` that finds OUTPUT complete and no
    interrupted job tells by it whether an identical job finished it."""
    import hashlib
    import json

    return hashlib.sha1(json.dumps(job, sort_keys=True, default=repr).encode()).hexdigest()


# What a user changed, for a key of a job's description (:func:`.job.describe`,
# :func:`.records_job.describe`) that differs from the interrupted job's: the option typed, or
# what changed in INPUT. Until 2026-12-01 (a new-user probe) a refused --resume named the keys
# alone, "rows (1000 then, 300 now)" for --chunks, and a changed INPUT as two hashes.
_CHANGED = {"where": "--where", "output": "--output", "out_chunk": "--output-chunks",
            "fields": "--fields", "row_chunk": "--chunks", "shape": "INPUT's shape",
            "dtype": "INPUT's dtype", "kept": "INPUT's arrays copied unchanged",
            "version": "dask-compact's version"}
_HASHED = {"input": "INPUT's files changed since",
           "copied": "INPUT's copied arrays or attributes changed since"}


def _differs(key: str, then: Any, now: Any, group: bool) -> str:
    if key in _HASHED:
        return f"{key} ({_HASHED[key]})"
    # "rows" is the array job's --chunks, and a group's number of rows (INPUT's)
    what = (("INPUT's rows" if group else "--chunks or dask-compact.batch.task-bytes")
            if key == "rows" else _CHANGED.get(key))
    return f"{key} ({what + ': ' if what else ''}{then!r} then, {now!r} now)"


def finished_identity(store: Any) -> str | None:
    """The ``job`` token of the complete output of this tool at ``store``, None if it is not
    one or has none (written by an earlier version)."""
    import zarr

    if not complete_marker(store):
        return None
    attrs = zarr.open_group(store=store, mode="r").attrs.get("dask_compact")
    job = attrs.get("job") if isinstance(attrs, dict) else None
    return job if isinstance(job, str) else None


def complete_marker(store: Any) -> bool:
    """Whether ``store`` is a Zarr group this tool finished writing."""
    import zarr

    try:
        group = zarr.open_group(store=store, mode="r")
        attrs = group.attrs.get("dask_compact")
    except Exception:  # noqa: BLE001 -- not a group, unreadable, not Zarr: not ours
        return False
    return isinstance(attrs, dict) and attrs.get("complete") is True


# ---------------------------------------------------------------------------------------------
# Output: a temporary sibling, moved into place when complete


# fsspec file systems that cannot hold an OUTPUT, refused before anything runs
# an archive's file system is read-only: zarr's writes to zip:// died in a 54-line traceback
# (FileNotFoundError for a new zip file, IsADirectoryError for an empty one)
ARCHIVE_PROTOCOLS = ("zip", "tar", "libarchive")
# the in-memory file system ends with the process: a probe's memory:// OUTPUT was "written",
# exit 0, and gone when the command returned (tests set this to () to use it for an object
# store, in-process)
EPHEMERAL_PROTOCOLS = ("memory",)
# fsspec's caches (.caches.CACHE_PROTOCOLS) read through to their target, but a write through
# one lands in the cache's local copy first: a probe's simplecache::file://.../out.zarr OUTPUT
# failed halfway with a FileNotFoundError in the temporary group (exit 1, nothing left)


def check_writable_url(output: str) -> None:
    """Refuse an fsspec URL OUTPUT on a file system that cannot keep it (any part of a chained
    URL: ``simplecache::memory://x`` is in memory too), or a name no fsspec URL is."""
    refuse_unknown_chain(output, "OUTPUT")
    protocols = url_protocols(output)
    archive = next((p for p in protocols if p in ARCHIVE_PROTOCOLS), None)
    if archive is not None:
        raise click.BadParameter(
            f"{output!r}: cannot write into a {archive} file ({archive}:// is read-only to "
            "zarr); write a Zarr directory and archive it afterwards (a zip of it is read "
            "back as zip://::FILE.zip)", param_hint="OUTPUT")
    if any(p in EPHEMERAL_PROTOCOLS for p in protocols):
        raise click.BadParameter(
            f"{output!r} is on fsspec's in-memory file system, which ends with this "
            "command's process: the output would be gone when it exits. Give a path or an "
            "object store's URL", param_hint="OUTPUT")
    cache = next((p for p in protocols if p in CACHE_PROTOCOLS), None)
    if cache is not None:
        raise click.BadParameter(
            f"{output!r} writes through fsspec's {cache}, which does not write OUTPUT to the "
            "file system it caches: give that URL itself (without the cache)",
            param_hint="OUTPUT")


class Target:
    """OUTPUT, its lock and its temporary sibling; local paths are renamed, URLs moved with
    fsspec."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.url = is_url(output)
        self._lock_fd: int | None = None
        self._made: list[str] = []  # OUTPUT's folders that this job made, the deepest last
        self.committed = False  # the new group is at OUTPUT (what an interrupt leaves)
        self.old_left: str | None = None  # the replaced output, until it is removed
        self.old_error = ""  # why it could not be removed
        self.started_over = False  # --resume found the interrupted job's group changed
        tag = f"{TMP_MARK}{uuid.uuid4().hex[:12]}"
        if self.url or "::" in output:  # fsspec's short chain (zip::out.zip) is one too
            check_writable_url(output)
        if self.url:
            import fsspec

            self.fs, self.path = fsspec.core.url_to_fs(output)
            self.path = self.path.rstrip("/")
            parent, base = os.path.split(self.path)
            self.tmp_path = f"{parent}/.{base}{tag}" if parent else f".{base}{tag}"
            self.tmp = self.fs.unstrip_protocol(self.tmp_path)
        else:
            self.path = local(output)
            parent, base = os.path.split(self.path)
            self.parent, self.base = parent, base
            self.hidden = hidden_name(parent, base, output)
            self.tmp_path = self.tmp = os.path.join(parent, f".{self.hidden}{tag}")
            self.lock_path = os.path.join(parent, f".{self.hidden}{LOCK_SUFFIX}")

    def exists(self) -> bool:
        return self.fs.exists(self.path) if self.url else os.path.lexists(self.path)

    # -- the job's lock ------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take OUTPUT's lock for the rest of the job, or refuse if another job holds it."""
        if self.url:
            return
        import fcntl

        try:
            fd = self._make_folders_and_lock()
        except OSError as e:  # a file where a directory must be, a read-only place...
            why = f"{e.strerror or e} ({e.filename})"
            blocking = _file_in_the_way(self.parent)
            if blocking is not None:  # makedirs says "File exists" of it
                why = f"{blocking} is a file, not a directory"
            elif e.errno == errno.ELOOP:
                why = (f"{self.lock_path} is a symbolic link, not the lock file of dask "
                       "compact; remove it (the job would have written through it)")
            raise click.BadParameter(f"cannot write beside {self.output!r}: {why}",
                                     param_hint="OUTPUT") from None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_small(fd)
                os.close(fd)
                raise click.ClickException(
                    f"another dask compact job is writing {self.output!r}"
                    f"{' (' + holder + ')' if holder else ''}; wait for it to end, or choose "
                    "another OUTPUT"
                ) from None
            # The holder removes the file as it lets go: a lock on a removed file is no lock.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
            fd = self._open_lock()
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:  # a file of ours alone
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode())
        self._lock_fd = fd

    def _make_folders_and_lock(self) -> int:
        """Make OUTPUT's missing folders (recording them: :meth:`release`) and open the lock
        in them; again where another job's :meth:`release` removed a folder just made (a
        job on another OUTPUT in it that failed)."""
        attempts = 3
        while True:
            missing = []
            folder = self.parent
            while not os.path.lexists(folder):
                missing.append(folder)
                folder = os.path.dirname(folder)
            for folder in reversed(missing):
                try:
                    os.mkdir(folder)
                except FileExistsError:  # made meanwhile, by another job: not this one's
                    continue
                self._made.append(folder)
            try:
                return self._open_lock()
            except FileNotFoundError:
                attempts -= 1
                if not attempts:
                    raise

    def _open_lock(self) -> int:
        """The lock file, made if absent, never through a symbolic link: until 2026-12-01
        (fifteenth session, a probe) a link at the lock's name led the job to write its pid
        over the file it pointed to. (A file of several hard links, as a snapshot tool makes
        of a stale lock, is locked but not written: see acquire().)"""
        return os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)

    def release(self) -> None:
        """Let go of the lock; and where the job wrote nothing at OUTPUT, remove the folders
        it made for it (those left empty: a temporary output kept for ``--resume`` keeps
        its folder). Until 2026-12-02 (sixteenth session, the fifteenth session's probe) a
        failed or interrupted job left them, empty."""
        if self._lock_fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.lock_path)  # while still held: see acquire()
        os.close(self._lock_fd)
        self._lock_fd = None
        if self.committed:
            return
        while self._made:
            try:
                os.rmdir(self._made[-1])
            except OSError:  # not empty (what is kept, or another job's), or gone
                break
            self._made.pop()

    # -- what is at OUTPUT and beside it ---------------------------------------------------------

    def check_replaceable(self, overwrite: bool) -> None:
        """Refuse to touch OUTPUT unless it is absent, or ours and complete with --overwrite."""
        if not self.exists():
            return
        if not overwrite:
            raise click.UsageError(
                f"OUTPUT {self.output!r} exists; pass --overwrite to replace it"
            )
        if not self.url and (os.path.islink(self.path) or not os.path.isdir(self.path)):
            what = "a symbolic link" if os.path.islink(self.path) else "a file"
            raise click.UsageError(self._not_ours(what))
        if not complete_marker(self.output if self.url else self.path):
            raise click.UsageError(self._not_ours("not a complete output of dask compact"))
        self._check_only_ours()
        if not self.url:
            self._check_removable()

    def _check_only_ours(self) -> None:
        """Refuse to replace an output that holds anything its job did not write (an array, a
        file or a folder a user added in it): ``--overwrite`` replaces the job's output, not
        their other work, which a probe's ``--overwrite`` deleted with it, exit 0."""
        added = added_to(self.output if self.url else self.path, self._entries)
        if added:
            raise click.UsageError(
                f"OUTPUT {self.output!r} holds what dask compact did not write: "
                f"{', '.join(added)}. --overwrite replaces only an output that holds nothing "
                "else: move those elsewhere, or choose another OUTPUT")

    def _entries(self, sub: str = "") -> list[str]:
        """The names in OUTPUT's folder ``sub`` ("" for OUTPUT itself), "/" after a folder's."""
        if self.url:
            where = f"{self.path}/{sub}" if sub else self.path
            return [os.path.basename(e["name"].rstrip("/")) + ("/" if e["type"] == "directory"
                                                                else "")
                    for e in self.fs.ls(where, detail=True)]
        where = os.path.join(self.path, sub)
        with os.scandir(where) as it:
            return [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in it]

    def _check_removable(self) -> None:
        """Refuse to replace an old output that could not then be removed (a folder of it
        write-protected): a probe's job swapped the new output in, failed removing the old
        one and said "job failed", leaving it under a temporary name that made every later
        job on OUTPUT fail. (The directories are what removal needs: a file is unlinked from
        its folder. Root may remove anything: os.access says so.)"""
        root = os.path.realpath(self.path)
        points = mount_points()
        # a FILE mounted in it too (a chunk bind-mounted from elsewhere), which the walk of
        # folders missed until 2026-12-02 (seventeenth session, a probe): the job ran, and
        # failed removing the old output (the mount point busy), leaving it beside OUTPUT
        inside = sorted(point for point in points if _within(point, root))
        if inside:
            raise click.BadParameter(self._mounted(root, inside[0]), param_hint="OUTPUT")
        for folder, _, _ in os.walk(root):
            if is_mount_point(folder, points):
                raise click.BadParameter(self._mounted(root, folder), param_hint="OUTPUT")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise click.BadParameter(
                    f"{self.output!r} cannot be replaced: {folder} is write-protected, so its "
                    "old output could not be removed; make it writable (chmod -R u+w "
                    f"{self.path}) or choose another OUTPUT", param_hint="OUTPUT")

    def _mounted(self, root: str, folder: str) -> str:
        """Why an old output that is, or holds, the mount point ``folder`` is not replaced:
        until 2026-12-02 (sixteenth session, the fifteenth session's probe) ``--overwrite``
        of a mount point ran the job and failed at the swap ("Device or resource busy", exit
        1: a mount point cannot be renamed), and a mount inside the old output would have
        been emptied with it (its removal crosses into mounts)."""
        if folder == root:
            return (f"{self.output!r} cannot be replaced: {folder} is a mount point (a file "
                    "system or a bind mount is mounted there), which cannot be moved aside "
                    "for the new output; write OUTPUT inside it (e.g. "
                    f"{os.path.join(self.path, self.base)}), or unmount it")
        return (f"{self.output!r} cannot be replaced: {folder} is a mount point (a file "
                "system or a bind mount is mounted there), whose files the old output's "
                "removal would delete; unmount it, or choose another OUTPUT")

    def _not_ours(self, what: str) -> str:
        return (
            f"OUTPUT {self.output!r} is {what}: --overwrite replaces only a complete output "
            "written by dask compact (its group attribute dask_compact.complete). Remove it "
            "yourself, or choose another OUTPUT"
        )

    def _stale(self) -> list[str]:
        if self.url or not os.path.isdir(self.parent):
            return []
        # and those of an earlier version, which named them after OUTPUT's whole name (a
        # job killed on an OUTPUT of 212-224 bytes; see hidden_name)
        prefixes = (f".{self.hidden}{TMP_MARK}", f".{self.base}{TMP_MARK}")
        return sorted(n for n in os.listdir(self.parent) if n.startswith(prefixes))

    def resumable(self, job: dict[str, Any],
                  earlier: Sequence[tuple[dict[str, Any], str]] = (),
                  say: Callable[[str], None] = lambda line: None) -> Manifest | None:
        """The manifest of an interrupted job on this OUTPUT identical to ``job``, whose group
        this job then continues (``self.tmp`` names it); None if there is none. An interrupted
        job that differs is refused, naming what differs: it is left for a run without
        ``--resume`` to remove. ``earlier``: (``job`` as an earlier version described it,
        what to say of an interrupted job identical to that one): where only the identity's
        form changed, "run it with the same arguments" cannot work (a review).

        The manifest's word is checked against the group (:func:`.manifest.
        changed_since_made`, :func:`.manifest.unmatched_chunks`): output chunks whose files
        differ from what their writes left are written again, and a group whose metadata or
        copied arrays changed is removed and the job started over (``started_over``), each
        said through ``say``."""
        if self.url:
            raise click.UsageError("--resume needs a local OUTPUT (an fsspec URL has no "
                                   "manifest of finished chunks)")
        found: list[tuple[float, str, Manifest]] = []
        unusable: list[tuple[str, str]] = []
        for name in self._stale():
            path = os.path.join(self.parent, name)
            if name.endswith(OLD_SUFFIX):
                continue
            m = manifest_io.read(path)
            if isinstance(m, Manifest):
                found.append((os.stat(manifest_io.path_in(path)).st_mtime, path, m))
            elif m:
                unusable.append((path, m))
        if not found:
            # A manifest edited or cut short by a hand is not used (its counts place what
            # follows the resume point): the group is removed with the other leftovers and
            # the job started over. Until 2026-12-01 (the twelfth session's probe) its counts
            # were taken as they were, and an output of wrong values committed, exit 0.
            for path, why in unusable:
                say(f"--resume: the manifest of the interrupted job on {self.output} ({path}) "
                    f"cannot be used: {why}; starting over")
                self.started_over = True
            return None
        found.sort(key=lambda t: t[0])
        for _, path, m in reversed(found):
            if m.job == job:
                return self._checked(path, m, say)
        _, path, m = found[-1]
        for old, why in earlier:
            if m.job == old:
                raise click.UsageError(
                    f"--resume: the interrupted job on {self.output!r} ({path}) {why}")
        diff = ", ".join(_differs(k, m.job.get(k), job.get(k), "fields" in job)
                         for k in sorted(set(job) | set(m.job)) if m.job.get(k) != job.get(k))
        raise click.UsageError(
            f"--resume: the interrupted job on {self.output!r} ({path}) differs in {diff}; "
            "run it with the same arguments, or without --resume to start over"
        )

    def _checked(self, path: str, m: Manifest, say: Callable[[str], None]) -> Manifest | None:
        """``m``, the manifest of the interrupted job's group ``path``, with the output chunks
        whose files no longer match taken off its ``written``; None (the group removed) where
        the files the group was made with changed. Until 2026-12-01 (a probe) a chunk file
        truncated or rewritten after the kill was committed as it was, and so was a group
        whose arrays' metadata had been edited, exit 0."""
        changed = manifest_io.changed_since_made(path, m)
        if changed and manifest_io.uncut(path, m, changed):
            say(f"--resume: the interrupted job on {self.output} ({path}) had cut its arrays "
                "to the selection's length when it was stopped, before its commit: set them "
                "back, continuing it")
            changed = []
        if changed:
            listed = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more"
                                               if len(changed) > 3 else "")
            self._cleaning(functools.partial(_remove, path), path,
                           "remove it yourself (the temporary output of an interrupted job)")
            say(f"--resume: the temporary output of the interrupted job on {self.output} "
                f"({path}) changed since the job was interrupted ({listed} differ from what "
                "the job made): removed it, starting over")
            self.started_over = True
            return None
        redo = manifest_io.unmatched_chunks(path, m)
        if redo:
            m.written -= redo
            for j in redo:
                m.files.pop(j, None)
            first = sorted(redo)
            listed = ", ".join(map(str, first[:5])) + (f" and {len(first) - 5} more"
                                                       if len(first) > 5 else "")
            say(f"--resume: output chunk{'s' if len(redo) > 1 else ''} {listed} of the "
                f"interrupted job on {self.output} differ{'' if len(redo) > 1 else 's'} from "
                "what the job wrote (changed or removed since, or written by a version that "
                "recorded no checksums): written again")
        self.tmp = self.tmp_path = path
        return m

    def clean_stale(self, say: Callable[[str], None]) -> None:
        """Remove temporary groups of jobs that died on this OUTPUT (none can be alive: we hold
        the lock), except the one a resumed job continues, and put back an old output a job
        died swapping out."""
        for name in self._stale():
            path = os.path.join(self.parent, name)
            if path == self.tmp:
                continue
            swapped_out = name.endswith(OLD_SUFFIX) and not os.path.lexists(self.path)
            if swapped_out and complete_marker(path):
                self._cleaning(functools.partial(os.rename, path, self.path), path,
                               f"move it back to {self.path} yourself (it is the old output, "
                               "complete)")
                say(f"restored {self.output} from an interrupted replacement ({name})")
                continue
            resumable = "; --resume would have continued it" if manifest_io.load(path) else ""
            self._cleaning(functools.partial(_remove, path), path,
                           "remove it yourself (a temporary or replaced output of dask "
                           "compact, not OUTPUT)")
            what = ("the workers' check folder" if name.endswith(SHARED_CHECK)  # see .shared
                    else "the temporary output")
            say(f"removed {path}: {what} of an interrupted job{resumable}")

    def _cleaning(self, step: Callable[[], None], path: str, remedy: str) -> None:
        """``step()`` on ``path``, left beside OUTPUT by an earlier job, its failure a short
        error saying what to do (a write-protected old output left by a replacement had made
        every later job on OUTPUT end in a traceback)."""
        try:
            step()
        except OSError as e:
            raise click.ClickException(
                f"cannot clean up {path}, left beside {self.output!r} by an earlier job "
                f"({e.strerror or e}: {e.filename}); {remedy}, then run again") from None

    # -- writing -------------------------------------------------------------------------------

    def prepare(self) -> None:
        if not self.url:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def discard(self) -> None:
        """Remove the temporary group (a failed or interrupted job); nothing once the new
        group is at OUTPUT (an interrupt while the old one was being removed: that one is
        left for the next job, which removes it at once). The writes that an interrupt left
        running in this process's IO threads end first (:func:`settle_io`): one of them
        made the group again after its removal."""
        if self.committed:
            return
        with held():
            _settle_io_before_removal()
            if self.url:
                if self.fs.exists(self.tmp_path):
                    self.fs.rm(self.tmp_path, recursive=True)
            else:
                shutil.rmtree(self.tmp_path, ignore_errors=True)

    def commit(self, mark_complete: Any, overwrite: bool) -> None:
        """Put the finished group at OUTPUT: a new one, or in place of our own old one, which
        is then removed (:meth:`remove_old`). Not after an interrupt whose exception was lost
        (:func:`.signals.raise_if_interrupted`)."""
        raise_if_interrupted()
        if self.url:
            # Object stores have no atomic rename: move first, and only then mark the group
            # complete, so a move cut short leaves a group that does not say it is finished.
            if self.fs.exists(self.path):
                self.check_replaceable(overwrite)
                self.fs.rm(self.path, recursive=True)
            self.fs.mv(self.tmp_path, self.path, recursive=True)
            mark_complete(self.output)
            self.committed = True
            return
        mark_complete(self.tmp)
        # An interrupt waits for the renames, so that `committed` says where the new group is.
        with held():
            raise_if_interrupted()  # one lost while the group was marked complete
            if os.path.lexists(self.path):
                if not overwrite:  # it was absent at the start: another program made it
                    raise click.ClickException(self._appeared())
                self.check_replaceable(overwrite)  # it may have changed since the start
                self.old_left = self._swap_in()
            else:
                self._move_in()
            self.committed = True
        self.remove_old()

    def remove_old(self) -> None:
        """Remove the old output that a replacement moved aside (the new one is in place).
        An interrupt here leaves it (the next job on OUTPUT removes it); a failure to remove
        it is kept in ``old_error`` for the job to report, the new output being complete."""
        if self.old_left is None:
            return
        try:
            _remove(self.old_left)
        except OSError as e:
            self.old_error = f"{type(e).__name__}: {e.strerror or e} ({e.filename})"
            return
        self.old_left = None

    def _move_in(self) -> None:
        try:
            done = rename2(self.tmp, self.path, _RENAME_NOREPLACE)
        except FileExistsError:
            raise click.ClickException(self._appeared()) from None
        if not done:
            # No renameat2: rename() would silently replace an empty directory, so look first;
            # every dask compact job holds the lock, so only another program could race here.
            if os.path.lexists(self.path):
                raise click.ClickException(self._appeared())
            os.rename(self.tmp, self.path)

    def _appeared(self) -> str:
        return (
            f"OUTPUT {self.output!r} appeared while the job ran (made by another program: "
            "dask compact jobs take its lock); it was left as it is, and this job's result "
            "was not written"
        )

    def _swap_in(self) -> str:
        """The new group in place of the old; where the old one now is."""
        if rename2(self.tmp, self.path, _RENAME_EXCHANGE):
            return self.tmp  # the old group, now under the temporary name
        # Two renames: a job killed between them leaves the old group aside under the name
        # clean_stale() looks for, and the next job on OUTPUT puts it back.
        old = self.tmp + OLD_SUFFIX
        os.rename(self.path, old)
        os.rename(self.tmp, self.path)
        return old


# How long a discard waits for the writes an interrupt left running (see settle_io): a local
# file system's end in milliseconds; an object store's, cut off by a hung connection, are not
# worth holding the command's exit longer
SETTLE_SECONDS = 5.0


def settle_io(timeout: float = SETTLE_SECONDS) -> None:
    """Wait, at most ``timeout`` seconds, until the coroutines running on the IO threads of
    zarr and fsspec in this process have ended.

    zarr's and fsspec's blocking calls run their coroutine on a thread of their own and wait
    for it; an interrupt ends the wait, not the coroutine. A probe's Ctrl-C landed in
    :func:`.job.create_group`: the command removed the temporary group, said "was not
    written", exit 130, and the group's ``zarr.json``, written a moment later, made it again
    (3 of 4 runs, ``--local processes``, 2^24 float32, the signal within 2 ms of the folder
    appearing). The same holds for every zarr write of this process (the arrays' cut, the
    completion marker) and for fsspec's calls on a URL OUTPUT."""
    import time

    deadline = time.monotonic() + timeout
    for loop in _io_loops():
        _wait_for_tasks(loop, max(0.0, deadline - time.monotonic()))


def _settle_io_before_removal() -> None:
    """:func:`settle_io` where a removal follows that must run whatever it raises: a
    ``concurrent.futures.CancelledError`` (an IO loop shutting down) or anything else had
    skipped the removal of a failed job's temporary output and hidden the job's own error
    (a review). Logged, not raised: the writes are then not known to have ended."""
    try:
        settle_io()
    except Exception as e:  # noqa: BLE001 (any failure: the removal comes first)
        logging.getLogger(__name__).warning(
            "waiting for the IO threads' writes before removing the temporary output "
            "failed (%s: %s); removing it now", type(e).__name__, e)


# How long the process's exit waits for zarr's IO thread to stop (see end_zarr_io_at_exit)
IO_EXIT_SECONDS = 5.0


@functools.cache  # registered once per process
def end_zarr_io_at_exit() -> None:
    """At the process's exit, stop zarr's IO loop and wait for its thread (at most
    ``IO_EXIT_SECONDS``) before zarr's own exit handler runs: that one waits 0.2 s, then
    closes the loop, and a loop still running then (its thread held up by a callback or by
    a loaded machine) printed "RuntimeError: Cannot close a running event loop" with its
    traceback after the command's last line (a README probe on a busy 2-core machine, once,
    under a refused INPUT; a callback of 0.6 s on the loop makes it every time). zarr's
    handler then finds the loop stopped and closes it. Registered after zarr's (atexit runs
    the last registered first)."""
    import atexit

    import zarr.core.sync  # noqa: F401 -- zarr's handler registered before ours

    atexit.register(_stop_zarr_io, IO_EXIT_SECONDS)


def _stop_zarr_io(timeout: float) -> None:
    from zarr.core import sync  # imported when this was registered

    loop, thread = sync.loop[0], sync.iothread[0]
    if loop is None or thread is None or loop.is_closed() or not loop.is_running():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)


def _io_loops() -> list[Any]:
    """The running event loops of zarr's and fsspec's IO threads (those started)."""
    import sys

    loops = []
    for module in ("zarr.core.sync", "fsspec.asyn"):
        held_loop = getattr(sys.modules.get(module), "loop", None)  # [loop] or [None]
        loop = held_loop[0] if isinstance(held_loop, list) and held_loop else None
        if loop is not None and loop.is_running() and not loop.is_closed():
            loops.append(loop)
    return loops


def _wait_for_tasks(loop: Any, timeout: float) -> None:
    """Until the tasks on ``loop`` (running in another thread) when this is called have
    ended, at most ``timeout`` seconds."""
    import asyncio
    import concurrent.futures

    async def others_ended() -> None:
        me = asyncio.current_task()
        others = {t for t in asyncio.all_tasks() if t is not me}
        if others:
            await asyncio.wait(others, timeout=timeout)

    waiting = asyncio.run_coroutine_threadsafe(others_ended(), loop)
    try:
        waiting.result(timeout + 1.0)
    except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError,
            RuntimeError):  # a loop stopping meanwhile (its tasks cancelled)
        waiting.cancel()


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _read_small(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


class _Input(Protocol):
    local_path: str | None

    @property
    def url(self) -> str | None: ...


def check_overlap(src: _Input, target: Target) -> None:
    """OUTPUT must be neither INPUT (a :class:`.inputs.Source` or a Zarr group's
    :class:`.records_job.GroupInput`) nor inside it, nor contain it: the job would write into
    its input, or ``--overwrite`` delete it. Judged on one file system's paths, whether they
    are spelled as paths or as fsspec URLs (``file://`` and ``local://`` are paths; an
    overlap of two ``s3://`` URLs was not looked for and a probe's ``--overwrite`` deleted its
    INPUT), through fsspec's caches (``simplecache::``, ``filecache::``, ``blockcache::``: the
    file system they cache), for an archive's member (``zip://x::/p/g.zip``) as the archive
    file, and, for a ``reference://`` INPUT, against every file its references point to."""
    out = _place(None if target.url else target.path, target.output if target.url else None)
    places = _input_places(src.local_path, src.url)
    walks: dict[str, tuple[set[tuple[int, int]], list[str]]] = {}  # each folder walked once
    mounted: list[tuple[str, str, str]] | None = None

    def walked(path: str) -> tuple[set[tuple[int, int]], list[str]]:
        if path not in walks:
            walks[path] = _folders_of(path)
        return walks[path]

    def overlaps(place: tuple[str, str], other: tuple[str, str], walk_other: bool) -> bool:
        nonlocal mounted
        if _overlap(place, other):
            return True
        if place[0] != "file" or other[0] != "file":
            return False
        if _linked_overlap(walked(place[1]), other[1]):
            return True
        if mounted is None:
            mounted = mounts()  # read once for OUTPUT and every leftover
        if _mounted_overlap(walked(place[1])[1], other[1], mounted):
            return True
        # A folder of ``other`` mounted inside INPUT (a bind mount, an NFS export mounted
        # twice): its path above is INPUT's, so only the folders themselves show it. Until
        # 2026-12-02 (sixteenth session, the fifteenth session's probe) a group INPUT whose
        # field was a bind mount of prev.zarr/values passed, and --overwrite of prev.zarr
        # emptied it, exit 0. ``other``'s folders are walked where the job would remove
        # them: an output of ours (--overwrite replaces it) and a leftover beside it.
        return walk_other and bool(walked(place[1])[0] & walked(other[1])[0])

    ours = out[0] == "file" and os.path.isdir(out[1]) and complete_marker(out[1])
    if any(overlaps(place, out, ours) for place in places):
        raise click.BadParameter("OUTPUT must not be INPUT, lie inside it or contain it",
                                 param_hint="OUTPUT")
    # What killed jobs left beside OUTPUT, which this job removes (Target.clean_stale) or
    # continues: until 2026-12-01 (fifteenth session, a probe) an INPUT there (an old output
    # a killed --overwrite had swapped out, compacted again to salvage it) was removed as
    # litter, and the job failed reading it.
    for name in target._stale():
        left = ("file", os.path.realpath(os.path.join(target.parent, name)))
        if any(overlaps(place, left, True) for place in places):
            raise click.BadParameter(
                f"OUTPUT must not be INPUT, lie inside it or contain it: INPUT is in "
                f"{left[1]}, left beside OUTPUT by an interrupted job, which a job on "
                "OUTPUT removes (or continues); move it elsewhere first, or choose "
                "another OUTPUT", param_hint="OUTPUT")


def _linked_overlap(walk: tuple[set[tuple[int, int]], list[str]], out: str) -> bool:
    """Whether the local INPUT (its folders, ``walk``) and OUTPUT ``out`` overlap as the file
    system sees them (folders by device and inode), where their paths do not: INPUT read
    through links (a group's field linked to ``prev.zarr/values``, an array's ``c`` to another
    folder; zarr follows them, :func:`.reader.walk_files`), or one folder mounted twice (a
    bind mount, an NFS export under two paths). Until 2026-12-01 (fifteenth session, a probe)
    only the paths were compared, and ``--overwrite`` of such a ``prev.zarr`` replaced the
    folders INPUT read, exit 0.

    OUTPUT (or the deepest folder of it that exists: where it would be made) lies in INPUT
    where one of its ancestors is one of INPUT's folders; INPUT lies in OUTPUT where OUTPUT
    is an ancestor of INPUT or of a folder a link in it leads to. ``walk``: INPUT's folders
    (:func:`_folders_of`, walked once by :func:`check_overlap` for OUTPUT and every leftover
    beside it; the input's fingerprint walks its files too), then a few ``stat`` calls."""
    folders, roots = walk
    out_chain = _ancestors(out)
    if folders & set(out_chain):
        return True
    if not os.path.isdir(out):
        return False
    here = out_chain[0]
    return any(here in _ancestors(root) for root in roots)


def _folders_of(root: str) -> tuple[set[tuple[int, int]], list[str]]:
    """(device, inode) of ``root`` and of every folder under it, links followed (each folder
    once); and the paths ``root`` and each linked folder lead to, and the folder of each file
    a link leads to.

    A linked file (a chunk ``c/3 -> prev.zarr/values/c/3``, which zarr reads through) was
    left out until 2026-12-02 (seventeenth session, a probe): ``--overwrite`` of
    ``prev.zarr`` passed, exit 0, and INPUT's chunk was then the new output's. A link is
    known by its listing's type, so plain files still cost no ``stat``."""
    seen: set[tuple[int, int]] = set()
    roots = [os.path.realpath(root)]
    if not os.path.isdir(root):
        return seen, roots
    st = os.stat(root)
    seen.add((st.st_dev, st.st_ino))
    stack = [root]
    linked_files: set[str] = set()  # the folders they lie in, each once
    resolved: dict[str, str] = {}  # see _linked_folder
    while stack:
        with os.scandir(stack.pop()) as entries:
            for e in entries:
                try:
                    if not e.is_dir():  # follows a link; no stat for a plain file
                        if e.is_symlink():
                            linked_files.add(_linked_folder(e.path, resolved))
                        continue
                    st = e.stat()
                except OSError:  # a dangling link: nothing is read there
                    continue
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                stack.append(e.path)
                if e.is_symlink():
                    roots.append(os.path.realpath(e.path))
    return seen, roots + sorted(linked_files)


def _linked_folder(link: str, resolved: dict[str, str]) -> str:
    """The real folder of the file that the link ``link`` leads to. Each folder a link names
    is resolved once (``resolved``, by its spelling): a ``realpath`` of each of 10,000 linked
    chunk files took 0.7 s on the 2-core machine, where the walk took 0.06 s."""
    target = os.path.join(os.path.dirname(link), os.readlink(link))
    if os.path.islink(target):  # a link to a link: followed to its end
        return os.path.dirname(os.path.realpath(link))
    folder = os.path.dirname(target)
    if folder not in resolved:
        resolved[folder] = os.path.realpath(folder)
    return resolved[folder]


def _ancestors(path: str) -> list[tuple[int, int]]:
    """(device, inode) of the deepest part of ``path`` that exists, then of each folder above
    it up to ``/``."""
    chain: list[tuple[int, int]] = []
    path = os.path.realpath(path)
    while True:
        try:
            st = os.stat(path)
            chain.append((st.st_dev, st.st_ino))
        except OSError:
            pass
        up = os.path.dirname(path)
        if up == path:
            return chain
        path = up


def _overlap(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether the places ``a`` and ``b`` (:func:`_place`) are one, or one holds the other."""
    if a[0] != b[0]:
        return False  # two file systems
    sep = os.sep if a[0] == "file" else "/"
    return a[1] == b[1] or a[1].startswith(b[1] + sep) or b[1].startswith(a[1] + sep)


def _place(path: str | None, url: str | None) -> tuple[str, str]:
    """(the file system, the path on it) of a local path or an fsspec URL: the file system's
    protocol, and the path fsspec strips the URL to (an object store's bucket first, a web
    server's host). Storage options are left out: two spellings of one store (credentials,
    anonymous access) must not pass for two stores."""
    if url is None:
        assert path is not None
        return "file", os.path.realpath(path)
    return _place_on(*resolved(url))


def _place_on(fs: Any, path: str) -> tuple[str, str]:
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return "file", os.path.realpath(path)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]  # s3 == s3a
    return protocol, path.rstrip("/")


def _input_places(path: str | None, url: str | None) -> list[tuple[str, str]]:
    """Where INPUT's bytes lie: :func:`_place`, and for a ``reference://`` URL every file its
    references point to (the reference file itself is only read)."""
    if url is None:
        return [_place(path, url)]
    archive = archive_file(url)
    if archive is not None:
        return [_place_on(*resolved(archive))]
    from fsspec.implementations.reference import ReferenceFileSystem

    fs, stripped = resolved(url)
    if not isinstance(fs, ReferenceFileSystem):
        return [_place_on(fs, stripped)]
    return [_referenced_place(fs, target) for target in _reference_targets(fs, url)]


def archive_file(url: str) -> str | None:
    """Where the archive that ``url`` reads from lies (``zip://x::/p/g.zip``: ``/p/g.zip``, the
    chain after the archive's part), None if it reads from none. All of INPUT's bytes are in
    that file: an OUTPUT at it or inside it (a probe's ``/p/g.zip/out.zarr``) overlaps INPUT,
    which the place on the archive's own file system (``zip``, ``x``) never showed."""
    parts = url.split("::")
    for i, protocol in enumerate(url_protocols(url)[:-1]):
        if protocol in ARCHIVE_PROTOCOLS:
            return "::".join(parts[i + 1:])
    return None


def _reference_targets(fs: Any, url: str) -> set[str]:
    """The URLs or paths that the references of ``fs`` point to."""
    try:
        return {v[0] for v in fs.references.values()
                if isinstance(v, (list, tuple)) and v and isinstance(v[0], str)}
    except Exception as e:  # noqa: BLE001 -- a reference store fsspec cannot list
        raise click.BadParameter(
            f"cannot list the files that {url!r} refers to ({type(e).__name__}: {e}), so "
            "whether OUTPUT lies among them cannot be checked", param_hint="INPUT") from None


def _referenced_place(fs: Any, target: str) -> tuple[str, str]:
    """The place of one reference's target: a URL as it says, a bare path on the references'
    remote file system (``remote_protocol``)."""
    import fsspec

    if "://" in target or "::" in target:
        return _place(None, target)
    remote = fs.fss.get(None) or fsspec.filesystem("file")
    return _place_on(looked_past(remote), remote._strip_protocol(target))


def marker(attrs: dict[str, Any]) -> Any:
    """Marks the group at a store complete, with the names of what the job wrote in it
    (``wrote``: its arrays, see :func:`added_to`)."""

    def mark_complete(store: str) -> None:
        import zarr

        group = zarr.open_group(store=store, mode="r+")
        wrote = sorted(name for name, _ in group.members())
        group.attrs.update({"dask_compact": {**attrs, "wrote": wrote, "complete": True}})

    return mark_complete


# the arrays of a one-array job's output by --output, for an output written before the job
# recorded them (its attribute "wrote")
_ARRAYS_OF_MODE = {"values": ["values"], "indices": ["indices"], "both": ["values", "indices"]}


def added_to(store: str, entries: Callable[[str], list[str]]) -> list[str]:
    """What is in the complete output at ``store`` (of :func:`complete_marker`) that its job
    did not write, as ``entries(folder)`` lists it ("/" after a folder's name): anything
    beside its ``zarr.json`` and its arrays, and anything in an array's folder beside its
    ``zarr.json`` and chunks (the folder ``c``, or ``c.*`` files; a 0-d array's one chunk
    is the file ``c``).

    The arrays are those the job recorded (``wrote``, since 2026-11-30); an earlier output's
    are its ``--output`` arrays and fields, and any Zarr array in a Zarr group INPUT's output
    (the arrays it copied unchanged were not recorded)."""
    import zarr

    group = zarr.open_group(store=store, mode="r")
    attrs = group.attrs.get("dask_compact")
    assert isinstance(attrs, dict)  # complete_marker said so
    arrays = set(attrs.get("wrote") or ())
    if "wrote" not in attrs:
        arrays |= set(_ARRAYS_OF_MODE.get(str(attrs.get("output")), ()))
        arrays |= set(attrs.get("fields") or ())
        if "fields" in attrs:
            arrays |= {name for name, _ in group.arrays()}
    root = sorted(entries(""))
    added = [e for e in root if e != "zarr.json" and e.rstrip("/") not in arrays
             or e in arrays]  # an array's name as a file
    for name in sorted(arrays):
        if f"{name}/" in root:
            added += [f"{name}/{e}" for e in sorted(entries(name))
                      if e not in ("zarr.json", "c/", "c") and not e.startswith("c.")]
    return added


# The longest name a job gives to what it makes beside OUTPUT, past the name it takes from
# OUTPUT's (hidden_name): the leading dot, the temporary output's mark and 12-digit id, and the
# workers' check folder's suffix (.shared.SHARED_CHECK; the replaced output's OLD_SUFFIX and the
# lock's LOCK_SUFFIX are shorter)
_BESIDE = 1 + max(len(TMP_MARK) + 12 + max(len(SHARED_CHECK), len(OLD_SUFFIX)),
                 len(LOCK_SUFFIX))
_DIGEST = 16  # hex digits of OUTPUT's name's hash in a shortened hidden name


def hidden_name(parent: str, base: str, output: str) -> str:
    """The name that the job's lock, temporary output and check folder beside OUTPUT take
    from OUTPUT's name ``base`` in the folder ``parent``: ``base`` itself where every one of
    them fits the file system's limit on a name (255 bytes on most), else as much of it as
    fits with a hash of the whole name (``ooo…~<16 hex digits>``): the same for every job on
    OUTPUT, so that a lock keeps two jobs apart and ``--resume`` and the clean-up find what a
    killed job left, and another for every other OUTPUT in the folder. Until 2026-12-02
    (sixteenth session, the fifteenth session's probe) they were ``base`` with their
    suffixes, and an OUTPUT of 225-236 bytes failed after the job had started (the
    temporary output's name too long; 212-224 on a cluster, where the check folder's is
    longer), one of 236-255 at its lock. An OUTPUT whose own name is too long is refused
    here, before anything runs (it had failed at the lock, saying why only in errno's
    words)."""
    limit = _name_max(parent)
    size = len(os.fsencode(base))
    if size > limit:
        raise click.BadParameter(
            f"{output!r}: its name is {size} bytes, longer than the file system allows for "
            f"a name ({limit} bytes); choose a shorter name", param_hint="OUTPUT")
    if size + _BESIDE <= limit:
        return base
    import hashlib

    digest = hashlib.sha1(os.fsencode(base)).hexdigest()[:_DIGEST]
    kept = os.fsencode(base)[:limit - _BESIDE - 1 - _DIGEST]
    return f"{kept.decode('utf-8', 'ignore')}~{digest}"  # a character cut in two left out


def _name_max(folder: str) -> int:
    """The longest name the file system at ``folder`` (or its deepest existing ancestor, where
    the job will make it) takes, in bytes: 255 where it does not say."""
    while True:
        try:
            return int(os.pathconf(folder or ".", "PC_NAME_MAX"))
        except (OSError, ValueError):
            up = os.path.dirname(folder)
            if not folder or up == folder:
                return 255
            folder = up


def mount_points() -> set[str]:
    """The folders (or files) something is mounted on, as this process sees them (its mount
    namespace's ``/proc/self/mountinfo``: a bind mount of a folder of the same file system
    too, which ``os.path.ismount`` does not see); empty where that is not there (not
    Linux)."""
    return {point for _, _, point in mounts()}


def mounts() -> list[tuple[str, str, str]]:
    """(device ``major:minor``, the mounted folder's or file's path on that device, the mount
    point) of each mount this process sees, in the order they were mounted
    (``/proc/self/mountinfo``); empty where that is not there (not Linux)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:  # paths have their blanks and backslashes as octal escapes
            root, point = (os.fsdecode(re.sub(rb"\\([0-7]{3})",
                                              lambda m: bytes([int(m[1], 8)]), field))
                           for field in fields[3:5])
            found.append((os.fsdecode(fields[2]), root, point))
    return found


def _within(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _on_device(path: str, mounted: list[tuple[str, str, str]]) -> tuple[str, str] | None:
    """(device, path on that device) of the real path ``path``, through the deepest mount
    point above it (the last mounted there: it hides those before)."""
    best = None
    for dev, root, point in mounted:
        if _within(path, point) and (best is None or len(point) >= len(best[2])):
            best = (dev, root, point)
    if best is None:
        return None
    dev, root, point = best
    rest = os.path.relpath(path, point)
    return dev, root if rest == "." else os.path.join(root, rest)


def _mounted_overlap(ins: list[str], out: str, mounted: list[tuple[str, str, str]]) -> bool:
    """Whether a mount point lying in INPUT (under one of its real paths ``ins``: INPUT and
    what links in it lead to) has its source in OUTPUT ``out`` or around it, or one in
    OUTPUT its source in INPUT or around it: a single chunk FILE bind-mounted between them,
    which no walk of folders sees (:func:`_linked_overlap`); folders too. By device and path
    on the device, from ``mounted`` (:func:`mounts`): no walk at all. Until 2026-12-02
    (seventeenth session, the sixteenth session's probe) ``--overwrite`` of ``prev.zarr``
    with INPUT's ``c/3`` a bind mount of ``prev.zarr/values/c/3`` unlinked the only name of
    INPUT's chunk with the old output, exit 0."""
    for here, there in ((ins, [out]), ([out], ins)):
        sources = [s for s in (_on_device(p, mounted) for p in there) if s is not None]
        for dev, root, point in mounted:
            if any(_within(point, p) for p in here) and any(
                    dev == d and (_within(root, r) or _within(r, root)) for d, r in sources):
                return True
    return False


def is_mount_point(folder: str, mounts: set[str] | None = None) -> bool:
    """Whether something is mounted on ``folder`` (a real path): another device than its
    parent's (``os.path.ismount``), or among ``mounts`` (:func:`mount_points`, read here if
    not given)."""
    if os.path.ismount(folder):
        return True
    return folder in (mount_points() if mounts is None else mounts)


def _file_in_the_way(path: str) -> str | None:
    """The nearest existing ancestor of ``path`` (itself included) where it is not a
    directory, else None."""
    while path and not os.path.lexists(path):
        up = os.path.dirname(path)
        if up == path:
            return None
        path = up
    return path if path and not os.path.isdir(path) else None
