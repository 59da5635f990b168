"""Which encoder takes an output chunk where both could (``--encode auto`` where the command's
process drives the GPUs): nvCOMP on the chunk's device, or zstd on the writer's own thread,
chosen chunk by chunk from what this job has measured so far.

Why by measurement: neither encoder is the faster on every host. The GPU path's write floor
was 0.73 s against 0.91 s for the CPUs on one H100 host (2026-11-27), level with them on one
H200 (1.00 / 1.01 s), and 2.93-3.39 s against 0.93-0.99 s on other H200 instances
(2026-12-02), where the fixed choice of the GPU made the job 1.3-1.4x slower than ``--encode
cpu``. A rule fixed in advance (the earlier trial, 8cbf23d: a chunk to the CPUs where the
device's encoder had more than 1 GiB queued) cannot be right on every host: it took CPU time
the H100's reads needed and gained nothing there.

What is measured is each path as a whole, from a chunk's choice to its file written: on the
GPU the wait for the device's encoder, its batch, the copy of the frames back through the
staging ring and the write (nvCOMP's own batches ran at 1.0-5.7 GB/s on the H200 where the
whole GPU path delivered ~1 GB/s: the encoder alone says little); on the CPUs the copy of the
chunk back, its encode and the write. A device's GPU path is one server: a chunk is written
``(ahead + nbytes) / rate`` after its choice, ``ahead`` being the bytes of that path's chunks
chosen before it and not yet written, and each chunk written measures the rate the same way,
``(ahead at its choice + its bytes) / its seconds``. The CPUs are as many servers as the
process has cores, each at one core's rate: a CPU chunk measures ``nbytes`` over the CPU time
of its thread (the copy back, the encode and the write), and a new one is expected to take
that time while fewer CPU chunks than cores are in flight, else its share of theirs. Why CPU
time: the job runs three threads per core, so a thread's wall time counts the other threads'
reads and encodes; measured so, one writer thread encoded at 75-180 MB/s on one H200 (a core
does ~300 MB/s), the CPUs' rate looked a tenth of what they wrote together in ``--encode cpu``
(~2.9 GB/s), and the rule sent the GPU 21-32 of 33 chunks, the job 0.5-1.5 s slower than
``--encode cpu`` (2026-12-02, c70918a; the same with the CPUs as one server, 6e823ed). One
core's rate times the cores is more than the job leaves them (the reads use cores too): the
rule errs towards the CPUs, the faster encoder on every H200 measured. (A chunk that zstd's
multi-threaded encoder writes at the job's end counts only its own thread's time: the CPUs
look faster then, when the reads have ended and they are idle.) The rule: a chunk goes where
it is expected to be written sooner.

Until a device's GPU path has a rate, one chunk at a time tries it (its trial) and the others
go to the CPUs, which measure theirs on them; until the CPUs have a rate, chunks go to them.
Why the CPUs first: the writers choose as the pieces come, most of them before the first
chunk is written; starting on the GPU (6e823ed to e2ba28e), 15-32 of 33 chunks were in the
device's queue or its batch before it had a rate, on one H200 whose GPU path wrote ~1 GB/s
against ~2.9 GB/s for the CPUs, and the job was 0.2-1.3 s slower than ``--encode cpu``. A
chunk chosen for the GPU by the rule asks again while it waits in the device's queue
(:func:`.gpu_zstd.encode`'s ``give_up``), with the bytes ahead of it then, and leaves for
the CPUs where they would now write it sooner. Rates are moving averages, so a host whose GPU
slows (shared with other work) moves its chunks over as the job runs.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass, field

WEIGHT = 0.5  # of a new measurement in the moving average: the job's load changes as it runs
CPU = -1  # the CPUs' path, beside each device's


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


CORES = _cores()  # the CPUs' servers


class _Path:
    """One path's rate (bytes/s, None before its first chunk is written) and its chunks not
    yet written, by ticket number."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.live: dict[int, int] = {}

    def ahead(self, number: int | None = None) -> int:
        """Bytes of its live chunks (chosen before ticket ``number``)."""
        return sum(b for k, b in self.live.items() if number is None or k < number)

    def measured(self, ahead: int, nbytes: int, seconds: float) -> None:
        if seconds > 0 and nbytes > 0:
            sample = (ahead + nbytes) / seconds
            self.rate = sample if self.rate is None else (
                (1 - WEIGHT) * self.rate + WEIGHT * sample)


_lock = threading.Lock()
_paths: dict[int, _Path] = {}  # device -> its GPU path; CPU -> the CPUs'
_numbers = itertools.count()  # tickets in the order of their choice
_trying: set[int] = set()  # the devices whose GPU path a chunk is measuring for the first time
_chosen = {"gpu": 0, "cpu": 0, "moved": 0}  # chunks each way, and moved (tests, the summary)
_clock = time.perf_counter  # (tests set the times by hand)
_cpu_clock = time.thread_time  # a CPU chunk's: its thread's CPU time


def _path(key: int) -> _Path:
    return _paths.setdefault(key, _Path())


def _claim_trial(dev: int) -> bool:
    """Whether the caller's chunk may be device ``dev``'s trial (none under way); it then is
    (``_lock`` held)."""
    if dev in _trying:
        return False
    _trying.add(dev)
    return True


@dataclass
class Ticket:
    """One chunk's choice: ``gpu`` says where it goes. Call :meth:`done` once it is written
    (its time then measures the path), or :meth:`abandoned` if it failed. A GPU chunk still
    waiting in its device's queue asks :meth:`better_on_cpu` and, where it leaves the queue,
    calls :meth:`moved`."""

    dev: int
    nbytes: int
    gpu: bool
    ahead: int  # bytes ahead of it on its path at its choice
    trial: bool = False  # its GPU path's first measurement
    number: int = field(default_factory=lambda: next(_numbers))
    t0: float = field(default_factory=lambda: _clock())
    c0: float = field(default_factory=lambda: _cpu_clock())  # (only a CPU chunk's is used)

    @property
    def key(self) -> int:
        return self.dev if self.gpu else CPU

    def better_on_cpu(self) -> bool:
        """Whether this GPU chunk, still queued, would now be written sooner on the CPUs: the
        rule with the bytes ahead of it on each path now (no while either has no rate: the
        trial stays to measure its GPU)."""
        with _lock:
            gpu, cpu = _path(self.dev), _path(CPU)
            if gpu.rate is None or cpu.rate is None:
                return False
            return not prefers_gpu(gpu.rate, gpu.ahead(self.number),
                                   _cpu_seconds(cpu, self.nbytes), self.nbytes)

    def moved(self) -> None:
        """This chunk left its GPU's queue for the CPUs: it is theirs from here."""
        with _lock:
            self._leave()
            self.gpu = False
            cpu = _path(CPU)
            self.ahead = cpu.ahead()
            cpu.live[self.number] = self.nbytes
            self.t0, self.c0 = _clock(), _cpu_clock()
            _chosen["gpu"] -= 1
            _chosen["cpu"] += 1
            _chosen["moved"] += 1

    def done(self) -> None:
        """Its chunk is written: its time measures its path (a GPU chunk's from its choice,
        with what was ahead; a CPU chunk's in its thread's CPU time, one core's rate)."""
        seconds = _clock() - self.t0 if self.gpu else _cpu_clock() - self.c0
        with _lock:
            self._leave().measured(self.ahead if self.gpu else 0, self.nbytes, seconds)

    def abandoned(self) -> None:
        with _lock:
            self._leave()

    def _leave(self) -> _Path:
        """Its path, which it leaves (``_lock`` held); a trial ends with it."""
        path = _path(self.key)
        path.live.pop(self.number, None)
        if self.trial:
            _trying.discard(self.dev)
            self.trial = False
        return path


def _cpu_seconds(cpu: _Path, nbytes: int) -> float:
    """Seconds until a chunk of ``nbytes`` chosen for the CPUs now would be written (once
    they have a rate): its own time on one core while fewer CPU chunks than :data:`CORES` are
    in flight, else at least its share of the work ahead on every core."""
    assert cpu.rate is not None
    own = nbytes / cpu.rate
    if len(cpu.live) < CORES:
        return own
    return max(own, (cpu.ahead() + nbytes) / (CORES * cpu.rate))


def prefers_gpu(gpu_rate: float, gpu_ahead: int, cpu_seconds: float, nbytes: int) -> bool:
    """The rule once both paths have a rate (see the module's docstring): the path on which
    the chunk is expected to be written sooner (``cpu_seconds``: :func:`_cpu_seconds`)."""
    return (gpu_ahead + nbytes) / gpu_rate <= cpu_seconds


def choose(dev: int, nbytes: int) -> Ticket:
    """Where a chunk of ``nbytes`` compacted on device ``dev`` is encoded (see the module's
    docstring); the ticket's :meth:`Ticket.done` must follow its write."""
    with _lock:
        gpu, cpu = _path(dev), _path(CPU)
        gpu_ahead, cpu_ahead = gpu.ahead(), cpu.ahead()
        trial = False
        if gpu.rate is None:  # one chunk at a time tries the device, the others the CPUs
            on_gpu = trial = _claim_trial(dev)
        elif cpu.rate is None:  # the CPUs measure theirs on the chunks they take
            on_gpu = False
        else:
            on_gpu = prefers_gpu(gpu.rate, gpu_ahead, _cpu_seconds(cpu, nbytes), nbytes)
        ticket = Ticket(dev, nbytes, on_gpu, gpu_ahead if on_gpu else cpu_ahead, trial)
        (gpu if on_gpu else cpu).live[ticket.number] = nbytes
        _chosen["gpu" if on_gpu else "cpu"] += 1
        return ticket


def chosen() -> dict[str, int]:
    """Chunks sent to each encoder so far in this process, and how many of the CPUs' were
    moved there from a GPU's queue."""
    with _lock:
        return dict(_chosen)


def rates() -> dict[str, float | None]:
    """The rates measured so far (bytes/s): ``cpu`` and ``gpu<d>`` for each device."""
    with _lock:
        cpu = _paths.get(CPU)
        return {"cpu": cpu.rate if cpu else None,
                **{f"gpu{d}": p.rate for d, p in sorted(_paths.items())
                   if d != CPU and p.rate is not None}}


def live_bytes() -> int:
    """Bytes of chunks chosen and not yet written or abandoned, over every path (0 once a
    job's writes have all ended)."""
    with _lock:
        return sum(p.ahead() for p in _paths.values())


def forget() -> None:
    """Drop what was measured (each job measures its own host anew: a job's rates say little
    of the next one's load)."""
    with _lock:
        _paths.clear()
        _trying.clear()
        _chosen.update(gpu=0, cpu=0, moved=0)
