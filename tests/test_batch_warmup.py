"""The GPU warm-up's order of steps (batch/warmup.py) without a GPU: a stand-in for CuPy with
four "devices" whose context creation, kernel preparation and ring registration are recorded,
so that what runs on which device, side by side, and what a closed warm-up no longer starts,
are checked here. The real steps run in tests/gpu/test_batch_gpu.py."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import types

import numpy as np
import pytest

from dask_compact.batch import staging, warmup

DEVICES = 4


@pytest.fixture
def fake(monkeypatch):
    """``done``: the steps each device went through, as (step, device) in the order they
    ended; ``gate``: set for the kernels' step to go on; ``devices``: how many there are."""
    done: list[tuple[str, int]] = []
    state = types.SimpleNamespace(done=done, gate=threading.Event(), devices=DEVICES,
                                  waiting=0)
    state.gate.set()
    lock = threading.Lock()
    local = threading.local()
    # Every device's context is created while the others' are: their threads meet here.
    together: list[threading.Barrier] = []

    def count():
        together.append(threading.Barrier(state.devices, timeout=20))
        return state.devices

    @contextlib.contextmanager
    def device(d):
        prev = getattr(local, "dev", None)
        local.dev = d
        try:
            yield
        finally:
            local.dev = prev

    def free(ptr):
        together[0].wait()
        with lock:
            done.append(("context", local.dev))

    runtime = types.SimpleNamespace(getDeviceCount=count, free=free)
    cuda = types.SimpleNamespace(runtime=runtime, Device=device)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))

    def prepare(cupy, d, where, dtype, mode):
        assert (where, dtype, mode) == ("x < 0.5", np.dtype("float32"), "values")
        with lock:
            state.waiting += 1
        state.gate.wait(20)
        with lock:
            done.append(("kernels", d))

    def ring(d):
        assert local.dev == d  # registered under the device's context
        with lock:
            done.append(("ring", d))

    monkeypatch.setattr(warmup, "_prepare", prepare)
    monkeypatch.setattr(staging, "ring", ring)
    return state


def test_every_device_gets_its_context_at_once_and_kernels_where_the_job_runs(fake):
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=2)
    assert w.wait(timeout=30)
    w.close()
    assert w.devices == DEVICES and w.prepared
    assert sorted(d for s, d in fake.done if s == "context") == [0, 1, 2, 3]
    # A job of two chunks uses devices 0 and 1 (chunk i on device i % 4): nothing else built
    assert sorted(d for s, d in fake.done if s == "kernels") == [0, 1]
    assert sorted(d for s, d in fake.done if s == "ring") == [0, 1]  # several devices: rings
    for d in (0, 1):
        assert fake.done.index(("kernels", d)) < fake.done.index(("ring", d))
    assert set(w.timeline()) == {"gpu_contexts", "gpu_kernels", "gpu_rings"}


def test_every_device_is_prepared_when_the_chunks_are_not_known(fake):
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values")
    w.prepare("x > 9", np.dtype("int8"), "indices")  # a job asks once: ignored
    assert w.wait(timeout=30)
    assert w.prepared
    assert sorted(d for s, d in fake.done if s == "kernels") == [0, 1, 2, 3]


def test_a_closed_warmup_starts_no_further_step(fake):
    """The job's end stops the warm-up: kernels under way end, no ring is registered after."""
    fake.gate.clear()  # the kernels' step waits until released
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=8)
    while fake.waiting < DEVICES:  # every device's kernels under way
        time.sleep(0.01)
    w.close(timeout=0.2)  # they are still being built
    assert not w.wait(timeout=0)
    fake.gate.set()
    assert w.wait(timeout=30)
    assert sorted(d for s, d in fake.done if s == "kernels") == [0, 1, 2, 3]
    assert not [d for s, d in fake.done if s == "ring"]
    assert "gpu_rings" not in w.timeline()


def test_a_warmup_closed_before_it_was_asked_builds_nothing(fake):
    w = warmup.GpuWarmup()
    w.close(timeout=30)
    assert w.devices == DEVICES and not w.prepared
    assert [s for s, _ in fake.done] == ["context"] * DEVICES


def test_one_device_registers_no_ring(fake):
    fake.devices = 1  # one GPU: the job copies through the threads' own pinned buffers
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=5)
    assert w.wait(timeout=30)
    assert w.prepared
    assert fake.done == [("context", 0), ("kernels", 0)]
