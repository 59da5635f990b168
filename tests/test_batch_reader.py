"""The batch job's chunk-file reader against zarr's own reads: every layout it accepts gives
zarr's values, the ones it refuses fall back to zarr, and a missing chunk is an error unless
allowed (then the fill value)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from dask_compact.batch.inputs import open_zarr
from dask_compact.batch.reader import (
    ChunkKeys,
    ZarrChunkFiles,
    ZarrRows,
    chunk_files_reader,
    chunk_keys,
)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float32",
                                   "float64"])
@pytest.mark.parametrize("shape, chunks", [((1,), (1,)), ((1025,), (100,)), ((997,), (997,)),
                                           ((61, 5), (8, 5)), ((33, 2, 3), (7, 2, 3))])
def test_chunk_files_read_what_zarr_reads(tmp_path, dtype, shape, chunks):
    rng = np.random.default_rng(sum(shape))
    a = (rng.random(shape) * 200 - 50).astype(dtype)
    path = tmp_path / "a.zarr"
    z = zarr.create_array(store=str(path), shape=shape, dtype=dtype, chunks=chunks)
    z[...] = a
    reader, why = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)
    assert isinstance(reader, ZarrChunkFiles), why
    n = shape[0]
    # blocks aligned with the chunks, straddling them, single rows, the whole array
    for r0, r1 in [(0, n), (0, min(n, chunks[0])), (n // 3, n - n // 4), (n - 1, n), (0, 1)]:
        if r0 >= r1:
            continue
        got = reader.read(r0, r1)
        assert got.dtype == a.dtype and got.shape == a[r0:r1].shape
        np.testing.assert_array_equal(got, a[r0:r1])


@pytest.mark.parametrize("encoding", [{"name": "default", "separator": "/"},
                                      {"name": "default", "separator": "."},
                                      {"name": "v2", "separator": "."},
                                      {"name": "v2", "separator": "/"}], ids=str)
@pytest.mark.parametrize("shape, chunks", [((1,), (1,)), ((23,), (2,)), ((61, 5), (8, 5)),
                                           ((12, 2, 3), (1, 2, 3))])
def test_chunk_keys_are_zarrs_and_a_reader_pickles_in_constant_size(tmp_path, encoding, shape,
                                                                     chunks):
    """The reader's keys are zarr's own for every chunk, under each chunk key encoding; they
    are a formula (ChunkKeys), so the reader a distributed job sends with every task pickles
    in the same size for 10 or 10,000 chunks (a list of every key made 10,000 one-row chunks
    take 129 s under --local processes, 5,000 42 s)."""
    import pickle

    path = tmp_path / "a.zarr"
    z = zarr.create_array(store=str(path), shape=shape, dtype="int16", chunks=chunks,
                          chunk_key_encoding=encoding)
    z[...] = np.arange(np.prod(shape), dtype="int16").reshape(shape) + 1
    reader, why = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)
    assert isinstance(reader, ZarrChunkFiles), why
    meta = zarr.open_array(str(path)).metadata
    zeros = (0,) * (len(shape) - 1)
    want = [meta.encode_chunk_key((c, *zeros)) for c in range(-(-shape[0] // chunks[0]))]
    assert isinstance(reader.keys, ChunkKeys)
    assert list(reader.keys) == want and reader.keys == want and len(reader.keys) == len(want)
    assert all(os.path.exists(os.path.join(str(path), k)) for k in reader.keys)
    np.testing.assert_array_equal(reader.read(0, shape[0]), z[...])
    small = pickle.dumps(reader)
    big = chunk_files_reader(zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(10_000,),
                                               dtype="int16", chunks=(1,),
                                               chunk_key_encoding=encoding),
                             str(tmp_path / "b.zarr"), "fp", True)[0]
    assert len(pickle.dumps(big)) < len(small) + 64
    assert pickle.loads(pickle.dumps(big)).keys == big.keys


def test_chunk_keys_fall_back_to_a_list_where_the_index_is_not_between_a_prefix_and_suffix():
    def odd(coords):  # the index written twice: no one place for it
        return f"{coords[0]}-{coords[0]}"

    keys = chunk_keys(odd, 4, ())
    assert keys == ["0-0", "1-1", "2-2", "3-3"] and isinstance(keys, list)
    assert chunk_keys(lambda c: f"k{c[0]}", 0, ()) == []
    k = ChunkKeys("c/", "/0", 3)
    assert k[-1] == "c/2/0" and k[1:] == ["c/1/0", "c/2/0"] and k != ["c/0/0"]
    with pytest.raises(IndexError):
        k[3]


def test_a_view_of_a_chunk_file_alive_after_its_decode_does_not_fail_the_read(
        tmp_path, monkeypatch):
    """A view of a mapped chunk file outliving its decode (a distributed worker's sampling
    profiler holding the decoder's frame) leaves the map to be closed with the view; the read
    succeeds, at chunk boundaries and inside a chunk alike."""
    import numcodecs

    a = np.random.default_rng(3).random(250).astype(np.float32)
    path = tmp_path / "a.zarr"
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(100,))[...] = a
    reader, why = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)
    assert isinstance(reader, ZarrChunkFiles), why
    held = []
    real = numcodecs.Zstd.decode

    def decode(self, buf, out=None):
        held.append(memoryview(buf))  # still exported when the read closes its map
        return real(self, buf, out=out)

    monkeypatch.setattr(numcodecs.Zstd, "decode", decode)
    np.testing.assert_array_equal(reader.read(0, 200), a[:200])
    np.testing.assert_array_equal(reader.read(50, 250), a[50:250])
    assert len(held) == 5
    held.clear()  # the maps close with their last views


def test_layouts_it_refuses_fall_back_to_zarr(tmp_path):
    a = np.arange(60.0).reshape(12, 5)
    cases = {
        "trailing split": dict(chunks=(4, 2)),
        "not zstd": dict(chunks=(4, 5), compressors=None),
        "zarr v2": dict(chunks=(4, 5), zarr_format=2),
    }
    for name, kw in cases.items():
        path = tmp_path / name.replace(" ", "_")
        z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, **kw)
        z[...] = a
        src = open_zarr(str(path), None)
        assert isinstance(src.reader, ZarrRows), name
        assert src.no_gpu_decode
        np.testing.assert_array_equal(src.reader.read(3, 9), a[3:9])


def test_a_chunk_zarr_cannot_read_is_named(tmp_path):
    """Through zarr (a layout the chunk-file reader refuses), a corrupted chunk's error names
    the chunk and its rows, which zarr's own error does not; the chunks around it still read."""
    a = np.random.default_rng(3).random((200, 3)).astype(np.float32)
    for name, kw in {"zarr v2": dict(zarr_format=2), "v3": {}}.items():
        path = tmp_path / name.replace(" ", "_")
        z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(40, 3),
                              **kw)
        z[...] = a
        key = z.metadata.encode_chunk_key((2, 0))  # rows 80:120
        (path / key).write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(100))
        reader = ZarrRows(str(path), a.shape, a.dtype, "fp")
        with pytest.raises(ValueError, match=rf"Zarr chunk {key} \(rows 80:120\): "):
            reader.read(0, 200)
        np.testing.assert_array_equal(reader.read(0, 80), a[:80])
        np.testing.assert_array_equal(reader.read(120, 200), a[120:])


def _replaced(tmp_path, chunk: int, data: bytes):
    """A float32 array of 1050 rows in chunks of 100 (the last, c/10, an edge chunk) whose chunk
    file ``chunk`` is replaced by ``data``; its reader and values."""
    a = np.random.default_rng(5).random(1050).astype(np.float32)
    path = tmp_path / "a.zarr"
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(100,))[:] = a
    (path / "c" / str(chunk)).write_bytes(data)
    reader, why = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)
    assert isinstance(reader, ZarrChunkFiles), why
    return reader, a


def _frames(*parts, content_size=True):
    import zstandard

    if not content_size:
        c = zstandard.ZstdCompressor(write_content_size=False)
        return b"".join(c.compress(np.asarray(p, np.float32).tobytes()) for p in parts)
    from numcodecs import Zstd

    return b"".join(Zstd().encode(np.asarray(p, np.float32)) for p in parts)


SHORT_OR_LONG = {
    "short": _frames(np.full(20, 0.5)),
    "short, no declared size": _frames(np.full(20, 0.5), content_size=False),
    "short, two frames": _frames(np.full(50, 0.5), np.full(30, 0.5)),
    "long": _frames(np.full(120, 0.5)),
    "the chunk, then one frame more": _frames(np.full(100, 0.5), np.full(8, 0.5)),
    "long, no declared size": _frames(np.full(101, 0.5), content_size=False),
}


@pytest.mark.parametrize("chunk", [3, 10])  # a whole chunk, the edge chunk
@pytest.mark.parametrize("what", list(SHORT_OR_LONG))
def test_a_chunk_that_decodes_to_another_size_is_an_error_naming_it(tmp_path, chunk, what):
    """zarr refuses a chunk file that does not decode to the chunk's size; so does the
    reader, whether it decodes into the caller's buffer (a reused one would otherwise keep
    another chunk's values past a short chunk) or apart (an edge chunk, a part of one)."""
    reader, _ = _replaced(tmp_path, chunk, SHORT_OR_LONG[what])
    # the chunk's own rows, not the read's (the task's: a probe, 2026-12-07)
    rows = rf"\(rows {chunk * 100}:{min(1050, chunk * 100 + 100)}\)"
    with pytest.raises(ValueError,
                       match=f"Zarr chunk c/{chunk} {rows} (decodes to|does not decode)"):
        reader.read(0, 1050)
    r0 = chunk * 100 + 7  # a part of the chunk only
    with pytest.raises(ValueError, match=f"Zarr chunk c/{chunk} {rows}"):
        reader.read(r0, min(1050, r0 + 20))
    out = np.full(100, 7.0, np.float32)  # a reused buffer of the whole chunk's rows
    if chunk == 3:
        with pytest.raises(ValueError, match="Zarr chunk c/3"):
            reader.read(300, 400, out=out)


@pytest.mark.parametrize("parts, content_size", [((40, 60), True), ((100,), False),
                                                 ((30, 30, 40), False), ((1, 99), True)])
def test_a_chunk_of_several_frames_or_no_declared_size_reads_exactly(tmp_path, parts,
                                                                      content_size):
    """Valid zstd of the chunk's size in any framing reads as zarr reads it."""
    a = np.random.default_rng(5).random(1050).astype(np.float32)
    cut = np.cumsum((0,) + parts)
    data = _frames(*(a[300 + lo : 300 + hi] for lo, hi in zip(cut, cut[1:])),
                   content_size=content_size)
    reader, a = _replaced(tmp_path, 3, data)
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "a.zarr"))[:], a)
    np.testing.assert_array_equal(reader.read(0, 1050), a)
    np.testing.assert_array_equal(reader.read(310, 390), a[310:390])
    out = np.full(100, 7.0, np.float32)
    np.testing.assert_array_equal(reader.read(300, 400, out=out), a[300:400])


def test_missing_chunk_is_an_error_unless_allowed(tmp_path):
    a = np.arange(1, 101, dtype=np.float32)
    path = tmp_path / "a.zarr"
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(10,),
                          fill_value=-1)
    z[:] = a
    os.remove(path / "c" / "3")
    node = zarr.open_array(str(path))
    strict, _ = chunk_files_reader(node, str(path), "fp", False)
    with pytest.raises(FileNotFoundError, match=r"c/3 \(rows 30:40\) is missing"):
        strict.read(25, 45)
    lenient, _ = chunk_files_reader(node, str(path), "fp", True)
    expect = a.copy()
    expect[30:40] = -1
    np.testing.assert_array_equal(lenient.read(25, 45), expect[25:45])


def test_gpu_decode_without_a_gpu_falls_back_to_the_cpu(tmp_path):
    from click.testing import CliRunner

    from dask_compact import cli
    from dask_compact.batch import gpu_zstd

    if not gpu_zstd.unavailable():
        pytest.skip("GPU decode is possible here")
    a = np.random.default_rng(1).random(1000)
    path = tmp_path / "a.zarr"
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(100,))[:] = a
    res = CliRunner().invoke(cli.main, [str(path), str(tmp_path / "o.zarr"), "-w", "x > 0.5",
                                        "--local", "threads", "--decode", "gpu", "--json"])
    assert res.exit_code == 0, res.output
    assert ("GPU decode is not possible (the chunks are compacted on CPUs); decoding on the CPU"
            in res.stderr)
    summary = json.loads(res.stdout)
    assert summary["decode"] == "cpu" and summary["gpu_decode"] is False
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "o.zarr"))["values"][:],
                                  a[a > 0.5])


def test_gpu_encode_on_cpus_falls_back_with_the_reason(tmp_path):
    """``--encode gpu`` where the chunks are compacted on CPUs: one stderr line, CPU encode,
    the output exact; ``cpu`` says nothing."""
    from click.testing import CliRunner

    from dask_compact import cli

    a = np.random.default_rng(2).random(1001)
    path = tmp_path / "a.zarr"
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(100,))[:] = a
    for encode, says in (("gpu", True), ("cpu", False)):
        out = tmp_path / f"o-{encode}.zarr"
        res = CliRunner().invoke(cli.main, [str(path), str(out), "-w", "x > 0.5", "--local",
                                            "threads", "--device", "cpu", "--encode", encode,
                                            "--output-chunks", "64", "--json"])
        assert res.exit_code == 0, res.output
        line = ("GPU encode is not possible (the chunks are compacted on CPUs); encoding on "
                "the CPU")
        assert (line in res.stderr) is says
        summary = json.loads(res.stdout)
        assert summary["encode"] == "cpu" and summary["gpu_encoded"] == 0
        assert summary["encode_shared"] is False and summary["encode_rates"] == {}
        assert summary["encode_moved"] == 0
        np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], a[a > 0.5])


def test_a_npy_moved_over_the_input_mid_job_is_refused_not_read(tmp_path):
    """A .npy file replaced by another of the same size and modification time (``cp -p`` then
    ``mv``) while a job reads it: the job's reader refuses it (InputChanged) rather than read
    the new file's rows after the old one's (a review: chunks 0.0 then 1.0, and the commit's
    check passed: the fingerprint had no inode). The fingerprint now differs, so the commit's
    check refuses too, and a new job (the new fingerprint) reads the new file."""
    from dask_compact.batch.reader import InputChanged, NpyRows, npy_fingerprint

    a, b = np.arange(100.0), np.arange(100.0) + 1000
    path, other = str(tmp_path / "a.npy"), str(tmp_path / "b.npy")
    np.save(path, a)
    np.save(other, b)
    st = os.stat(path)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    reader = NpyRows(path, a.shape, a.dtype, npy_fingerprint(path))
    np.testing.assert_array_equal(reader.read(0, 50), a[:50])
    os.replace(other, path)
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    with pytest.raises(InputChanged, match="changed since the job started"):
        reader.read(50, 100)
    assert npy_fingerprint(path) != reader.fingerprint
    again = NpyRows(path, b.shape, b.dtype, npy_fingerprint(path))
    np.testing.assert_array_equal(again.read(0, 100), b)
    with pytest.raises(InputChanged):  # the old job's reader, after the new one mapped it
        reader.read(50, 100)


def test_a_npy_replaced_before_the_first_read_is_refused(tmp_path):
    """A file moved over the input between the job's plan (its fingerprint) and its first
    read in a process: the map made then is not of the job's file, refused as well."""
    from dask_compact.batch.reader import InputChanged, NpyRows, npy_fingerprint

    path, other = str(tmp_path / "a.npy"), str(tmp_path / "b.npy")
    np.save(path, np.zeros(10))
    np.save(other, np.ones(10))
    reader = NpyRows(path, (10,), np.dtype("f8"), npy_fingerprint(path))
    os.replace(other, path)
    with pytest.raises(InputChanged):
        reader.read(0, 10)


TRUNCATED = """
import os, sys
import numpy as np
from dask_compact.batch.reader import NpyRows, npy_fingerprint

path = sys.argv[1]
a = np.arange(1 << 16, dtype=np.float64)  # 512 KiB: 128 pages mapped
np.save(path, a)
reader = NpyRows(path, a.shape, a.dtype, npy_fingerprint(path))
assert (reader.read(0, 10) == a[:10]).all()
os.truncate(path, 4096)  # in place: the map's pages past the first are gone
try:
    reader.read(60_000, 65_536)
except ValueError as e:
    print("refused:", e)
"""


def test_a_npy_truncated_in_place_while_mapped_is_refused_not_a_crash(tmp_path):
    """A .npy file truncated in place while a process has it mapped: the read is refused
    (the file is mapped again, which a file shorter than its header declares cannot be);
    reading the old map past the new end killed the process with SIGBUS (a worker lost).
    In a subprocess: the crash it guards against would take pytest with it."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", TRUNCATED, str(tmp_path / "a.npy")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert "refused:" in res.stdout, res.stdout


@pytest.mark.parametrize("chunk, auto", [(1 << 10, "cpu"), ((128 << 20) // 4 - 1, "cpu"),
                                         ((128 << 20) // 4, "gpu")])
def test_decode_auto_takes_the_gpu_for_large_chunks_only(tmp_path, monkeypatch, chunk, auto):
    """--decode auto where nvCOMP could decode (a process driving its GPUs, zstd chunk files):
    the GPU for chunks of GPU_DECODE_FROM_BYTES or more, the CPUs below (measured slower there
    on the H100); --decode gpu and cpu as asked, whatever the chunk."""
    from types import SimpleNamespace

    from dask_compact.batch import gpu_zstd, job
    from dask_compact.batch.inputs import open_zarr

    path = tmp_path / "in.zarr"
    zarr.create_array(store=str(path), shape=(3 * chunk,), dtype="float32", chunks=(chunk,))
    src = open_zarr(str(path), None, allow_missing_chunks=True)
    assert job.chunk_bytes(src) == chunk * 4 and not src.no_gpu_decode
    monkeypatch.setattr(gpu_zstd, "unavailable", lambda: "")
    runner = SimpleNamespace(gpu=True, client=None)
    assert job.choose_decode(runner, src, "auto") == auto
    assert job.choose_decode(runner, src, "gpu") == "gpu"
    assert job.choose_decode(runner, src, "cpu") == "cpu"
