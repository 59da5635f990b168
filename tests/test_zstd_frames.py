"""The zstd frame format read on the CPU (:mod:`dask_compact.batch.zstd_frames`) and how GPU
decode plans a chunk file (:func:`dask_compact.batch.gpu_zstd.chunk_frames`): single frames,
several frames (as the GPU encoder writes them, :func:`dask_compact.batch.gpu_zstd.encode`),
frames without a declared size, skippable frames, checksums, truncated and foreign bytes.
Runs on the CPU; the GPU suite decodes such chunks with nvCOMP (tests/gpu/test_batch_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import zstandard
from numcodecs import Zstd

from dask_compact.batch import gpu_zstd
from dask_compact.batch.zstd_frames import Frame, content_size, split


def _data(n: int, seed: int = 0) -> bytes:
    # few distinct bytes: compressed blocks, with runs that make RLE and raw blocks too
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 9, n, dtype=np.uint8)
    a[n // 3 : n // 3 + n // 5] = 7
    return a.tobytes()


def test_frame_header_size():
    """GPU decode checks each frame's declared size on the CPU first (nvCOMP can fault on a
    frame that is not what it expects)."""
    for n in (0, 1, 255, 256, 257, 65_791, 70_000, 5_000_000):
        data = _data(n, n)
        for level in (0, 1, 9):
            assert content_size(Zstd(level=level).encode(data)) == n
    assert content_size(b"\x28\xb5\x2f\xfd" + bytes(range(256))) is None  # no size
    assert content_size(b"not a zstd frame at all") is None
    assert content_size(b"") is None


@pytest.mark.parametrize("sizes", [[1], [300_001], [131_072, 131_072, 5],
                                   [1 << 20] * 3 + [17], [8] * 40])
def test_split_finds_every_frame_numcodecs_and_zstd_decode(sizes):
    datas = [_data(n, k) for k, n in enumerate(sizes)]
    frames = [Zstd(level=(1, 3, 9)[k % 3]).encode(d) for k, d in enumerate(datas)]
    blob = b"".join(frames)
    got = split(blob)
    assert got is not None and [f.content for f in got] == sizes
    at = 0
    for f, frame in zip(got, frames):
        assert f == Frame(at, len(frame), len(frame) and f.content)
        at += len(frame)
    # what a reader of the chunk file sees: one stream (numcodecs since 0.16.4)
    assert bytes(Zstd().decode(blob)) == b"".join(datas)
    out = np.empty(sum(sizes), np.uint8)
    Zstd().decode(blob, out=out)  # the batch reader decodes in place
    assert out.tobytes() == b"".join(datas)


def test_split_with_checksums_skippable_frames_and_no_declared_size():
    with_sum = zstandard.ZstdCompressor(write_checksum=True).compress(_data(70_000, 1))
    no_size = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    streamed = no_size.compress(_data(200_000, 2)) + no_size.flush()
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    blob = with_sum + skippable + streamed + Zstd().encode(_data(9, 3))
    got = split(blob)
    assert got is not None
    assert [(f.offset, f.content) for f in got] == [
        (0, 70_000), (len(with_sum) + 13, None), (len(blob) - got[2].length, 9)
    ]
    assert got[0].length == len(with_sum) and got[1].length == len(streamed)
    assert bytes(Zstd().decode(blob)) == _data(70_000, 1) + _data(200_000, 2) + _data(9, 3)


@pytest.mark.parametrize("cut", [1, 4, 5, 9, -5, -1])
def test_split_refuses_truncated_and_foreign_bytes(cut):
    frame = Zstd().encode(_data(300_000, 4))
    assert split(frame[:cut]) is None
    assert split(frame + frame[:cut]) is None
    assert split(b"not a zstd frame at all, but long enough to look") is None
    bad = bytearray(frame)
    bad[4] |= 0x08  # the header's reserved bit
    assert split(bytes(bad)) is None
    empty = Zstd().encode(b"")  # a valid frame of no content (numcodecs will not decode it)
    assert split(empty) == [Frame(0, len(empty), 0)] and split(b"") == []


def test_frame_cuts_are_aligned_and_cover_the_chunk():
    assert gpu_zstd.frame_cuts(100, 0) == [(0, 100)]
    assert gpu_zstd.frame_cuts(100, 100) == [(0, 100)]
    assert gpu_zstd.frame_cuts(0, 16) == [(0, 0)]
    for n, frame in [(1000, 100), (1001, 13), (128 << 20, 16 << 20), (9, 3), (37, 1)]:
        cuts = gpu_zstd.frame_cuts(n, frame)
        assert cuts[0][0] == 0 and cuts[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
        assert all(lo % 8 == 0 for lo, _ in cuts)
        assert all(0 < hi - lo <= max(8, frame) for lo, hi in cuts)


def test_frame_bytes_follow_the_config():
    import dask.config

    assert gpu_zstd.frame_bytes() == 16 << 20
    with dask.config.set({"dask-compact.batch.gpu-frame-bytes": 0}):
        assert gpu_zstd.frame_bytes() == 0
    with dask.config.set({"dask-compact.batch.gpu-frame-bytes": "4096"}):
        assert gpu_zstd.frame_bytes() == 4096


def test_chunk_frames_plans_what_nvcomp_can_take():
    one = Zstd().encode(_data(4096, 5))
    assert gpu_zstd.chunk_frames(one, 4096, "c/0") == [Frame(0, len(one), 4096)]
    parts = [_data(n, k) for k, n in enumerate([1024, 1024, 1000])]
    several = b"".join(Zstd().encode(p) for p in parts)
    plan = gpu_zstd.chunk_frames(several, 3048, "c/1")
    assert plan is not None and [f.content for f in plan] == [1024, 1024, 1000]
    # an output that would start off 8-byte alignment, or a frame that declares no size:
    # valid zstd, decoded on the CPU (None)
    odd = b"".join(Zstd().encode(_data(n, n)) for n in (1001, 1000))
    assert gpu_zstd.chunk_frames(odd, 2001, "c/2") is None
    streamed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    unsized = streamed.compress(_data(5000, 6)) + streamed.flush()
    assert gpu_zstd.chunk_frames(unsized, 5000, "c/3") is None
    with_empty = Zstd().encode(parts[0]) + zstandard.ZstdCompressor().compress(b"") + (
        Zstd().encode(parts[1]))
    assert gpu_zstd.chunk_frames(with_empty, 2048, "c/7") is None
    # the wrong total, a truncated chunk, foreign bytes: an error naming the chunk
    with pytest.raises(ValueError, match=r"c/4 decodes to 3048 bytes, not the chunk's 4000"):
        gpu_zstd.chunk_frames(several, 4000, "c/4")
    with pytest.raises(ValueError, match="c/5 is not a zstd frame of 3048 bytes"):
        gpu_zstd.chunk_frames(several[:-3], 3048, "c/5")
    with pytest.raises(ValueError, match="c/6 is not a zstd frame of 10 bytes"):
        gpu_zstd.chunk_frames(b"0123456789", 10, "c/6")
    # a frame of the chunk's size, then another (zarr refuses it; nvCOMP, handed the whole
    # file as one frame, decoded the first and ignored the rest)
    with pytest.raises(ValueError, match=r"c/8 decodes to 5120 bytes, not the chunk's 4096"):
        gpu_zstd.chunk_frames(one + Zstd().encode(parts[0]), 4096, "c/8")
    with pytest.raises(ValueError, match="c/9 is not a zstd frame of 4096 bytes"):
        gpu_zstd.chunk_frames(one + b"\0" * 10, 4096, "c/9")  # junk after it


def test_encoder_batch_gives_each_chunk_its_own_frames(monkeypatch):
    """One nvCOMP call encodes the frames of several chunks; each writer gets back its own
    chunk's frames, in order (the codec replaced: no device here)."""
    from dask_compact.batch import nvcomp_capi

    calls = []

    def fake_encode(frames, stream):
        calls.append(len(frames))
        return [f"enc({f})" for f in frames]

    monkeypatch.setattr(nvcomp_capi, "encode", fake_encode)
    enc = gpu_zstd._Encoder.__new__(gpu_zstd._Encoder)  # no thread: _process called here
    enc.stream = None
    items = [["a0", "a1"], ["b0"], ["c0", "c1", "c2"]]
    assert enc._process(items) == [["enc(a0)", "enc(a1)"], ["enc(b0)"],
                                   ["enc(c0)", "enc(c1)", "enc(c2)"]]
    assert calls == [6]
