"""Batch job output: a Zarr group written under a hidden sibling name and moved into place only
when complete."""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Any

import click
import dask.array as da

from .inputs import Source, is_url, local

# ---------------------------------------------------------------------------------------------
# Output: a temporary sibling, moved into place when complete


class Target:
    """OUTPUT and its temporary sibling; local paths are renamed, URLs moved with fsspec."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.url = is_url(output)
        tag = f".dask-compact-tmp-{uuid.uuid4().hex[:12]}"
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
            self.tmp_path = self.tmp = os.path.join(parent, f".{base}{tag}")

    def exists(self) -> bool:
        return self.fs.exists(self.path) if self.url else os.path.lexists(self.path)

    def prepare(self) -> None:
        if not self.url:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)

    def discard(self) -> None:
        """Remove the temporary group (a failed or interrupted job)."""
        if self.url:
            if self.fs.exists(self.tmp_path):
                self.fs.rm(self.tmp_path, recursive=True)
        else:
            shutil.rmtree(self.tmp_path, ignore_errors=True)

    def commit(self, mark_complete: Any) -> None:
        """Put the finished group at OUTPUT (replacing an existing one: --overwrite checked)."""
        if self.url:
            # Object stores have no atomic rename: move first, and only then mark the group
            # complete, so a move cut short leaves a group that does not say it is finished.
            if self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=True)
            self.fs.mv(self.tmp_path, self.path, recursive=True)
            mark_complete(self.output)
            return
        mark_complete(self.tmp)
        if not os.path.lexists(self.path):
            os.rename(self.tmp, self.path)
            return
        # rename() cannot replace a non-empty directory: move the old one aside first, so
        # OUTPUT is at every moment either the old complete group or the new one.
        old = self.tmp + "-old"
        os.rename(self.path, old)
        os.rename(self.tmp, self.path)
        if os.path.isdir(old) and not os.path.islink(old):
            shutil.rmtree(old)
        else:
            os.remove(old)


def check_overlap(src: Source, target: Target) -> None:
    if src.local_path is None or target.url:
        return
    a, b = os.path.realpath(src.local_path), os.path.realpath(target.path)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise click.BadParameter("OUTPUT must not be INPUT or contain it", param_hint="OUTPUT")


def write_group(
    store: str, arrays: dict[str, da.Array], attrs: dict[str, Any], chunk: int
) -> tuple[Any, list[da.Array], list[Any]]:
    """Create the group and its (empty) arrays; return the sources and targets to store."""
    import zarr

    group = zarr.open_group(store=store, mode="w-", attributes={"dask_compact": attrs})
    sources, targets = [], []
    for name, a in arrays.items():
        z = group.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(max(1, chunk),))
        if a.size:
            sources.append(a)
            targets.append(z)
    return group, sources, targets


def marker(attrs: dict[str, Any]) -> Any:
    def mark_complete(store: str) -> None:
        import zarr

        group = zarr.open_group(store=store, mode="r+")
        group.attrs.update({"dask_compact": {**attrs, "complete": True}})

    return mark_complete
