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
  copied arrays);
* a CRC-32C of all the above as written (``sum``, last): a manifest that does not match it is
  not used.

``--resume`` checks both against the files (:func:`changed_since_made`,
:func:`unmatched_chunks`): a chunk file truncated, rewritten or removed after the kill is
written again, and a group whose metadata changed is started over. Until 2026-12-01 the
manifest's word was taken: a chunk file of the temporary group truncated by hand, or
rewritten with other bytes of its size, was committed as it was, exit 0 (a probe). Until
2026-12-01 (the twelfth session's probe) its own counts were taken as they were: a count
edited by one, or made negative, placed the chunks after the resume point wrongly, and the
output, of wrong values, was committed, exit 0. The manifest now carries a checksum of its
own (:func:`read` refuses one that does not match), and its counts are checked against the
job's chunks (:meth:`Manifest.inconsistency`).

A resumed job recomputes only the input chunks that feed output chunks not yet written, from
the first such one on, with the offsets the manifest gives; the arrays it produces are those
of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
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
    # the output arrays -> their length (axis 0) as made, before the cut (see uncut)
    lengths: dict[str, int] = field(default_factory=dict)
    # False: read without a checksum of its own (an earlier build's): its counts and
    # `written` are not trusted, every chunk is written again (see unmatched_chunks)
    signed: bool = True

    def to_json(self) -> str:
        body = {"job": self.job, "counts": self.counts, "written": sorted(self.written),
                "files": {str(j): self.files[j] for j in sorted(self.written)
                          if j in self.files},
                "made": self.made, "lengths": self.lengths}
        text = json.dumps(body)  # the sum goes last, over the bytes before it (see _signed)
        return f'{text[:-1]}{_SUM_KEY}{checksum(text.encode())}}}'

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """The manifest ``text`` holds; ValueError (saying why) where it is not one, or does
        not match its own checksum (edited, or cut short by a hand: a save replaces the file
        whole)."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError("not a JSON object")
        signed = "sum" in d
        if signed and not _signed(text, d.pop("sum")):
            raise ValueError("it does not match its own checksum (edited since the job saved "
                             "it)")
        try:
            files = {int(j): {str(k): [int(n), int(c)] for k, (n, c) in v.items()}
                     for j, v in d.get("files", {}).items()}
            made = {str(k): [int(n), int(c)] for k, (n, c) in d.get("made", {}).items()}
            lengths = {str(k): int(n) for k, n in d.get("lengths", {}).items()}
            return cls(d["job"], [int(c) for c in d["counts"]],
                       {int(j) for j in d["written"]}, files, made, lengths, signed)
        except KeyError as e:
            raise ValueError(f"it has no {e}") from None
        except (TypeError, AttributeError) as e:
            raise ValueError(f"it is not a manifest ({e})") from None

    def inconsistency(self, nchunks: int, size: Callable[[int], int], out_chunk: int) -> str:
        """Why the counts and written chunks cannot be a job's whose input chunks are
        ``size(0..nchunks-1)`` elements and whose output chunks are ``out_chunk`` long ("" if
        they can): each count within its chunk, no more counts than chunks, and only output
        chunks that the counts' prefix fills written (the stream writes no other). A check
        beside the checksum, which a manifest saved by this build always matches."""
        if len(self.counts) > nchunks:
            return f"{len(self.counts)} counts for {nchunks} input chunks"
        for i, c in enumerate(self.counts):
            if not 0 <= c <= size(i):
                return f"input chunk {i}'s count {c} is not within its {size(i)} elements"
        total = sum(self.counts)
        filled = (-(-total // out_chunk) if len(self.counts) == nchunks
                  else total // out_chunk) if out_chunk > 0 else 0
        beyond = sorted(j for j in self.written if not 0 <= j < filled)
        if beyond:
            return (f"output chunk {beyond[0]} is listed as written, but its counts fill "
                    f"{filled} output chunks")
        return ""

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


_SUM_KEY = ', "sum": '


def _signed(text: str, crc: Any) -> bool:
    """Whether the manifest ``text`` ends with its ``sum`` ``crc`` and that is the CRC-32C of
    the body as it was written (the text before it, closed): the bytes themselves, so a save
    costs one ``json.dumps`` and a CRC (a canonical form read back and dumped again took 4x
    the save's time for a manifest of 10,000 chunks)."""
    at = text.rfind(_SUM_KEY)
    return (at > 0 and text[at:] == f"{_SUM_KEY}{crc}}}"
            and checksum((text[:at] + "}").encode()) == crc)


def read(group: str) -> Manifest | str:
    """The manifest in ``group``, or why it cannot be used ("" where there is none)."""
    try:
        with open(path_in(group), "rb") as f:
            text = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return ""
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    try:
        return Manifest.from_json(text.decode())
    except json.JSONDecodeError as e:
        return f"it is not JSON ({e})"
    except ValueError as e:  # UnicodeDecodeError too
        return str(e)


def load(group: str) -> Manifest | None:
    m = read(group)
    return m if isinstance(m, Manifest) else None


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


def uncut(group: str, m: Manifest, changed: list[str]) -> bool:
    """Where the only files of ``group`` that differ from what it was made with (``changed``)
    are its output arrays' metadata, set those arrays' length back to the one they were made
    with (``m.lengths``; a metadata write, as the cut was) and say whether the group is then
    as it was made, checksums and all. That is a job killed between the arrays' cut to the
    selection's length (:func:`.job.cut`) and the manifest's removal: until 2026-12-01 (the
    twelfth session) its group was removed and the job started over; now it continues, and
    whatever the manifest lists is not computed again. Any other change (an edit beside
    the length, a manifest without ``lengths``) leaves the group to be started over."""
    arrays = {f"{name}/zarr.json": name for name in m.lengths}
    if not changed or not all(rel in arrays for rel in changed):
        return False
    import zarr
    from zarr.core.sync import sync

    for rel in changed:
        name = arrays[rel]
        try:
            a = zarr.open_array(store=group, path=name, mode="r+")
            sync(a.async_array.resize((m.lengths[name], *a.shape[1:]),
                                      delete_outside_chunks=False))
        except Exception:  # noqa: BLE001 -- metadata zarr cannot take: started over
            return False
    return not changed_since_made(group, m)


def unmatched_chunks(group: str, m: Manifest) -> set[int]:
    """The output chunks the manifest lists as written whose files differ now from what their
    write left (truncated, rewritten, removed), or for which it recorded none (a manifest
    of an earlier version): they are written again, and all of them where the manifest has
    no checksum of its own (an earlier build's: its counts are not known to be the job's).
    Reads every file it lists once (the bytes of the output written so far), only on
    ``--resume``."""
    unknown = {j for j in m.written if not m.files.get(j) or not m.signed}
    listed = [(rel, s) for j in m.written - unknown for rel, s in m.files[j].items()]
    owner = {rel: j for j in m.written - unknown for rel in m.files[j]}
    return unknown | {owner[rel] for rel in _differing(group, listed)}
