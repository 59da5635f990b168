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
    took(ec.choose(0, 128 * MiB), 128 * MiB / gpu_rate)
    held, trial = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert held.gpu and not trial.gpu and trial.trial
    took(trial, 128 * MiB / cpu_rate)
    held.abandoned()
    assert ec.rates() == {"cpu": pytest.approx(cpu_rate), "gpu0": pytest.approx(gpu_rate)}
    assert ec.live_bytes() == 0


def test_without_a_gpu_rate_every_chunk_goes_to_the_gpu():
    tickets = [ec.choose(0, 128 * MiB) for _ in range(5)]
    assert all(t.gpu for t in tickets)
    assert [t.ahead for t in tickets] == [k * 128 * MiB for k in range(5)]
    assert not tickets[3].better_on_cpu()  # nor do they leave its queue
    assert ec.chosen() == {"gpu": 5, "cpu": 0, "moved": 0}
    assert ec.live_bytes() == 5 * 128 * MiB


def test_a_chunk_measures_its_path_with_what_was_ahead_of_it():
    first, second = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    took(first, 0.125)  # 128 MiB alone in 1/8 s: 1 GiB/s
    assert ec.rates()["gpu0"] == pytest.approx(1 << 30)
    took(second, 0.5)  # 256 MiB (its own and the first's) in 1/2 s: 512 MiB/s
    assert ec.rates()["gpu0"] == pytest.approx((1 - ec.WEIGHT) * (1 << 30) + ec.WEIGHT * 512 * MiB)
    assert ec.choose(0, 1).ahead == 0  # both written: nothing ahead


def test_one_chunk_at_a_time_tries_the_cpus_before_they_have_a_rate():
    took(ec.choose(0, 128 * MiB), 0.125)
    alone = ec.choose(0, 128 * MiB)
    assert alone.gpu  # nothing ahead on the GPU: it takes it
    trial = ec.choose(0, 128 * MiB)
    assert not trial.gpu and trial.trial  # 128 MiB ahead: this one tries the CPUs
    assert ec.choose(0, 128 * MiB).gpu  # while it runs the others go to the GPU
    trial.abandoned()  # it failed: another may try
    again = ec.choose(0, 128 * MiB)
    assert not again.gpu and again.ahead == 0
    took(again, 0.5)
    assert ec.rates()["cpu"] == pytest.approx(256 * MiB)
    assert ec.chosen() == {"gpu": 3, "cpu": 2, "moved": 0}


@pytest.mark.parametrize("gpu_ahead, on_gpu", [(0, True), (127, True), (129, False),
                                              (2048, False)])
def test_a_chunk_goes_where_it_is_expected_to_be_written_sooner(gpu_ahead, on_gpu):
    """GPU path 1 GiB/s, the CPUs 0.25 s for a 128 MiB chunk: on the GPU it is written
    (gpu_ahead + 128 MiB) / 1 GiB/s after its choice, level at 128 MiB ahead."""
    assert ec.prefers_gpu(float(1 << 30), gpu_ahead * MiB, 0.25, 128 * MiB) is on_gpu


def test_the_cpus_are_a_server_per_core_at_one_threads_rate():
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


def test_each_device_has_its_own_path_and_an_unmeasured_device_takes_its_chunks():
    measured(256 * MiB, 512 * MiB)  # a slow device 0
    assert not ec.choose(0, 128 * MiB).gpu  # 128 MiB at 256 MiB/s: 0.5 s against 0.25 s
    assert ec.choose(1, 128 * MiB).gpu  # device 1 not measured yet
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
    """The writers choose as the pieces come, before the GPU has a rate: every chunk goes to
    the GPU. Once its first chunk is written, those still queued ask again, with the bytes
    ahead of each on both paths: first one CPU trial at a time, then by the rule."""
    queued = [ec.choose(0, 128 * MiB) for _ in range(8)]
    took(queued[0], 0.5)  # 128 MiB in 0.5 s: 256 MiB/s
    assert queued[5].better_on_cpu() and queued[5].trial  # the trial
    assert not queued[6].better_on_cpu()  # one at a time
    queued[5].moved()
    assert queued[5].ahead == 0 and not queued[5].gpu
    assert ec.live_bytes() == 7 * 128 * MiB
    took(queued[5], 0.25)  # the CPUs: 512 MiB/s (its time counted from the move)
    assert ec.rates()["cpu"] == pytest.approx(512 * MiB)
    # queued[1]: nothing ahead on the GPU, 0.5 s at 256 MiB/s against 0.25 s on the CPUs
    assert queued[1].better_on_cpu()
    queued[1].moved()
    queued[2].moved()  # (as asked) both cores busy now
    # queued[3]: nothing ahead on the GPU now (0.5 s) against the CPUs' 256 MiB ahead and
    # its own over 2 x 512 MiB/s (0.375 s): it goes; with another on the CPUs (0.5 s), level:
    # queued[4] stays
    assert queued[3].better_on_cpu()
    queued[3].moved()
    assert not queued[4].better_on_cpu()
    assert ec.chosen() == {"gpu": 4, "cpu": 4, "moved": 4}


def test_a_trial_whose_chunk_stayed_on_the_gpu_frees_the_trial():
    first = ec.choose(0, 128 * MiB)
    took(ec.choose(0, 128 * MiB), 0.5)
    assert first.better_on_cpu() and first.trial  # but a batch took it before it could leave
    other = ec.choose(0, 128 * MiB)
    assert not other.better_on_cpu()
    took(first, 1.0)  # written by the GPU
    assert other.better_on_cpu() and other.trial


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


def test_a_cpu_chunk_is_timed_in_its_threads_cpu_time_a_gpu_chunk_in_wall_time(monkeypatch):
    """Under the job's load (three threads per core) a writer thread's wall time counts the
    other threads' work: the CPUs' rate is what the chunk's own thread spent; the GPU path's
    is the wall time from its choice, the wait in the device's queue included."""
    clocks = {"wall": NOW, "cpu": NOW}
    monkeypatch.setattr(ec, "_clock", lambda: clocks["wall"])
    monkeypatch.setattr(ec, "_cpu_clock", lambda: clocks["cpu"])
    gpu = ec.choose(0, 128 * MiB)
    clocks["wall"] += 0.5
    clocks["cpu"] += 0.01  # the writer thread waited for nvCOMP
    gpu.done()
    assert ec.rates()["gpu0"] == pytest.approx(256 * MiB)  # 128 MiB over 0.5 s of wall time
    ahead, trial = ec.choose(0, 128 * MiB), ec.choose(0, 128 * MiB)
    assert not trial.gpu and trial.trial
    clocks["wall"] += 1.0  # the other threads' reads and encodes had the cores too
    clocks["cpu"] += 0.25
    trial.done()
    assert ec.rates()["cpu"] == pytest.approx(512 * MiB)  # 128 MiB over 0.25 s of CPU time
    moved = ahead
    assert moved.better_on_cpu()  # nothing ahead of it: 0.5 s on the GPU, 0.25 s on a core
    moved.moved()
    clocks["wall"] += 2.0
    clocks["cpu"] += 0.5  # timed from the move
    moved.done()
    assert ec.rates()["cpu"] == pytest.approx((512 + 256) / 2 * MiB)
