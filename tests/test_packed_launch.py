"""``cupy_launch.PackedLaunch.copy`` without a GPU: the ready call of a predicate that differs
from a kept one only in its constants takes a copy of the kept call's argument slots
(``cupy_ready.PackedKernel.rebound``), so the copy's pointer array must point at its own
slots, hold the same arguments, and never write the original's. CuPy is stood in for: the
slots are host memory, and no launch is made."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dask_compact.backends.cupy_launch import SLOT, PackedLaunch


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> PackedLaunch:
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        driver=types.SimpleNamespace(launchKernel=None)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return PackedLaunch(types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=4096)), 13)


def _slot(p: PackedLaunch, i: int, dtype: type) -> np.generic:
    return p._bytes[i * SLOT : i * SLOT + np.dtype(dtype).itemsize].view(dtype)[0]


def test_a_copy_points_at_slots_of_its_own_holding_the_same_arguments(launch):
    launch.pointer(0, 0xDEAD0000)
    launch.int64(2, -12345)
    launch.uint64(9, 2**64 - 1)
    launch.scalar(10, np.float32(0.5))
    launch.scalar(12, np.complex128(1.5 - 2j))
    other = launch.copy()
    base = other._slots.ctypes.data
    assert other._params.dtype == np.uint64
    assert other._params.tolist() == [base + SLOT * i for i in range(13)]
    assert other._params_ptr == other._params.ctypes.data != launch._params_ptr
    assert launch._params.tolist() == [launch._slots.ctypes.data + SLOT * i for i in range(13)]
    assert bytes(other._bytes) == bytes(launch._bytes)
    other.scalar(10, np.float32(0.25))
    other.int64(2, 7)
    assert _slot(launch, 10, np.float32) == 0.5 and _slot(other, 10, np.float32) == 0.25
    assert _slot(launch, 2, np.int64) == -12345 and _slot(other, 2, np.int64) == 7
    assert _slot(other, 12, np.complex128) == 1.5 - 2j
    assert other.kernel is launch.kernel and other._func == launch._func == 4096


def test_copies_of_copies_stay_apart(launch):
    launch.scalar(10, np.float64(1.0))
    copies = [launch]
    for i in range(5):
        c = copies[-1].copy()
        c.scalar(10, np.float64(i + 2.0))
        copies.append(c)
    assert [float(_slot(c, 10, np.float64)) for c in copies] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    for c in copies:
        assert c._params.tolist() == [c._slots.ctypes.data + SLOT * i for i in range(13)]
