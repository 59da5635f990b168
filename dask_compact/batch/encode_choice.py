"""Where an output chunk that nvCOMP could encode is encoded under ``--encode auto``: on its
device, or by its writer on a CPU core when the device's encoder would finish it later.

Measured on one H100 host (8 GiB of float32 in 64 chunks of 128 MiB, ``x < 0.5``, every output
chunk encoded on the GPU; the command's steps traced in
``benchmarks/results/trace-2026-11-27-1x_NVIDIA_H100_80GB_HBM3-0d842ab.txt``): nvCOMP's encoder
ran without a pause from the first piece to the last write (5 batches, 1.12 s, 3.8 GB/s beside
the decoder); the reads ended at 2.14 s and the writes at 2.84 s, 22 writers waiting 0.5 s on
the encoder's last batch while the 16 cores had nothing to do. One core encodes a chunk of
128 MiB in 0.25 s alone, 0.46 s with every core encoding (numcodecs).

The rule, per chunk: the CPU when a core is free (fewer CPU encodes of this process running
than cores) and the chunk's bytes at the rate this process's CPU encodes have reached
(:data:`CPU_RATE` until one is measured) take less time than the wait on the device's
encoder: the bytes queued there and the chunk's own at the rate its batches have kept on
average (:data:`GPU_RATE` until one is measured). An average, not its best batch: a first
version took the fastest batch (plus the shortest as a fixed cost), sent 1-13 of 33 chunks to
the CPUs, and the last writes still ended 0.55-0.7 s after the last piece (one H100 host,
``benchmarks/results/batch-2026-11-27-1x_NVIDIA_H100_80GB_HBM3-ea29eba.md``). The estimates stay rough: a chunk sent to a core that
turns out slower costs one core for a while, never a wrong byte, since both encoders write one
zstd frame that every zstd reader decodes to the same chunk.
"""

from __future__ import annotations

import os
import threading

# Rates assumed before one is measured in this process (one H100 host, chunks of 128 MiB):
CPU_RATE = 0.3e9  # bytes/s of one core's encode with the others busy (0.46 s for 128 MiB)
GPU_RATE = 3.8e9  # bytes/s of nvCOMP's encoder beside the decoder (the trace above)
CPU_WEIGHT = 0.25  # the newest CPU encode's weight in the rate's moving average


class BatchLoad:
    """What one device's batching thread (:class:`.gpu_zstd._Batcher`: its encoder) has
    queued and how fast its batches went."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0  # bytes submitted and not yet encoded
        self.done_bytes = 0  # bytes of the batches ended so far
        self.busy_s = 0.0  # and their seconds

    def queued(self, nbytes: int) -> None:
        with self._lock:
            self.pending += nbytes

    def batch_done(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.pending -= nbytes
            self.done_bytes += nbytes
            self.busy_s += max(0.0, seconds)

    @property
    def rate(self) -> float:
        """Bytes per second of the batches so far (:data:`GPU_RATE` before any)."""
        with self._lock:
            return self.done_bytes / self.busy_s if self.busy_s > 0 else GPU_RATE

    def wait(self, nbytes: int) -> float:
        """Seconds until a request of ``nbytes`` submitted now would be encoded."""
        rate = self.rate
        with self._lock:
            return (self.pending + nbytes) / rate


class CpuEncodes:
    """The CPU encodes of output chunks that the GPU could have encoded: how many run, and
    the rate one core has reached (a moving average over the encodes so far)."""

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)
        self._lock = threading.Lock()
        self.running = 0
        self.rate = 0.0
        self.taken = 0  # chunks encoded on a core so far

    def take(self, nbytes: int, gpu_wait: float) -> bool:
        """Whether a chunk of ``nbytes`` whose wait on the device is ``gpu_wait`` seconds
        goes to this thread's core; if so, :meth:`done` must follow."""
        with self._lock:
            if self.running >= self.cores:
                return False
            if nbytes / (self.rate or CPU_RATE) >= gpu_wait:
                return False
            self.running += 1
            self.taken += 1
            return True

    def done(self, nbytes: int, seconds: float) -> None:
        """A chunk taken by :meth:`take` was encoded in ``seconds`` (``seconds`` <= 0: it
        failed; only the core is given back)."""
        with self._lock:
            self.running -= 1
            if seconds > 0:
                r = nbytes / seconds
                self.rate = r if not self.rate else (1 - CPU_WEIGHT) * self.rate + CPU_WEIGHT * r


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_cpu: CpuEncodes | None = None
_cpu_lock = threading.Lock()


def cpu_encodes() -> CpuEncodes:
    """This process's :class:`CpuEncodes` (made on first use)."""
    global _cpu
    with _cpu_lock:
        if _cpu is None:
            _cpu = CpuEncodes(cores())
        return _cpu
