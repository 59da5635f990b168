"""Ready calls: a repeated call of one predicate on one size with everything but its input,
outputs and count prepared (the kernel, its arguments packed once, the grid, its own words),
so that a small call costs a few launches of host time, not CuPy's per-argument boxing.
Two kinds: :class:`OneReadCall` (``compact_array``'s exact-size small call: one read into
scratch, the count watched in mapped host memory, the selection copied out) and
:class:`IntoCall` (``compact_into``: the caller's buffers and count, nothing waits).
``cupy_calls`` caches them per (thread, predicate, dtype, output, algorithm, n, device,
stream); each is used by one thread only (the packed slots are state).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..validate import output_bytes
from .cupy_device import (
    NO_CAP,
    by_output,
    head_copy,
    head_rows,
    landed,
    output_empty,
    read_counts,
)
from .cupy_launchers import Plan, tile_words
from .cupy_modules import compiled, resident_blocks
from .cupy_source import group_of
from .cupy_tuning import COPY_BLOCK, COPY_MAX_GRID, SPIN_MAX_N

__all__ = ["PackedKernel", "CopyOut", "OneReadCall", "IntoCall", "fraction_key", "learn",
           "learned", "speculated", "KEEP_SCRATCH_BYTES"]

# Scratch of a cached small call is kept with it up to this many bytes (2^20 float64 values, or
# 2^20 indices), saving an allocation from CuPy's pool and its return per call; larger calls
# take theirs from the pool each time. At 4 MiB (until 2026-11-26) a 2^20 float64 call paid
# them while float32 did not. At most memory-entries (64) calls keep one each.
KEEP_SCRATCH_BYTES = 8 << 20
# Iterations of the host's wait for a mapped count before it falls back to a stream sync.
_SPIN = 4000
_NOT_YET = np.uint64(2**64 - 1)
# Tile-word sets of a packed single-pass kernel, zeroed together once per round of calls:
# at most this many, and at most this many bytes (float32 tiles of 16384: 2^20 has 64 tiles,
# 16 sets in 8.4 KiB; 2^26, 7 sets; from 2^28 up one set, zeroed per call, where the memset
# is a small part of the call).
WORD_SETS = 16
WORD_SETS_BYTES = 256 << 10


def fraction_key(dtype: np.dtype, output: str) -> tuple:
    """The key of a predicate's memo under which :func:`learn` keeps its selected fraction."""
    return ("fraction", dtype, output)


def learn(memo: dict | None, dtype: np.dtype, output: str, total: int, n: int) -> None:
    """What the next call of this predicate on ``dtype`` chooses its exact path by: the
    fraction this call selected (cupy_exact._one_read, OneReadCall._speculate)."""
    if memo is not None and n:
        memo[fraction_key(dtype, output)] = total / n


def learned(memo: dict | None, dtype: np.dtype, output: str) -> float | None:
    """The fraction the predicate's last call on ``dtype`` for ``output`` selected
    (:func:`learn`), or None before its first."""
    return None if memo is None else memo.get(fraction_key(dtype, output))


class PackedKernel:
    """The compaction kernel of one plan with its arguments packed once
    (``cupy_launch.PackedLaunch``: its own workspace words, the size, the predicate's
    constants), the grid and the shared memory; a call queues one launch with the input,
    outputs and count pointers written into their slots. For repeated calls of one predicate
    on one size (see OneReadCall, IntoCall); not thread-safe (the slots are state): each
    thread keeps its own.

    A launch needs zeroed tile words (look-back status, tile dispenser). The single-pass
    kernel gets one of up to ``WORD_SETS`` sets in turn, and the first call of each round
    zeroes all of them with one memset (the sets were used by earlier calls, which stream
    order has finished): a memset per call had cost 1.3 us of host time, and a step on the
    stream before the kernel, out of ~40 us. The hybrid's counter is its count, read after
    the call: its words are zeroed per call."""

    def __init__(self, plan: Plan, output: str) -> None:
        import cupy

        from .cupy_launch import PackedLaunch

        spec, n, tiles = plan.spec, plan.n, plan.tiles
        # held: an evicted module stays loaded while this lives (main and copy_out are both
        # in the compact group of the output's module)
        self.module = compiled(spec, output, group_of("main"))
        kernel = plan.kernels["main"]
        self.block, self.smem = spec.tuning.block, spec.smem_bytes(output)
        self.grid = min(tiles, resident_blocks(kernel, self.block, self.smem))
        self.hybrid = spec.algorithm == "hybrid"
        # arguments: 6 per call (input, mask, n, index base, the two outputs), then the words
        # (hybrid: counter, dispenser; single-pass: status, count, dispenser, the outputs'
        # cap and a run's chained start, null here), then constants
        first_param = 8 if self.hybrid else 11
        self.launch = PackedLaunch(kernel, first_param + len(plan.params))
        self.launch.pointer(1, 0)  # no mask: the fused predicate
        if not self.hybrid:
            self.launch.pointer(10, 0)  # one chunk: no chained start
        self.launch.int64(2, n)
        if self.hybrid:
            # (counter, tiles): the counter is the count, zeroed with the words
            ws = tile_words(spec.algorithm, tiles, exact=False)
            self.words, self.count = ws.words, ws.count
            self.launch.pointer(6, ws.counter.data.ptr)
            self.launch.pointer(7, ws.tiles.data.ptr)
            self.count_slot, self.sets = 6, 1
        else:
            # (status, count, tiles) per set: tiles status words, the count word (unused: the
            # caller's count goes in its slot), the dispenser
            self.stride = tiles + 2
            self.sets = max(1, min(WORD_SETS, WORD_SETS_BYTES // (8 * self.stride)))
            self.words = cupy.zeros(self.sets * self.stride, dtype=np.uint64)
            # zeroed on the current stream, while a call may queue on another (compact_into's
            # stream=, a non-blocking stream that does not wait for the legacy default one):
            # its first launch could read the words before the zeros land (seen once in the
            # GPU suite as a count of 0), so the zeroing is waited for here, once per call kept
            cupy.cuda.get_current_stream().synchronize()
            self.count = None
            self.count_slot = 7
        self.next_set = 0
        self.used = False  # a set has been launched on since the words were zeroed
        self.first_param = first_param
        self.rebind(plan.params)

    def rebind(self, params: tuple) -> None:
        """The predicate's constants, bound (NumPy scalars of their typed dtypes), into their
        argument slots: a string's numbers new at a later call of its shape
        (``cupy_shaped``)."""
        for i, v in enumerate(params):
            self.launch.scalar(self.first_param + i, v)

    def queue(self, a_ptr: int, base: int, vals_ptr: int, idx_ptr: int, count_ptr: int,
              stream_ptr: int, cap: Any = NO_CAP) -> None:
        """One launch; ``cap``: the outputs' room (single-pass only: the hybrid's outputs
        always hold every selected element)."""
        import cupy

        launch, words = self.launch, self.words
        if self.hybrid:
            cupy.cuda.runtime.memsetAsync(words.data.ptr, 0, words.nbytes, stream_ptr)
        else:
            j = self.next_set
            if j == 0 and self.used:
                cupy.cuda.runtime.memsetAsync(words.data.ptr, 0, words.nbytes, stream_ptr)
            self.used = True
            at = words.data.ptr + 8 * j * self.stride
            launch.pointer(6, at)  # status words
            launch.pointer(8, at + 8 * (self.stride - 1))  # the tile dispenser
            launch.uint64(9, cap)
            self.next_set = j + 1 if j + 1 < self.sets else 0
        launch.pointer(0, a_ptr)
        launch.int64(3, base)
        launch.pointer(4, vals_ptr)
        launch.pointer(5, idx_ptr)
        launch.pointer(self.count_slot, count_ptr)
        launch(self.grid, self.block, self.smem, stream_ptr)


class CopyOut:
    """The first ``k`` elements of a scratch array into a new exact-size array by one packed
    launch of ``dcx_copy_out`` (kernels/copy_out.cu): ``cudaMemcpyAsync`` device to device
    cost 6.5-7.8 us of host time per call at 2 MiB on the H100, about twice a launch.
    Pointers not 16-byte aligned (never from CuPy's allocator) take ``cudaMemcpyAsync``."""

    def __init__(self, kernel: Any) -> None:
        from .cupy_launch import PackedLaunch

        self.launch = PackedLaunch(kernel, 3)

    def __call__(self, scratch: Any, k: int, stream_ptr: int) -> Any:
        out = output_empty(k, scratch.dtype)
        if k:
            nbytes = k * scratch.itemsize
            src, dst = scratch.data.ptr, out.data.ptr
            if (src | dst) & 15:
                return head_copy(scratch, k, stream_ptr)
            launch = self.launch
            launch.pointer(0, src)
            launch.pointer(1, dst)
            launch.int64(2, nbytes)
            grid = min(COPY_MAX_GRID, -(-nbytes // (16 * COPY_BLOCK)))
            launch(grid, COPY_BLOCK, 0, stream_ptr)
        return out


class OneReadCall:
    """A repeated one-read call with everything but its input and outputs ready: the packed
    kernel, the scratch (up to KEEP_SCRATCH_BYTES; stream order makes its reuse safe: a
    call's kernel runs after the previous call's copy out of it). Per call it queues the
    kernel, waits for the count and copies the selection out; once its predicate has
    selected before on this dtype and output, the single-pass kernel writes straight into
    outputs sized from that fraction instead (:meth:`_speculate`), with no scratch and no
    copy. One per (thread, predicate object, dtype, output, algorithm, n, device, stream):
    see ``cupy_calls.one_read_call``.

    The count: the single-pass kernel's last tile stores the total with one plain store, so
    it is stored straight into pinned host memory (mapped: with unified addressing the host
    pointer is the device's too) and the host watches that word, instead of a device-to-host
    copy queued after the kernel and a stream synchronisation (10.6 us of the H100 host's
    time for 8 bytes, the copy engine's latency). The copy out is queued on the stream, so it
    starts after the kernel ends whatever the moment the count arrived. A word not written
    after _SPIN looks falls back to synchronising the stream (which raises a kernel's error);
    a call of more than SPIN_MAX_N elements synchronises at once.
    The hybrid's count is an atomic counter, final only at the end: it is read back as
    before."""

    def __init__(self, plan: Plan, output: str) -> None:
        import cupy

        n = plan.n
        self.n, self.dtype, self.output, self.memo = n, plan.flat.dtype, output, plan.memo
        self.kernel = PackedKernel(plan, output)
        self.copy_out = CopyOut(plan.kernels["copy_out"])
        self.mapped = not self.kernel.hybrid
        if self.mapped:
            self.host_mem = cupy.cuda.alloc_pinned_memory(8)
            self.host_count = np.frombuffer(self.host_mem, dtype=np.uint64, count=1)
        self.stream = cupy.cuda.get_current_stream()
        scratch = n * output_bytes(self.dtype.itemsize, output)
        self.keep = scratch <= KEEP_SCRATCH_BYTES
        self.vals: Any = None
        self.idx: Any = None

    def _scratch(self) -> tuple[Any, Any]:
        import cupy

        vals, idx = self.vals, self.idx
        if vals is None and idx is None:
            n, output = self.n, self.output
            vals = cupy.empty(n, dtype=self.dtype) if output != "indices" else None
            idx = cupy.empty(n, dtype=np.int64) if output != "values" else None
            if self.keep:
                self.vals, self.idx = vals, idx
        return vals, idx

    def __call__(self, a: Any, base: int) -> Any:
        output = self.output
        frac = learned(self.memo, self.dtype, output) if self.mapped else None
        if frac is not None:
            return self._speculate(a, base, frac)
        vals, idx = self._scratch()
        total = self._run(a, base, vals, idx, NO_CAP)
        learn(self.memo, self.dtype, output, total, self.n)
        sp, copy_out = self.stream.ptr, self.copy_out
        return by_output(None if vals is None else copy_out(vals, total, sp),
                         None if idx is None else copy_out(idx, total, sp), output)

    def _speculate(self, a: Any, base: int, frac: float) -> Any:
        """The call once its predicate has selected before on this dtype and output: the
        kernel writes straight into outputs sized from that fraction (:func:`speculated`),
        and the result is their first ``total`` elements, with neither scratch nor a copy
        out (the copy of the selection cost 0.3-0.4 of a 2^28 float32 call at p = .5 on one
        H200, and 11-17 us of host time at 2^20). A call that selects more than they hold
        (its kernel wrote only what fitted, and stored the whole count) runs again into
        exact-size outputs: a second read of the input, as counting first costs."""
        output, n = self.output, self.n
        cap = speculated(frac, n)
        vals, idx = self._outputs(cap)
        total = self._run(a, base, vals, idx, cap)
        learn(self.memo, self.dtype, output, total, n)
        if total > cap:
            vals, idx = self._outputs(total)
            self._run(a, base, vals, idx, NO_CAP)
            return by_output(vals, idx, output)
        return by_output(None if vals is None else head_rows(vals, total),
                         None if idx is None else head_rows(idx, total), output)

    def _outputs(self, k: int) -> tuple[Any, Any]:
        output = self.output
        return (output_empty(k, self.dtype) if output != "indices" else None,
                output_empty(k, np.int64) if output != "values" else None)

    def _run(self, a: Any, base: int, vals: Any, idx: Any, cap: Any) -> int:
        """The kernel queued into ``vals`` / ``idx`` (room for ``cap`` elements), and the
        whole selected count, however much of it they hold."""
        stream, kernel = self.stream, self.kernel
        vp = 0 if vals is None else vals.data.ptr
        ip = 0 if idx is None else idx.data.ptr
        try:
            if self.mapped:
                word = self.host_count
                word[0] = _NOT_YET  # the previous call's count was read: nothing writes it now
                kernel.queue(a.data.ptr, base, vp, ip, self.host_mem.ptr, stream.ptr, cap)
                for _ in range(_SPIN if self.n <= SPIN_MAX_N else 0):
                    if word[0] != _NOT_YET:
                        break
                else:
                    stream.synchronize()
                    if word[0] == _NOT_YET:
                        raise RuntimeError(
                            "the compaction kernel ended without storing its count")
                return int(word[0])
            kernel.queue(a.data.ptr, base, vp, ip, kernel.count.data.ptr, stream.ptr)
            (total,) = read_counts([kernel.count])
            return total
        except BaseException:
            # interrupted in its wait (KeyboardInterrupt, or anything raised there): the
            # kernel may still be running, to store its count late into the mapped word,
            # the one state a later call reads outside stream order (the word sets and the
            # kept scratch are used in it). Until 2026-12-01 (fourteenth session; left by
            # the thirteenth session's probes) the next call on this stream reset the word,
            # watched it, and took this call's count for its own (a selection cut short or
            # padded with stale scratch); and a call evicted meanwhile gave its pinned word
            # back to CuPy's pool with the store to come. Waited for here: no cost to a call
            # that is not interrupted.
            landed(stream)
            raise


# The room of a speculative output (OneReadCall._speculate) over the count its predicate's
# previous call gave for the same fraction, k: k * SPECULATE_MARGIN + SPECULATE_SIGMAS * sqrt(k)
# + SPECULATE_SLACK elements, at most n (output_empty rounds it up to its size class). The square
# root covers the count's spread over data drawn alike (a binomial count's standard deviation
# is under sqrt(k)); the margin, a fraction that drifts a little from call to call. Memory:
# the result keeps the whole allocation alive (a view of it), as the size classes' already
# do (class_items: up to 0.8%).
SPECULATE_MARGIN = 1.005
SPECULATE_SIGMAS = 4
SPECULATE_SLACK = 256


def speculated(frac: float, n: int) -> int:
    """The elements a speculative output holds for a call on ``n`` elements whose
    predicate's previous call selected ``frac`` of its input (see SPECULATE_MARGIN).

    >>> speculated(0.5, 1 << 20)
    530061
    >>> speculated(0.0, 1000), speculated(1.0, 1000)
    (256, 1000)
    """
    k = frac * n
    return min(n, int(k * SPECULATE_MARGIN + SPECULATE_SIGMAS * math.sqrt(k)) + SPECULATE_SLACK)


class IntoCall:
    """``compact_into``'s repeated call of one predicate on one size: the packed kernel, with
    the caller's outputs and count written into its slots per call; nothing waits. The
    hybrid's count is its atomic counter, zeroed in stream order first."""

    def __init__(self, plan: Plan, output: str) -> None:
        self.kernel = PackedKernel(plan, output)

    def __call__(self, a: Any, vals: Any, idx: Any, count: Any, stream_ptr: int) -> Any:
        import cupy

        if self.kernel.hybrid:
            cupy.cuda.runtime.memsetAsync(count.data.ptr, 0, 8, stream_ptr)
        self.kernel.queue(a.data.ptr, 0, 0 if vals is None else vals.data.ptr,
                          0 if idx is None else idx.data.ptr, count.data.ptr, stream_ptr)
        return count
