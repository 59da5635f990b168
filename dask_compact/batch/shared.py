"""OUTPUT on a cluster: the workers write its chunk files and this process commits them, so
both must see one file system at OUTPUT's path.

A new-user probe ran the batch CLI against workers that each had their own disk at OUTPUT's
folder (mount namespaces, as on other machines): a field with trailing axes went to the
workers' disks (their task made the chunk's folders there), and the job said "complete" with
an output of zeros, exit 0; a 1-D field failed in its first write with a bare
FileNotFoundError. Three checks now keep chunks from going anywhere but OUTPUT:

* before any task runs, every worker must read a token that this process wrote beside the
  temporary output (:func:`check_workers_see`), else the job is refused, naming them;
* a worker never makes OUTPUT's folders: it makes only a chunk's own folders under the
  array's ``c`` folder that this process made, so a worker that loses the file system during
  the job fails it, named, instead of writing elsewhere (:func:`open_chunk_file`);
* before the commit, every output chunk the job wrote must be in the temporary output as this
  process sees it (:func:`check_chunks_written`).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable
from typing import IO, Any

import click

SHARED_CHECK = ".shared-check"  # the token file's suffix, after the temporary output's name

NOT_SHARED = (
    "OUTPUT must be on a file system every worker shares with this machine, "
    "mounted at the same path"
)
REMEDY = (
    "put OUTPUT on a shared file system (NFS, Lustre, GPFS...) mounted at the same "
    "path on every worker, or give an object store's URL"
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
# Before the job: every worker reads what this process wrote


def sees_token(path: str, token: str) -> tuple[str, str]:
    """Run on each worker: (its host, why it does not see ``token`` in the file ``path``;
    "" if it does)."""
    host = socket.gethostname()
    try:
        with open(path) as f:
            found = f.read(200)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        return host, "no such file" if os.path.isdir(parent) else f"no folder {parent}"
    except OSError as e:
        return host, f"cannot read it ({e.strerror or e})"
    if found != token:
        return host, "another file is there (another file system at that path)"
    return host, ""


def check_workers_see(client: Any, tmp: str) -> None:
    """Refuse the job (a usage error, exit 2) unless every worker of ``client`` reads the
    token that this process writes at ``tmp`` + :data:`SHARED_CHECK`, beside the temporary
    output ``tmp`` (no mount can lie between them: ``tmp`` is a new name in that folder).
    Nothing is left: the file is removed whatever the answer (or, if this process is killed,
    by the next job on OUTPUT, with the temporary groups it removes)."""
    path = tmp + SHARED_CHECK
    token = uuid.uuid4().hex
    with open(path, "w") as f:
        f.write(token)
    try:
        answers = client.run(sees_token, path, token)
    finally:
        os.remove(path)
    blind = {addr: a for addr, a in answers.items() if a[1]}
    if not blind:
        return
    names = {addr: w.get("name", addr) for addr, w in client.scheduler_info()["workers"].items()}
    listed = "; ".join(
        f"worker {names.get(addr, addr)!r} ({addr}, host {host}): {why}"
        for addr, (host, why) in sorted(blind.items())
    )
    raise click.BadParameter(
        f"{NOT_SHARED} (the workers write its chunks, this machine commits them): "
        f"{len(blind)} of the cluster's {len(answers)} workers do not see the file {path} "
        f"that this machine ({socket.gethostname()}) wrote beside it ({listed}). Nothing "
        f"was started or written: {REMEDY}",
        param_hint="OUTPUT",
    )


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
