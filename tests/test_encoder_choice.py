"""The choice between nvCOMP's encoder and the writers' CPU threads for an output chunk under
``--encode auto`` (:mod:`dask_compact.batch.encoder_choice`): a device's GPU path one server
whose rate its written chunks measure, the CPUs one server per core at the rate one thread's
CPU time measures, a chunk to the path where it is expected to be written sooner, one CPU
trial before the CPUs have a rate, and queued GPU chunks that ask again. Runs on the CPU with
two cores assumed: the times are set by hand; the GPU suite runs jobs that choose
(tests/gpu/test_batch_gpu.py)."""

from __future__ import annotations

import pytest

from dask_compact.batch import encoder_choice as ec

MiB = 1 << 20
NOW = 1000.0


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(ec, "_clock", lambda: NOW)
    monkeypatch.setattr(ec, "_cpu_clock", lambda: NOW)
    monkeypatch.setattr(ec, "CORES", 2)
    ec.forget()
    yield
    ec.forget()


def took(ticket: ec.Ticket, seconds: float) -> None:
    """``ticket``'s chunk written ``seconds`` after its choice (or its move): on a CPU, its
    thread's CPU time."""
    ticket.t0 = ticket.c0 = NOW - seconds
    ticket.done()


def measured(gpu_rate: float, cpu_rate: float) -> None:
    """Both paths measured at these rates (bytes/s), nothing left on either."""
    trial, cpu = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert trial.gpu and trial.trial and not cpu.gpu
    took(trial, 128 * MiB / gpu_rate)
    took(cpu, 128 * MiB / cpu_rate)
    assert ec.rates() == {"cpu": pytest.approx(cpu_rate), "gpu0": pytest.approx(gpu_rate)}
    assert ec.live_bytes() == 0


def test_one_chunk_at_a_time_tries_a_gpu_before_it_has_a_rate_the_others_go_to_the_cpus():
    """The writers choose as the pieces come, most before any chunk is written: only one of
    them waits on a device not yet measured."""
    tickets = [ec.choose(0, 128 * MiB) for _ in range(5)]
    assert [t.gpu for t in tickets] == [True, False, False, False, False]
    assert tickets[0].trial and not any(t.trial for t in tickets[1:])
    assert [t.ahead for t in tickets[1:]] == [k * 128 * MiB for k in range(4)]
    assert not tickets[0].better_on_cpu()  # the trial stays to measure its device
    assert ec.chosen() == {"gpu": 1, "cpu": 4, "moved": 0}
    assert ec.live_bytes() == 5 * 128 * MiB
    tickets[0].abandoned()  # it failed: another chunk tries the device
    again = ec.choose(0, 128 * MiB)
    assert again.gpu and again.trial and again.ahead == 0
    took(again, 0.125)
    assert ec.rates() == {"cpu": None, "gpu0": pytest.approx(1 << 30)}
    # the GPU measured, the CPUs not yet: they take the chunks until they have a rate
    assert not ec.choose(0, 128 * MiB).gpu


def test_a_gpu_chunk_measures_its_path_with_what_was_ahead_of_it():
    measured(1 << 30, 64 * MiB)  # the CPUs slow: the GPU takes the next chunks
    first, second = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert first.gpu and second.gpu and second.ahead == 128 * MiB
    took(first, 0.125)  # 128 MiB alone in 1/8 s: 1 GiB/s
    assert ec.rates()["gpu0"] == pytest.approx(1 << 30)
    took(second, 0.5)  # 256 MiB (its own and the first's) in 1/2 s: 512 MiB/s
    assert ec.rates()["gpu0"] == pytest.approx((1 - ec.WEIGHT) * (1 << 30) + ec.WEIGHT * 512 * MiB)
    assert ec.choose(0, 1).ahead == 0  # both written: nothing ahead


@pytest.mark.parametrize("gpu_ahead, on_gpu", [(0, True), (127, True), (129, False),
                                              (2048, False)])
def test_a_chunk_goes_where_it_is_expected_to_be_written_sooner(gpu_ahead, on_gpu):
    """GPU path 1 GiB/s, the CPUs 0.25 s for a 128 MiB chunk: on the GPU it is written
    (gpu_ahead + 128 MiB) / 1 GiB/s after its choice, level at 128 MiB ahead."""
    assert ec.prefers_gpu(float(1 << 30), gpu_ahead * MiB, 0.25, 128 * MiB) is on_gpu


def test_the_cpus_are_a_server_per_core_at_one_cores_rate():
    """A CPU chunk measures one core's rate (its thread's CPU time), whatever else ran beside
    it; a new chunk takes its own time while a core is free, else its share of the work ahead
    on every core."""
    measured(1 << 30, 512 * MiB)
    side_by_side = [ec.choose(0, 128 * MiB) for _ in range(3)]
    assert [t.gpu for t in side_by_side] == [True, True, False]  # 0.125, 0.25 vs 0.375 s
    took(side_by_side[2], 0.5)  # 128 MiB in 0.5 s of its thread's CPU time: 256 MiB/s
    assert ec.rates()["cpu"] == pytest.approx((512 + 256) / 2 * MiB)
    cpu = ec._path(ec.CPU)
    assert ec._cpu_seconds(cpu, 128 * MiB) == pytest.approx(128 / 384)  # nothing in flight
    busy = [ec.Ticket(0, 128 * MiB, False, 0) for _ in range(2)]
    for t in busy:
        cpu.live[t.number] = t.nbytes
    # both cores busy: (256 + 128) MiB over 2 x 384 MiB/s = 0.5 s
    assert ec._cpu_seconds(cpu, 128 * MiB) == pytest.approx(0.5)
    cpu.live.pop(busy[0].number)
    assert ec._cpu_seconds(cpu, 128 * MiB) == pytest.approx(128 / 384)  # a core is free


def test_choices_follow_the_rule_on_both_paths():
    measured(1 << 30, 512 * MiB)
    assert ec.choose(0, 128 * MiB).gpu  # 0.125 s against 0.25 s
    assert ec.choose(0, 128 * MiB).gpu  # 128 MiB ahead on the GPU: level, 0.25 s
    third = ec.choose(0, 128 * MiB)
    assert not third.gpu  # 256 MiB ahead there: 0.375 s against 0.25 s
    assert third.ahead == 0
    assert not ec.choose(0, 128 * MiB).gpu  # one core still free: 0.25 s against 0.375 s
    # both cores busy: (256 + 128) MiB over 2 x 512 MiB/s = 0.375 s, level: the GPU
    assert ec.choose(0, 128 * MiB).gpu
    assert ec.live_bytes() == 5 * 128 * MiB


def test_each_device_has_its_own_path_and_its_own_trial():
    measured(256 * MiB, 512 * MiB)  # a slow device 0
    assert not ec.choose(0, 128 * MiB).gpu  # 128 MiB at 256 MiB/s: 0.5 s against 0.25 s
    trial = ec.choose(1, 128 * MiB)
    assert trial.gpu and trial.trial  # device 1 not measured yet: one chunk tries it
    assert not ec.choose(1, 128 * MiB).gpu
    assert set(ec.rates()) == {"cpu", "gpu0"}


def test_a_gpu_that_slows_loses_its_chunks():
    """Rates move with the job: a GPU that slows (shared with other work) loses its chunks
    as its writes show it."""
    measured(2 << 30, 512 * MiB)
    a, b = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert a.gpu and b.gpu  # b: 256 MiB at 2 GiB/s, 0.125 s against 0.25
    took(a, 2.0)  # 128 MiB in 2 s
    took(b, 2.0)  # 256 MiB (a's and its own) in 2 s
    assert ec.rates()["gpu0"] < 700 * MiB
    assert ec.choose(0, 128 * MiB).gpu  # nothing ahead: 0.21 s against 0.25
    assert not ec.choose(0, 128 * MiB).gpu  # 128 MiB ahead: 0.42 s against 0.25


def test_queued_gpu_chunks_move_to_the_cpus_once_the_rates_say_so():
    """A chunk the rule sent to the GPU asks again while it waits in the device's queue, with
    the bytes ahead of it on both paths then."""
    measured(2 << 30, 1 << 30)
    queued = [ec.choose(0, 128 * MiB) for _ in range(3)]
    # 0.0625 and 0.125 s (level) on the GPU against 0.125 s; the third 0.1875 s: the CPUs
    assert [t.gpu for t in queued] == [True, True, False]
    took(queued[0], 1.0)  # the device slowed: 128 MiB in 1 s, its rate 1088 MiB/s
    assert not queued[1].better_on_cpu()  # nothing ahead of it now: 0.118 s against 0.125 s
    took(queued[2], 1 / 16)  # the CPUs quicker: 2 GiB/s, their rate 1.5 GiB/s
    assert queued[1].better_on_cpu()  # 0.118 s against 0.083 s
    queued[1].moved()
    assert queued[1].ahead == 0 and not queued[1].gpu
    took(queued[1], 1 / 16)  # timed from the move
    assert ec.rates()["cpu"] == pytest.approx(1792 * MiB)
    assert ec.chosen() == {"gpu": 2, "cpu": 3, "moved": 1}
    assert ec.live_bytes() == 0


def test_a_cpu_chunk_is_timed_in_its_threads_cpu_time_a_gpu_chunk_in_wall_time(monkeypatch):
    """Under the job's load (three threads per core) a writer thread's wall time counts the
    other threads' work: the CPUs' rate is what the chunk's own thread spent; the GPU path's
    is the wall time from its choice, the wait in the device's queue included."""
    clocks = {"wall": NOW, "cpu": NOW}
    monkeypatch.setattr(ec, "_clock", lambda: clocks["wall"])
    monkeypatch.setattr(ec, "_cpu_clock", lambda: clocks["cpu"])
    trial, cpu = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert trial.gpu and not cpu.gpu
    clocks["wall"] += 0.5
    clocks["cpu"] += 0.01  # the writer thread waited for nvCOMP
    trial.done()
    assert ec.rates()["gpu0"] == pytest.approx(256 * MiB)  # 128 MiB over 0.5 s of wall time
    clocks["wall"] += 1.0  # the other threads' reads and encodes had the cores too
    clocks["cpu"] += 0.24
    cpu.done()
    assert ec.rates()["cpu"] == pytest.approx(512 * MiB)  # 128 MiB over 0.25 s of CPU time


def test_empty_or_instant_writes_measure_nothing_and_forget_clears():
    t = ec.choose(0, 0)
    t.done()  # no bytes, no time
    assert ec.rates() == {"cpu": None}
    took(ec.choose(0, 100), 1.0)
    assert ec.rates()["gpu0"] == pytest.approx(100)
    ec.choose(0, 5)
    ec.forget()
    assert ec.rates() == {"cpu": None} and ec.live_bytes() == 0
    assert ec.chosen() == {"gpu": 0, "cpu": 0, "moved": 0}


def test_the_summary_says_where_chunks_were_encoded():
    from dask_compact.cli import _encode_words

    assert _encode_words({"encode": "cpu", "gpu_encoded": 0}) == "CPU"
    assert _encode_words({"encode": "gpu", "gpu_encoded": 9, "encode_shared": False}) == "GPU"
    assert _encode_words({"encode": "gpu", "gpu_encoded": 5, "encode_shared": True}) == (
        "GPU (5 chunks) and CPU")

