"""The streaming batch job under faults: a job SIGKILLed halfway and resumed, a corrupted input
chunk, a worker killed mid-job, and an input four times larger than the workers' memory.

Kills use real subprocesses (tests/cli_driver.py pauses the job at the moment under test);
the rest runs in-process through click's runner, on the threaded scheduler or a real
distributed LocalCluster of worker processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from cli_helpers import kill_halfway, litter, run, start, wait_for

from dask_compact.batch.manifest import Manifest


def group(path: Path) -> tuple[dict, dict]:
    g = zarr.open_group(store=str(path), mode="r")
    return dict(g.attrs), {name: a[:] for name, a in g.arrays()}


@pytest.fixture
def zin(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a = np.random.default_rng(23).random(200_000).astype(np.float32)
    path = tmp_path / "in.zarr"
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(5000,))
    z[:] = a
    return path, a


@pytest.fixture(scope="module")
def killed_at_six(tmp_path_factory) -> tuple[Path, np.ndarray, list[str], Path, Path]:
    """A job over a Zarr input (:func:`zin`'s data) SIGKILLed once 6 output chunks were written
    (:func:`cli_helpers.kill_halfway`), made once for the tests that change what it left and
    resume it: the input, the job's arguments, the folder holding what the kill left beside
    OUTPUT (its temporary group and lock: each test copies them beside an OUTPUT of its
    own), and the uninterrupted job's output. What the kill leaves is files (the lock is an
    flock, released by the kill; the group's name is random, found beside OUTPUT by its
    prefix), so a copy is that state exactly. A killed job each (14 tests) was a subprocess
    apiece (2026-12-01 (fourteenth session), CI time). The input is the same files for all:
    a job's identity holds its input's inodes."""
    folder = tmp_path_factory.mktemp("killed-at-six")
    a = np.random.default_rng(23).random(200_000).astype(np.float32)
    path = folder / "in.zarr"
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(5000,))
    z[:] = a
    args = ["--where", "x < 0.5", "--output", "both", "--output-chunks", "3000"]
    left = folder / "left"
    left.mkdir()
    kill_halfway(folder, path, left / "out.zarr", *args, writes=6)
    ref = folder / "ref.zarr"
    run(path, ref, *args)
    return path, a, args, left, ref


def _killed_copy(killed: tuple, tmp_path: Path) -> Path:
    """What :func:`killed_at_six`'s kill left, copied beside ``tmp_path / "out.zarr"``."""
    shutil.copytree(killed[3], tmp_path, dirs_exist_ok=True)
    return tmp_path / "out.zarr"


@pytest.mark.parametrize("where_run", [[], ["--local", "processes", "--workers", "2"]],
                         ids=["threads", "local-cluster"])
def test_resume_after_sigkill_is_bit_identical(zin, tmp_path, where_run):
    path, a = zin
    args = ["--where", "x < 0.5", "--output", "both", "--output-chunks", "3000", *where_run]
    ref = tmp_path / "ref.zarr"
    full = json.loads(run(path, ref, *args, "--json").stdout)
    out = tmp_path / "out.zarr"
    n_out = -(-full["selected"] // 3000)
    kill_halfway(tmp_path, path, out, *args, writes=n_out // 2)
    assert [n for n in litter(tmp_path) if "tmp" in n]  # the interrupted job's group

    res = run(path, out, *args, "--resume", "--json")
    resumed = json.loads(res.stdout)
    assert resumed["resumed_from_chunk"] > 0
    # it recomputed about the half that was not written, not the whole input
    assert resumed["chunks_read"] <= 0.7 * full["chunks_read"], (resumed, full)
    ref_attrs, ref_arrays = group(ref)
    attrs, arrays = group(out)
    assert attrs == ref_attrs
    assert arrays.keys() == ref_arrays.keys()
    for k in arrays:
        assert arrays[k].dtype == ref_arrays[k].dtype
        np.testing.assert_array_equal(arrays[k], ref_arrays[k])
    np.testing.assert_array_equal(arrays["values"], a[a < 0.5])
    assert sorted(os.listdir(out)) == ["indices", "values", "zarr.json"]  # no manifest left
    assert litter(tmp_path) == []


def test_resume_and_the_clean_up_find_what_a_job_on_a_long_name_left(zin, tmp_path):
    """An OUTPUT whose name is too long for the job's hidden names to take it whole (250
    bytes; see output.hidden_name): a killed job's temporary output is continued by
    ``--resume`` and removed by a plain run, as for any OUTPUT, and one left by an earlier
    version under OUTPUT's whole name (a name of 220 bytes) is removed too. Two OUTPUTs whose
    names share their first 240 bytes keep apart. INPUT unchanged."""
    from test_cli_safety import _digest

    path, a = zin
    before = _digest(path)
    args = ["--where", "x < 0.5", "--output-chunks", "3000"]
    out = tmp_path / ("o" * 245 + ".zarr")
    kill_halfway(tmp_path, path, out, *args, writes=4)
    left = [n for n in litter(tmp_path) if "tmp" in n]
    assert len(left) == 1 and len(left[0]) <= 255
    resumed = json.loads(run(path, out, *args, "--resume", "--json").stdout)
    assert resumed["resumed_from_chunk"] > 0
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
    assert litter(tmp_path) == []
    shutil.rmtree(out)
    kill_halfway(tmp_path, path, out, *args, writes=4)
    res = run(path, out, *args)
    assert "--resume would have continued it" in res.output
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
    assert litter(tmp_path) == []
    older = tmp_path / ("p" * 215 + ".zarr")
    earlier = tmp_path / f".{older.name}.dask-compact-tmp-0123456789ab"
    earlier.mkdir()
    (earlier / "zarr.json").write_text("{}")
    run(path, older, *args)
    assert not earlier.exists() and litter(tmp_path) == []
    twin = tmp_path / ("o" * 245 + ".zar2")
    run(path, twin, "--where", "x > 0.9", "--output-chunks", "3000")
    np.testing.assert_array_equal(group(twin)[1]["values"], a[a > 0.9])
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
    assert litter(tmp_path) == [] and _digest(path) == before


def _damage(group: Path, how: str) -> None:
    """Change a killed job's temporary group as a user's hand or a disk might."""
    chunk = group / "values" / "c" / "1"  # written, and in the manifest
    data = chunk.read_bytes()
    if how == "truncated":
        chunk.write_bytes(data[: len(data) // 2])
    elif how == "same-size":  # other values in valid zstd of the same size
        import struct

        from numcodecs import Zstd

        values = np.frombuffer(Zstd().decode(data), np.float32).copy()
        values[::7] = 0.125
        other = bytes(Zstd(level=0).encode(values))
        pad = len(data) - len(other) - 8  # filled up by a skippable frame (RFC 8878, 3.1.2)
        assert pad >= 0
        chunk.write_bytes(other + struct.pack("<II", 0x184D2A50, pad) + bytes(pad))
        assert len(chunk.read_bytes()) == len(data)
    elif how == "removed":
        chunk.unlink()
    elif how == "attributes":
        meta = json.loads((group / "values" / "zarr.json").read_text())
        meta["attributes"] = {"units": "furlongs"}
        (group / "values" / "zarr.json").write_text(json.dumps(meta))
    elif how == "dtype":
        meta = json.loads((group / "indices" / "zarr.json").read_text())
        meta["data_type"] = "int32"
        (group / "indices" / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("how", ["truncated", "same-size", "removed", "attributes", "dtype"])
def test_resume_checks_the_files_the_manifest_lists(killed_at_six, tmp_path, how):
    """``--resume`` took the manifest's word: a chunk file of the temporary group truncated
    or rewritten (same size) after the kill was committed as it was, exit 0, and so was a
    group whose arrays' metadata had been edited (a probe; a removed chunk failed the job,
    exit 1). Now each chunk's size and CRC-32C, recorded by its writer, and those of the files
    the group was made with are checked: a chunk that differs is written again, a group whose
    metadata changed is started over, each said on stderr; the output is the uninterrupted
    job's, bit for bit."""
    path, a, args, _, ref = killed_at_six
    out = _killed_copy(killed_at_six, tmp_path)
    (left,) = [n for n in litter(tmp_path) if "tmp" in n]
    _damage(tmp_path / left, how)
    res = run(path, out, *args, "--resume", "--json")
    ref_attrs, ref_arrays = group(ref)
    attrs, arrays = group(out)
    assert {k: v for k, v in attrs["dask_compact"].items() if k != "input"} == {
        k: v for k, v in ref_attrs["dask_compact"].items() if k != "input"}
    for name in ("values", "indices"):
        assert (out / name / "zarr.json").read_text() == (ref / name / "zarr.json").read_text()
        assert sorted(os.listdir(out / name / "c")) == sorted(os.listdir(ref / name / "c"))
        for f in os.listdir(ref / name / "c"):
            assert (out / name / "c" / f).read_bytes() == (ref / name / "c" / f).read_bytes()
    np.testing.assert_array_equal(arrays["values"], a[a < 0.5])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a < 0.5))
    assert litter(tmp_path) == []
    said = " ".join(res.stderr.split())
    if how in ("attributes", "dtype"):
        assert "changed since the job was interrupted" in said and "starting over" in said
    else:
        assert "output chunk 1 of the interrupted job" in said and "written again" in said


def _edit_manifest(group: Path, how: str) -> None:
    """Change a killed job's resume manifest as a hand (or a disk) might."""
    path = group / "dask-compact-manifest.json"
    text = path.read_text()
    m = json.loads(text)
    if how == "json":
        path.write_text(text[: len(text) // 2])
        return
    # the input chunk before the one the job resumes from: its count places what follows
    first, _ = Manifest({}, m["counts"], set(m["written"])).resume_point(3000)
    assert 1 < first < len(m["counts"])
    if how == "count":
        m["counts"][first - 1] += 1
    elif how == "negative":
        m["counts"][first - 1] = -5
    elif how == "larger":  # than the chunk
        m["counts"][first - 1] = 10**6
    elif how == "unbalanced":  # the same sum, moved across the resume point
        m["counts"][first - 1] += 7
        m["counts"][first] -= 7
    elif how == "keys":
        del m["counts"]
    elif how == "unsigned":  # as an earlier build saved it
        del m["sum"]
    elif how.startswith("signed"):  # saved with a sum that matches (not a hand's doing)
        from dask_compact.batch import manifest

        signed = manifest.Manifest.from_json(text)
        signed.counts[first - 1] = -5 if how == "signed-negative" else 10**6
        manifest.save(str(group), signed)
        return
    path.write_text(json.dumps(m))


@pytest.mark.parametrize("how", ["count", "negative", "larger", "unbalanced", "json", "keys",
                                 "signed-negative", "signed-larger", "unsigned"])
def test_resume_does_not_trust_an_edited_manifest(killed_at_six, tmp_path, how):
    """``--resume`` took the manifest's counts (where the chunks after the resume point go) as
    they were: a count edited by one, or made negative, after the kill gave an output of
    wrong values marked complete, exit 0 (the twelfth session's probe). The manifest now
    carries a checksum of its own: one that does not match it (edited, cut short, keys
    missing) is not used, and one whose counts cannot be its chunks' is not either: the job
    starts over saying why, and the output is NumPy's. One without a checksum of its own (an
    earlier build's) has every chunk it lists written again."""
    path, a, args, _, _ = killed_at_six
    out = _killed_copy(killed_at_six, tmp_path)
    (left,) = [n for n in litter(tmp_path) if "tmp" in n]
    _edit_manifest(tmp_path / left, how)
    res = run(path, out, *args, "--resume", "--json")
    arrays = group(out)[1]
    np.testing.assert_array_equal(arrays["values"], a[a < 0.5])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a < 0.5))
    said = " ".join(res.stderr.split())
    if how == "unsigned":  # its group is kept, but nothing it lists is trusted
        assert "output chunks 0, 1, 2, 3, 4 and" in said and "written again" in said, said
    else:
        assert "the manifest of the interrupted job" in said and "starting over" in said, said
    assert litter(tmp_path) == []


@pytest.mark.parametrize("kind", ["array", "group"])
def test_a_job_killed_after_its_arrays_were_cut_is_continued(zin, tmp_path, kind):
    """A job killed between the arrays' cut to the selection's length (a metadata write) and
    the manifest's removal was started over by ``--resume``: its metadata was no longer what
    the group was made with. The arrays' length is now set back and the job continues: the
    manifest lists every chunk (saved at each write here), so nothing is read again, and the
    output is the uninterrupted job's, bit for bit."""
    path, a = zin
    if kind == "group":  # a field with a trailing axis, and a coordinate copied as it is
        path = tmp_path / "grp.zarr"
        g = zarr.open_group(store=str(path), mode="w")
        g.create_array("x", shape=a.shape, dtype=a.dtype, chunks=(5000,))[:] = a
        g.create_array("v", shape=(a.size, 3), dtype=np.int16, chunks=(5000, 3))[:] = (
            np.arange(a.size * 3, dtype=np.int16).reshape(-1, 3))
        g.create_array("t", shape=(7,), dtype=np.float64, chunks=(7,))[:] = np.arange(7.0)
    args = ["--where", "x < 0.5", "--output", "both", "--output-chunks", "3000"]
    ref = tmp_path / "ref.zarr"
    run(path, ref, *args)
    out = tmp_path / "out.zarr"
    ready = tmp_path / "ready"
    proc = start("pause-after-cut", ready, path, out, *args)
    wait_for(ready, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert not out.exists()
    res = run(path, out, *args, "--resume", "--json")
    said = " ".join(res.stderr.split())
    assert "set them back, continuing it" in said and "starting over" not in said, said
    assert json.loads(res.stdout)["chunks_read"] == 0
    ref_attrs, ref_arrays = group(ref)
    attrs, arrays = group(out)
    assert {k: v for k, v in attrs["dask_compact"].items() if k != "input"} == {
        k: v for k, v in ref_attrs["dask_compact"].items() if k != "input"}
    assert arrays.keys() == ref_arrays.keys()
    for name in arrays:
        assert (out / name / "zarr.json").read_text() == (ref / name / "zarr.json").read_text()
        np.testing.assert_array_equal(arrays[name], ref_arrays[name])
    np.testing.assert_array_equal(arrays["x" if kind == "group" else "values"], a[a < 0.5])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a < 0.5))
    assert "dask-compact-manifest.json" not in os.listdir(out)
    assert litter(tmp_path) == []


def test_resume_refuses_a_different_job_and_a_plain_run_starts_over(zin, tmp_path):
    path, a = zin
    out = tmp_path / "out.zarr"
    kill_halfway(tmp_path, path, out, "--where", "x < 0.5", "--output-chunks", "3000",
                  writes=5)
    res = run(path, out, "--where", "x < 0.25", "--output-chunks", "3000", "--resume", code=2)
    assert "differs in where" in res.output and "'x < 0.5' then" in res.output
    assert [n for n in litter(tmp_path) if "tmp" in n]  # left for a run without --resume
    res = run(path, out, "--where", "x < 0.25", "--output-chunks", "3000")
    assert "--resume would have continued it" in res.output
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.25])
    assert litter(tmp_path) == []
    # --resume with nothing to resume runs the job afresh and says so
    out2 = tmp_path / "out2.zarr"
    res = run(path, out2, "--where", "x < 0.25", "--resume")
    assert "no interrupted job" in res.output
    np.testing.assert_array_equal(group(out2)[1]["values"], a[a < 0.25])


def test_resume_refuses_an_input_whose_values_were_written_again(zin, tmp_path):
    """zarr rewrites chunk files, not its metadata, when values are written again: a job
    resumed over the new values would mix two selections. The input's identity covers its
    chunk files, so the resume is refused and a plain run gives the new values' selection."""
    path, a = zin
    out = tmp_path / "out.zarr"
    kill_halfway(tmp_path, path, out, "--where", "x < 0.5", "--output-chunks", "3000",
                  writes=5)
    b = np.random.default_rng(99).random(a.size).astype(np.float32)
    zarr.open_array(str(path), mode="r+")[:] = b  # same shape, dtype, chunks and metadata
    res = run(path, out, "--where", "x < 0.5", "--output-chunks", "3000", "--resume", code=2)
    assert "differs in input" in res.output
    run(path, out, "--where", "x < 0.5", "--output-chunks", "3000")
    np.testing.assert_array_equal(group(out)[1]["values"], b[b < 0.5])
    assert litter(tmp_path) == []


def _zipped(store: Path, archive: Path) -> None:
    """The Zarr store ``store`` as the zip file ``archive`` (written aside, then moved in)."""
    import zipfile

    aside = archive.with_suffix(".new")
    with zipfile.ZipFile(aside, "w") as zf:
        for f in sorted(p for p in store.rglob("*") if p.is_file()):
            zf.write(f, f.relative_to(store).as_posix())
    os.replace(aside, archive)


@pytest.mark.parametrize("kind", ["array", "group"])
def test_resume_refuses_a_zip_input_written_again(zin, tmp_path, kind):
    """A zip INPUT's identity was its metadata alone (a URL's): a new-user probe killed a job
    on ``zip://::/p/in.zip``, zipped other values under the same metadata over the file, and
    ``--resume`` committed an output mixing the two selections, exit 0. The archive file's
    device, inode, size and modification time are now part of the identity."""
    path, a = zin
    store = path
    if kind == "group":
        store = tmp_path / "grp.zarr"
        zarr.open_group(store=str(store), mode="w").create_array(
            "x", shape=a.shape, dtype=a.dtype, chunks=(5000,))[:] = a
    archive = tmp_path / "in.zip"
    _zipped(store, archive)
    out = tmp_path / "out.zarr"
    args = ["--where", "x < 0.5", "--output-chunks", "3000"]
    kill_halfway(tmp_path, f"zip://::{archive}", out, *args, writes=5)
    b = np.random.default_rng(99).random(a.size).astype(np.float32)
    (zarr.open_array(str(path), mode="r+") if kind == "array"
     else zarr.open_group(str(store), mode="r+")["x"])[:] = b  # same metadata
    _zipped(store, archive)
    res = run(f"zip://::{archive}", out, *args, "--resume", code=2)
    assert "differs in input" in res.output
    run(f"zip://::{archive}", out, *args)
    np.testing.assert_array_equal(group(out)[1]["values" if kind == "array" else "x"],
                                  b[b < 0.5])
    assert litter(tmp_path) == []


@pytest.mark.parametrize("kind", ["zarr", "npy", "npy-moved", "group", "zip"])
def test_input_changed_while_the_job_reads_it_is_not_committed(zin, tmp_path, monkeypatch,
                                                                kind):
    """A probe replaced chunk files of the input while the job ran: the output mixed old and
    new values and was marked complete, exit 0. The input's fingerprint is taken again before
    the commit, and a change refuses it. (In-process, threads: the change lands as the first
    output chunk is written, when at most a few input chunks have been read.)"""
    from dask_compact.batch import stream

    path, a = zin
    b = np.random.default_rng(5).random(a.size).astype(np.float32)
    if kind.startswith("npy"):
        path = tmp_path / "in.npy"
        np.save(path, a)
    elif kind == "group":
        path = tmp_path / "grp.zarr"
        g = zarr.open_group(store=str(path), mode="w")
        g.create_array("x", shape=a.shape, dtype=a.dtype, chunks=(5000,))[:] = a
    elif kind == "zip":  # its metadata alone identified it until 2026-12-01 (a probe)
        _zipped(path, tmp_path / "in.zip")
        path = f"zip://::{tmp_path / 'in.zip'}"
    changed = []

    def change_input() -> None:
        if kind == "zip":  # other values, same metadata, zipped over it
            alt = tmp_path / "alt.zarr"
            zarr.create_array(store=str(alt), shape=a.shape, dtype=a.dtype,
                              chunks=(5000,))[:] = np.concatenate([a[:-5000], b[-5000:]])
            _zipped(alt, tmp_path / "in.zip")
            return
        if kind == "npy-moved":  # a copy made by cp -p moved over it: same size and time
            copy = tmp_path / "copy.npy"
            np.save(copy, np.concatenate([a[:-5000], b[-5000:]]))
            st = os.stat(path)
            os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(copy, path)
            return
        if kind == "npy":
            np.lib.format.open_memmap(path, mode="r+")[-5000:] = b[-5000:]  # in place
            target = path
        else:
            array = path if kind == "zarr" else path / "x"
            alt = tmp_path / "alt.zarr"
            zarr.create_array(store=str(alt), shape=a.shape, dtype=a.dtype,
                              chunks=(5000,))[:] = b
            target = array / "c" / "39"  # the last chunk, not read yet
            os.replace(alt / "c" / "39", target)
        st = os.stat(target)  # later than anything the job saw, on any timestamp resolution
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))

    real = stream._Stream.write_done

    def write_done(self, *args):
        if not changed:
            changed.append(True)
            change_input()
        return real(self, *args)

    monkeypatch.setattr(stream._Stream, "write_done", write_done)
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x < 0.5", "--output-chunks", "3000", "--local",
              "threads", "--no-read-ahead", code=1)
    assert changed
    said = " ".join(res.output.split())
    # the check before the commit refuses it; a .npy read after the change is refused by
    # that read already (the file moved over it is not the job's), whichever comes first
    assert ("INPUT changed while the job read it" in said and "OUTPUT was not written" in said
            or kind.startswith("npy") and "changed since the job started" in said), said
    assert not out.exists() and litter(tmp_path) == []
    monkeypatch.undo()
    now = np.concatenate([a[:-5000], b[-5000:]])
    run(path, out, "--where", "x < 0.5", "--local", "threads")
    np.testing.assert_array_equal(group(out)[1]["x" if kind == "group" else "values"],
                                  now[now < 0.5])


@pytest.mark.parametrize("when", ["before the job", "during the job"])
def test_a_npy_input_written_through_a_memory_map_is_not_committed(tmp_path, monkeypatch,
                                                                   when):
    """A .npy INPUT that another program writes through a writable memory map (``np.load(p,
    mmap_mode="r+")``) while the job reads it: such writes change no modification time once
    their pages are mapped writable, so the fingerprint saw nothing, and until 2026-12-02
    (seventeenth session, a probe) a job started while the writer ran committed an output
    mixing its versions, exit 0 (4 to 8 distinct values where the writer wrote one at a
    time). A file open for writing (a read lease refused) is now refused as INPUT before
    the job, exit 2, and, opened meanwhile, at the commit, exit 1; nothing written. The
    writer here is this process's own map (it counts as any other's)."""
    from dask_compact.batch import stream

    a = np.random.default_rng(29).random(200_000).astype(np.float32)
    path = tmp_path / "in.npy"
    np.save(path, a)
    before = open(path, "rb").read()
    maps = []
    if when == "before the job":  # its pages mapped writable: no time is set again
        maps.append(np.lib.format.open_memmap(path, mode="r+"))
        maps[0][:] = a
    st = os.stat(path)

    def write_done(self, *args, real=stream._Stream.write_done):
        if len(maps) < 2:
            if not maps:
                maps.append(np.lib.format.open_memmap(path, mode="r+"))
            maps[0][-5000:] = -1.0  # the last rows, not read yet
            maps.append(None)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # no time said it
        return real(self, *args)

    monkeypatch.setattr(stream._Stream, "write_done", write_done)
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x < 0.5", "--chunks", "5000", "--output-chunks", "3000",
              "--local", "threads", "--no-read-ahead",
              code=2 if when == "before the job" else 1)
    said = " ".join(res.output.split())
    if when == "before the job":
        assert "open for writing" in said and "Invalid value for INPUT" in said, said
    else:  # a task that reads after the map's first write may see a new time: refused there
        assert ("opened for writing while the job read it" in said
                and "OUTPUT was not written" in said
                or "changed since the job started" in said), said
    assert not out.exists() and litter(tmp_path) == []
    maps[0][-5000:] = a[-5000:]
    del maps[:]
    monkeypatch.undo()
    assert open(path, "rb").read() == before
    run(path, out, "--where", "x < 0.5", "--local", "threads")
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])


@pytest.mark.parametrize("kind", ["zarr", "group"])
def test_resume_of_a_job_that_finished_says_output_is_complete(zin, tmp_path, kind):
    """A job killed after its commit (or a script repeating ``--resume``): the rerun said
    "OUTPUT exists; pass --overwrite to replace it". Now an identical job's complete OUTPUT
    is reported as complete, exit 0, untouched; another job's is refused as before."""
    path, a = zin
    if kind == "group":
        path = tmp_path / "grp.zarr"
        g = zarr.open_group(store=str(path), mode="w")
        g.create_array("x", shape=a.shape, dtype=a.dtype, chunks=(5000,))[:] = a
    out = tmp_path / "out.zarr"
    args = ["--where", "x < 0.5", "--output-chunks", "3000", "--local", "threads"]
    run(path, out, *args, "--resume")
    before = sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*"))
    res = run(path, out, *args, "--resume", "--json")
    assert "is already complete: an identical job finished it" in " ".join(res.output.split())
    assert sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")) == before
    res = run(path, out, "--where", "x < 0.25", "--output-chunks", "3000", "--resume", code=2)
    assert "written by another job" in res.output and "--overwrite" in res.output
    zarr.open_array(str(path if kind == "zarr" else path / "x"), mode="r+")[:5000] = 0.25
    res = run(path, out, *args, "--resume", code=2)  # the input changed since
    assert "written by another job" in res.output
    np.testing.assert_array_equal(group(out)[1]["values" if kind == "zarr" else "x"],
                                  a[a < 0.5])
    assert litter(tmp_path) == []


def test_corrupted_chunk_is_named_and_resume_after_the_fix_works(zin, tmp_path):
    path, a = zin
    chunk_file = path / "c" / "7"
    good = chunk_file.read_bytes()
    chunk_file.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))  # a zstd magic, then junk
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x > 0.3", "--output-chunks", "2000", code=1)
    assert "input chunk 7 (rows 35000:40000)" in res.output
    assert not out.exists() and litter(tmp_path) == []
    chunk_file.write_bytes(good)
    run(path, out, "--where", "x > 0.3", "--output-chunks", "2000", "--resume")
    np.testing.assert_array_equal(group(out)[1]["values"], a[a > 0.3])


def test_a_failed_task_on_local_worker_processes_is_one_line(zin, tmp_path):
    """The worker processes of ``--local processes`` share the command's stderr, where
    distributed's "Compute Failed" log of the failed task (its key, task and traceback) came
    above the job's one line (a probe, 2026-12-06)."""
    path, _ = zin
    (path / "c" / "7").write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))
    out = tmp_path / "out.zarr"
    proc = subprocess.run(
        [sys.executable, "-m", "dask_compact", str(path), str(out), "--where", "x > 0.3",
         "--local", "processes", "--workers", "2", "--no-progress"],
        capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "input chunk 7 (rows 35000:40000)" in lines[0], proc.stderr
    assert not out.exists() and litter(tmp_path) == []


@pytest.mark.parametrize("how", ["failed", "SIGINT", "partly there"])
def test_the_folders_a_failed_job_made_for_output_are_removed(zin, tmp_path, how):
    """OUTPUT's missing folders are made for its lock and temporary output: until 2026-12-02
    (sixteenth session, the fifteenth session's probe) they stayed, empty, after a job that
    failed (a corrupted input chunk) or was interrupted (SIGINT mid-write, ``--local
    processes``). Now exactly those the job made are removed; a folder that was there
    before stays (``partly there``: ``new`` was, holding a user's file)."""
    from test_cli_safety import _digest

    path, a = zin
    (tmp_path / "kept").mkdir()
    out = tmp_path / "kept" / "new" / "deeper" / "out.zarr"
    args = ["--where", "x > 0.3", "--chunks", "1000", "--output-chunks", "1000"]
    good = (path / "c" / "7").read_bytes()
    if how != "SIGINT":
        (path / "c" / "7").write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))
    if how == "partly there":
        (tmp_path / "kept" / "new").mkdir()
        (tmp_path / "kept" / "new" / "notes.txt").write_text("mine")
    before = _digest(path)
    if how == "SIGINT":
        ready = tmp_path / "ready"
        proc = start("slow-write", ready, path, out, *args, "--local", "processes",
                     "--workers", "2")
        wait_for(ready, proc)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "was not written" in stderr, stderr
    else:
        res = run(path, out, *args, code=1)
        assert "Zarr chunk c/7" in res.output
    assert _digest(path) == before
    if how == "partly there":
        assert os.listdir(tmp_path / "kept") == ["new"]
        assert sorted(os.listdir(tmp_path / "kept" / "new")) == ["notes.txt"]
    else:
        assert os.listdir(tmp_path / "kept") == []
    (path / "c" / "7").write_bytes(good)
    run(path, out, *args)
    np.testing.assert_array_equal(group(out)[1]["values"], a[a > 0.3])


@pytest.mark.parametrize("where_run", [[], ["--no-read-ahead"],
                                       ["--local", "processes", "--workers", "2"]])
def test_a_chunk_that_decodes_short_fails_the_job_and_leaves_no_output(zin, tmp_path,
                                                                        where_run):
    """A valid zstd frame holding fewer values than its chunk (zarr refuses it): the job
    fails naming the chunk, whether the early read, a task or a worker reads it; nothing is
    written."""
    from numcodecs import Zstd

    path, a = zin
    (path / "c" / "7").write_bytes(Zstd().encode(np.full(1000, 0.95, np.float32)))
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x > 0.9", "-o", "both", *where_run, code=1)
    assert "input chunk 7 (rows 35000:40000)" in res.output and "decodes to" in res.output
    assert not out.exists() and litter(tmp_path) == []


def test_worker_killed_mid_job_gives_the_exact_result(zin, tmp_path, monkeypatch):
    """A worker process dies while reading a chunk (the nanny restarts it, the scheduler reruns
    its tasks); the job still gives exactly NumPy's answer."""
    from dask_compact.batch import stream, tasks

    path, a = zin
    marker = tmp_path / "killed-once"
    real = tasks.read_compact

    def dying(reader, i, *args):  # a closure: the workers get it by value
        if i == 9 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return real(reader, i, *args)

    monkeypatch.setattr(stream.tasks, "read_compact", dying)
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.6", "-o", "both", "--output-chunks", "2500",
        "--local", "processes", "--workers", "2")
    assert marker.exists()
    _, arrays = group(out)
    m = a > 0.6
    np.testing.assert_array_equal(arrays["values"], a[m])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    assert litter(tmp_path) == []


@pytest.mark.parametrize("how", ["times-out", "waits"])
def test_a_cluster_that_lost_every_worker_is_said_and_may_time_out(zin, tmp_path, monkeypatch,
                                                                    how):
    """A ``--scheduler`` job whose every worker died for good (workers without nannies)
    waited with no word until Ctrl-C (a probe). Now a line on stderr says so once the
    cluster has had no workers for a while (30 s; 1 s here), and again as the wait goes on;
    ``--no-workers-timeout`` fails the job then (exit 1, what was written kept for
    ``--resume``, which finishes it once the cluster has workers again); without it the job
    goes on when a worker joins. Real processes: a ``dask worker --no-nanny`` SIGKILLed after
    the job's first write, another one started later."""
    import contextlib
    import threading
    import time

    from cluster_helpers import worker_named, worker_process
    from distributed import Client, LocalCluster

    from dask_compact.batch import executor, stream

    path, a = zin
    monkeypatch.setattr(executor, "NO_WORKERS_SAY_S", 1.0, raising=False)
    args = ["--where", "x < 0.5", "-o", "both", "--output-chunks", "3000",
            "--memory-budget", "1MB"]
    out = tmp_path / "out.zarr"
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(n_workers=0, processes=True,
                                                   dashboard_address=":0"))
        client = stack.enter_context(Client(cluster, set_as_default=False))
        addr = cluster.scheduler_address
        first = stack.enter_context(worker_process(addr, tmp_path, "first"))
        worker_named(client, "first")
        real = stream._Stream.write_done
        killed: list[float] = []

        def write_done(self, j, *args):
            real(self, j, *args)
            # the only worker dies for good, the job not half done, once the first output
            # chunk is written and saved: writes end out of order, and a kill after another
            # one left --resume nothing to start past (resumed_from_chunk 0, a loaded CI run)
            if not killed and 0 in self.job.manifest.written:
                self.save_manifest(force=True)
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
                killed.append(time.monotonic())
                if how == "waits":  # a worker joins 3.5 s later (an autoscaler's)
                    threading.Timer(3.5, lambda: stack.enter_context(
                        worker_process(addr, tmp_path, "second"))).start()

        monkeypatch.setattr(stream._Stream, "write_done", write_done)
        if how == "times-out":
            res = run(path, out, *args, "--scheduler", addr, "--no-workers-timeout", "2.5",
                      code=1)
        else:
            res = run(path, out, *args, "--scheduler", addr)
        said = " ".join(res.stderr.split())
        assert killed
        assert f"no workers on {addr} for 1 s; waiting for workers" in said, said
        assert f"no workers on {addr} for 2 s" in said, said  # and again
        if how == "waits":
            np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
            assert litter(tmp_path) == []
            return
        assert f"no workers on {addr} for 2.5 s (--no-workers-timeout)" in said, said
        assert "kept for --resume" in said, said
        assert not out.exists()
        assert [n for n in litter(tmp_path) if "tmp" in n]  # what was written, for --resume
        monkeypatch.undo()
        stack.enter_context(worker_process(addr, tmp_path, "third"))
        worker_named(client, "third")
        resumed = json.loads(run(path, out, *args, "--scheduler", addr, "--resume",
                                 "--json").stdout)
    assert resumed["resumed_from_chunk"] > 0
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
    np.testing.assert_array_equal(group(out)[1]["indices"], np.flatnonzero(a < 0.5))
    assert litter(tmp_path) == []


def test_no_workers_timeout_needs_a_cluster(zin, tmp_path):
    """An option that would be ignored is refused, as --workers is on the threaded
    scheduler."""
    path, _ = zin
    res = run(path, tmp_path / "o.zarr", "-w", "x < 0.5", "--no-workers-timeout", "5", code=2)
    assert "--no-workers-timeout applies to a cluster's workers" in res.output
    assert not (tmp_path / "o.zarr").exists()


# -- bounded memory -----------------------------------------------------------------------------

WORKER_LIMIT = 1 << 30  # distributed's memory limit of each of the two workers
CHUNK = 1 << 22  # float32 elements per input chunk (16 MiB)
DISTINCT = 8  # distinct chunks; the others are hard links to them (no disk, no write time)


def _large_input(path: Path, nbytes: int) -> list[np.ndarray]:
    """A Zarr float32 array of ``nbytes`` whose chunks repeat DISTINCT random ones (hard-linked
    chunk files): as large as wanted on a small disk, still random data to compact."""
    n_chunks = nbytes // (CHUNK * 4)
    z = zarr.create_array(store=str(path), shape=(n_chunks * CHUNK,), dtype=np.float32,
                          chunks=(CHUNK,))
    rng = np.random.default_rng(31)
    blocks = [(rng.integers(0, 4096, CHUNK) / 4096).astype(np.float32) for _ in range(DISTINCT)]
    for k, b in enumerate(blocks):
        z[k * CHUNK : (k + 1) * CHUNK] = b
    for k in range(DISTINCT, n_chunks):
        os.link(path / "c" / str(k % DISTINCT), path / "c" / str(k))
    return blocks


@pytest.mark.slow
def test_input_four_times_the_cluster_memory_streams_within_the_budget(tmp_path):
    from distributed import Client, LocalCluster

    total_limit = 2 * WORKER_LIMIT
    path = tmp_path / "big.zarr"
    blocks = _large_input(path, 4 * total_limit)
    n_chunks = 4 * total_limit // (CHUNK * 4)
    with LocalCluster(n_workers=2, threads_per_worker=1, memory_limit=WORKER_LIMIT,
                      dashboard_address=":0", processes=True) as cluster, Client(cluster) as c:
        workers_before = set(c.scheduler_info()["workers"])
        out = tmp_path / "out.zarr"
        summary = json.loads(run(path, out, "--where", "x < 0.002", "--scheduler",
                                 cluster.scheduler_address, "--json").stdout)
        workers_after = set(c.scheduler_info()["workers"])
        spilled = c.run(lambda dask_worker: sum(
            v for (label, unit), v in dask_worker.data.cumulative_metrics.items()
            if label == "disk-write" and unit == "count"))
        logs = c.get_worker_logs()
    print(json.dumps(summary))  # the measured numbers, in the test log
    assert summary["bytes"] >= 4 * total_limit
    assert workers_after == workers_before  # none restarted by the memory monitor
    assert set(spilled.values()) == {0}, spilled  # nothing spilled to disk
    assert not [line for w in logs.values() for _, line in w
                if "paus" in line.lower() or "spill" in line.lower()], logs
    peaks = summary["peak_memory"]
    assert len(peaks) == 2
    for peak in peaks.values():
        # below distributed's spill (70 %) and pause (80 %) thresholds of process memory
        assert peak < 0.7 * WORKER_LIMIT, peaks
    assert summary["peak_reserved"] <= summary["memory_budget"] <= total_limit
    # exact result
    expect = np.concatenate([blocks[k % DISTINCT][blocks[k % DISTINCT] < 0.002]
                             for k in range(n_chunks)])
    got = zarr.open_group(store=str(out), mode="r")["values"][:]
    np.testing.assert_array_equal(got, expect)


def test_progress_bar_and_summary_report_the_job(zin, tmp_path):
    """The progress bar counts input bytes on stderr; the summary gives GB/s, the task-time
    split, the budget, the peak memory per process and where decoding ran."""
    path, a = zin
    res = run(path, tmp_path / "o.zarr", "-w", "x > 0.5", "--progress", "--memory-budget",
              "3MB")
    assert "dask compact:" in res.stderr and "/800k [" in res.stderr  # bytes of input
    out = res.stdout
    assert "GB/s of input; task time read" in out and "compact" in out and "write" in out
    assert "budget 3.0 MB" in out and "peak per process" in out and "CPU decode" in out
    summary = json.loads(run(path, tmp_path / "o2.zarr", "-w", "x > 0.5", "--json",
                             "--memory-budget", "3MB").stdout)
    assert summary["memory_budget"] == 3_000_000
    assert 0 < summary["peak_reserved"] <= 3_000_000
    assert set(summary["task_seconds"]) == {"read", "compact", "write"}
    assert summary["chunks_read"] == 40 and summary["gpu_decode"] is False
    assert all(v > 50e6 for v in summary["peak_memory"].values())
    res = run(path, tmp_path / "o3.zarr", "-w", "x > 0.5", "--memory-budget", "lots", code=2)
    assert "--memory-budget" in res.output


def test_a_real_failed_write_leaves_no_output(zin, tmp_path):
    """The output side fails for real: the job runs under a file-size limit (RLIMIT_FSIZE),
    so writing an output chunk file larger than it fails with EFBIG, as a full disk fails with
    ENOSPC. The job exits 1 naming the error; no OUTPUT, no temporary group."""
    import resource

    path, _ = zin

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    out = tmp_path / "out.zarr"
    proc = subprocess.run(
        [sys.executable, "-m", "dask_compact", str(path), str(out), "-w", "x > 0.1",
         "--output-chunks", "40000", "--local", "threads"],
        capture_output=True, text=True, preexec_fn=limited, timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "job failed" in proc.stderr and "File too large" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert litter(tmp_path) == []


def test_resume_needs_a_local_output(zin, monkeypatch):
    from dask_compact.batch import output

    monkeypatch.setattr(output, "EPHEMERAL_PROTOCOLS", ())  # in-process: an object store's stand-in
    path, _ = zin
    res = run(path, "memory://resume-test/out.zarr", "-w", "x > 0.5", "--local", "threads",
              "--resume", code=2)
    assert "--resume needs a local OUTPUT" in res.output


def test_a_change_of_input_behind_its_cache_is_seen(tmp_path, monkeypatch):
    """INPUT ``simplecache::URL`` (``memory://`` stands in for an object store, in process):
    the commit's input-change check opened INPUT again through the cache, which answered
    from its own copy of the metadata, so a change during the job passed unseen (exit 0).
    It now reads the store itself; and a cache folder kept from an earlier job that holds
    older metadata than the store is refused up front."""
    import fsspec

    from dask_compact.batch import stream

    a = np.random.default_rng(41).random(3_000)
    url = "memory://change-test/in.zarr"
    fs = fsspec.filesystem("memory")
    try:
        zarr.create_array(store=url, data=a, chunks=(300,))
        real = stream._Stream.write_done
        changed = []

        def write_done(self, *args):
            if not changed:
                changed.append(True)
                zarr.open_array(url, mode="r+").attrs["rewritten"] = True
            return real(self, *args)

        monkeypatch.setattr(stream._Stream, "write_done", write_done)
        out = tmp_path / "out.zarr"
        res = run(f"simplecache::{url}", out, "-w", "x < 0.5", "--output-chunks", "300",
                  "--local", "threads", code=1)
        assert changed and "INPUT changed while the job read it" in " ".join(res.output.split())
        assert not out.exists() and litter(tmp_path) == []
        monkeypatch.undo()
        # a cache folder kept between jobs (fsspec's configuration): the second job's cache
        # holds the first one's zarr.json
        monkeypatch.setitem(fsspec.config.conf, "simplecache",
                            {"cache_storage": str(tmp_path / "cache")})
        run(f"simplecache::{url}", out, "-w", "x < 0.5", "--local", "threads")
        np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
        zarr.open_array(url, mode="r+").attrs["rewritten"] = "again"
        res = run(f"simplecache::{url}", tmp_path / "o2.zarr", "-w", "x < 0.5",
                  "--local", "threads", code=2)
        assert "holds another copy of its metadata" in " ".join(res.output.split())
    finally:
        fs.rm("/change-test", recursive=True)


def test_a_npy_moved_over_the_input_after_a_read_fails_the_job(zin, tmp_path, monkeypatch):
    """A copy made by ``cp -p`` moved over a .npy input after the job's first read: the next
    read refuses it (it had mapped the new file and read on, half old, half new, and the
    commit's check passed), exit 1 naming the change; nothing is written."""
    from dask_compact.batch import reader

    _, a = zin
    path = tmp_path / "in.npy"
    np.save(path, a)
    real = reader.NpyRows.read
    moved = []

    def read(self, r0, r1):
        out = real(self, r0, r1)
        if not moved:
            moved.append(True)
            copy = tmp_path / "copy.npy"
            np.save(copy, a[::-1].copy())
            st = os.stat(path)
            os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(copy, path)
        return out

    monkeypatch.setattr(reader.NpyRows, "read", read)
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x < 0.5", "--chunks", "10000", "--local", "threads",
              "--no-read-ahead", code=1)
    said = " ".join(res.output.split())
    # a later read refuses the new file; where every read was done before the move (reads
    # run in parallel, CI once), the check before the commit refuses the job instead
    assert ("InputChanged" in said and "changed since the job started" in said
            or "INPUT changed while the job read it" in said), said
    assert not out.exists() and litter(tmp_path) == []


def test_resume_of_a_npy_job_from_before_the_inode_says_it_cannot_continue(zin, tmp_path):
    """A .npy job interrupted under a version whose fingerprint had no inode: its identity
    differs from this version's for the same file, so it cannot be resumed, and the refusal
    says so ("run it with the same arguments" could not work); a run without --resume
    starts over."""
    from dask_compact.batch import manifest as manifest_io
    from dask_compact.batch.reader import npy_fingerprint_before_inode

    _, a = zin
    path = tmp_path / "in.npy"
    np.save(path, a)
    out = tmp_path / "out.zarr"
    args = ["--where", "x < 0.5", "--chunks", "20000", "--output-chunks", "3000"]
    kill_halfway(tmp_path, path, out, *args, writes=3)
    (group_path,) = [p for p in tmp_path.iterdir() if ".dask-compact-tmp-" in p.name]
    m = manifest_io.load(str(group_path))
    assert m is not None
    m.job["input"] = npy_fingerprint_before_inode(str(path))  # the earlier version's form
    manifest_io.save(str(group_path), m)
    res = run(path, out, *args, "--resume", code=2)
    said = " ".join(res.output.split())
    assert "earlier version" in said and "inode" in said and "cannot be resumed" in said, said
    assert "same arguments" not in said
    run(path, out, *args)
    np.testing.assert_array_equal(group(out)[1]["values"], a[a < 0.5])
    assert litter(tmp_path) == []
