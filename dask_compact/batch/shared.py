"""OUTPUT on a cluster: the workers write its chunk files and this process commits them, so
both must see one file system at OUTPUT's path.

A new-user probe ran the batch CLI against workers that each had their own disk at OUTPUT's
folder (mount namespaces, as on other machines): a field with trailing axes went to the
workers' disks (their task made the chunk's folders there), and the job said "complete" with
an output of zeros, exit 0; a 1-D field failed in its first write with a bare
FileNotFoundError. Three checks now keep chunks from going anywhere but OUTPUT:

* before any task runs, every worker must read a token that this process wrote in a folder
  beside the temporary output, and write a file of its own in that folder
  (:func:`check_workers_see`), else the job is refused, naming them;
* a worker never makes OUTPUT's folders: it makes only a chunk's own folders under the
  array's ``c`` folder that this process made, so a worker that loses the file system during
  the job fails it, named, instead of writing elsewhere (:func:`open_chunk_file`);
* before the commit, every output chunk the job wrote must be in the temporary output as this
  process sees it (:func:`check_chunks_written`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterable
from typing import IO, Any

import click

SHARED_CHECK = ".shared-check"  # the check folder's suffix, after the temporary output's name

NOT_SHARED = (
    "OUTPUT must be on a file system every worker shares with this machine, "
    "mounted at the same path"
)
REMEDY = (
    "put OUTPUT on a shared file system (NFS, Lustre, GPFS...) mounted at the same "
    "path on every worker, or give an object store's URL"
)
NOT_WRITABLE = "OUTPUT's folder must be writable by every worker"
WRITABLE_REMEDY = (
    "mount OUTPUT's file system read-write on every worker and let the user the workers run "
    "as write in OUTPUT's folder, or choose another OUTPUT"
)


class OutputNotShared(RuntimeError):
    """A worker does not see OUTPUT's temporary folder where this process made it."""


def this_process() -> str:
    """Who runs this: a distributed worker (its name, address and host), or this process."""
    host = socket.gethostname()
    try:
        from distributed import get_worker

        w = get_worker()
    except (ImportError, ValueError):  # not in a worker's task (the threaded scheduler)
        return f"this process (host {host})"
    return f"worker {w.name!r} ({w.address}, host {host})"


# ---------------------------------------------------------------------------------------------
# Before the job: every worker reads what this process wrote, and writes beside it


TOKEN = "token"  # the token's file in the check folder


def sees_and_writes(path: str, token: str) -> tuple[str, str, str]:
    """Run on each worker: (its host, what is wrong: "" if nothing, "unseen" or "read-only",
    why) for the file ``path`` that should hold ``token``, and a file of the worker's own
    written and removed beside it (as its chunk writes make files and folders in folders
    that this job's client made)."""
    host = socket.gethostname()
    try:
        with open(path) as f:
            found = f.read(200)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        return host, "unseen", "no such file" if os.path.isdir(parent) else f"no folder {parent}"
    except OSError as e:
        return host, "unseen", f"cannot read it ({e.strerror or e})"
    if found != token:
        return host, "unseen", "another file is there (another file system at that path)"
    own = os.path.join(os.path.dirname(path), f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(own, "x") as f:
            f.write(token)
    except OSError as e:  # a read-only mount, another user's folder, a full disk
        return host, "read-only", f"cannot write in it ({e.strerror or e})"
    with contextlib.suppress(OSError):  # the client removes the folder in any case
        os.remove(own)
    return host, "", ""


def check_workers_see(client: Any, tmp: str) -> None:
    """Refuse the job (a usage error, exit 2) unless every worker of ``client`` reads the
    token that this process writes in the folder ``tmp`` + :data:`SHARED_CHECK`, beside the
    temporary output ``tmp`` (no mount can lie between them: ``tmp`` is a new name in that
    folder), and writes a file there (where this process made a folder, as it makes the
    temporary output's). Nothing is left: the folder is removed whatever the answer, an
    interrupt included (or, if this process is killed, by the next job on OUTPUT, with the
    temporary groups it removes)."""
    folder = tmp + SHARED_CHECK
    path = os.path.join(folder, TOKEN)
    token = uuid.uuid4().hex
    try:
        os.mkdir(folder)
        with open(path, "w") as f:
            f.write(token)
        answers = client.run(sees_and_writes, path, token)
    finally:
        _remove_check_folder(folder)
    wrong = {addr: a for addr, a in answers.items() if a[1]}
    if not wrong:
        return
    names = {addr: w.get("name", addr) for addr, w in client.scheduler_info()["workers"].items()}

    def listed(problem: str) -> tuple[int, str]:
        found = sorted((addr, a) for addr, a in wrong.items() if a[1] == problem)
        return len(found), "; ".join(
            f"worker {names.get(addr, addr)!r} ({addr}, host {host}): {why}"
            for addr, (host, _, why) in found
        )

    here = socket.gethostname()
    unseen, unseen_list = listed("unseen")
    read_only, read_only_list = listed("read-only")
    parts = []
    if unseen:
        parts.append(
            f"{NOT_SHARED} (the workers write its chunks, this machine commits them): "
            f"{unseen} of the cluster's {len(answers)} workers do not see the file {path} "
            f"that this machine ({here}) wrote beside it ({unseen_list})"
        )
    if read_only:
        parts.append(
            f"{NOT_WRITABLE}: {read_only} of the cluster's {len(answers)} workers cannot "
            f"write in the folder {folder} that this machine ({here}) made beside it, where "
            f"they would write its chunks ({read_only_list})"
        )
    remedy = REMEDY if unseen else WRITABLE_REMEDY
    raise click.BadParameter(
        f"{'. '.join(parts)}. Nothing was started or written: {remedy}", param_hint="OUTPUT"
    )


def input_seen(path: str, opened: bool = False) -> tuple[str, str]:
    """Run on each worker (and here): (its host, a digest of what it sees at the local INPUT
    ``path``: every file under the folder by path, size and modification time, as the
    input's fingerprint lists them, or the file's size and modification time; "" where
    nothing is there). No device or inode: one NFS file has another on each host.

    ``opened``: each file's size and time as it is opened (:func:`_opened`), which an NFS
    client revalidates with the server (close-to-open), where a plain ``stat`` may answer
    from its attribute cache; a folder's listing is revalidated as the folder is opened
    (``os.scandir``) either way."""
    import hashlib

    from .reader import walk_files

    def sized(file: str, st: os.stat_result) -> tuple[int, int]:
        return _opened(file, st) if opened else (st.st_size, st.st_mtime_ns)

    host = socket.gethostname()
    try:
        if os.path.isdir(path):
            seen: list[Any] = sorted((rel, *sized(os.path.join(path, rel), st))
                                     for rel, st in walk_files(path))
        else:
            seen = [sized(path, os.stat(path))]
    except OSError:
        return host, ""
    return host, hashlib.sha1(repr(seen).encode()).hexdigest()


def _opened(path: str, listed: os.stat_result) -> tuple[int, int]:
    """(size, modification time) of the file ``path`` as it is opened; as ``listed`` where
    it cannot be opened (not readable: the job's read fails and says so)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return listed.st_size, listed.st_mtime_ns
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_size, st.st_mtime_ns


def check_workers_read(client: Any, path: str | None) -> None:
    """Refuse the job (a usage error on INPUT, exit 2) unless every worker of ``client``
    sees at the local INPUT ``path`` the files this process sees there (:func:`input_seen`):
    the workers read INPUT's chunks, this process checks and names them. Until 2026-12-01
    (fifteenth session, a probe) a ``--scheduler`` worker with its own disk at INPUT's
    folder (another store of that shape and dtype) had its store compacted and committed as
    INPUT's selection, exit 0. One listing of INPUT on each worker."""
    if path is None:
        return
    _, here = input_seen(path)
    answers = client.run(input_seen, path)
    wrong = sorted((addr, host, digest) for addr, (host, digest) in answers.items()
                   if digest != here)
    if wrong:
        # A worker may list INPUT through an NFS client's attribute cache (actimeo, 3-60
        # s) holding the sizes and times of files written again here meanwhile; its reads
        # would not (an open revalidates the file). Until 2026-12-02 (sixteenth session,
        # the fifteenth session's probe) that refused the job, exit 2. Those workers look
        # again opening every file, and so does this process (an NFS client too, maybe):
        # another store at INPUT's path still differs. One open per file, only there.
        _, here = input_seen(path, True)
        again = client.run(input_seen, path, True, workers=[addr for addr, _, _ in wrong])
        wrong = sorted((addr, host, digest) for addr, (host, digest) in again.items()
                       if digest != here)
    if not wrong:
        return
    names = {addr: w.get("name", addr) for addr, w in client.scheduler_info()["workers"].items()}
    listed = "; ".join(f"worker {names.get(addr, addr)!r} ({addr}, host {host}): "
                       + ("nothing there" if not digest else "other files")
                       for addr, host, digest in wrong[:3])
    more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
    raise click.BadParameter(
        f"INPUT must be the same on every worker (the workers read its chunks): {len(wrong)} "
        f"of the cluster's {len(answers)} workers see other files at {path} than this "
        f"machine ({socket.gethostname()}) does ({listed}{more}). Nothing was started or "
        "written: put INPUT on a file system every worker shares with this machine, mounted "
        "at the same path", param_hint="INPUT")


def _remove_check_folder(folder: str) -> None:
    """Remove the check folder, Ctrl-C waiting; once more after a moment where a worker's
    file landed as it was removed (an interrupt cut the client's wait, not the workers')."""
    import shutil
    import time

    from .signals import held

    with held():
        for _ in range(3):
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.lexists(folder):
                return
            time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# During the job: a worker writes only into folders this process made


def open_chunk_file(array_dir: str, key: str) -> IO[bytes]:
    """The chunk file ``key`` (``c/7``, ``c/7/0/0``) of the array at ``array_dir``, opened for
    writing. Its folders below the array's ``c`` (made by this job's client,
    :func:`.job.writes_chunk_files`) are made one at a time, never ``c`` nor anything above:
    where the worker does not see them (another file system at that path, a mount lost), the
    write fails naming the worker and the folder, instead of making OUTPUT's folders on the
    worker's own disk."""
    parts = key.split("/")
    folder = os.path.join(array_dir, parts[0])
    try:
        for part in parts[1:-1]:
            folder = os.path.join(folder, part)
            try:
                os.mkdir(folder)
            except FileExistsError:
                pass
        return open(os.path.join(folder, parts[-1]), "wb")
    except FileNotFoundError:
        raise not_seen(os.path.join(array_dir, parts[0])) from None


def not_seen(folder: str) -> OutputNotShared:
    """The error of a worker that does not see OUTPUT's temporary ``folder``."""
    return OutputNotShared(
        f"{this_process()} does not see the folder {folder} of the temporary output that "
        f"this job's client made ({NOT_SHARED}; or it was lost during the job); nothing was "
        "written elsewhere"
    )


# ---------------------------------------------------------------------------------------------
# Before the commit: every chunk written is where this process commits it


def check_chunks_written(
    store: str, names: Iterable[str], rows: int, out_chunk: int, output: str
) -> None:
    """Fail the job (exit 1; the temporary output is then removed) unless each of the arrays
    ``names`` of the local group ``store`` holds the file of every output chunk that its
    ``rows`` rows fill (written as :func:`open_chunk_file` writes them, one file a chunk:
    zarr's own writes may leave a chunk of fill values out). One listing of each folder of
    chunk files: the array's ``c``, or one a chunk for an array with trailing axes."""
    import zarr

    nchunks = -(-rows // out_chunk) if rows else 0
    missing: dict[str, list[str]] = {}
    for name in names:
        z = zarr.open_array(store=store, path=name, mode="r")
        keys = [z.metadata.encode_chunk_key((j, *[0] * (z.ndim - 1))) for j in range(nchunks)]
        lost = _absent(os.path.join(store, name), keys)
        if lost:
            missing[name] = lost
    if not missing:
        return
    listed = "; ".join(
        f"{name!r}: {len(lost)} of {nchunks} ({', '.join(lost[:3])}"
        f"{', ...' if len(lost) > 3 else ''})"
        for name, lost in missing.items()
    )
    raise click.ClickException(
        f"output chunks this job wrote are not in its temporary output {store} as this "
        f"machine sees it ({listed}): {output!r} was not written. {NOT_SHARED}: {REMEDY}"
    )


def _absent(array_dir: str, keys: list[str]) -> list[str]:
    """The chunk keys of ``keys`` that have no file under ``array_dir``."""
    listed: dict[str, set[str]] = {}
    lost = []
    for key in keys:
        folder, _, name = key.rpartition("/")
        if folder not in listed:
            try:
                listed[folder] = set(os.listdir(os.path.join(array_dir, folder)))
            except (FileNotFoundError, NotADirectoryError):
                listed[folder] = set()
        if name not in listed[folder]:
            lost.append(key)
    return lost
