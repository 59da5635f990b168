"""The choice of encoder for an output chunk held on a GPU under ``--encode auto``
(:mod:`dask_compact.batch.encode_choice`): the device's nvCOMP encoder, or the writer's CPU
core where the device's backlog would finish the chunk later. Runs on the CPU with made-up
paces; tests/gpu/test_batch_gpu.py runs jobs that encode on both."""

from __future__ import annotations

import threading

import pytest

from dask_compact.batch import encode_choice
from dask_compact.batch.encode_choice import BatchLoad, CpuEncodes

MB = 10**6


def test_the_wait_on_a_device_grows_with_its_backlog():
    load = BatchLoad()
    # nothing measured yet: the assumed pace
    assert load.rate == encode_choice.GPU_RATE
    assert load.wait(100 * MB) == pytest.approx(100 * MB / encode_choice.GPU_RATE)
    load.queued(400 * MB)
    load.batch_done(400 * MB, 0.1)  # 4 GB/s
    load.queued(100 * MB)
    load.batch_done(100 * MB, 0.15)  # a lone request, slower: the average is 2 GB/s
    assert load.pending == 0
    assert load.rate == pytest.approx(2e9)
    assert load.wait(100 * MB) == pytest.approx(0.05)
    load.queued(800 * MB)
    assert load.wait(100 * MB) == pytest.approx(0.45)


def test_a_core_takes_a_chunk_only_when_sooner_and_free():
    cpu = CpuEncodes(cores=2)
    n = 120 * MB  # 0.4 s at the assumed 0.3 GB/s
    assert not cpu.take(n, gpu_wait=0.2)  # the device is sooner
    assert cpu.take(n, gpu_wait=1.0)
    assert cpu.take(n, gpu_wait=1.0)
    assert not cpu.take(n, gpu_wait=10.0)  # both cores are encoding
    cpu.done(n, 0.2)  # measured: 0.6 GB/s
    assert cpu.rate == pytest.approx(0.6e9)
    assert cpu.take(n, gpu_wait=0.25)  # 0.2 s now beats 0.25
    cpu.done(n, 0.0)  # failed: the core is back, the pace unchanged
    cpu.done(n, 0.6)  # 0.2 GB/s, averaged in
    assert cpu.running == 0
    assert cpu.rate == pytest.approx(0.75 * 0.6e9 + 0.25 * 0.2e9)
    assert cpu.taken == 3


def test_cores_hold_under_many_writers():
    cpu = CpuEncodes(cores=3)
    got, lock = [], threading.Lock()
    start = threading.Barrier(16)

    def writer():
        start.wait()
        took = cpu.take(MB, gpu_wait=100.0)
        with lock:
            got.append(took)

    threads = [threading.Thread(target=writer) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(got) == 3 and cpu.running == 3


def test_the_process_counts_its_cores():
    assert encode_choice.cores() >= 1
    assert encode_choice.cpu_encodes() is encode_choice.cpu_encodes()
    assert encode_choice.cpu_encodes().cores == encode_choice.cores()


def test_the_summary_says_where_chunks_were_encoded():
    from dask_compact.cli import _encode_words

    assert _encode_words({"encode": "cpu", "cpu_encoded": 0, "gpu_encoded": 0}) == "CPU encode"
    assert _encode_words({"encode": "gpu", "cpu_encoded": 0, "gpu_encoded": 8}) == "GPU encode"
    assert (_encode_words({"encode": "gpu", "cpu_encoded": 3, "gpu_encoded": 5})
            == "GPU encode (3 of 8 chunks on the CPUs)")
