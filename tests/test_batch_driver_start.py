"""CUDA's start through the driver library (batch/driver_start.py) without a driver: a stand-in
for libcuda records the calls, so what is retained, how many devices, and that every reference
is given back, are checked here. The real library runs in the GPU tests' batch jobs."""

from __future__ import annotations

import pytest

from dask_compact.batch import driver_start


class _FakeCuda:
    def __init__(self, devices=4, init=0):
        self.devices, self.init = devices, init
        self.calls: list[tuple] = []
        self.held: dict[int, int] = {}

    def cuInit(self, flags):
        self.calls.append(("init", flags))
        return self.init

    def cuDeviceGetCount(self, p):
        p._obj.value = self.devices
        return 0

    def cuDeviceGet(self, p, i):
        p._obj.value = 100 + i  # a handle is not the ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, p, dev):
        self.held[dev.value] = self.held.get(dev.value, 0) + 1
        p._obj.value = 0xC0 + dev.value
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, dev):
        self.held[dev.value] -= 1
        return 0


@pytest.fixture
def cuda(monkeypatch):
    lib = _FakeCuda()
    monkeypatch.setattr(driver_start, "LIBRARY", "libcuda.so.1")
    monkeypatch.setattr(driver_start.ctypes, "CDLL", lambda name: lib)
    return lib


def test_contexts_of_the_devices_asked_for_then_given_back(cuda):
    asked = []

    def devices(n):
        asked.append(n)
        return 2  # a job of two chunks

    d = driver_start.DriverStart(devices)
    assert d.wait(timeout=30)
    assert cuda.calls == [("init", 0)]
    assert cuda.held == {100: 1, 101: 1} and d.retained == 2
    assert set(asked) == {4} and len(asked) == 3  # asked before each device, and once more
    d.release()
    assert cuda.held == {100: 0, 101: 0} and d.retained == 0
    d.release()  # twice: nothing more
    assert cuda.held == {100: 0, 101: 0}


def test_every_device_while_the_job_is_not_known(cuda):
    d = driver_start.DriverStart(lambda n: n)
    d.release()  # waits for the thread first
    assert cuda.held == {100: 0, 101: 0, 102: 0, 103: 0}


def test_a_driver_that_fails_to_start_is_left_alone(cuda):
    cuda.init = 100  # CUDA_ERROR_NO_DEVICE
    d = driver_start.DriverStart(lambda n: n)
    d.release()
    assert cuda.held == {} and d.retained == 0


def test_no_driver_library_does_nothing(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(driver_start, "LIBRARY", "libcuda.so.1")
    monkeypatch.setattr(driver_start.ctypes, "CDLL", missing)
    d = driver_start.DriverStart(lambda n: n)
    assert d.wait(timeout=30)
    d.release()
    assert d.retained == 0

