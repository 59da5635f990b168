"""The GPU warm-up's steps (batch/warmup.py) without a GPU: a stand-in for CuPy with four
"devices" whose context creation, kernel preparation and ring registration are recorded, so
that what runs on which device, in which order, and what a closed warm-up no longer starts,
are checked here. The real steps run in tests/gpu/test_batch_gpu.py."""

from __future__ import annotations

import contextlib
import sys
import threading
import types

import numpy as np
import pytest
from conftest import until

from dask_compact.batch import staging, warmup


@pytest.fixture
def fake(monkeypatch):
    """``done``: the steps, as (step, device) in the order they ended; ``contexts`` and
    ``kernels``: set for those steps to go on; ``devices``: how many there are; ``waiting``:
    steps waiting for their gate."""
    state = types.SimpleNamespace(done=[], contexts=threading.Event(),
                                  kernels=threading.Event(), devices=4, waiting=0)
    state.contexts.set()
    state.kernels.set()
    lock = threading.Lock()
    local = threading.local()

    @contextlib.contextmanager
    def device(d):
        prev = getattr(local, "dev", None)
        local.dev = d
        try:
            yield
        finally:
            local.dev = prev

    def gate(event):
        with lock:
            state.waiting += 1
        assert event.wait(20)

    def free(ptr):
        gate(state.contexts)
        state.done.append(("context", local.dev))

    runtime = types.SimpleNamespace(getDeviceCount=lambda: state.devices, free=free)
    cuda = types.SimpleNamespace(runtime=runtime, Device=device)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))

    def prepare(cupy, d, where, dtype, mode):
        assert (where, dtype, mode) == ("x < 0.5", np.dtype("float32"), "values")
        gate(state.kernels)
        state.done.append(("kernels", d))

    def ring(d):
        assert local.dev == d  # registered under the device's context
        state.done.append(("ring", d))

    monkeypatch.setattr(warmup, "_prepare", prepare)
    monkeypatch.setattr(staging, "ring", ring)
    return state


def test_every_device_in_turn_when_the_chunks_are_not_known(fake):
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values")
    w.prepare("x > 9", np.dtype("int8"), "indices")  # a job asks once: ignored
    assert w.wait(timeout=30)
    w.close()
    assert w.devices == 4 and w.prepared
    assert _steps(fake, "context") == [0, 1, 2, 3]
    assert _steps(fake, "kernels") == [0, 1, 2, 3]
    assert [s for s, _ in fake.done if s != "context"] == ["kernels"] * 4 + ["ring"] * 4
    assert set(w.timeline()) == {"gpu_asked", "gpu_contexts", "gpu_backend", "gpu_kernels",
                                 "gpu_rings"}


def test_kernels_are_built_while_the_contexts_are_made(fake):
    """The predicate's kernels do not wait for the contexts (NVRTC needs none): with device
    0's context held up, device 0's kernels are built all the same."""
    fake.contexts.clear()
    w = warmup.GpuWarmup()
    until(lambda: fake.waiting == 1)  # device 0's context under way
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=1)
    until(lambda: ("kernels", 0) in fake.done)
    assert not any(s == "context" for s, _ in fake.done)
    fake.contexts.set()
    assert w.wait(timeout=30)
    assert w.devices == 1 and w.prepared
    assert sorted(fake.done) == [("context", 0), ("kernels", 0), ("ring", 0)]


def _steps(fake, step):
    return [d for s, d in fake.done if s == step]


def test_only_the_devices_the_job_uses_when_it_is_known_first(fake):
    """A job of two chunks runs on devices 0 and 1 (chunk i on device i % 4): asked for before
    the contexts are made, nothing is made on the others."""
    fake.contexts.clear()
    w = warmup.GpuWarmup()
    until(lambda: fake.waiting == 1)  # device 0's context under way
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=2)
    fake.contexts.set()
    assert w.wait(timeout=30)
    assert w.devices == 2 and w.prepared
    assert _steps(fake, "context") == [0, 1]
    assert _steps(fake, "kernels") == [0, 1] and _steps(fake, "ring") == [0, 1]


def test_a_job_known_late_gets_kernels_where_it_runs(fake):
    w = warmup.GpuWarmup()
    until(lambda: w.devices == 4)
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=1)
    assert w.wait(timeout=30)
    assert w.prepared
    assert sorted(fake.done[4:]) == [("kernels", 0), ("ring", 0)]


def test_a_closed_warmup_starts_no_further_step(fake):
    """The command's end stops the warm-up: the step under way ends, no other begins."""
    fake.kernels.clear()
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values")
    until(lambda: ("context", 3) in fake.done and fake.waiting == 5)  # device 0's kernels
    w.close(timeout=0.2)
    assert not w.wait(timeout=0)
    fake.kernels.set()
    assert w.wait(timeout=30)
    assert _steps(fake, "kernels") == [0]
    assert not w.prepared and "gpu_kernels" not in w.timeline()


def test_a_warmup_closed_before_it_was_asked_builds_nothing(fake):
    w = warmup.GpuWarmup()
    until(lambda: w.devices == 4)
    w.close(timeout=30)
    assert not w.prepared
    assert [s for s, _ in fake.done] == ["context"] * 4


def test_one_device_registers_no_ring(fake):
    fake.devices = 1  # one GPU: the job copies through the threads' own pinned buffers
    w = warmup.GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=5)
    assert w.wait(timeout=30)
    assert w.prepared
    assert sorted(fake.done) == [("context", 0), ("kernels", 0)]


def test_one_device_registers_its_ring_for_the_gpu_codec(fake):
    fake.devices = 1  # nvCOMP's codec copies through the ring on one GPU too
    w = warmup.GpuWarmup(rings=True)
    w.prepare("x < 0.5", np.dtype("float32"), "values", chunks=5)
    assert w.wait(timeout=30)
    assert sorted(fake.done) == [("context", 0), ("kernels", 0), ("ring", 0)]
