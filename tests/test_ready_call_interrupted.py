"""The GPU's small ready call (``backends/cupy_ready.OneReadCall``) interrupted in its wait,
without a GPU: stand-ins for its kernel, its stream and the mapped count word, with the GPU's
work queued and run in order, a step at each look of the host at the word (the GPU moves on
while the host watches) and all of it when the stream is synchronised. The GPU file
``tests/gpu/test_one_read.py`` checks the same on the device
(``test_a_call_interrupted_in_its_wait_leaves_nothing_a_next_call_reads``)."""

from __future__ import annotations

import sys
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
              stream_ptr: int) -> None:
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
