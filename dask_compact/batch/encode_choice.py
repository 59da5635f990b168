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
encoder: its shortest batch so far (the fixed cost of a batch) plus the bytes queued there
and the chunk's own at the best rate its batches have reached (:data:`GPU_FIXED_S` and
:data:`GPU_RATE` until one is measured). The estimates are rough on purpose: a chunk sent to a
core that turns out slower costs one core for a while, never a wrong byte, since both
encoders write one zstd frame that every zstd reader decodes to the same chunk.
"""

from __future__ import annotations

import os
import threading

# Rates assumed before one is measured in this process (one H100 host, chunks of 128 MiB):
CPU_RATE = 0.3e9  # bytes/s of one core's encode with the others busy (0.46 s for 128 MiB)
GPU_RATE = 4e9  # bytes/s of a batch of nvCOMP's encoder (3.8-6.1 GB/s measured)
GPU_FIXED_S = 0.1  # seconds of a batch whatever its size (a lone frame of 128 MiB: 0.16 s)
CPU_WEIGHT = 0.25  # the newest CPU encode's weight in the rate's moving average


class BatchLoad:
    """What one device's batching thread (:class:`.gpu_zstd._Batcher`: its encoder) has
    queued and how fast its batches went."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0  # bytes submitted and not yet encoded
        self.best_rate = 0.0  # bytes/s of its fastest batch
        self.least_s = 0.0  # seconds of its shortest batch

    def queued(self, nbytes: int) -> None:
        with self._lock:
            self.pending += nbytes

    def batch_done(self, nbytes: int, seconds: float) -> None:
        with self._lock:
            self.pending -= nbytes
            if seconds > 0:
                self.best_rate = max(self.best_rate, nbytes / seconds)
                self.least_s = min(self.least_s, seconds) if self.least_s else seconds

    def wait(self, nbytes: int) -> float:
        """Seconds until a request of ``nbytes`` submitted now would be encoded."""
        with self._lock:
            fixed = self.least_s or GPU_FIXED_S
            return fixed + (self.pending + nbytes) / (self.best_rate or GPU_RATE)


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
