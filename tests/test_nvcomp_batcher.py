"""The batching of nvCOMP requests (:class:`dask_compact.batch.gpu_zstd._Batcher`): requests
queued by many threads while a batch runs make the next batch, each result goes back to its
own request, and a request that fails a batch fails alone. Runs on the CPU: the codec and the
device are replaced; the GPU suite decodes real frames (tests/gpu/test_batch_gpu.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dask_compact.batch import gpu_zstd


class Upper(gpu_zstd._Batcher):
    """Upper-cases strings, a batch at a time, slowly enough for requests to queue."""

    kind = "test"
    max_items = 4
    max_bytes = 1 << 20

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lengths: list[list[int]] = []
        super().__init__(dev=0)

    def _on_device(self):
        return contextlib.nullcontext()

    def _process(self, items):
        self.sizes.append(len(items))
        self.lengths.append([len(s) for s in items])
        time.sleep(0.02)
        if any("bad" in s for s in items):
            raise ValueError("a bad frame in this batch")
        return [KeyError(s) if s.startswith("own") else s.upper() for s in items]


def test_requests_of_many_threads_are_batched_and_answered_each():
    b = Upper()
    words = [f"word{k}" for k in range(40)]
    start = threading.Barrier(len(words))

    def ask(w):
        start.wait()
        return b.submit(w, len(w)).result(timeout=30)

    with ThreadPoolExecutor(len(words)) as pool:
        got = list(pool.map(ask, words))
    assert got == [w.upper() for w in words]
    assert b.requests == len(words)
    assert b.batches < len(words)  # 40 requests at once: batches of up to 4
    assert max(b.sizes) == 4 and sum(b.sizes) == len(words)


def test_a_bad_request_fails_alone():
    b = Upper()
    words = ["a", "b", "bad", "c", "d", "e", "f", "g"]
    start = threading.Barrier(len(words))

    def ask(w):
        start.wait()
        return b.submit(w, 1)

    with ThreadPoolExecutor(len(words)) as pool:
        futs = list(pool.map(ask, words))
    for w, f in zip(words, futs):
        if w == "bad":
            with pytest.raises(ValueError, match="bad frame"):
                f.result(timeout=30)
        else:
            assert f.result(timeout=30) == w.upper()


def test_a_batch_stops_at_its_bytes():
    b = Upper()
    b.max_bytes = 10
    words = ["x" * 3] + ["y" * 6] * 6
    futs = [b.submit(w, len(w)) for w in words]
    assert [f.result(timeout=30) for f in futs] == [w.upper() for w in words]
    # a batch takes one more request while its bytes are under the limit, never past it
    assert all(sum(lens[:-1]) < 10 for lens in b.lengths)
    assert sum(map(len, b.lengths)) == len(words) and max(map(sum, b.lengths)) > 6


def test_decode_tasks_per_device_follow_the_config():
    import dask.config

    assert gpu_zstd.decode_threads(2) == 64
    with dask.config.set({"dask-compact.batch.gpu-decode-tasks": 5}):
        assert gpu_zstd.decode_threads(4) == 20


def test_a_request_failing_on_its_own_fails_alone_without_a_retry():
    b = Upper()
    words = ["a", "own-failure", "b", "c"]
    futs = [b.submit(w, 1) for w in words]
    with pytest.raises(KeyError, match="own-failure"):
        futs[1].result(timeout=30)
    assert [futs[k].result(timeout=30) for k in (0, 2, 3)] == ["A", "B", "C"]
    assert sum(b.sizes) == len(words)  # every request processed once


@pytest.mark.parametrize("wait_s", [0.0, 2.0])
def test_a_batch_waits_for_announced_requests_only_when_told(wait_s):
    """Requests announced before the first is queued and submitted 50 ms apart: one batch
    where the batcher waits for announced requests, separate batches where it does not."""
    b = Upper()
    b.wait_s = wait_s
    words = ["one", "two", "three"]
    ready = threading.Barrier(len(words) + 1)

    def ask(k, w):
        with b.announced() as token:
            ready.wait()
            time.sleep(0.05 * k)
            return b.submit(w, len(w), token).result(timeout=30)

    with ThreadPoolExecutor(len(words)) as pool:
        futs = [pool.submit(ask, k, w) for k, w in enumerate(words)]
        ready.wait()
        assert [f.result(timeout=30) for f in futs] == [w.upper() for w in words]
    assert b.coming == 0
    assert (b.sizes == [3]) if wait_s else (b.sizes[0] == 1 and len(b.sizes) >= 2)


def test_an_announced_request_that_never_comes_holds_a_batch_no_longer_than_its_block():
    b = Upper()
    b.wait_s = 30.0
    left = threading.Event()

    def announce_and_leave():
        with b.announced():
            left.wait(30)  # never submits: an error in its copies, say

    t = threading.Thread(target=announce_and_leave)
    t.start()
    deadline = time.monotonic() + 10
    while not b.coming and time.monotonic() < deadline:
        time.sleep(0.001)
    fut = b.submit("alone", 5)
    time.sleep(0.1)
    assert not fut.done()  # waiting for the announced one
    t0 = time.monotonic()
    left.set()
    assert fut.result(timeout=30) == "ALONE"
    assert time.monotonic() - t0 < 5 and b.coming == 0
    t.join()


class Held(Upper):
    """Says when a batch has begun (``started``) and holds it until ``go`` is set."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()
        super().__init__()

    def _process(self, items):
        self.started.set()
        self.go.wait(30)
        return super()._process(items)


def test_a_request_cancelled_while_queued_is_dropped_and_a_running_one_cannot_be():
    """A writer whose chunk leaves the encoder's queue for the CPU cancels its request
    (gpu_zstd.encode's give_up): no batch runs it; once a batch has taken a request, the
    cancel fails and its writer gets the result."""
    b = Held()
    first = b.submit("a" * 10, 10)
    assert b.started.wait(30)  # the first batch holds "a" * 10 alone
    queued = [b.submit(w, len(w)) for w in ("bb", "cc", "dd")]
    assert not first.cancel() and first.running()
    assert queued[1].cancel() and not queued[0].running()
    b.go.set()
    assert first.result(timeout=30) == "A" * 10
    assert [queued[k].result(timeout=30) for k in (0, 2)] == ["BB", "DD"]
    assert queued[1].cancelled()
    assert b.lengths == [[10], [2, 2]]
