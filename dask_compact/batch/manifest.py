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
* the output chunks written.

A resumed job recomputes only the input chunks that feed output chunks not yet written, from
the first such one on, with the offsets the manifest gives; the arrays it produces are those
of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

NAME = "dask-compact-manifest.json"


@dataclass
class Manifest:
    job: dict[str, Any]
    counts: list[int] = field(default_factory=list)  # input chunks 0..len-1, in order
    written: set[int] = field(default_factory=set)  # output chunks on disk

    def to_json(self) -> str:
        return json.dumps({"job": self.job, "counts": self.counts,
                           "written": sorted(self.written)})

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        d = json.loads(text)
        return cls(d["job"], [int(c) for c in d["counts"]], {int(j) for j in d["written"]})

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
