"""The GPU's small ready call (``backends/cupy_ready.OneReadCall``) interrupted in its wait,
without a GPU: stand-ins for its kernel, its stream and the mapped count word, with the GPU's
work queued and run in order, a step at each look of the host at the word (the GPU moves on
while the host watches) and all of it when the stream is synchronised. The GPU file
``tests/gpu/test_one_read.py`` checks the same on the device
(``test_a_call_interrupted_in_its_wait_leaves_nothing_a_next_call_reads``).

The same for the other GPU calls that leave host-visible work queued when interrupted before
their wait: the counts' read backs (``cupy_device.read_counts``, ``read_words``: one pinned
buffer per thread, streams as stand-ins; on the device in ``tests/gpu/test_threads_streams.py``)
and the records' ready call (``cupy_records_ready.RecordsCall``: two pinned tables in turn;
on the device in ``tests/gpu/test_records_ready.py``)."""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

import numpy as np
import pytest

from dask_compact.backends import cupy_ready


class _Device:
    """The GPU's queue: work run in stream order, a step at a time or all at once."""

    def __init__(self) -> None:
        self.queued: list[Any] = []

    def step(self) -> None:
        if self.queued:
            self.queued.pop(0)()

    def synchronize(self) -> None:
        while self.queued:
            self.step()


class _Word(np.ndarray):
    """The mapped count word as the host reads it: a look at a word that holds no count yet
    lets the GPU run one step (it moves on while the host waits), and where ``armed`` holds
    an exception class the look raises it first (a KeyboardInterrupt landing in the wait)."""

    device: _Device
    armed: list[Any]

    def __getitem__(self, i: Any) -> Any:
        if _Word.armed:
            raise _Word.armed.pop()()
        if super().__getitem__(0) == cupy_ready._NOT_YET:
            _Word.device.step()
        return super().__getitem__(i)


class _Kernel:
    """The packed compaction kernel: a launch queues the store of its input's count (the
    stand-in input's pointer) into the count word."""

    hybrid = False

    def __init__(self, device: _Device, word: np.ndarray) -> None:
        self.device, self.word = device, word

    def queue(self, a_ptr: int, base: int, vals_ptr: int, idx_ptr: int, count_ptr: int,
              stream_ptr: int, cap: Any = None) -> None:
        def store() -> None:
            self.word[0] = a_ptr

        self.device.queued.append(store)


def _ready_call(device: _Device, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A mapped OneReadCall of 1024 float32 values over the stand-ins; it returns the count
    it read (its copy out's length)."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())  # imported, not used
    word = np.zeros(1, np.uint64)
    monkeypatch.setattr(_Word, "device", device, raising=False)
    monkeypatch.setattr(_Word, "armed", [], raising=False)
    call = object.__new__(cupy_ready.OneReadCall)
    call.n, call.dtype, call.output, call.memo = 1024, np.dtype(np.float32), "values", None
    call.kernel = _Kernel(device, word)
    call.copy_out = lambda scratch, k, stream_ptr: k
    call.mapped = True
    call.host_mem = types.SimpleNamespace(ptr=1 << 20)
    call.host_count = word.view(_Word)
    call.stream = types.SimpleNamespace(ptr=0, synchronize=device.synchronize)
    call.keep = True
    call.vals = types.SimpleNamespace(data=types.SimpleNamespace(ptr=1 << 24))
    call.idx = None
    return call


def _input(count: int) -> Any:
    """A stand-in input whose kernel selects ``count`` elements."""
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=count))


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_a_ready_call_interrupted_in_its_wait_leaves_no_late_count(error, monkeypatch):
    """A small GPU call watches the count its kernel stores into mapped host memory. One
    interrupted in that wait (Ctrl-C, or anything raised there) left its kernel running, and
    the next call on the same ready call reset the word and watched it while that kernel was
    still to store its count: it took the interrupted call's count for its own (here 5 of
    its 9). Until 2026-12-01 (fourteenth session; left by the thirteenth session's probes):
    the interrupted call now waits for its stream before it raises, leaving nothing queued,
    and the next call reads its own count."""
    device = _Device()
    call = _ready_call(device, monkeypatch)
    assert call(_input(7), 0) == 7  # the plain call: its own count
    _Word.armed.append(error)
    with pytest.raises(error):
        call(_input(5), 0)
    assert not device.queued, "the interrupted call left its kernel running"
    assert call(_input(9), 0) == 9
    assert call(_input(0), 0) == 0


class _Streams:
    """The GPU's streams: each runs its own work in order; a stream's synchronisation runs
    its work, then the other streams move on too (their copies land after its own, before
    the host reads). ``armed``: an exception class the next synchronisation raises before it
    waits (a KeyboardInterrupt landing between a call's copies and its wait)."""

    def __init__(self) -> None:
        self.queued: dict[int, list[Any]] = {}
        self.armed: list[Any] = []

    def stream(self, ptr: int) -> Any:
        def synchronize() -> None:
            if self.armed:
                raise self.armed.pop()()
            for p in [ptr, *self.queued]:
                while self.queued.get(p):
                    self.queued[p].pop(0)()

        return types.SimpleNamespace(ptr=ptr, synchronize=synchronize)

    def busy(self) -> bool:
        return any(self.queued.values())


def _fake_cupy(streams: _Streams, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A stand-in CuPy whose copies are queued on their stream and read their source when they
    run; the returned list holds the current stream."""
    import ctypes

    current = [streams.stream(1)]

    def memcpy_async(dst: int, src: int, n: int, kind: int, stream_ptr: int) -> None:
        streams.queued.setdefault(stream_ptr, []).append(lambda: ctypes.memmove(dst, src, n))

    runtime = types.SimpleNamespace(memcpyAsync=memcpy_async, memcpyDeviceToHost=2)
    cuda = types.SimpleNamespace(runtime=runtime, get_current_stream=lambda: current[0],
                                 alloc_pinned_memory=bytearray)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    return current


def _words(*values: int) -> Any:
    """Device count words as the read backs see them (``data.ptr``, ``size``)."""
    w = np.array(values, np.uint64)
    return types.SimpleNamespace(host=w, size=w.size, data=types.SimpleNamespace(ptr=w.ctypes.data))


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
@pytest.mark.parametrize("how", ["read_counts", "read_words"])
def test_a_read_back_interrupted_before_its_wait_leaves_no_late_copy(error, how, monkeypatch):
    """The counts' read backs (``cupy_device.read_counts``, ``read_words``) copy device words
    into one pinned buffer per thread, then synchronise the stream. One interrupted between
    its copies and its wait (Ctrl-C, or anything raised there) left its copy queued, to land
    during the thread's next read back on another stream, after that read's own copy and
    before its host read: it returned the interrupted call's 5 for its 9. Until 2026-12-01
    (fourteenth session; noted by the ready call's fix, daeb377): the interrupted read back
    now waits for its stream before it raises."""
    from dask_compact.backends import cupy_device

    monkeypatch.setattr(cupy_device, "_count_buffers", threading.local())
    streams = _Streams()
    current = _fake_cupy(streams, monkeypatch)
    a, b = current[0], streams.stream(2)

    held = []  # the device words live on (a late copy reads its own call's)

    def read(*values: int) -> list[int]:
        w = _words(*values)
        held.append(w)
        if how == "read_counts":
            return cupy_device.read_counts([types.SimpleNamespace(data=types.SimpleNamespace(
                ptr=w.data.ptr + 8 * i)) for i in range(len(values))])
        return cupy_device.read_words(w)

    assert read(7, 3) == [7, 3]
    streams.armed.append(error)
    with pytest.raises(error):
        read(5, 6)
    assert not streams.busy(), "the interrupted read back left its copy queued"
    current[0] = b  # the thread's next read back, on another stream
    assert read(9, 4) == [9, 4]
    current[0] = a  # and on the same one
    assert read(11, 0) == [11, 0]


def _records_call(device: _Device, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A RecordsCall of one 4-byte field over stand-ins: the GPU's queue (run only when the
    stream is synchronised: a GPU behind the host), copies queued on it that read their
    source when they run, passes that store the total, and a copy pass that records the
    column table it reads (from the workspace's table, as the copy kernels do)."""
    import ctypes

    from dask_compact.backends import cupy_records_ready as rr

    def memcpy_async(dst: int, src: int, n: int, kind: int, stream_ptr: int) -> None:
        device.queued.append(lambda: ctypes.memmove(dst, src, n))

    runtime = types.SimpleNamespace(memcpyAsync=memcpy_async, memcpyDeviceToHost=2,
                                    memcpyHostToDevice=1)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=runtime)))
    made: list[Any] = []  # the outputs, kept (a pointer of each)

    def output(rows: int) -> Any:
        made.append(np.empty(max(rows, 1), np.float32))
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=made[-1].ctypes.data),
                                     shape=(rows,), nbytes=4 * rows)

    monkeypatch.setattr(rr, "output_empty", lambda total, dtype, tail=(): output(total))
    call = object.__new__(rr.RecordsCall)
    call.n, call.tiles, call.indices, call.device = 1 << 20, 4, False, 0
    call.layout = [("x", np.dtype(np.float32), (), 4)]
    call.tables = np.zeros((2, 4), np.int64)
    call.turn, call.last_total = 0, None
    call.host = np.zeros(3, np.uint64)
    call.ws = device_ws = np.zeros(16, np.int64)  # the counts (tiles + 3 words), the table
    call.counts_ptr, call.table_ptr = device_ws.ctypes.data, device_ws.ctypes.data + 8 * 8
    call.stream = types.SimpleNamespace(ptr=0, synchronize=device.synchronize)
    call.seen = []  # per copy pass: the column table it read

    def passes(fields: dict[str, Any], sp: int) -> None:
        def store() -> None:
            device_ws[call.tiles:call.tiles + 3] = (fields["x"].rows, 1, 0)

        device.queued.append(store)

    def copy(table: int, ncols: int, idx: int, index_base: int, lengths: Any, sp: int) -> None:
        device.queued.append(lambda: call.seen.append(device_ws[8:8 + 4 * ncols].tolist()))

    call._queue_passes, call._queue_copy = passes, copy
    # every previous total has its outputs made early: the table written before the sync
    call._early_outputs = lambda total: None if not total else ({"x": output(total)}, None)
    return call


def _fields(rows: int) -> dict[str, Any]:
    """A stand-in field whose passes select ``rows`` rows."""
    return {"x": types.SimpleNamespace(rows=rows, data=types.SimpleNamespace(ptr=rows << 12))}


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_a_records_call_interrupted_before_its_sync_leaves_no_table_upload_queued(
        error, monkeypatch):
    """The records' ready call (``cupy_records_ready.RecordsCall``) writes its column table
    into one of two pinned tables in turn, before its sync where it makes its outputs early,
    relying on the call between to have synchronised (the other table's upload has then
    run). One interrupted before its sync (Ctrl-C, or anything raised there) broke that: the
    next call wrote its table over the one the call before the interrupted one had queued
    after its sync and the GPU had still to upload, and that call's copy ran with the next
    call's column table (its outputs unwritten, the next call's written with its selection).
    Until 2026-12-01 (fourteenth session; a sweep after the ready call's fix, daeb377): the
    interrupted call now waits for its stream before it raises."""
    device = _Device()
    call = _records_call(device, monkeypatch)
    first = call(_fields(300), 0)  # no previous total: its table written after its sync
    want = [(300 << 12), first["x"].data.ptr, 4, 1]
    armed = [error]
    real_sync = call.stream.synchronize

    def sync() -> None:
        if armed:
            raise armed.pop()()
        real_sync()

    call.stream.synchronize = sync
    with pytest.raises(error):
        call(_fields(500), 0)
    assert not device.queued, "the interrupted call left its work queued"
    third = call(_fields(700), 0)
    device.synchronize()
    assert call.seen[0] == want, "the first call's copy read another call's column table"
    assert call.seen[-1] == [(700 << 12), third["x"].data.ptr, 4, 1]
