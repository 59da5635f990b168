"""The resume manifest: what a job has finished, kept inside its temporary group.

A job writes ``dask-compact-manifest.json`` beside the output arrays (at its first write, then
at most once a second; not at the end, where the commit removes it), replacing it atomically
(write, rename) and listing only output chunks whose writes have returned, so a job killed at
any moment leaves a manifest that describes only chunks that are really in the files.
Nothing is fsynced, as zarr fsyncs none of its writes: an ``fsync`` here made the file system
commit every output chunk written so far to the disk (ext4's ordered journal), 0.25 s per save
on the H100 host, which turned a job running from the page cache into one waiting on the disk.
It holds

* the job: input fingerprint, shape, dtype, row chunking, ``--where``, ``--output``, output
  chunk length and the tool's version; ``--resume`` continues only an identical job;
* the counts of the input chunks whose offsets it used (the prefix of the exclusive scan);
* the output chunks written, each with the size and CRC-32C of every file its write left
  (computed by the writer from the bytes it had in memory);
* the size and CRC-32C of every file the group was made with (its metadata, a group job's
  copied arrays).

``--resume`` checks both against the files (:func:`changed_since_made`,
:func:`unmatched_chunks`): a chunk file truncated, rewritten or removed after the kill is
written again, and a group whose metadata changed is started over. Until 2026-12-01 the
manifest's word was taken: a chunk file of the temporary group truncated by hand, or
rewritten with other bytes of its size, was committed as it was, exit 0 (a probe).

A resumed job recomputes only the input chunks that feed output chunks not yet written, from
the first such one on, with the offsets the manifest gives; the arrays it produces are those
of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

NAME = "dask-compact-manifest.json"
ABSENT = -1  # the size recorded for a chunk file zarr left out (a chunk of fill values)


@dataclass
class Manifest:
    job: dict[str, Any]
    counts: list[int] = field(default_factory=list)  # input chunks 0..len-1, in order
    written: set[int] = field(default_factory=set)  # output chunks on disk
    # output chunk -> {its file, relative to the group: [size, CRC-32C]} as its write left it
    files: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    # every file the group was made with -> [size, CRC-32C] (see made_files)
    made: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "counts": self.counts,
                           "written": sorted(self.written),
                           "files": {str(j): self.files[j] for j in sorted(self.written)
                                     if j in self.files},
                           "made": self.made})

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        files = {int(j): {str(k): [int(n), int(c)] for k, (n, c) in v.items()}
                 for j, v in d.get("files", {}).items()}
        made = {str(k): [int(n), int(c)] for k, (n, c) in d.get("made", {}).items()}
        return cls(d["job"], [int(c) for c in d["counts"]], {int(j) for j in d["written"]},
                   files, made)

    def resume_point(self, out_chunk: int) -> tuple[int, int]:
        """``(first input chunk to recompute, its global offset)``: the first input chunk whose
        piece reaches into an output chunk not yet written (the written chunks below it form a
        contiguous prefix)."""
        done = 0
        while done in self.written:
            done += 1
        needed_from = done * out_chunk  # the first element not known to be on disk
        offset = 0
        for i, c in enumerate(self.counts):
            if offset + c > needed_from:
                return i, offset
            offset += c
        return len(self.counts), offset


def path_in(group: str) -> str:
    return os.path.join(group, NAME)


def save(group: str, manifest: Manifest) -> None:
    p = path_in(group)
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        f.write(manifest.to_json())
    os.replace(tmp, p)


def load(group: str) -> Manifest | None:
    try:
        with open(path_in(group)) as f:
            return Manifest.from_json(f.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------
# What the files were: checked by --resume before it trusts the manifest


def checksum(data: Any) -> int:
    """The CRC-32C of ``data`` (bytes or a buffer), as a writer records it for the files it
    wrote: google-crc32c's C extension (a dependency of zarr; hardware CRC, 8-14 GB/s on the
    2-core machine, against 1.0 GB/s for the zstd encode of the same bytes, and it lets go of
    the GIL from 1 MB on), or zlib's CRC-32 (2-4 GB/s) where that extension is missing: its
    pure-Python fallback takes seconds a megabyte. A check made with the other one (a
    cluster's worker with another environment) only finds a mismatch, so the chunk is
    written again: never a wrong output."""
    if not isinstance(data, bytes):  # google-crc32c takes bytes only (a GPU job's frames)
        data = bytes(memoryview(data).cast("B"))
    return int(_CHECKSUM(data))


def _pick_checksum() -> Any:
    try:
        import google_crc32c

        if google_crc32c.implementation == "c":
            return google_crc32c.value
    except ImportError:
        pass
    import zlib

    return zlib.crc32


_CHECKSUM = _pick_checksum()


def file_sum(path: str) -> list[int]:
    """``[size, checksum]`` of the file at ``path``, ``[ABSENT, 0]`` where there is none."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return [ABSENT, 0]
    return [len(data), checksum(data)]


def made_files(group: str) -> dict[str, list[int]]:
    """Every file under the local ``group`` (but the manifest), by its path relative to the
    group: ``[size, checksum]``. Taken when the temporary group has been made, before any
    chunk is written: its metadata, and a group job's arrays copied as they are."""
    out = {}
    for folder, _, names in os.walk(group):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, group).replace(os.sep, "/")
            if rel not in (NAME, NAME + ".tmp"):
                out[rel] = file_sum(path)
    return out


def _differing(group: str, files: Iterable[tuple[str, list[int]]]) -> list[str]:
    """The files of ``files`` (relative path, recorded ``[size, checksum]``) that now differ:
    sizes first (one ``stat`` each), then the checksums of those whose size still matches,
    read on a few threads (the reads and the CRC let go of the GIL)."""
    same_size = []
    changed = []
    for rel, (size, crc) in files:
        path = os.path.join(group, rel)
        try:
            now = os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            now = ABSENT
        if now != size:
            changed.append(rel)
        elif size != ABSENT:
            same_size.append((rel, crc))
    if same_size:
        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
            sums = pool.map(lambda t: file_sum(os.path.join(group, t[0]))[1], same_size)
            changed += [rel for (rel, crc), now_crc in zip(same_size, sums) if now_crc != crc]
    return sorted(changed)


def changed_since_made(group: str, m: Manifest) -> list[str]:
    """The files the temporary ``group`` was made with that differ now (its metadata edited,
    a copied array changed or removed): the job cannot go on in that group."""
    return _differing(group, m.made.items())


def unmatched_chunks(group: str, m: Manifest) -> set[int]:
    """The output chunks the manifest lists as written whose files differ now from what their
    write left (truncated, rewritten, removed), or for which it recorded none (a manifest
    of an earlier version): they are written again. Reads every file it lists once (the
    bytes of the output written so far), only on ``--resume``."""
    unknown = {j for j in m.written if not m.files.get(j)}
    listed = [(rel, s) for j in m.written - unknown for rel, s in m.files[j].items()]
    owner = {rel: j for j in m.written - unknown for rel in m.files[j]}
    return unknown | {owner[rel] for rel in _differing(group, listed)}
