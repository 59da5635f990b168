"""The batch CLI never destroys or silently replaces data, never takes an incomplete input for a
complete one, and leaves no litter once the next job on the same OUTPUT has run.

Signals and kills use real subprocesses (tests/cli_driver.py pauses them at the moment
under test); everything else runs in-process through click's runner.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from cli_helpers import litter, run, start, wait_for

import dask_compact
from dask_compact.batch import output


def values(path: Path) -> np.ndarray:
    return zarr.open_group(store=str(path), mode="r")["values"][:]


def where_of(path: Path) -> str:
    return zarr.open_group(store=str(path), mode="r").attrs["dask_compact"]["where"]


@pytest.fixture
def npy(tmp_path: Path):
    a = np.random.default_rng(11).random(20_000)
    path = tmp_path / "in.npy"
    np.save(path, a)
    return path, a


# -- inputs ---------------------------------------------------------------------------------------


def test_missing_zarr_chunk_is_refused_unless_allowed(tmp_path):
    a = np.random.default_rng(1).random(100)
    store = tmp_path / "in.zarr"
    z = zarr.create_array(store=str(store), shape=(100,), dtype="f8", chunks=(10,), fill_value=0.5)
    z[:] = a
    (store / "c" / "3").unlink()  # a lost chunk: it reads as the fill value 0.5
    out = tmp_path / "out.zarr"
    res = run(store, out, "--where", "x > 0.25", code=2)
    assert "1 of its 10 chunks are not in the store" in res.output
    assert "--allow-missing-chunks" in res.output
    assert not out.exists() and litter(tmp_path) == []
    run(store, out, "--where", "x > 0.25", "--allow-missing-chunks")
    b = a.copy()
    b[30:40] = 0.5
    np.testing.assert_array_equal(values(out), b[b > 0.25])


# (rows written, chunks missing): 1003 rows in chunks of 10 (101 chunks), shards of 30 rows
# (the last shard holds 2 chunks and room for a third past the end)
SHARD_GAPS = {
    "inner chunks": ([(0, 10), (30, 1003)], 2),  # shard 0 stored, its chunks 1 and 2 not
    "whole shards": ([(30, 960), (990, 1003)], 3 + 3),  # shards 0 and 32 not stored
    "both": ([(0, 10), (60, 975), (990, 1003)], 2 + 3 + 1),  # chunk 98 of shard 32 not
}


@pytest.mark.parametrize("gaps", list(SHARD_GAPS))
def test_missing_chunk_of_a_sharded_zarr_is_refused_unless_allowed(tmp_path, gaps):
    """A chunk never written inside a stored shard reads as the fill value too: a probe's was
    accepted (zarr's nchunks_initialized counts a stored shard as all its chunks), and the
    count of a refusal left such chunks out."""
    written, missing = SHARD_GAPS[gaps]
    a = np.random.default_rng(2).random(1003)
    store = tmp_path / "in.zarr"
    z = zarr.create_array(store=str(store), shape=(1003,), dtype="f8", chunks=(10,),
                          shards=(30,), fill_value=0.5)
    b = np.full_like(a, 0.5)  # what the array reads as
    for lo, hi in written:
        z[lo:hi] = a[lo:hi]
        b[lo:hi] = a[lo:hi]
    out = tmp_path / "out.zarr"
    res = run(store, out, "--where", "x > 0.25", code=2)
    assert f"{missing} of its 101 chunks are not in the store" in res.output
    assert "--allow-missing-chunks" in res.output
    assert not out.exists() and litter(tmp_path) == []
    run(store, out, "--where", "x > 0.25", "--allow-missing-chunks")
    np.testing.assert_array_equal(values(out), b[b > 0.25])


def test_a_complete_sharded_zarr_is_accepted(tmp_path):
    """Every chunk stored, the edge shard's room past the array's end counts for nothing."""
    a = np.random.default_rng(3).random(1003)
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), shape=a.shape, dtype="f8", chunks=(10,),
                      shards=(30,))[:] = a
    run(store, tmp_path / "out.zarr", "--where", "x > 0.25")
    np.testing.assert_array_equal(values(tmp_path / "out.zarr"), a[a > 0.25])


def test_a_sharding_codec_followed_by_a_checksum_is_read_as_zarr_reads_it(tmp_path):
    """A sharding codec followed by a bytes-to-bytes codec (crc32c over the whole shard) is a
    valid array that zarr reads with its shards whole (``shards`` None): the up-front count
    of stored chunks was a traceback (``zip(None, ...)``, a probe, 2026-12-06). Its stored
    shards are counted as chunks; a missing one is refused as any missing chunk."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    a = np.random.default_rng(5).random(1003)
    store = tmp_path / "in.zarr"
    z = zarr.create_array(store=str(store), shape=a.shape, dtype="f8", chunks=(100,),
                          serializer=ShardingCodec(chunk_shape=(10,), codecs=[BytesCodec()]),
                          compressors=[Crc32cCodec()])
    z[:] = a
    assert z.shards is None  # zarr's own reading of it
    run(store, tmp_path / "out.zarr", "--where", "x > 0.25")
    np.testing.assert_array_equal(values(tmp_path / "out.zarr"), a[a > 0.25])
    os.remove(store / "c" / "3")
    res = run(store, tmp_path / "out2.zarr", "--where", "x > 0.25", code=2)
    assert "1 of its 11 chunks are not in the store" in res.output


@pytest.mark.parametrize("allow", [False, True])
def test_a_damaged_shard_index_is_one_line_naming_the_shard(tmp_path, allow):
    """One byte of a shard's index flipped (its checksum then fails): the up-front count of
    stored chunks gave zarr's traceback (a probe, 2026-12-06); now one line naming the shard,
    exit 2, nothing written. With --allow-missing-chunks the index is not read up front, and
    the read of the chunk fails as a job error naming it."""
    a = np.random.default_rng(3).random(1003)
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), shape=a.shape, dtype="f8", chunks=(10,),
                      shards=(30,))[:] = a
    shard = store / "c" / "1"
    raw = bytearray(shard.read_bytes())
    raw[-2] ^= 1  # inside the index's checksum, at the shard's end
    shard.write_bytes(bytes(raw))
    out = tmp_path / "out.zarr"
    if allow:
        res = run(store, out, "--where", "x > 0.25", "--allow-missing-chunks", code=1)
        assert "Stored and computed checksum do not match" in res.output
    else:
        res = run(store, out, "--where", "x > 0.25", code=2)
        assert "the index of its shard c/1 cannot be read" in res.output
        assert "Stored and computed checksum do not match" in res.output
    assert "Traceback" not in res.output
    assert not out.exists() and litter(tmp_path) == []


def _linked_input(tmp_path: Path, kind: str) -> tuple[Path, np.ndarray, str]:
    """A Zarr input whose chunks lie in a folder reached through a symbolic link, as a user
    moves them to another disk: (INPUT, its values, the values' output array)."""
    rng = np.random.default_rng(4)
    a = rng.random(1003) if kind != "2-D" else rng.random((101, 3))
    store = tmp_path / "in.zarr"
    elsewhere = tmp_path / "elsewhere"
    if kind == "group":
        g = zarr.open_group(store=str(store), mode="w")
        g.create_array("x", shape=a.shape, dtype="f8", chunks=(10,))[:] = a
        linked, name = store / "x" / "c", "x"
    else:
        zarr.create_array(store=str(store), shape=a.shape, dtype="f8", chunks=(10, 3)[:a.ndim],
                          shards=(30,) if kind == "sharded" else None)[:] = a
        linked, name = store / "c", "values"
    if kind == "2-D":  # a chunk's own folder linked (c/4/0 is its file)
        linked = store / "c" / "4"
    os.rename(linked, elsewhere)
    os.symlink(elsewhere, linked)
    (elsewhere / "loop").symlink_to(store)  # a cycle: the listing must not follow it forever
    return store, a, name


@pytest.mark.parametrize("kind", ["array", "2-D", "sharded", "group"])
def test_a_chunk_folder_reached_through_a_link_is_read_as_zarr_reads_it(tmp_path, kind):
    """zarr reads chunks through a linked folder (``in.zarr/c -> /other/disk/c``) but its
    listing does not follow the link, so the chunks check refused such an INPUT as missing
    every chunk (a probe). The listing follows linked folders now (each folder once: a link
    back up is not followed again); the job reads what zarr reads."""
    store, a, name = _linked_input(tmp_path, kind)
    np.testing.assert_array_equal(zarr.open(str(store), mode="r")[name if kind == "group"
                                                                  else ...][:], a)
    out = tmp_path / "out.zarr"
    run(store, out, "--where", "x > 0.25")
    got = zarr.open_group(store=str(out), mode="r")
    np.testing.assert_array_equal(got[name][:], a[a > 0.25] if kind != "group" else a[a > 0.25])
    assert litter(tmp_path) == []


def test_resume_sees_values_rewritten_in_a_linked_chunk_folder(tmp_path):
    """The input's identity lists every file under it: the files of a linked chunk folder
    were left out (the link itself stood for them), so a job resumed over values written
    again there would have mixed the two selections."""
    from cli_helpers import kill_halfway

    store, a, _ = _linked_input(tmp_path, "array")
    out = tmp_path / "out.zarr"
    args = ["--where", "x > 0.25", "--output-chunks", "50"]
    kill_halfway(tmp_path, store, out, *args, writes=3)
    b = np.random.default_rng(8).random(a.size)
    zarr.open_array(str(store), mode="r+")[:] = b  # through the link, same metadata
    assert not (store / "c").is_dir() or (store / "c").is_symlink()
    res = run(store, out, *args, "--resume", code=2)
    assert "differs in input" in res.output
    run(store, out, *args)
    np.testing.assert_array_equal(values(out), b[b > 0.25])


@pytest.mark.parametrize("shape", [(10, 0), (0,), (0, 3), (4, 0, 2)])
@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_empty_input_gives_complete_empty_output(tmp_path, shape, kind):
    if kind == "npy":
        src = tmp_path / "e.npy"
        np.save(src, np.zeros(shape, dtype=np.float32))
    else:
        src = tmp_path / "e.zarr"
        zarr.create_array(store=str(src), shape=shape, dtype="f4",
                          chunks=tuple(max(1, s) for s in shape))
    out = tmp_path / "o.zarr"
    res = run(src, out, "--where", "x > 0", "-o", "both")
    assert "selected  0" in res.output
    g = zarr.open_group(store=str(out), mode="r")
    assert g.attrs["dask_compact"]["complete"] is True
    assert g["values"].shape == (0,) and g["values"].dtype == np.float32
    assert g["indices"].shape == (0,) and g["indices"].dtype == np.int64


@pytest.mark.parametrize("dtype", [">f8", ">i4", ">u2", ">c8"])
@pytest.mark.parametrize("kind", ["npy", "zarr-v2"])
def test_big_endian_input(tmp_path, dtype, kind):
    a = (np.random.default_rng(2).random(1001) * 100).astype(dtype)
    if kind == "npy":
        src = tmp_path / "be.npy"
        np.save(src, a)
    else:
        src = tmp_path / "be.zarr"
        z = zarr.create_array(store=str(src), shape=a.shape, dtype=dtype, chunks=(100,),
                              zarr_format=2)
        z[:] = a
    out = tmp_path / "o.zarr"
    pred = "real(x) > 50" if a.dtype.kind == "c" else "x > 50"
    run(src, out, "--where", pred, "-o", "both")
    m = (a.real if a.dtype.kind == "c" else a) > 50
    g = zarr.open_group(store=str(out), mode="r")
    np.testing.assert_array_equal(g["values"][:], a[m])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(m))


# -- what is at OUTPUT ----------------------------------------------------------------------------


def test_overwrite_never_replaces_what_this_tool_did_not_write(npy, tmp_path):
    path, a = npy
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "thesis.txt").write_text("four years of work")
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "notes.txt"
    afile.write_text("notes")
    link = tmp_path / "link"
    link.symlink_to(thesis)
    foreign = tmp_path / "foreign.zarr"
    zarr.open_group(store=str(foreign), mode="w", attributes={"owner": "someone"})
    unfinished = tmp_path / "unfinished.zarr"
    zarr.open_group(store=str(unfinished), mode="w",
                    attributes={"dask_compact": {"complete": False}})
    for target in (thesis, empty, afile, link, foreign, unfinished):
        res = run(path, target, "--where", "x > 0.5", "--overwrite", code=2)
        assert "replaces only a complete output written by dask compact" in res.output
    assert (thesis / "thesis.txt").read_text() == "four years of work"
    assert empty.is_dir() and not any(empty.iterdir())
    assert afile.read_text() == "notes" and link.is_symlink()
    assert zarr.open_group(store=str(foreign), mode="r").attrs["owner"] == "someone"
    assert litter(tmp_path) == []
    # our own complete output is replaced, atomically, and leaves nothing beside it
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    run(path, out, "--where", "x > 0.9", "--overwrite")
    np.testing.assert_array_equal(values(out), a[a > 0.9])
    assert litter(tmp_path) == []


def test_overlap_of_input_and_output_is_refused_however_they_are_spelled(tmp_path,
                                                                          monkeypatch):
    """A probe's ``--overwrite`` with INPUT given as a ``local://`` URL inside OUTPUT deleted
    the INPUT (the check looked only at two plain paths); ``memory://`` (an object store's
    stand-in) wrote OUTPUT inside its INPUT. Local paths, ``file://`` and ``local://`` are one
    file system; URLs of one other file system are compared among themselves."""
    import fsspec

    a = np.random.default_rng(5).random(3_001)
    out = tmp_path / "chain.zarr"
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), shape=a.shape, chunks=(1_000,), dtype=a.dtype)[:] = a
    run(store, out, "--where", "x < 0.5", "--local", "threads")
    spellings = [str(out), f"file://{out}", f"local://{out}"]
    for inp in spellings:
        for target in spellings:
            res = run(f"{inp}/values", target, "-w", "x < 0.25", "--overwrite",
                      "--local", "threads", code=2)
            assert "must not be INPUT" in res.output
    np.testing.assert_array_equal(values(out), a[a < 0.5])  # the INPUT is still there
    # memory:// stands in for an object store (an OUTPUT there is refused: it ends with the
    # process; this one runs in-process)
    monkeypatch.setattr(output, "EPHEMERAL_PROTOCOLS", ())
    fs = fsspec.filesystem("memory")
    try:
        url = "memory://overlap-test/in.zarr"
        zarr.create_array(store=url, shape=a.shape, chunks=(1_000,), dtype=a.dtype)[:] = a
        for target in (url, f"{url}/sel", "memory://overlap-test"):
            res = run(url, target, "-w", "x < 0.5", "--overwrite", "--local", "threads",
                      code=2)
            assert "must not be INPUT" in res.output
        group = "memory://overlap-test/group.zarr"
        zarr.open_group(store=group, mode="w").create_array("x", shape=(4,), dtype="f8")[:] = 1
        res = run(group, f"{group}/sel", "-w", "x > 0", "--local", "threads", code=2)
        assert "must not be INPUT" in res.output
        assert sorted(fs.ls("/overlap-test/in.zarr", detail=False)) == [
            "/overlap-test/in.zarr/c", "/overlap-test/in.zarr/zarr.json"]
        # another file system, or a sibling on the same one, is no overlap
        run(url, "memory://overlap-test/in.zarr2", "-w", "x < 0.5", "--local", "threads")
        run(url, tmp_path / "from-memory.zarr", "-w", "x < 0.5", "--local", "threads")
        np.testing.assert_array_equal(values(tmp_path / "from-memory.zarr"), a[a < 0.5])
    finally:
        fs.rm("/overlap-test", recursive=True)


@pytest.mark.parametrize("cache", ["simplecache", "filecache", "blockcache"])
def test_overlap_is_refused_through_fsspec_caches(tmp_path, cache):
    """``simplecache::file://OUTPUT/values`` as INPUT with ``--overwrite`` replaced the INPUT,
    exit 0, and ``simplecache::file://IN`` wrote OUTPUT ``IN/inside`` (a probe): the cache's
    protocol made the two look like two file systems."""
    a = np.random.default_rng(7).random(500)
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), data=a, chunks=(100,))
    out = tmp_path / "prev.zarr"
    run(store, out, "-w", "x > 0.3", "--local", "threads")
    res = run(f"{cache}::file://{out}/values", out, "-w", "x > 0.5", "--overwrite",
              "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    res = run(f"{cache}::file://{store}", store / "inside", "-w", "x > 0.5",
              "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    res = run(out / "values", f"{cache}::file://{out}", "-w", "x > 0.5", "--overwrite",
              "--local", "threads", code=2)  # OUTPUT spelled through the cache: refused
    assert f"writes through fsspec's {cache}" in " ".join(res.output.split())
    np.testing.assert_array_equal(values(out), a[a > 0.3])
    assert not (store / "inside").exists()


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_input_through_fsspec_caches_of_local_files_is_read_as_its_path(tmp_path,
                                                                           zarr_format):
    """A ``filecache::`` INPUT failed inside the job with a ChunkError (exit 1, nothing
    written: fsspec's filecache updates its record of cached files unsafely from the job's
    threads), and a cache in front of a bare path (``simplecache::/p``) was refused as not
    existing. Caches in front of the local file system are looked through: the job reads
    the path, with a path's early read, chunk checks and input-change check."""
    a = np.random.default_rng(31).random(3_000)
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), data=a, chunks=(500,), zarr_format=zarr_format)
    spellings = [f"filecache::file://{store}", f"filecache::{store}",
                 f"simplecache::{store}", f"blockcache::local://{store}",
                 f"filecache::simplecache::{store}"]
    for i, inp in enumerate(spellings[:3]):
        out = tmp_path / f"o{i}.zarr"
        res = run(inp, out, "-w", "x > 0.4", "--local", "threads", "--json")
        np.testing.assert_array_equal(values(out), a[a > 0.4])
        summary = json.loads(res.output)
        assert summary["input"] == str(store)
        # the early read began, as for a local v3 array of zarr's default codecs (how many
        # chunks it took before the tasks did varies)
        assert (summary["read_ahead"] is not None) == (zarr_format == 3)
    # the chunk check: a missing chunk is refused through the cache as for the path
    os.remove(store / ("c/1" if zarr_format == 3 else "1"))
    res = run(f"filecache::file://{store}", tmp_path / "missing.zarr", "-w", "x > 0.4",
              "--local", "threads", code=2)
    assert "1 of its 6 chunks are not in the store" in res.output
    assert litter(tmp_path) == []
    from dask_compact.batch.inputs import cached_local_path

    for inp in spellings:
        assert cached_local_path(inp) == str(store)
    for url in (str(store), f"simplecache::s3://b/{store.name}", f"zip://x::{store}",
                f"simplecache://x::{store}"):
        assert cached_local_path(url) is None  # a path, another file system, an archive


def test_an_input_through_fsspec_caches_of_another_file_system(tmp_path):
    """In front of another file system (``memory://`` stands in for an object store, in
    process): ``simplecache::`` reads through its cache; ``filecache::`` is refused before
    anything runs, saying what to write instead (its reads from several threads failed,
    a ChunkError, exit 1 in most runs)."""
    import fsspec

    a = np.random.default_rng(32).random(3_000)
    fs = fsspec.filesystem("memory")
    try:
        for fmt in (2, 3):
            url = f"memory://cache-in-test/in{fmt}.zarr"
            zarr.create_array(store=url, data=a, chunks=(300,), zarr_format=fmt)
            out = tmp_path / f"o{fmt}.zarr"
            run(f"simplecache::{url}", out, "-w", "x > 0.6", "--local", "threads")
            np.testing.assert_array_equal(values(out), a[a > 0.6])
            res = run(f"filecache::{url}", tmp_path / "f.zarr", "-w", "x > 0.6",
                      "--local", "threads", code=2)
            said = " ".join(res.output.split())
            assert "Invalid value for INPUT" in said and "write simplecache:: in its place" in said
        group = "memory://cache-in-test/g.zarr"
        zarr.open_group(store=group, mode="w").create_array("m", data=a, chunks=(300,))
        res = run(f"filecache::{group}", tmp_path / "g.zarr", "-w", "m > 0.6",
                  "--local", "threads", code=2)
        assert "write simplecache:: in its place" in " ".join(res.output.split())
        run(f"simplecache::{group}", tmp_path / "g.zarr", "-w", "m > 0.6", "--local", "threads")
        np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "g.zarr"))["m"][:],
                                      a[a > 0.6])
        assert not (tmp_path / "f.zarr").exists() and litter(tmp_path) == []
    finally:
        fs.rm("/cache-in-test", recursive=True)


# The command in a process of its own whose INPUT is on fsspec's in-memory file system (filled
# there first, standing in for an object store): the process ends as the script's does
_COMMAND_ON_MEMORY = """
import sys
import numpy as np
import zarr
from dask_compact import cli
a = np.random.default_rng(33).random(3_000)
zarr.create_array(store="memory://cache-exit/in.zarr", data=a, chunks=(300,))
sys.argv = ["dask-compact", *sys.argv[1:]]
cli.script()
"""


@pytest.mark.parametrize("cache, code", [("simplecache", 0), ("blockcache", 2)])
def test_the_commands_cache_folders_are_removed_as_it_ends(tmp_path, cache, code):
    """The command's process ends with ``os._exit``, which skips fsspec's finalizers: the
    temporary folder of a cache in front of a remote INPUT (fsspec's default, a full copy of
    what the job read) was left in the temporary directory after every such command, done
    (exit 0) or refused (exit 2: ``blockcache::`` over ``memory://``, which has no blocks;
    OUTPUT already there)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out.zarr"

    def command() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _COMMAND_ON_MEMORY, f"{cache}::memory://cache-exit/in.zarr",
             str(out), "-w", "x > 0.6", "--local", "threads"], capture_output=True, text=True,
            timeout=120, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp)})

    proc = command()
    assert proc.returncode == code, proc.stderr
    assert list(tmp.iterdir()) == []
    if code == 0:
        a = np.random.default_rng(33).random(3_000)
        np.testing.assert_array_equal(values(out), a[a > 0.6])
        proc = command()
        assert proc.returncode == 2 and "exists" in proc.stderr, proc.stderr
        assert list(tmp.iterdir()) == []


def test_a_cache_folder_whose_first_removal_fails_is_removed(tmp_path, monkeypatch):
    """fsspec's own removal swallows its errors: a block still being written into the folder
    by a thread of the job makes it "not empty" (the test above left one in a CI run, exit 2);
    the command removes the folder again. Its first removal is made to fail here."""
    import tempfile
    import weakref

    from fsspec.implementations import cached

    from dask_compact import cli

    class Cache:  # stands for a CachingFileSystem made with cache_storage="TMP"
        pass

    folder = tempfile.mkdtemp(dir=tmp_path)
    (Path(folder) / "block").write_bytes(b"x" * 10)
    cache = Cache()
    finalizer = weakref.finalize(cache, cached.CachingFileSystem._remove_tempdir, folder)
    real, calls = cached.rmtree, []

    def failing_once(path, *a, **k):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(39, "Directory not empty")
        return real(path, *a, **k)

    monkeypatch.setattr(cached, "rmtree", failing_once)
    # the finalizer alone: the whole registry holds the other tests' live caches in this process
    cli._run_cache_finalizers([finalizer], cached.CachingFileSystem._remove_tempdir)
    assert calls == [folder] and not Path(folder).exists()


def test_a_cache_folder_written_again_after_its_removal_is_removed(tmp_path):
    """A thread of the job (zarr's I/O, still reading through the cache after a refusal)
    writing into the cache folder just after the command removed it: the folder came back
    and was left (once in a CI run, 2026-12-06). The command watches the folder until it stays
    gone."""
    import os
    import tempfile
    import threading
    import time
    import weakref

    from fsspec.implementations import cached

    from dask_compact import cli

    class Cache:  # stands for a CachingFileSystem made with cache_storage="TMP"
        pass

    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "block").write_bytes(b"x" * 10)
    cache = Cache()
    finalizer = weakref.finalize(cache, cached.CachingFileSystem._remove_tempdir, str(folder))
    wrote = threading.Event()

    def straggler() -> None:  # writes a block again once the folder is gone
        while folder.exists():
            time.sleep(0.001)
        time.sleep(0.01)
        # the folder comes back with its block at once (a rename): made and then written,
        # the command's watch could remove it between the two, and the write failed instead
        # (once in a CI run, 2026-12-07: the folder empty for a moment on the loaded machine)
        staged = Path(tempfile.mkdtemp(dir=tmp_path))
        (staged / "block").write_bytes(b"y" * 10)
        os.rename(staged, folder)
        wrote.set()

    t = threading.Thread(target=straggler)
    t.start()
    cli._run_cache_finalizers([finalizer], cached.CachingFileSystem._remove_tempdir)
    t.join()
    assert wrote.is_set() and not folder.exists()


def test_an_output_inside_an_archive_input_is_refused_as_an_overlap(tmp_path):
    """INPUT ``zip://x::/p/g.zip`` was placed on the zip's own file system (``zip``, ``x``),
    so an OUTPUT at, inside or around ``/p/g.zip`` was never compared with it (writing there
    failed for other reasons). All of INPUT's bytes are in the archive file: an OUTPUT there
    overlaps it, for an array member and for the group at the archive's root."""
    import zipfile

    a = np.random.default_rng(33).random(1_000)
    src = tmp_path / "g"
    zarr.open_group(str(src), mode="w").create_array("x", data=a, chunks=(250,))
    archive = tmp_path / "p" / "g.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as z:
        for f in src.rglob("*"):
            if f.is_file():
                z.write(f, f.relative_to(src).as_posix())
    before = archive.read_bytes()
    for inp in (f"zip://x::{archive}", f"zip://::{archive}", f"zip://x::file://{archive}"):
        for target, extra in ((archive / "out.zarr", []), (archive, ["--overwrite"]),
                              (archive.parent, ["--overwrite"])):
            res = run(inp, target, "-w", "x > 0.5", "--local", "threads", *extra, code=2)
            assert "must not be INPUT" in res.output, (inp, target, res.output)
    assert archive.read_bytes() == before
    run(f"zip://x::{archive}", tmp_path / "p" / "sel.zarr", "-w", "x > 0.5", "--local",
        "threads")  # a sibling of the archive is no overlap
    np.testing.assert_array_equal(values(tmp_path / "p" / "sel.zarr"), a[a > 0.5])


def test_overlap_is_refused_for_references_into_output(tmp_path):
    """A ``reference://`` INPUT whose references point into OUTPUT: ``--overwrite`` would
    delete the files it reads."""
    import json

    a = np.random.default_rng(8).random(500)
    store = tmp_path / "in.zarr"
    zarr.create_array(store=str(store), data=a, chunks=(100,))
    out = tmp_path / "prev.zarr"
    run(store, out, "-w", "x > 0.3", "--local", "threads")
    arr = out / "values"
    refs = {"zarr.json": (arr / "zarr.json").read_text()}
    for f in (arr / "c").iterdir():
        refs[f"c/{f.name}"] = [str(f)]
    (tmp_path / "refs.json").write_text(json.dumps({"version": 1, "refs": refs}))
    url = f"reference://::{tmp_path / 'refs.json'}"
    res = run(url, out, "-w", "x > 0.5", "--overwrite", "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.3])
    run(url, tmp_path / "elsewhere.zarr", "-w", "x > 0.5", "--local", "threads")
    b = a[a > 0.3]
    np.testing.assert_array_equal(values(tmp_path / "elsewhere.zarr"), b[b > 0.5])


def _prev_output(tmp_path: Path, seed: int) -> tuple[np.ndarray, Path, Path]:
    """(values, the Zarr array ``raw.zarr`` holding them, ``prev.zarr``: a complete output of
    theirs ``x > 0.2``, in chunks of 500)."""
    a = np.random.default_rng(seed).random(5_003)
    raw = tmp_path / "raw.zarr"
    zarr.create_array(store=str(raw), data=a, chunks=(500,))
    prev = tmp_path / "prev.zarr"
    run(raw, prev, "-w", "x > 0.2", "--local", "threads")
    return a, raw, prev


@pytest.mark.parametrize("link", ["group field", "chunk folder"])
def test_overlap_is_refused_where_input_reaches_into_output_through_a_link(tmp_path, link):
    """An INPUT read through a link into OUTPUT (a group whose field is a link to
    ``prev.zarr/values``, an array whose ``c`` is one to ``prev.zarr/values/c``): until
    2026-12-01 (fifteenth session, a probe) ``--overwrite`` of ``prev.zarr`` passed the check
    of the two paths and replaced it, exit 0: the group's field was left a dangling link, and
    the array read the new output's chunks under its old metadata, zeros past them."""
    a, _, prev = _prev_output(tmp_path, 9)
    b = a[a > 0.2]
    inp = tmp_path / "in.zarr"
    if link == "group field":
        zarr.open_group(str(inp), mode="w")
        (inp / "x").symlink_to("../prev.zarr/values")
    else:
        inp.mkdir()
        (inp / "zarr.json").write_text((prev / "values" / "zarr.json").read_text())
        (inp / "c").symlink_to(prev / "values" / "c")
    res = run(inp, prev, "-w", "x > 0.7", "--overwrite", "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    linked = prev / "values" / ("sub" if link == "group field" else "c/sub")  # in INPUT
    res = run(inp, linked, "-w", "x > 0.7", "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    np.testing.assert_array_equal(values(prev), b)
    read = zarr.open(str(inp), mode="r")
    np.testing.assert_array_equal(read["x"][:] if link == "group field" else read[:], b)
    run(inp, tmp_path / "elsewhere.zarr", "-w", "x > 0.7", "--local", "threads")
    got = zarr.open_group(str(tmp_path / "elsewhere.zarr"), mode="r")
    np.testing.assert_array_equal(got["x" if link == "group field" else "values"][:],
                                  b[b > 0.7])


def _bindable(tmp_path: Path, first: str, second: str) -> tuple[Path, Path]:
    """Two new folders of ``tmp_path``; the test is skipped where a mount namespace of its own
    (``unshare -m``) cannot bind one over the other."""
    a, b = tmp_path / first, tmp_path / second
    a.mkdir()
    b.mkdir()
    probe = subprocess.run(["unshare", "-m", "mount", "--bind", str(b), str(a)],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -m mount --bind)")
    return a, b


def _unshared(script: str, codes: list[int], said: str) -> subprocess.CompletedProcess:
    """``sh -c script`` in a mount namespace of its own (see :func:`_bindable`), whose
    commands each echo ``rc=$?``: their exit codes must be ``codes``, and each refusal
    (exit 2) must say ``said``."""
    res = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                         text=True, timeout=300)
    got = [int(w[3:]) for w in res.stdout.split() if w.startswith("rc=")]
    assert got == codes, res.stdout + res.stderr
    assert res.stderr.count(said) == codes.count(2), res.stderr
    return res


def test_overlap_is_refused_through_another_mount_of_the_same_folder(tmp_path):
    """A bind mount (or a second mount of one NFS export) spells one folder two ways that no
    path comparison joins: until 2026-12-01 (fifteenth session, a probe) ``--overwrite`` of
    ``other/prev.zarr`` with INPUT ``real/prev.zarr/values``, ``other`` a bind mount of
    ``real``, replaced prev.zarr and with it INPUT, exit 0. Run under ``unshare -m`` (a mount
    namespace of its own), skipped where that is not allowed."""
    real, other = _bindable(tmp_path, "real", "other")
    a = np.random.default_rng(10).random(2_001)
    store = real / "in.zarr"
    zarr.create_array(store=str(store), data=a, chunks=(500,))
    prev = real / "prev.zarr"
    run(store, prev, "-w", "x > 0.2", "--local", "threads")
    command = [sys.executable, "-m", "dask_compact"]
    script = (f"mount --bind {real} {other} && "
              f"{{ {' '.join(command)} {prev}/values {other}/prev.zarr -w 'x > 0.7' "
              f"--overwrite --local threads; echo rc=$?; "
              f"{' '.join(command)} {store} {other}/in.zarr/sub -w 'x > 0.7' "
              f"--local threads; echo rc=$?; }}")
    _unshared(script, [2, 2], "must not be INPUT")
    np.testing.assert_array_equal(values(prev), a[a > 0.2])
    assert sorted(p.name for p in store.iterdir()) == ["c", "zarr.json"]


def test_the_mount_point_check_sees_real_mount_points(tmp_path):
    """output.is_mount_point on this machine's own mounts: ``/`` and ``/proc`` are, a folder
    of the tests' temporary directory is not."""
    assert output.is_mount_point("/") and output.is_mount_point("/proc")
    assert not output.is_mount_point(str(tmp_path)) and not output.is_mount_point("/proc/self")
    assert "/proc" in output.mount_points()


@pytest.mark.parametrize("where", ["OUTPUT", "inside"])
def test_overwrite_of_a_mount_point_is_refused_before_the_job(npy, tmp_path, monkeypatch,
                                                               where):
    """``--overwrite`` of an OUTPUT that is a mount point (or holds one): until 2026-12-02
    (sixteenth session, the fifteenth session's probe) the job ran and failed at the swap,
    "job failed: OSError: [Errno 16] Device or resource busy", exit 1 (the old output intact,
    the job for nothing); a mount inside it would have been emptied with the old output.
    Refused before the job now, exit 2, naming it; the mount faked here (see the test
    under unshare -m for real ones)."""
    path, a = npy
    before = _digest(path)
    out = tmp_path / "prev.zarr"
    run(path, out, "--where", "x > 0.5")
    mounted = os.path.realpath(out if where == "OUTPUT" else out / "values")
    monkeypatch.setattr(output, "mount_points", lambda: {mounted})
    res = run(path, out, "--where", "x > 0.7", "--overwrite", code=2)
    said = " ".join(res.output.split())
    assert "Invalid value for OUTPUT" in said and f"{mounted} is a mount point" in said, said
    np.testing.assert_array_equal(values(out), a[a > 0.5])
    assert litter(tmp_path) == [] and _digest(path) == before
    monkeypatch.undo()
    run(path, out, "--where", "x > 0.7", "--overwrite")
    np.testing.assert_array_equal(values(out), a[a > 0.7])


def test_overwrite_of_a_real_mount_point_is_refused_before_the_job(npy, tmp_path):
    """The same with real mounts, in a mount namespace of its own (``unshare -m``; skipped
    where not allowed): OUTPUT bind-mounted on itself (one device: os.path.ismount does not
    see it) and a tmpfs holding a complete output (another device)."""
    path, a = npy
    before = _digest(path)
    bound, tmpfs = _bindable(tmp_path, "bound.zarr", "tmpfs.zarr")
    for out in (bound, tmpfs):
        out.rmdir()
        run(path, out, "--where", "x > 0.5")
    command = f"{sys.executable} -m dask_compact {path}"
    script = (f"mount --bind {bound} {bound} && mount -t tmpfs none {tmpfs} && "
              f"cp -a {bound}/. {tmpfs}/ && "
              f"for o in {bound} {tmpfs}; do {command} $o -w 'x > 0.7' --overwrite "
              f"--local threads; echo rc=$?; done; "
              f"{sys.executable} -c 'import zarr; print(zarr.open_group(\"{tmpfs}\")"
              f"[\"values\"].shape)'")
    res = _unshared(script, [2, 2], "is a mount point")
    assert f"({int((a > 0.5).sum())},)" in res.stdout  # the tmpfs's output as it was
    np.testing.assert_array_equal(values(bound), a[a > 0.5])
    assert litter(tmp_path) == [] and _digest(path) == before


def test_overlap_is_refused_where_a_folder_of_output_is_mounted_inside_input(tmp_path):
    """A folder of OUTPUT mounted inside INPUT (a group's field bind-mounted from
    ``prev.zarr/values``): its path above is INPUT's, and until 2026-12-02 (sixteenth
    session, the fifteenth session's probe) ``--overwrite`` of ``prev.zarr`` passed the
    check, exit 0, and the removal of the old output emptied INPUT's field. Now OUTPUT's
    folders (where it is an output of ours) and those of every leftover beside it are
    compared with INPUT's by device and inode: exit 2, nothing touched. Run under
    ``unshare -m``, skipped where that is not allowed; the same for a leftover beside
    OUTPUT (which the clean-up would remove)."""
    a = np.random.default_rng(13).random(5_003)
    raw = tmp_path / "raw.zarr"
    zarr.create_array(store=str(raw), data=a, chunks=(500,))
    prev = tmp_path / "prev.zarr"
    run(raw, prev, "-w", "x > 0.2", "--local", "threads")
    field, _ = _bindable(tmp_path, "in.zarr", "unused")
    zarr.open_group(str(field), mode="w")
    (field / "x").mkdir()
    left = tmp_path / f".other.zarr{output.TMP_MARK}0123456789ab"
    shutil.copytree(prev, left)
    before = {p: _digest(p) for p in (prev, left)}
    command = f"{sys.executable} -m dask_compact {field}"
    script = (f"mount --bind {prev}/values {field}/x && "
              f"{command} {prev} -w 'x > 0.7' --overwrite --local threads; echo rc=$?; "
              f"umount {field}/x && mount --bind {left}/values {field}/x && "
              f"{command} {tmp_path}/other.zarr -w 'x > 0.7' --local threads; echo rc=$?; "
              f"{command} {tmp_path}/third.zarr -w 'x > 0.7' --local threads; echo rc=$?")
    _unshared(script, [2, 2, 0], "must not be INPUT")  # the last reads it as any store
    assert {p: _digest(p) for p in (prev, left)} == before
    b = a[a > 0.2]
    np.testing.assert_array_equal(values(prev), b)
    got = zarr.open_group(str(tmp_path / "third.zarr"), mode="r")["x"][:]
    np.testing.assert_array_equal(got, b[b > 0.7])


def _input_sharing_a_chunk_of(prev: Path, inp: Path) -> None:
    """``inp``: an array of ``prev``'s ``values`` metadata and chunk files (copies), its chunk 3
    to be made a link or a mount of ``prev``'s own by the caller."""
    inp.mkdir(exist_ok=True)
    shutil.copy(prev / "values" / "zarr.json", inp / "zarr.json")
    shutil.copytree(prev / "values" / "c", inp / "c")


def test_overlap_is_refused_where_a_chunk_file_of_input_links_into_output(tmp_path):
    """An INPUT whose chunk file ``c/3`` is a symbolic link to ``prev.zarr/values/c/3`` (zarr
    reads through it): until 2026-12-02 (seventeenth session, a probe) the overlap check
    looked at folders only, ``--overwrite`` of ``prev.zarr`` passed, exit 0, and INPUT's
    chunk 3 was then the new output's chunk 3 (another 500 values). Exit 2 now, nothing
    touched; a hard link there is no overlap (the old output's removal unlinks its name, and
    INPUT keeps its bytes)."""
    a, _, prev = _prev_output(tmp_path, 17)
    b = a[a > 0.2]
    inp = tmp_path / "in.zarr"
    _input_sharing_a_chunk_of(prev, inp)
    (inp / "c" / "3").unlink()
    (inp / "c" / "3").symlink_to(prev / "values" / "c" / "3")
    before = {p: _digest(p) for p in (prev, inp)}
    res = run(inp, prev, "-w", "x > 0.7", "--overwrite", "--local", "threads", code=2)
    assert "must not be INPUT" in res.output
    assert {p: _digest(p) for p in (prev, inp)} == before and litter(tmp_path) == []
    np.testing.assert_array_equal(zarr.open_array(str(inp), mode="r")[:], b)
    (inp / "c" / "3").unlink()
    os.link(prev / "values" / "c" / "3", inp / "c" / "3")
    run(inp, prev, "-w", "x > 0.7", "--overwrite", "--local", "threads")
    assert _digest(inp) == before[inp]
    np.testing.assert_array_equal(zarr.open_array(str(inp), mode="r")[:], b)
    np.testing.assert_array_equal(values(prev), b[b > 0.7])


def test_overlap_is_refused_where_a_chunk_file_is_mounted_between_input_and_output(tmp_path):
    """One chunk FILE bind-mounted from OUTPUT into INPUT (``prev.zarr/values/c/3`` on
    ``in.zarr/c/3``), or from INPUT into OUTPUT: the walk of folders does not see a file's
    mount. Until 2026-12-02 (seventeenth session, the sixteenth session's probe)
    ``--overwrite`` of ``prev.zarr`` passed: the first unlinked the only name of INPUT's
    chunk 3 with the old output (the mount held it, link count 0: gone at the unmount), exit
    0; the second ran the job and failed removing the old output (the mount point busy),
    leaving it beside OUTPUT. Now every mount point under one tree whose source (device and
    root, ``/proc/self/mountinfo``) lies in the other is refused, exit 2, nothing touched.
    A file of elsewhere mounted inside the old output is refused as a mount point its
    removal would meet. Run under ``unshare -m``, skipped where that is not allowed."""
    a, raw, prev = _prev_output(tmp_path, 18)
    inp, _ = _bindable(tmp_path, "in.zarr", "unused")
    _input_sharing_a_chunk_of(prev, inp)
    other = tmp_path / "other.bin"
    other.write_bytes(b"someone else's")
    watched = (prev, inp, raw, other)
    before = {p: _digest(p) for p in watched}
    command = f"{sys.executable} -m dask_compact"
    chunk = "values/c/3"
    script = (f"mount --bind {prev}/{chunk} {inp}/c/3 && "
              f"{command} {inp} {prev} -w 'x > 0.7' --overwrite --local threads; echo rc=$?; "
              f"stat -c links=%h {inp}/c/3; umount {inp}/c/3 && "
              f"mount --bind {raw}/c/3 {prev}/{chunk} && "
              f"{command} {raw} {prev} -w 'x > 0.7' --overwrite --local threads; echo rc=$?")
    res = _unshared(script, [2, 2], "must not be INPUT")
    assert "links=1" in res.stdout, res.stdout
    script = (f"mount --bind {other} {prev}/{chunk} && "
              f"{command} {raw} {prev} -w 'x > 0.7' --overwrite --local threads; echo rc=$?")
    _unshared(script, [2], "is a mount point")
    assert {p: _digest(p) for p in watched} == before and litter(tmp_path) == []
    np.testing.assert_array_equal(values(prev), a[a > 0.2])


def test_overwrite_refuses_an_output_holding_what_the_job_did_not_write(npy, tmp_path):
    """A probe's ``--overwrite`` deleted an array, a file and a folder the user had added
    inside a complete output, exit 0: it now refuses, naming them, and touches nothing."""
    path, a = npy
    out = tmp_path / "prev.zarr"
    run(path, out, "--where", "x > 0.5")
    run(path, out, "--where", "x > 0.6", "--overwrite")  # nothing added: replaced
    zarr.open_group(str(out), mode="r+").create_array("my_analysis", data=np.arange(10))
    (out / "NOTES.txt").write_text("hand notes")
    (out / "plots").mkdir()
    (out / "values" / "README").write_text("mine")
    res = run(path, out, "--where", "x > 0.9", "--overwrite", code=2)
    said = " ".join(res.output.split())
    assert "did not write: NOTES.txt, my_analysis/, plots/, values/README" in said
    np.testing.assert_array_equal(values(out), a[a > 0.6])
    assert (out / "NOTES.txt").exists() and (out / "my_analysis").exists()
    assert litter(tmp_path) == []
    for added in ("NOTES.txt", "plots", "values/README"):
        os.remove(out / added) if added != "plots" else (out / added).rmdir()
    import shutil

    shutil.rmtree(out / "my_analysis")
    run(path, out, "--where", "x > 0.9", "--overwrite")
    np.testing.assert_array_equal(values(out), a[a > 0.9])


def test_overwrite_of_a_group_output_keeps_to_what_its_job_wrote(tmp_path):
    """A Zarr group INPUT's output: its fields, indices and the arrays copied unchanged are
    the job's; a file added beside them is not."""
    rng = np.random.default_rng(12)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    g.create_array("m", data=rng.random(300))
    g.create_array("r", data=rng.random(300))
    g.create_array("grid", data=np.arange(7.0))  # another length: copied unchanged
    # a 0-d array copied unchanged: its one chunk is a FILE named "c", which --overwrite took
    # for something the job did not write (a review)
    g.create_array("height", data=np.array(2.0))
    out = tmp_path / "sel.zarr"
    run(tmp_path / "in.zarr", out, "--where", "m > 0.5", "--output", "both")
    run(tmp_path / "in.zarr", out, "--where", "m > 0.7", "--output", "both", "--overwrite")
    (out / "NOTES.txt").write_text("hand notes")
    res = run(tmp_path / "in.zarr", out, "--where", "m > 0.9", "--overwrite", code=2)
    assert "did not write: NOTES.txt" in " ".join(res.output.split())
    m = zarr.open_group(str(tmp_path / "in.zarr"))["m"][:]
    np.testing.assert_array_equal(zarr.open_group(str(out))["m"][:], m[m > 0.7])


def test_a_zip_output_is_refused_up_front(npy, tmp_path, monkeypatch):
    """A probe's ``zip://`` OUTPUT ended in a 54-line traceback (FileNotFoundError; with an
    empty zip file, IsADirectoryError): fsspec's zip file system is read-only to zarr. The
    short chain ``zip::FILE`` (no ``://``) made a local directory named ``zip::`` (a review)."""
    import zipfile

    monkeypatch.chdir(tmp_path)  # where a relative "zip::..." directory would appear
    path, _ = npy
    empty = tmp_path / "empty.zip"
    zipfile.ZipFile(empty, "w").close()
    before = empty.read_bytes()
    for url in (f"zip://::{tmp_path / 'new.zip'}", f"zip://sel::{empty}", f"zip://::{empty}",
                "zip::short.zip"):
        res = run(path, url, "-w", "x > 0.5", "--local", "threads", code=2)
        assert "cannot write into a zip file" in res.output
        assert res.output.strip().splitlines()[-1].startswith("Error: Invalid value for OUTPUT")
    assert not (tmp_path / "new.zip").exists() and empty.read_bytes() == before
    assert not (tmp_path / "zip::short.zip").exists() and not (tmp_path / "short.zip").exists()


def test_an_output_through_an_fsspec_cache_is_refused_up_front(npy, tmp_path):
    """A probe's ``simplecache::file://.../out.zarr`` OUTPUT failed inside the job with a
    FileNotFoundError in its temporary group (a write through the cache lands in its local
    copy): refused before anything runs, naming the cache, and the target URL works."""
    path, a = npy
    for cache in ("simplecache", "filecache", "blockcache"):
        url = f"{cache}::file://{tmp_path / 'out.zarr'}"
        res = run(path, url, "-w", "x > 0.5", "--local", "threads", code=2)
        assert f"writes through fsspec's {cache}" in " ".join(res.output.split())
        assert not list(tmp_path.glob("*out.zarr*"))
    run(path, f"file://{tmp_path / 'out.zarr'}", "-w", "x > 0.5", "--local", "threads")
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "out.zarr"))["values"][:],
                                  a[a > 0.5])


def test_a_memory_output_is_refused_up_front(npy, tmp_path):
    """A probe's ``memory://`` OUTPUT was written, exit 0, and gone when the command ended (the
    file system lives in its process). A ``memory://`` INPUT is still read."""
    import fsspec

    path, a = npy
    fs = fsspec.filesystem("memory")
    for url in ("memory://keep-test/out.zarr", "simplecache::memory://keep-test/out.zarr"):
        res = run(path, url, "-w", "x > 0.5", "--local", "threads", code=2)
        assert "in-memory file system" in res.output and "OUTPUT" in res.output
    assert not fs.exists("/keep-test")
    try:  # a memory:// INPUT is read as any URL's
        zarr.create_array(store="memory://keep-test/in.zarr", shape=a.shape, chunks=(3_000,),
                          dtype=a.dtype)[:] = a
        run("memory://keep-test/in.zarr", tmp_path / "o.zarr", "-w", "x > 0.5",
            "--local", "threads")
        np.testing.assert_array_equal(values(tmp_path / "o.zarr"), a[a > 0.5])
    finally:
        fs.rm("/keep-test", recursive=True)


def test_output_where_nothing_can_be_written_is_a_short_error(npy, tmp_path):
    # a raw FileExistsError / FileNotFoundError traceback before (found by a probe)
    path, _ = npy
    (tmp_path / "afile").write_text("notes")
    for target, why in ((tmp_path / "afile" / "out.zarr", "afile is a file, not a directory"),
                        (tmp_path / "afile" / "deeper" / "out.zarr", "afile is a file, not a"),
                        (Path("/proc/out.zarr"), "No such file or directory")):
        res = run(path, target, "--where", "x > 0.5", code=2)
        assert "Invalid value for OUTPUT: cannot write beside" in res.output
        assert why in res.output and "Traceback" not in res.output
    assert (tmp_path / "afile").read_text() == "notes"


def _digest(path: Path) -> str:
    """A hash of every file under ``path`` (or of the file), names and bytes: INPUT must be
    left byte for byte as it was."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("length, where_run", [
    (211, ["--local", "threads"]), (225, ["--local", "threads"]),
    (236, ["--local", "threads"]), (255, ["--local", "threads"]),
    (240, ["--local", "processes", "--workers", "2"]),
], ids=["211", "225", "236", "255", "240-processes"])
def test_an_output_of_a_long_name_is_written(npy, tmp_path, length, where_run):
    """An OUTPUT whose name the file system takes, however long: until 2026-12-02 (sixteenth
    session, the fifteenth session's probe) a name of 225-236 bytes failed after the job
    started, exit 1 (its hidden working folder's name, OUTPUT's name and 31 characters, past
    the 255-byte limit), one of 212-224 the same on a cluster (the workers' check folder,
    44 characters more) and one of 236-255 was refused for its lock's name. Written, replaced
    with --overwrite, nothing left beside it, INPUT unchanged."""
    path, a = npy
    before = _digest(path)
    out = tmp_path / ("o" * (length - 5) + ".zarr")
    run(path, out, "--where", "x > 0.5", *where_run)
    np.testing.assert_array_equal(values(out), a[a > 0.5])
    run(path, out, "--where", "x > 0.7", "--overwrite", *where_run)
    np.testing.assert_array_equal(values(out), a[a > 0.7])
    assert litter(tmp_path) == [] and sorted(os.listdir(tmp_path)) == sorted(["in.npy", out.name])
    assert _digest(path) == before


def test_an_output_whose_name_cannot_exist_is_refused_before_the_job(npy, tmp_path):
    """A name longer than the file system takes (255 bytes): refused as a bad OUTPUT, exit 2,
    nothing made (a multi-byte name counted in bytes)."""
    path, _ = npy
    before = _digest(path)
    for name in ("o" * 256, "\u00e9" * 128):  # 256 bytes either way
        res = run(path, tmp_path / "new" / name, "--where", "x > 0.5", code=2)
        said = " ".join(res.output.split())
        assert "Invalid value for OUTPUT" in said and "256 bytes" in said, said
        assert sorted(os.listdir(tmp_path)) == ["in.npy"]
    assert _digest(path) == before


def test_the_lock_never_writes_into_a_file_of_someone_else(npy, tmp_path):
    """The lock's name beside OUTPUT being a link to a user's file (a symbolic link, or a
    hard link a snapshot tool made of a stale lock file): until 2026-12-01 (fifteenth
    session, a probe) the job opened it through the link and wrote its pid over the file,
    exit 0. A symbolic link is refused as a bad OUTPUT, and a file of several links is
    locked but left unwritten."""
    path, a = npy
    thesis = tmp_path / "thesis.txt"
    thesis.write_text("four years of work")
    lock = tmp_path / f".out.zarr{output.LOCK_SUFFIX}"
    lock.symlink_to(thesis.name)
    res = run(path, tmp_path / "out.zarr", "--where", "x > 0.5", code=2)
    assert "is a symbolic link" in res.output and str(lock) in res.output
    assert thesis.read_text() == "four years of work" and lock.is_symlink()
    lock.unlink()
    os.link(thesis, lock)
    run(path, tmp_path / "out.zarr", "--where", "x > 0.5")
    np.testing.assert_array_equal(values(tmp_path / "out.zarr"), a[a > 0.5])
    assert thesis.read_text() == "four years of work"


def test_a_second_job_on_a_locked_output_refuses(npy, tmp_path):
    path, _ = npy
    out = tmp_path / "out.zarr"
    lock = tmp_path / f".out.zarr{output.LOCK_SUFFIX}"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # as a running job holds it
        res = run(path, out, "--where", "x > 0.5", code=1)
        assert "another dask compact job is writing" in res.output
    assert not out.exists()


def test_concurrent_jobs_on_one_output_leave_exactly_one_result(npy, tmp_path):
    path, a = npy
    out = tmp_path / "out.zarr"
    thresholds = [0.1, 0.3, 0.5, 0.7]
    procs = [
        subprocess.Popen([sys.executable, "-m", "dask_compact", str(path), str(out), "--where",
                          f"x > {t}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for t in thresholds
    ]
    results = [(p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for p in procs]
    winners = [t for t, (rc, _, _) in zip(thresholds, results) if rc == 0]
    assert len(winners) == 1, results
    for rc, _, err in results:
        assert rc == 0 or "another dask compact job" in err or "exists" in err, err
        assert "Traceback" not in err
    assert where_of(out) == f"x > {winners[0]}"
    np.testing.assert_array_equal(values(out), a[a > winners[0]])
    assert litter(tmp_path) == []


def test_output_appearing_during_the_job_is_left_alone(npy, tmp_path, monkeypatch):
    """Another program makes OUTPUT (an empty directory) while the job runs: rename() would
    silently replace it; the job refuses instead and leaves it as it is."""
    path, _ = npy
    out = tmp_path / "out.zarr"
    from dask_compact.batch import job

    real = job.create_group

    def create_group(*args, **kw):
        out.mkdir()
        return real(*args, **kw)

    monkeypatch.setattr(job, "create_group", create_group)
    res = run(path, out, "--where", "x > 0.5", code=1)
    assert "appeared while the job ran" in res.output
    assert out.is_dir() and not any(out.iterdir())
    assert litter(tmp_path) == []


# -- kills and signals ----------------------------------------------------------------------------


def test_kill_between_the_renames_of_a_replacement_is_repaired(npy, tmp_path):
    """Without renameat2 a replacement takes two renames; a job SIGKILLed between them leaves
    OUTPUT missing and the old group aside: the next job puts it back, then goes on."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    ready = tmp_path / "ready"
    proc = start("pause-swap", ready, path, out, "--where", "x > 0.9", "--overwrite")
    wait_for(ready, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()  # the window: only the old group, aside
    res = run(path, out, "--where", "x > 0.8", "--overwrite")
    assert "restored" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.8])
    assert litter(tmp_path) == []
    # and a job that does not replace it just restores the old group and refuses to go on
    ready2 = tmp_path / "ready2"
    proc = start("pause-swap", ready2, path, out, "--where", "x > 0.9", "--overwrite")
    wait_for(ready2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    res = run(path, out, "--where", "x > 0.1", code=2)
    assert "restored" in res.output and "exists" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.8])
    assert litter(tmp_path) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["sigterm", "sigint"])
def test_signal_while_the_old_output_is_removed_says_output_was_written(npy, tmp_path, sig,
                                                                        code):
    """A signal after ``--overwrite`` swapped the new output in, while the old one is being
    removed (slow for many chunk files): the job said "OUTPUT was not written" (SIGTERM
    unwound the commit before it was recorded). Now: OUTPUT written, the old one left beside
    it, and the next job removes it."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    ready = tmp_path / "ready"
    proc = start("pause-remove-old", ready, path, out, "--where", "x > 0.9", "--overwrite")
    wait_for(ready, proc)
    proc.send_signal(sig)  # the job alone: its process is its session's leader
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert f"{out} had been written completely; the old output it replaced is left at" in err
    np.testing.assert_array_equal(values(out), a[a > 0.9])
    assert [n for n in litter(tmp_path) if "tmp" in n]  # the old one, for the next job
    res = run(path, out, "--where", "x > 0.8", "--overwrite")
    assert "removed" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.8])
    assert litter(tmp_path) == []


def test_sigterm_during_the_renames_is_delivered_after_them():
    """signals.held: SIGTERM waits for the block (the commit's renames), then unwinds."""
    from dask_compact.batch.signals import EXIT_SIGTERM, held, terminate_as_exit

    done = []
    with pytest.raises(SystemExit) as e, terminate_as_exit():
        with held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the signal arrives here; the block goes on
            done.append(True)
        done.append(False)  # not reached: delivered as the block ends
    assert done == [True] and e.value.code == EXIT_SIGTERM


def _write_protect(tree: Path, monkeypatch) -> None:
    """``chmod -R a-w tree``; as root (who may remove anything), os.access as the job sees it
    then answers as for an ordinary user."""
    for folder, dirs, files in os.walk(tree):
        for name in [*dirs, *files, "."]:
            p = Path(folder, name)
            p.chmod(p.stat().st_mode & ~0o222)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(output.os, "access", lambda p, mode, **kw: real(p, mode, **kw) and (
            not mode & os.W_OK or bool(os.stat(p).st_mode & 0o200)))


def _writable(tree: Path) -> None:
    for folder, dirs, files in os.walk(tree):
        for name in [*dirs, *files, "."]:
            p = Path(folder, name)
            p.chmod(p.stat().st_mode | 0o200)


def test_write_protected_old_output_is_refused_before_the_job(npy, tmp_path, monkeypatch):
    """``--overwrite`` of an old output that could not be removed: a probe's job swapped the
    new output in and then failed with "job failed: PermissionError", leaving the old group
    under a temporary name. Now refused at the start, nothing changed."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    _write_protect(out, monkeypatch)
    try:
        res = run(path, out, "--where", "x > 0.9", "--overwrite", code=2)
        assert "write-protected" in res.output and "chmod -R u+w" in res.output
        np.testing.assert_array_equal(values(out), a[a > 0.5])
        assert litter(tmp_path) == []
    finally:
        _writable(out)
    monkeypatch.undo()
    run(path, out, "--where", "x > 0.9", "--overwrite")
    np.testing.assert_array_equal(values(out), a[a > 0.9])


def test_old_output_that_cannot_be_removed_after_the_swap_is_reported(npy, tmp_path,
                                                                      monkeypatch):
    """The old output became unremovable after the job's check (or removal failed
    otherwise): OUTPUT holds the new result, so the job succeeds, saying where the old one is
    left; a later job that cannot remove it either gives a short error, not a traceback."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    real = output._remove

    def refuse(p):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(output, "_remove", refuse)
    res = run(path, out, "--where", "x > 0.9", "--overwrite")
    assert "could not be removed (PermissionError" in res.output
    assert "it is left at" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.9])
    left = [n for n in litter(tmp_path) if "tmp" in n]
    assert len(left) == 1
    res = run(path, out, "--where", "x > 0.8", "--overwrite", code=1)
    assert f"cannot clean up {tmp_path / left[0]}" in res.output
    assert "remove it yourself" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.9])
    monkeypatch.setattr(output, "_remove", real)
    res = run(path, out, "--where", "x > 0.8", "--overwrite")
    assert "removed" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.8])
    assert litter(tmp_path) == []


def test_sigkill_leftovers_are_removed_by_the_next_job(npy, tmp_path):
    path, a = npy
    out = tmp_path / "out.zarr"
    ready = tmp_path / "ready"
    proc = start("pause-write", ready, path, out, "--where", "x > 0.5")
    wait_for(ready, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert [n for n in litter(tmp_path) if "tmp" in n]  # what a kill leaves
    res = run(path, out, "--where", "x > 0.5")
    assert "interrupted job" in res.output
    np.testing.assert_array_equal(values(out), a[a > 0.5])
    assert litter(tmp_path) == []


@pytest.mark.parametrize("resume", [False, True])
def test_a_leftover_beside_output_that_is_input_is_not_removed(npy, tmp_path, resume):
    """INPUT in what a killed job left beside OUTPUT (the old output a killed ``--overwrite``
    had swapped out, complete, compacted again to salvage it): until 2026-12-01 (fifteenth
    session, a probe) the job's clean-up removed it as litter, then failed reading it, exit
    1, the old output gone. Now refused up front as an overlap, exit 2, nothing removed."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    left = tmp_path / f".out.zarr{output.TMP_MARK}0123456789ab"
    out.rename(left)  # as a kill after the swap of an --overwrite leaves the old output
    res = run(left / "values", out, "--where", "x > 0.7", *(["--resume"] if resume else []),
              code=2)
    assert "must not be INPUT" in res.output and str(left) in res.output
    b = a[a > 0.5]
    np.testing.assert_array_equal(values(left), b)
    assert not out.exists()
    run(left / "values", tmp_path / "salvaged.zarr", "--where", "x > 0.7")
    np.testing.assert_array_equal(values(tmp_path / "salvaged.zarr"), b[b > 0.7])


@pytest.mark.parametrize(
    "sig, code, where_run",
    [
        (signal.SIGINT, 130, ["--local", "processes", "--workers", "2"]),
        (signal.SIGTERM, 143, ["--local", "processes", "--workers", "2"]),
        (signal.SIGINT, 130, ["--local", "threads"]),
    ],
    ids=["sigint-processes", "sigterm-processes", "sigint-threads"],
)
def test_signal_mid_write_one_line_exit_code_no_litter(npy, tmp_path, sig, code, where_run):
    """As a terminal does, the signal goes to the whole process group (workers included)."""
    path, _ = npy
    out = tmp_path / "out.zarr"
    ready = tmp_path / "ready"
    proc = start("slow-write", ready, path, out, "--where", "x > 0.5", "--chunks", "1000",
                  "--output-chunks", "1000", *where_run)
    wait_for(ready, proc)
    time.sleep(0.5)  # tasks running on the workers
    os.killpg(proc.pid, sig)
    _ends_in_one_line_and_leaves_nothing(proc, code, out, tmp_path)


def _ends_in_one_line_and_leaves_nothing(proc: subprocess.Popen, code: int, out: Path,
                                        tmp_path: Path) -> None:
    """The signalled job exits ``code`` with one line saying OUTPUT was not written, and
    leaves nothing beside it."""
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == code, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "was not written" in lines[0], stderr
    assert not out.exists()
    time.sleep(1.0)  # nothing recreates the temporary group afterwards
    assert litter(tmp_path) == []


def test_a_local_cluster_that_never_starts_ends_the_job(npy, tmp_path):
    """distributed's LocalCluster waited forever where its nannies could not start their
    processes (a probe, 2026-12-06: the command run as a user whose multiprocessing resource
    tracker died), and the start ignores Ctrl-C and SIGTERM (the workers inherit that): only
    SIGKILL ended the command, its lock left beside OUTPUT. The start is bounded now: one
    line, exit 1, the processes the start made killed, nothing left."""
    import psutil

    path, _ = npy
    out = tmp_path / "out.zarr"
    ready = tmp_path / "ready"
    began = time.monotonic()
    proc = start("hang-start", ready, path, out, "--where", "x > 0.5", "--local", "processes",
                 "--workers", "2")
    try:
        _, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()  # SIGKILL: what alone ended the command before (it ignored the others)
        if ready.exists():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(int(ready.read_text())).kill()
    assert proc.returncode == 1, stderr
    assert time.monotonic() - began < 60
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "the local cluster did not start in 2 s" in lines[0], stderr
    child = int(ready.read_text())
    with contextlib.suppress(psutil.NoSuchProcess):
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE  # killed, not reaped
    assert not out.exists() and litter(tmp_path) == []


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
                         ids=["sigterm", "sigint"])
def test_a_signal_repeated_during_the_clean_up_leaves_no_litter(npy, tmp_path, sig, code):
    """A batch system repeats its SIGTERM (a user presses Ctrl-C again) while the job removes
    its temporary group: the removal held Ctrl-C but not SIGTERM, which cut it short (a
    probe, 2026-12-06: three SIGTERMs 0.3 s apart left 11,604 files of it beside OUTPUT).
    The clean-up, and the wait for the job's threads before it, now hold both."""
    path, _ = npy
    out = tmp_path / "out.zarr"
    ready = tmp_path / "ready"
    proc = start("slow-removal", ready, path, out, "--where", "x > 0.5", "--chunks", "500",
                 "--output-chunks", "500", "--local", "threads")
    wait_for(ready, proc)
    os.killpg(proc.pid, sig)
    wait_for(ready.with_suffix(".removing"), proc)
    for _ in range(3):
        os.killpg(proc.pid, sig)
        time.sleep(0.1)
    _ends_in_one_line_and_leaves_nothing(proc, code, out, tmp_path)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_signal_before_the_job_one_line_exit_code(npy, tmp_path, monkeypatch, sig, code,
                                                  word):
    """Ctrl-C or SIGTERM while the command is still starting (here as it opens its input):
    the same exit code and one line as during the job, not click's "Aborted!" and 1."""
    from dask_compact.batch import inputs

    real = inputs.open_input

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), sig)
        time.sleep(1.0)  # the handler runs in this (the main) thread meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(inputs, "open_input", signalled)
    path, _ = npy
    out = tmp_path / "out.zarr"
    # Python's own Ctrl-C handler, as in a terminal: a shell starts a background job's
    # processes with SIGINT ignored, and pytest keeps what it was given
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        res = run(path, out, "--where", "x > 0.5", code=code)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert f"dask compact: {word}; nothing was written" in res.output
    assert "Aborted" not in res.output
    assert not out.exists() and litter(tmp_path) == []


# INPUT is rewritten as the job reads it by its click callback (cli._input_as_read), which
# imports the input module (numpy, zarr's reader: ~0.2 s of the command's start); here the
# signal comes while it runs, in a process of its own (SIGTERM has no handler of ours there)
EARLY_SIGNAL = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job
from dask_compact.batch import inputs
real, sig = inputs.looked_through, int(sys.argv.pop(1))
def signalled(value):
    os.kill(os.getpid(), sig)
    time.sleep(1.0)  # the handler runs in this (the main) thread meanwhile
    return real(value)
inputs.looked_through = signalled
from dask_compact.cli import script
script()
"""


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_signal_while_input_is_parsed_one_line_exit_code(npy, tmp_path, sig, code, word):
    """Ctrl-C or SIGTERM while click parses the command line (INPUT's callback): until
    2026-12-01, click's "Aborted!" and exit 1, or death by SIGTERM without a word (a new-user
    probe's signal 0.2-0.5 s into the command), where the rest of the start exits 130 / 143
    with one line."""
    path, _ = npy
    out = tmp_path / "out.zarr"
    proc = subprocess.run([sys.executable, "-c", EARLY_SIGNAL, str(int(sig)), str(path),
                           str(out), "--where", "x > 0.5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"dask compact: {word}; nothing was written"], proc.stderr
    assert not out.exists() and litter(tmp_path) == []


# -- installation and arguments -------------------------------------------------------------------


def test_zarr_is_a_dependency_and_its_absence_is_a_short_error(npy, tmp_path, monkeypatch):
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert any(d.startswith("zarr") for d in project["project"]["dependencies"])
    monkeypatch.setitem(sys.modules, "zarr", None)  # import zarr -> ImportError
    path, _ = npy
    res = run(path, tmp_path / "o.zarr", "--where", "x > 0.5", code=1)
    assert "needs the zarr package" in res.output
    assert not (tmp_path / "o.zarr").exists()


def test_a_zarr_that_is_installed_but_does_not_import_is_named_as_such():
    """zarr <= 3.1.3 with numcodecs >= 0.16.4 fails on `import crc32c` (a probe of the lowest
    allowed versions): "needs the zarr package; pip install zarr" was wrong there."""
    from dask_compact.cli import _zarr_missing

    broken = _zarr_missing(ImportError("No module named 'crc32c'", name="crc32c"))
    assert "installed zarr package cannot be imported" in broken and "crc32c" in broken
    assert "zarr>=3.1.4" in broken
    absent = _zarr_missing(ImportError("No module named 'zarr'", name="zarr"))
    assert "needs the zarr package" in absent


def test_the_declared_lower_bounds_are_the_tested_ones():
    """A probe installed the lowest versions pyproject allowed: zarr 3.0-3.1.3 failed every
    CLI job (no `Array.async_array`), NumPy 1.26 typed constants by its old promotion rules,
    distributed 2025.1-2025.2 and xarray before 2025.6 failed tests. The bounds now exclude
    them; this keeps them from sliding back."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in project["project"]["dependencies"]]
    reqs += [Requirement(r) for extra in project["project"]["optional-dependencies"].values()
             for r in extra]
    lowest = {"zarr": "3.1.3", "numpy": "1.26.4", "dask": "2025.2.0",
              "distributed": "2025.2.0", "xarray": "2025.5.0"}
    for r in reqs:
        if r.name in lowest:
            assert Version(lowest[r.name]) not in r.specifier, (r, lowest[r.name])


def test_version_and_where_errors_come_before_output_errors(npy, tmp_path):
    res = run("--version")
    assert dask_compact.__version__ in res.output
    path, _ = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    res = run(path, out, "--where", "y > 0.5", code=2)  # OUTPUT exists, but --where is wrong
    assert "--where" in res.output and "'y'" in res.output


@pytest.mark.parametrize("args, message", [
    (["--workers", "3"], "--workers sizes a local cluster"),
    (["--local", "threads", "--workers", "3"], "--workers sizes a local cluster"),
    (["--scheduler", "tcp://127.0.0.1:1", "--workers", "2"], "a running cluster"),
    (["--scheduler", "tcp://127.0.0.1:1", "--local", "processes"], "give one"),
])
def test_options_that_would_be_ignored_are_refused(npy, tmp_path, args, message):
    """--workers on the threaded scheduler ran without a word (a probe); so did --local with
    --scheduler. Refused before anything starts, nothing written."""
    path, _ = npy
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x > 0.5", *args, code=2)
    assert message in res.output and not out.exists()


class _InterruptedFinalizer:
    """Runs the handler of ``signum`` in its ``__del__``, where Python drops what it raises."""

    ran: list[int] = []  # the signals whose handler a finalizer ran

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        self.ran.append(self.signum)
        signal.getsignal(self.signum)(self.signum, None)


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_an_interrupt_lost_in_a_finalizer_still_stops_the_job(npy, tmp_path, monkeypatch, sig,
                                                               code, word):
    """A probe's Ctrl-C landed in a pooled buffer's ``__del__`` (2 in ~120 runs): Python
    printed "Exception ignored in" and dropped the KeyboardInterrupt, and the job committed,
    exit 0. Here the handler runs in a finalizer in the main thread as the stream starts."""
    import sys

    path, _ = npy
    out = tmp_path / "out.zarr"
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_value))
    _lose_an_interrupt_in_a_finalizer(monkeypatch, sig)
    res = run(path, out, "--where", "x > 0.5", "--local", "threads", "--chunks", "5000",
              code=code)
    # the handler ran in the finalizer, whose exception Python dropped; the command's hook
    # does not pass its own interrupt on (see the next test)
    assert _InterruptedFinalizer.ran[-1:] == [sig] and dropped == []
    assert f"dask compact: {word};" in res.output and "was not written" in res.output
    assert not out.exists() and litter(tmp_path) == []


def _lose_an_interrupt_in_a_finalizer(monkeypatch, sig) -> list[bool]:
    """As the stream admits its first piece, the signal handler runs in a finalizer in the
    main thread (an :class:`_InterruptedFinalizer` made garbage at once); the list returned
    holds True once it has."""
    from dask_compact.batch import stream

    admit = stream._Stream.admit
    done: list[bool] = []

    def admit_after_a_lost_interrupt(self):
        if not done:
            done.append(True)
            _InterruptedFinalizer(sig)  # garbage at once: __del__ runs here
        admit(self)

    monkeypatch.setattr(stream._Stream, "admit", admit_after_a_lost_interrupt)
    return done


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated")])
def test_an_interrupt_in_a_finalizer_prints_no_traceback(npy, tmp_path, monkeypatch, sig,
                                                         code, word):
    """The interrupt lost in a finalizer is recorded and raised again (above), but Python
    still printed what the handler raised there ("Exception ignored in", a traceback ending
    in ``raise_if_interrupted``) above the command's one line: a new-user probe's Ctrl-C of
    one of two jobs on one cluster (2026-12-01). The command's own interrupt is not printed
    again; any other exception a finalizer drops still is."""
    import sys

    path, _ = npy
    out = tmp_path / "out.zarr"
    # Python's own hook (pytest's turns what it gets into a warning): it prints on stderr
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    done = _lose_an_interrupt_in_a_finalizer(monkeypatch, sig)
    res = run(path, out, "--where", "x > 0.5", "--local", "threads", "--chunks", "5000",
              code=code)
    assert done and "Exception ignored" not in res.output, res.output
    assert [line for line in res.output.splitlines() if line.strip()] == [
        f"dask compact: {word}; {out} was not written"], res.output


def test_the_command_passes_on_what_other_finalizers_drop(monkeypatch):
    """Only the handler's own interrupt is kept off stderr: another finalizer's exception,
    a KeyboardInterrupt of its own included, reaches the hook that was in place."""
    import sys

    from dask_compact.batch import signals

    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    class Raises:
        def __init__(self, exc: BaseException) -> None:
            self.exc = exc

        def __del__(self) -> None:
            raise self.exc

    with signals.terminate_as_exit():
        Raises(ValueError("x"))
        Raises(KeyboardInterrupt())
    assert [type(e) for e in seen] == [ValueError, KeyboardInterrupt]


def test_an_interrupt_lost_after_the_stream_stops_the_commit(npy, tmp_path, monkeypatch):
    """Lost after the stream's loop (here as the arrays are cut to the selection): the
    commit refuses, exit 130, nothing written."""
    import sys

    from dask_compact.batch import job

    path, _ = npy
    out = tmp_path / "out.zarr"
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    cut = job.cut

    def cut_after_a_lost_interrupt(*args):
        _InterruptedFinalizer(signal.SIGINT)
        cut(*args)

    monkeypatch.setattr(job, "cut", cut_after_a_lost_interrupt)
    res = run(path, out, "--where", "x > 0.5", "--local", "threads", code=130)
    assert "dask compact: interrupted;" in res.output
    assert not out.exists() and litter(tmp_path) == []
    monkeypatch.setattr(job, "cut", cut)
    run(path, out, "--where", "x > 0.5", "--local", "threads")  # the next command commits


@pytest.mark.parametrize("kind", ["array", "group"])
def test_an_interrupt_as_the_temporary_group_is_made_leaves_nothing(tmp_path, monkeypatch,
                                                                    kind):
    """A probe's Ctrl-C as ``.OUTPUT.dask-compact-tmp-...`` appeared left that group (its
    metadata only) while the command said "was not written", exit 130: zarr writes on an IO
    thread of its own, which the interrupt does not stop, and the group's ``zarr.json``
    landed after the removal. Here the interrupt comes as that first file is written, which
    then takes 0.5 s: the command must wait for it, then remove the group."""
    import asyncio
    import threading

    from zarr.storage import LocalStore

    if kind == "array":
        a = np.random.default_rng(12).random(5_001)
        src = tmp_path / "in.npy"
        np.save(src, a)
        where, want = "x > 0.5", {"values": a[a > 0.5]}
    else:
        data = _particles(tmp_path / "in.zarr")
        src, where = tmp_path / "in.zarr", "mass > 5"
        want = {name: v[data["mass"] > 5] for name, v in data.items()}
    out = tmp_path / "out.zarr"
    main, fired = threading.main_thread().ident, []
    real_set = LocalStore.set

    async def set_interrupted(self, key, value):
        if output.TMP_MARK in str(self.root) and not fired:
            fired.append(key)
            signal.pthread_kill(main, signal.SIGINT)  # as the terminal's Ctrl-C
            await asyncio.sleep(0.5)
        return await real_set(self, key, value)

    monkeypatch.setattr(LocalStore, "set", set_interrupted)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        res = run(src, out, "--where", where, "--local", "threads", code=130)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert fired == ["zarr.json"]
    assert "interrupted; " in res.output and "was not written" in res.output
    time.sleep(1.0)  # a write the command left running would land meanwhile
    assert not out.exists() and litter(tmp_path) == []
    monkeypatch.setattr(LocalStore, "set", real_set)
    run(src, out, "--where", where, "--local", "threads")
    got = zarr.open_group(store=str(out), mode="r")
    for name, v in want.items():
        np.testing.assert_array_equal(got[name][:], v)


# -- OUTPUT on a file system the workers share ---------------------------------------------------
# A new-user probe ran the CLI against workers in their own mount namespaces (each with its own
# disk at OUTPUT's folder, as on other machines): a field with trailing axes went to their disks
# and the job said "complete" with an output of zeros, exit 0. Here the workers' view is faked
# in the worker processes of a LocalCluster: paths under OUTPUT's folder lead them to another
# folder (``elsewhere``), as another file system mounted at that path would.

_SAVED: dict = {}


def _see_elsewhere(real: str, elsewhere: str, up_front: bool) -> None:
    """On a worker: OUTPUT's folder ``real`` is ``elsewhere`` for its chunk writes and, where
    ``up_front``, for the job's check before it starts too (else the worker loses the file
    system after that check, during the job)."""
    import importlib

    from dask_compact.batch import tasks

    def moved(path: str) -> str:
        return elsewhere + path[len(real):] if path.startswith(real) else path

    write = _SAVED.setdefault((tasks, "write_chunk_file"), tasks.write_chunk_file)
    tasks.write_chunk_file = lambda array_dir, *args: write(moved(array_dir), *args)
    if not up_front:
        return
    try:
        shared = importlib.import_module("dask_compact.batch.shared")
    except ImportError:  # before the check existed
        return
    name = "sees_and_writes" if hasattr(shared, "sees_and_writes") else "sees_token"
    sees = _SAVED.setdefault((shared, name), getattr(shared, name))
    setattr(shared, name, lambda path, token: sees(moved(path), token))


def _read_only_for_workers(folder: str) -> None:
    """On a worker: ``folder`` as on a read-only mount, whoever the worker runs as (root
    writes through permissions, so a chmod would not stop it): its opens for writing and its
    mkdirs there fail with EROFS."""
    import builtins
    import errno

    def refused(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    def under(path) -> bool:
        path = path if isinstance(path, str) else getattr(path, "__fspath__", lambda: "")()
        return isinstance(path, str) and (path == folder or path.startswith(folder + os.sep))

    real_open = _SAVED.setdefault((builtins, "open"), builtins.open)
    real_os_open = _SAVED.setdefault((os, "open"), os.open)
    real_mkdir = _SAVED.setdefault((os, "mkdir"), os.mkdir)

    def open_(file, mode="r", *args, **kwargs):
        if under(file) and any(c in mode for c in "wax+"):
            refused(file)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if under(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            refused(path)
        return real_os_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        if under(path):
            refused(path)
        return real_mkdir(path, *args, **kwargs)

    builtins.open, os.open, os.mkdir = open_, os_open, mkdir


def _see_output_again() -> None:
    for (module, name), fn in _SAVED.items():
        setattr(module, name, fn)
    _SAVED.clear()


def _particles(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    data = {"mass": rng.random(10_000) * 10, "pos": rng.random((10_000, 3))}
    g = zarr.open_group(store=str(path), mode="w")
    for name, v in data.items():
        g.create_array(name, data=v, chunks=(2_500, *v.shape[1:]))
    return data


def test_chunks_missing_from_the_temporary_output_fail_the_commit(tmp_path, monkeypatch):
    """Where writes returned but their chunks are not in the temporary output as this
    machine sees it (here: written nowhere), the job fails before the commit, exit 1,
    nothing left (it said "complete" with chunks that read as zeros)."""
    from dask_compact.batch import tasks

    data = _particles(tmp_path / "in.zarr")
    out = tmp_path / "sel.zarr"
    lost = tasks.write_chunk_file

    def lose_chunk_1(array_dir, j, data, *args):
        if j != 1:
            return lost(array_dir, j, data, *args)
        return "/".join(["c", "1", *["0"] * (data.ndim - 1)]), [0, 0]  # as if written

    monkeypatch.setattr(tasks, "write_chunk_file", lose_chunk_1)
    res = run(tmp_path / "in.zarr", out, "--where", "mass > 5", "--fields", "pos,mass",
              "--local", "threads", code=1)
    assert "output chunks this job wrote are not in its temporary output" in res.output
    assert re.search(r"'pos': 1 of 3 \(c/1/0\); 'mass': 1 of 3 \(c/1\)\)", res.output)
    assert not out.exists() and litter(tmp_path) == []
    monkeypatch.setattr(tasks, "write_chunk_file", lost)
    run(tmp_path / "in.zarr", out, "--where", "mass > 5", "--fields", "pos,mass",
        "--local", "threads")
    got = zarr.open_group(store=str(out), mode="r")
    for name in ("pos", "mass"):
        np.testing.assert_array_equal(got[name][:], data[name][data["mass"] > 5])


def test_check_chunks_written_lists_the_missing_chunk_files(tmp_path):
    """One listing a folder of chunk files: 1-D arrays' ``c``, a chunk's own folder with
    trailing axes; only the chunks the rows fill are looked for."""
    import click

    from dask_compact.batch import shared, tasks

    store = str(tmp_path / "g.zarr")
    g = zarr.open_group(store=store, mode="w")
    g.create_array("v", shape=(100,), dtype="f8", chunks=(10,))
    g.create_array("p", shape=(100, 2), dtype="f8", chunks=(10, 2))
    for name, tail in (("v", ()), ("p", (2,))):
        os.makedirs(os.path.join(store, name, "c"))
        for j in range(3):
            tasks.write_chunk_file(os.path.join(store, name), j, np.ones((10, *tail)), 10)
    shared.check_chunks_written(store, ["v", "p"], 30, 10, "o")
    shared.check_chunks_written(store, ["v", "p"], 0, 10, "o")
    with pytest.raises(click.ClickException, match=r"'v': 1 of 4 \(c/3\); 'p': 1 of 4 \(c/3/0\)"):
        shared.check_chunks_written(store, ["v", "p"], 31, 10, "o")
    os.remove(os.path.join(store, "p", "c", "1", "0"))
    with pytest.raises(click.ClickException, match=r"'p': 1 of 3 \(c/1/0\)"):
        shared.check_chunks_written(store, ["v", "p"], 30, 10, "o")
    g["v"][:30] = 2.0  # zarr reads the files as written
    np.testing.assert_array_equal(zarr.open_array(store=store, path="v")[:30], 2.0)


def test_a_write_never_makes_the_output_folders(tmp_path):
    """A chunk write makes only the chunk's folders below the array's ``c`` (its client made
    that one): where the array's folder is not there, it fails naming this process and the
    folder, and nothing is made (zarr's writes, which make their folders, are checked too)."""
    from dask_compact.batch import shared, tasks

    missing = tmp_path / "tmp-group" / "p"
    for ndim in (1, 2):
        with pytest.raises(shared.OutputNotShared, match="this process .* does not see the "
                           "folder .*tmp-group/p/c of the temporary output"):
            tasks.write_chunk_file(str(missing), 0, np.ones((4,) * ndim), 4)
    dest = tasks.OutputArrays(str(tmp_path / "tmp-group"), ("values",), 4, direct=False)
    piece = tasks.Piece(np.ones(4), None, 4)
    with pytest.raises(shared.OutputNotShared, match="does not see the folder .*group/values "):
        tasks.write_chunk(dest, 0, [0], [4], piece)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("form", ["folder", "file"])  # now, and before the workers wrote
def test_a_check_folder_left_by_a_killed_job_is_removed_by_the_next(npy, tmp_path, form):
    path, a = npy
    out = tmp_path / "out.zarr"
    left = tmp_path / f".out.zarr{output.TMP_MARK}0123456789ab.shared-check"
    if form == "folder":
        left.mkdir()
        (left / "token").write_text("token")
        (left / "host-123-0123abcd").write_text("token")  # a worker's, killed too
    else:
        left.write_text("token")
    res = run(path, out, "--where", "x > 0.5", "--local", "threads")
    assert "the workers' check folder of an interrupted job" in res.output
    assert not left.exists() and litter(tmp_path) == []
    np.testing.assert_array_equal(values(out), a[a > 0.5])


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes and a client that is no test's default scheduler: the tests
    reach the cluster by its address (``--scheduler``: the CLI makes a client of its own)
    and by ``cluster.run``. (Until 2026-12-01 it was the default from its first test to the
    module's end, so it came last in the file; three tests were added after it since.)"""
    from conftest import local_process_cluster

    with local_process_cluster(2, set_as_default=False) as client:
        yield client


def _job_on(cluster, tmp_path: Path, field: str, up_front: bool, code: int):
    """The group job ``--fields field`` on ``cluster`` whose workers write elsewhere; (its
    result, OUTPUT, what landed elsewhere, the input's arrays)."""
    data_dir, out_dir, elsewhere = (tmp_path / d for d in ("data", "out", "elsewhere"))
    for d in (data_dir, out_dir, elsewhere):
        d.mkdir(exist_ok=True)
    data = _particles(data_dir / "in.zarr")
    out = out_dir / "sel.zarr"
    cluster.run(_see_elsewhere, str(out_dir), str(elsewhere), up_front)
    try:
        res = run(data_dir / "in.zarr", out, "--where", "mass > 5", "--fields", field,
                  "--scheduler", cluster.scheduler.address, code=code)
    finally:
        cluster.run(_see_output_again)
    return res, out, sorted(str(p.relative_to(elsewhere)) for p in elsewhere.rglob("*")), data


@pytest.mark.parametrize("field", ["pos", "mass"])
def test_an_output_the_workers_do_not_see_is_refused_before_the_job(cluster, tmp_path, field):
    """Every worker must read a token this machine wrote beside the temporary output: the
    workers that do not are named, exit 2, nothing written there or elsewhere."""
    res, out, landed, _ = _job_on(cluster, tmp_path, field, True, code=2)
    assert "OUTPUT must be on a file system every worker shares with this machine" in res.output
    assert "2 of the cluster's 2 workers do not see the file" in res.output
    for addr in cluster.scheduler_info()["workers"]:
        assert addr in res.output
    assert not out.exists() and litter(out.parent) == [] and landed == []


@pytest.mark.parametrize("field", ["pos", "mass"])
def test_a_worker_that_loses_output_during_the_job_fails_it(cluster, tmp_path, field):
    """A worker that sees OUTPUT at the start and not when it writes (a mount lost) never makes
    OUTPUT's folders on its own disk: the job fails naming it and the folder, nothing
    committed, nothing written elsewhere; with every worker seeing OUTPUT the same job is
    exact."""
    res, out, landed, data = _job_on(cluster, tmp_path, field, False, code=1)
    assert "does not see the folder" in res.output
    assert "OUTPUT must be on a file system" in res.output
    assert re.search(r"worker \S+ \(tcp://", res.output), res.output
    assert not out.exists() and litter(out.parent) == [] and landed == []
    run(tmp_path / "data" / "in.zarr", out, "--where", "mass > 5", "--fields", field,
        "--scheduler", cluster.scheduler.address)
    got = zarr.open_group(store=str(out), mode="r")[field][:]
    np.testing.assert_array_equal(got, data[field][data["mass"] > 5])


@pytest.mark.parametrize("field", ["pos", "mass"])
def test_an_output_the_workers_cannot_write_is_refused_before_the_job(cluster, tmp_path, field):
    """Workers that see OUTPUT's folder but cannot write in it (a read-only mount, another
    user's folder) passed the check and failed the job at their first write, exit 1: each
    worker now writes a file in a folder that this machine made beside the temporary output,
    and the job is refused up front, exit 2, the workers named, nothing made at OUTPUT."""
    data = _particles(tmp_path / "in.zarr")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "sel.zarr"
    args = (tmp_path / "in.zarr", out, "--where", "mass > 5", "--fields", field,
            "--scheduler", cluster.scheduler.address)
    cluster.run(_read_only_for_workers, str(out_dir))
    try:
        res = run(*args, code=2)
    finally:
        cluster.run(_see_output_again)
    said = " ".join(res.output.split())
    assert "OUTPUT's folder must be writable by every worker" in said
    assert "2 of the cluster's 2 workers cannot write in the folder" in said
    assert "Read-only file system" in said and "Nothing was started or written" in said
    assert "do not see" not in said
    for addr in cluster.scheduler_info()["workers"]:
        assert addr in said
    assert list(out_dir.iterdir()) == []
    run(*args)
    got = zarr.open_group(store=str(out), mode="r")[field][:]
    np.testing.assert_array_equal(got, data[field][data["mass"] > 5])


@pytest.mark.parametrize("kind", ["array", "group", "npy"])
def test_an_input_the_workers_see_otherwise_is_refused_before_the_job(tmp_path, kind):
    """A ``--scheduler`` worker with its own disk at INPUT's folder (another store of the same
    shape and dtype there, as node-local scratch is): until 2026-12-01 (fifteenth session, a
    probe) the job compacted the worker's store and committed it as INPUT's selection, exit
    0. Now every worker must see the files this process sees at INPUT (paths, sizes,
    modification times), else exit 2 naming them, nothing written. A real ``dask worker``
    under ``unshare -m`` with a bind mount over INPUT's folder; skipped where that is not
    allowed."""
    from cluster_helpers import worker_named
    from distributed import Client, LocalCluster

    data, disk = _bindable(tmp_path, "data", "workerdisk")
    rng = np.random.default_rng(12)
    a, b = rng.random(20_003), rng.random(20_003)
    for folder, v in ((data, a), (disk, b)):
        if kind == "npy":
            np.save(folder / "in.npy", v)
        elif kind == "group":
            zarr.open_group(str(folder / "in.zarr"), mode="w").create_array(
                "x", data=v, chunks=(5_000,))
        else:
            zarr.create_array(store=str(folder / "in.zarr"), data=v, chunks=(5_000,))
    inp = data / ("in.npy" if kind == "npy" else "in.zarr")
    out = tmp_path / "out.zarr"
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", "--name", "elsewhere",
              "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0"]
    with LocalCluster(n_workers=0, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        script = (f"mount --bind {disk} {data} && "
                  f"exec {' '.join(worker)} {cluster.scheduler_address}")
        proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=tmp_path,
                                start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            worker_named(client, "elsewhere")
            res = run(inp, out, "-w", "x < 0.3", "--scheduler", cluster.scheduler_address,
                      "--device", "cpu", code=2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = " ".join(res.output.split())
    assert "Invalid value for INPUT" in said and "'elsewhere'" in said, said
    assert not out.exists() and litter(tmp_path) == []


class _Workers:
    """A stand-in for a distributed Client whose one worker sees INPUT's files through a
    stale NFS attribute cache: ``stale`` (by path) the sizes and times of an earlier look,
    as ``os.stat`` and ``reader.walk_files`` give them there; opening a file gets its own.
    ``seen``: where the worker looks instead of INPUT's path (another store), if given."""

    def __init__(self, monkeypatch, stale: dict[str, os.stat_result],
                 seen: str | None = None) -> None:
        self.monkeypatch, self.stale, self.seen = monkeypatch, stale, seen

    def run(self, fn, *args, workers=None):
        from dask_compact.batch import reader

        real_walk, real_stat = reader.walk_files, os.stat

        def walk(root):
            for rel, st in real_walk(root):
                yield rel, self.stale.get(os.path.join(root, rel), st)

        with self.monkeypatch.context() as m:
            m.setattr(reader, "walk_files", walk)
            m.setattr(os, "stat", lambda p, *a, **k: self.stale.get(p) or real_stat(p, *a, **k))
            return {"tcp://w:1": fn(*((self.seen,) + args[1:] if self.seen else args))}

    def scheduler_info(self):
        return {"workers": {"tcp://w:1": {"name": "nfs"}}}


@pytest.mark.parametrize("kind", ["array", "npy"])
def test_the_workers_input_check_looks_past_a_stale_attribute_cache(tmp_path, monkeypatch,
                                                                     kind):
    """A worker whose NFS client still holds the sizes and times of INPUT's files from before
    they were written again on this machine (``actimeo``, 3-60 s): until 2026-12-02
    (sixteenth session, the fifteenth session's probe) the check refused the job, exit 2,
    though the worker's reads (opening a file revalidates it) see INPUT. A worker that
    differs now looks again opening each file; it is refused only where what it then sees
    still differs (another store at that path: refused as before)."""
    import click

    from dask_compact.batch import shared

    rng = np.random.default_rng(14)

    def write(at: Path, n: int) -> list[Path]:
        if kind == "npy":
            np.save(at, rng.random(n))
            return [at]
        zarr.create_array(store=str(at), data=rng.random(n), chunks=(1_000,), overwrite=True)
        return [p for p in at.rglob("*") if p.is_file()]

    inp = tmp_path / ("in.npy" if kind == "npy" else "in.zarr")
    listed = {str(p): os.stat(p) for p in write(inp, 5_003)}
    time.sleep(0.01)
    write(inp, 5_007)  # the same names, other sizes, bytes and times
    before = _digest(inp)
    shared.check_workers_read(_Workers(monkeypatch, listed), str(inp))  # not refused
    other = tmp_path / "other" / inp.name
    other.parent.mkdir()
    write(other, 5_007)
    with pytest.raises(click.BadParameter, match="1 of the cluster's 1 workers see other"):
        shared.check_workers_read(_Workers(monkeypatch, {}, str(other)), str(inp))
    assert _digest(inp) == before


def test_a_refused_resume_keeps_the_interrupted_job(cluster, tmp_path):
    """The check comes before the job touches its temporary group: a ``--resume`` refused
    for workers that do not see OUTPUT leaves the interrupted job's group for a ``--resume``
    once they do, which completes it exactly."""
    from cli_helpers import kill_halfway

    data = _particles(tmp_path / "in.zarr")
    out_dir, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out_dir.mkdir()
    elsewhere.mkdir()
    out = out_dir / "sel.zarr"
    args = ("--where", "mass > 5", "--fields", "pos", "--chunks", "1000")
    kill_halfway(tmp_path, tmp_path / "in.zarr", out, *args, "--local", "threads", writes=2)
    left = [n for n in litter(out_dir) if output.TMP_MARK in n]  # and the dead job's lock
    assert len(left) == 1
    cluster.run(_see_elsewhere, str(out_dir), str(elsewhere), True)
    try:
        res = run(tmp_path / "in.zarr", out, *args, "--resume", "--scheduler",
                  cluster.scheduler.address, code=2)
    finally:
        cluster.run(_see_output_again)
    assert "OUTPUT must be on a file system every worker shares" in res.output
    assert [n for n in litter(out_dir) if output.TMP_MARK in n] == left and not out.exists()
    res = run(tmp_path / "in.zarr", out, *args, "--resume", "--scheduler",
              cluster.scheduler.address, "--json")
    assert json.loads(res.stdout)["resumed_from_chunk"] > 0
    got = zarr.open_group(store=str(out), mode="r")["pos"][:]
    np.testing.assert_array_equal(got, data["pos"][data["mass"] > 5])
    assert litter(out_dir) == []


def test_a_cached_input_under_the_home_folder_is_read_at_its_path(monkeypatch, tmp_path):
    """``simplecache::~/in.zarr`` and ``simplecache::file://~/in.zarr``: fsspec reads ~ as
    the home folder, and no shell expands it after "::"; the path read was ``./~/in.zarr``
    (exit 2, "does not exist"; a regression probe), where the URL had worked before."""
    from dask_compact.batch.inputs import cached_local_path

    monkeypatch.setenv("HOME", str(tmp_path))
    for url in ("simplecache::~/in.zarr", "simplecache::file://~/in.zarr",
                "filecache::local://~/in.zarr"):
        assert cached_local_path(url) == str(tmp_path / "in.zarr"), url


def test_the_cache_helpers_of_input_and_output_are_one_public_module(tmp_path):
    """.inputs and .output imported each other's private cache helpers (output._resolved,
    inputs._chained_base), each from inside a function to dodge the import cycle: they are
    batch.caches' public functions now, and neither side imports a private name of the
    other. The caches are looked through as before: simplecache:: and a chain of two name
    the local path, so INPUT and OUTPUT compare on one file system."""
    import ast
    import inspect

    from fsspec.implementations.local import LocalFileSystem

    from dask_compact.batch import inputs

    for module, other in ((inputs, "output"), (output, "inputs")):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == other:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{module.__name__} imports {private} from .{other}"
    from dask_compact.batch import caches

    store = tmp_path / "in.zarr"
    for url in (f"simplecache::file://{store}", f"filecache::simplecache::{store}"):
        fs, path = caches.resolved(url)
        assert isinstance(fs, LocalFileSystem) and path == str(store)
        assert output._place(None, url) == ("file", os.path.realpath(store))
    assert inputs.uncached(str(store)) == str(store)  # no cache: the URL itself


@pytest.mark.parametrize("error", [concurrent.futures.CancelledError, RuntimeError, OSError])
def test_discard_removes_the_temporary_output_when_the_wait_for_io_fails(
        tmp_path, monkeypatch, caplog, error):
    """Target.discard waits for the IO threads' writes (settle_io) before it removes the
    temporary output; a CancelledError there (an IO loop shutting down), or any error, had
    skipped the removal and hidden the job's own error (a review): now logged, the removal
    done, nothing raised."""
    target = output.Target(str(tmp_path / "out.zarr"))
    target.prepare()
    os.makedirs(os.path.join(target.tmp_path, "a"))
    with open(os.path.join(target.tmp_path, "zarr.json"), "w") as f:
        f.write("{}")

    def failing(*args, **kwargs):
        raise error("the IO loop is shutting down")

    monkeypatch.setattr(output, "settle_io", failing)
    with caplog.at_level("WARNING"):
        target.discard()
    assert not os.path.exists(target.tmp_path)
    assert error.__name__ in caplog.text and "removing it now" in caplog.text


def test_the_command_exits_without_zarrs_traceback_when_its_io_thread_is_slow(tmp_path):
    """zarr's exit handler waits 0.2 s for its IO thread, then closes the loop: a thread held
    up then (a callback running, a loaded machine) printed "RuntimeError: Cannot close a
    running event loop" with a traceback after the command's last line (a README probe, once
    on a busy 2-core machine). The command registers output.end_zarr_io_at_exit, which waits
    for the thread first. Here a refused INPUT under dask's CLI (whose error exit is the
    interpreter's: the dask-compact script's ends with os._exit), and a callback of 0.6 s on
    zarr's loop as the command ends."""
    z = zarr.create_array(str(tmp_path / "in.zarr"), shape=(10,), chunks=(5,), dtype="f8")
    z[:5] = np.random.default_rng(1).random(5)  # the second chunk never written: refused
    code = (
        "import sys, time\n"
        "from dask.cli import run_cli\n"
        "sys.argv = ['dask', 'compact', sys.argv[1], sys.argv[2], '--where', 'x > 0.5']\n"
        "try:\n"
        "    run_cli()\n"
        "finally:\n"
        "    from zarr.core.sync import loop\n"
        "    loop[0].call_soon_threadsafe(time.sleep, 0.6)\n"
        "    time.sleep(0.05)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.zarr"),
                           str(tmp_path / "out.zarr")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "chunks are not in the store" in proc.stderr
    assert "Traceback" not in proc.stderr and "event loop" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out.zarr").exists()


def test_the_module_cluster_serves_only_the_tests_that_ask_for_it():
    """After the cluster tests in the file's order, no distributed client is the default
    and a computation runs in this process (conftest.client_as_default). The cluster's tests
    reach it by its address and ``cluster.run``: it need not be the default anywhere. Until
    2026-12-01 it was, from its first test to the module's end (the three tests after them
    compute nothing with dask: none was seen to depend on it)."""
    from conftest import assert_no_client_is_the_default

    assert_no_client_is_the_default()
