"""The staging ring's bookkeeping (batch/staging.py) without a GPU: a stand-in for CuPy whose
"device" is host memory and whose copies are immediate, so that every offset, size and piece
handover of the ring's loops is checked here, with threads contending for two pieces. The
copies to real devices run in tests/gpu/test_batch_gpu.py."""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np
import pytest
from conftest import in_threads

from dask_compact.batch import staging


class _DeviceArray:
    """What the ring reads of a CuPy array: ``data.ptr`` and ``nbytes``."""

    def __init__(self, nbytes: int):
        self.host = np.zeros(nbytes, np.uint8)
        self.nbytes = nbytes
        self.data = types.SimpleNamespace(ptr=self.host.ctypes.data)


class _Event:
    def __init__(self, **kwargs):
        self.recorded = False

    def record(self, stream):
        self.recorded = True

    def synchronize(self):
        assert self.recorded


@pytest.fixture
def fake_cupy(monkeypatch):
    copies = []

    def memcpy_async(dst, src, n, kind, stream):
        copies.append(n)
        ctypes.memmove(dst, src, n)

    runtime = types.SimpleNamespace(memcpyAsync=memcpy_async, memcpyHostToDevice=1,
                                    memcpyDeviceToHost=2)  # fmt: skip
    cuda = types.SimpleNamespace(runtime=runtime, Event=_Event)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(staging, "pinned", lambda n: np.empty(n, np.uint8))
    return copies


def test_ring_copies_every_byte_in_order_with_threads_waiting_for_pieces(fake_cupy):
    ring = staging.StagingRing(0, pieces=2, piece_bytes=4096)
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)

    def work(seed):
        rng = np.random.default_rng(seed)
        for dtype in ("int8", "uint16", "float32", "float64"):
            for n in (0, 1, 31, 1023, 1024, 1025, 4096, 10_007):
                a = (rng.random(n) * 200 - 100).astype(dtype)
                d = _DeviceArray(a.nbytes)
                ring.to_device(d, a, stream)
                np.testing.assert_array_equal(d.host.view(dtype), a)
                back = np.empty_like(a)
                ring.to_host(back, d, stream)
                np.testing.assert_array_equal(back, a)

    in_threads(work, 6)
    assert max(fake_cupy) == 4096  # never more than a piece at a time
    assert sorted(ring._free) == [0, 1]  # every piece handed back


def test_gathered_parts_land_at_their_offsets_in_piece_sized_copies(fake_cupy):
    """A task's frames packed into one device buffer (gpu_zstd.decode_host): parts of any
    sizes, with gaps between them, smaller and larger than a piece and straddling pieces'
    edges, each lands at its offset, in copies of at most a piece, with threads contending."""
    ring = staging.StagingRing(0, pieces=2, piece_bytes=1000)
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            parts, at = [], int(rng.integers(0, 300))
            for _ in range(int(rng.integers(0, 12))):
                n = int(rng.choice([0, 1, 7, 999, 1000, 1001, 2500, int(rng.integers(1, 400))]))
                parts.append((at, rng.integers(0, 256, n, dtype=np.uint8)))
                at += n + int(rng.choice([0, 0, 1, 255]))
            d = _DeviceArray(at)
            d.host[:] = 7
            ring.gather_to_device(d.data.ptr, at, parts, stream)
            for off, data in parts:
                np.testing.assert_array_equal(d.host[off : off + data.nbytes], data)

    in_threads(work, 4)
    assert max(fake_cupy) <= 1000
    assert sorted(ring._free) == [0, 1]


def test_fill_piece_hands_the_next_piece_the_part_it_cut():
    parts = [(0, np.arange(5, dtype=np.uint8)), (8, np.arange(10, 30, dtype=np.uint8)),
             (30, np.arange(2, dtype=np.uint8))]
    pieces, at = [], 0
    for off in range(0, 32, 8):
        piece = np.zeros(min(8, 32 - off), np.uint8)
        at = staging.fill_piece(piece, off, parts, at)
        pieces.append((piece, at))
    assert [a for _, a in pieces] == [1, 1, 1, 3]  # the second part spans pieces 1 to 3
    got = np.concatenate([p for p, _ in pieces])
    assert list(got[:5]) == [0, 1, 2, 3, 4] and list(got[8:28]) == list(range(10, 30))
    assert list(got[30:]) == [0, 1]


def test_ring_refuses_what_it_cannot_copy(fake_cupy):
    ring = staging.StagingRing(0, pieces=1, piece_bytes=64)
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    with pytest.raises(ValueError, match="C-contiguous"):
        ring.to_device(_DeviceArray(40), np.zeros(10)[::2], stream)
    with pytest.raises(ValueError, match="40 host bytes to or from 32"):
        ring.to_device(_DeviceArray(32), np.zeros(5), stream)
    with pytest.raises(ValueError, match="host bytes to or from"):
        ring.to_host(np.zeros(3), _DeviceArray(32), stream)
    assert list(ring._free) == [0]


def test_one_gpu_keeps_the_threads_pinned_buffers():
    assert not staging.staged_devices(1) and staging.staged_devices(2)


def test_ring_pieces_are_smaller_where_one_process_drives_several_devices():
    """Each ring is registered into every device's context: with several devices the rings'
    set-up grows with their square, so their pieces are a quarter the size."""
    from dask_compact.batch import staging

    assert staging.piece_bytes(1) == staging.PIECE_BYTES == 32 << 20
    assert staging.piece_bytes(2) == staging.piece_bytes(4) == staging.SHARED_PIECE_BYTES
    assert staging.SHARED_PIECE_BYTES == 8 << 20
