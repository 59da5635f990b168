"""Compact NumPy chunks on the CPU: the fused numba loop, or NumPy with a boolean mask.

See :mod:`dask_compact.dispatch` for the contract. The fused path (one pass, no mask array)
runs when the predicate was traced or parsed, its dtypes are ones the loop computes exactly,
and its constants fit their dtypes; otherwise the predicate is evaluated with NumPy into a mask
(the mask path), which gives NumPy's own results and errors. The path taken and why is logged
at DEBUG on the ``dask_compact`` logger.

``stable`` and ``algorithm`` choose between GPU kernels; the CPU loop is always stable and has
one algorithm, so they are accepted and ignored here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..codegen.numba_loop import OUTPUTS, CompiledLoop, UnsupportedPredicate, fused_loop
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..validate import by_output, output_bytes

__all__ = ["compact", "compact_into", "compact_many", "compact_masked", "loop_call", "one_call"]

logger = logging.getLogger("dask_compact")

# Keep a view of the full-length output buffer only when it is at least this full; below it,
# copy the kept part so a tiny result does not pin a chunk-sized allocation. A quarter, not a
# half: at p = 0.5 a half would copy about every other chunk (a quarter of the loop's time at
# 2^24 float32), and the unwritten tail of a large buffer is never touched, so it costs address
# space rather than memory on Linux.
_KEEP_VIEW_FRACTION = 0.25


# Calls of more than this many elements in all run the loop over segments of at most this many
# into an output grown with the selection (:func:`_run_segmented`), so that their memory is
# about the selection plus a segment rather than a full-length buffer per output: a full one
# costs 8 bytes per input element for the indices whatever is selected (2^31 int8 asked 16 GiB
# for 3 indices, 2026-11-30). At or below it, chunks keep one loop call into one buffer of
# their length: 2^22 int64 indices are 32 MiB.
_SEGMENT = 1 << 22

# glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit): malloc maps a request
# of at least this many bytes fresh from the kernel, and each page the loop writes into it
# then faults in, zero-filled (about 0.4 us a 4 KiB page on the 2-core machine); a smaller
# request comes from the heap, where the freed buffers of earlier calls left their pages
# paged in. NumPy's np.flatnonzero allocates its exact result, so under 4 Mi selected it
# writes into such pages, where a full-length int64 buffer of 2^22 elements (32 MiB) faulted
# in every page it wrote: 0.57-0.88x np.flatnonzero at 2^22 float32 from p = 0.2, 0.92-0.97x
# at 5-6 Mi elements at p = 0.2 (2026-12-04, the 2-core machine). So, without a caller's
# ``alloc`` (whose memory is paged in already: the batch job's pool), a call whose
# full-length buffers would reach this size runs segmented whatever its length, and its
# buffers stay at the size its selection projects while that is under it
# (:meth:`_Selection._grow`): 1.38-1.63x there. Where the rates so far project buffers of
# 32 MiB or more, a sample of the rest of the input projects them once more
# (:meth:`_Selection._sampled_cap`): a rate falling along the call (all selected, then none).
_HEAP_BYTES = 32 << 20


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}")


Alloc = Callable[[int, np.dtype], np.ndarray]


def _trim(buf: np.ndarray, k: int, alloc: Alloc | None = None) -> np.ndarray:
    """The first ``k`` elements of a loop's output buffer: a view when they fill enough of it,
    else a copy (into ``alloc``'s memory when given, so the large buffer can be reused)."""
    if k == buf.shape[0] or k >= _KEEP_VIEW_FRACTION * buf.shape[0]:
        return buf[:k]
    if alloc is None:
        return buf[:k].copy()
    small = alloc(k, buf.dtype)
    small[:] = buf[:k]
    return small


def _flat(a: np.ndarray) -> np.ndarray:
    # C order, contiguous (a view when possible); the loop is compiled for C-contiguous 1-D.
    return np.ascontiguousarray(np.ravel(a, order="C"))


def _segments(a: np.ndarray, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``a``'s elements in C order as (flat offset, 1-D C-contiguous array of at most ``rows``
    elements), one after the other: views of a C-contiguous ``a``; for any other, copies of
    one segment at a time (whole rows of axis 0 where they fit, else each row's own segments),
    never the whole chunk that ``_flat`` would copy."""
    if a.size == 0:
        return
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        for lo in range(0, flat.size, rows):
            yield lo, flat[lo : lo + rows]
        return
    row = a.size // a.shape[0]  # elements per index of axis 0 (a non-contiguous a has ndim >= 1)
    per = rows // row
    if per >= 1:
        for lo in range(0, a.shape[0], per):
            yield lo * row, np.ascontiguousarray(a[lo : lo + per]).reshape(-1)
        return
    for i in range(a.shape[0]):
        for lo, seg in _segments(a[i], rows):
            yield i * row + lo, seg


def _run_fused(a: np.ndarray, pred: Predicate, output: str, index_base: int,
               alloc: Alloc | None = None) -> Any:
    """The fused loop's result, or raise UnsupportedPredicate/ParamOverflow/TypeError."""
    return _run_fused_many([a], pred, output, [index_base], alloc)


def compact(
    a: np.ndarray,
    pred: Predicate,
    output: str = "values",
    stable: bool = True,
    algorithm: str | None = None,
    index_base: int = 0,
    alloc: Alloc | None = None,
) -> Any:
    """Select the elements of ``a`` (flattened in C order) where ``pred`` holds.

    Returns the values (``a.dtype``), the int64 indices ``index_base + flat index``, or both as
    a tuple, each 1-D of exact length.

    ``alloc(n, dtype)``: where the fused loop's output buffers (``a.size`` elements, of which
    the result is a view of the first ``count``) come from, e.g. a pool of buffers already
    paged in (the batch job's, see :mod:`dask_compact.batch.host_buffers`); default
    ``np.empty``, and a small result is then copied out of the large buffer. A chunk of more
    than ``_SEGMENT`` elements asks for smaller buffers, grown with its selection (each
    request at most ``a.size`` elements, at most 1.25x the full-length buffers held at once,
    or without ``alloc`` the full-length buffers plus ``_HEAP_BYTES`` where that is more;
    see :class:`_Selection`), and its result is likewise a view of at least a quarter of one
    or a copy; so does, without ``alloc``, a chunk whose full-length buffers would reach
    ``_HEAP_BYTES`` (see there).
    """
    _check_output(output)
    a = np.asarray(a)
    if pred.path == "fused":
        try:
            result = _run_fused(a, pred, output, index_base, alloc)
        except (UnsupportedPredicate, ParamOverflow, TypeError) as e:
            reason = str(e)
        else:
            logger.debug("compact %s %s chunk %s: fused loop", a.dtype, a.shape, pred)
            return result
    else:
        reason = pred.reason or "not traced"
    logger.debug("compact %s %s chunk %s: mask path (%s)", a.dtype, a.shape, pred, reason)
    return compact_masked(a, pred.mask(a), output, index_base)


def compact_many(
    blocks: list[np.ndarray], pred: Predicate, output: str = "values", stable: bool = True,
    algorithm: str | None = None, bases: list[int] | None = None,
) -> Any:
    """A run of chunks compacted by one task: the concatenation of their outputs.

    ``bases[i]`` is chunk i's global index start. The fused loop writes every chunk straight
    into its place in one buffer (no concatenation copy); the mask path concatenates.
    """
    _check_output(output)
    bases = [0] * len(blocks) if bases is None else list(bases)
    blocks = [np.asarray(b) for b in blocks]
    if len(blocks) == 1:
        return compact(blocks[0], pred, output, stable, algorithm, bases[0])
    if pred.path == "fused" and len({b.dtype for b in blocks}) == 1:
        try:
            return _run_fused_many(blocks, pred, output, bases)
        except (UnsupportedPredicate, ParamOverflow, TypeError):
            pass  # each chunk takes the mask path below, which logs why
    parts = [compact(b, pred, output, stable, algorithm, base) for b, base in zip(blocks, bases)]
    if output == "both":
        return np.concatenate([v for v, _ in parts]), np.concatenate([i for _, i in parts])
    return np.concatenate(parts)


def _run_fused_many(
    blocks: list[np.ndarray], pred: Predicate, output: str, bases: list[int],
    alloc: Alloc | None = None,
) -> Any:
    """Every chunk through the fused loop into one buffer (chunk i's indices from bases[i])."""
    dtype = blocks[0].dtype
    tp = pred.typed(dtype)  # TypeError where NumPy's typing refuses or gives non-bools
    loop = fused_loop(tp, output)
    params = tp.bind(pred.params)
    n = sum(b.size for b in blocks)
    make = alloc or _empty
    if n > _SEGMENT or (alloc is None and not one_call(n, dtype, output)):
        sel = _run_segmented(loop, blocks, bases, params, _Selection(output, dtype, n, make))
        out, idx, k = sel.out, sel.idx, sel.k
    else:
        out, idx = _buffers(make, n, dtype, output)
        k = 0
        for b, base in zip(blocks, bases):
            outs = (None if out is None else out[k:], None if idx is None else idx[k:])
            k += loop(_flat(b), *outs, int(base), params)
    return _trimmed(out, idx, k, output, alloc)


def one_call(n: int, dtype: np.dtype, output: str) -> bool:
    """Whether a call of ``n`` elements without a caller's ``alloc`` runs the loop once into
    full-length buffers (:func:`loop_call`), not over segments (``_SEGMENT``, ``_HEAP_BYTES``)."""
    return n <= one_call_limit(dtype, output)


def one_call_limit(dtype: np.dtype, output: str) -> int:
    """The most elements for which :func:`one_call` holds: a kept call (``numpy_calls``)
    compares a size with it, 0.05 us where one_call takes 0.5 (2-core machine)."""
    return min(_SEGMENT, (_HEAP_BYTES - 1) // output_bytes(dtype.itemsize, output))


_INT64 = np.dtype(np.int64)


def loop_call(loop: CompiledLoop, flat: np.ndarray, output: str, base: int,
              params: tuple) -> Any:
    """One loop call over the 1-D C-contiguous ``flat`` into full-length buffers, trimmed: what
    :func:`compact` runs for a chunk where :func:`one_call` holds (the repeated call of
    ``numpy_calls`` runs it with the loop and constants it kept)."""
    # each output written out, not through _buffers and _trimmed: 1.1 us less of a 64-element
    # call of about 10 us (2-core machine)
    n = flat.shape[0]
    if output == "indices":
        idx = np.empty(n, _INT64)
        return _trim(idx, loop(flat, None, idx, base, params))
    if output == "values":
        out = np.empty(n, flat.dtype)
        return _trim(out, loop(flat, out, None, base, params))
    out, idx = np.empty(n, flat.dtype), np.empty(n, _INT64)
    k = loop(flat, out, idx, base, params)
    return _trim(out, k), _trim(idx, k)


def _trimmed(out: np.ndarray | None, idx: np.ndarray | None, k: int, output: str,
             alloc: Alloc | None) -> Any:
    return by_output(None if out is None else _trim(out, k, alloc),
                     None if idx is None else _trim(idx, k, alloc), output)


def _empty(n: int, dtype: np.dtype) -> np.ndarray:
    return np.empty(n, dtype=dtype)


def _buffers(make: Alloc, n: int, dtype: np.dtype,
             output: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The loop's output buffers of ``n`` elements from ``make``: values (``dtype``) and/or
    int64 indices, each None where ``output`` has none."""
    return (make(n, dtype) if output != "indices" else None,
            make(n, np.dtype(np.int64)) if output != "values" else None)


class _Selection:
    """The loop's output buffers of a segmented call (values and/or indices, ``cap`` elements
    each, from ``make``), the first ``k`` of them written, and how many of the call's ``n``
    input elements have run (``done``).

    They start at the first step's length (:func:`_first_step`), which measures the rate at
    which the input is selected; the buffers then grow to the selection that rate projects,
    copying only that step's selection. Starting them at a segment and growing them once
    filled copied and paged in again much of what the loop had written: at 2^24 elements,
    p = 0.5, indices, 1.33x (float32) and 1.36x (int8) the time of one full-length buffer
    (the 2-core machine, calls alternating in one process).
    """

    def __init__(self, output: str, dtype: np.dtype, n: int, make: Alloc) -> None:
        self.n, self.make, self.k, self.done = n, make, 0, 0
        self.output, self.width = output, output_bytes(dtype.itemsize, output)
        self.last = (0, 0)  # the last loop call's (selected, run)
        # () -> (selected, sampled) of a sample spread over the input not yet run, set by the
        # caller running the loop; None again once asked (:meth:`_sampled_cap`: once a call)
        self.rest: Callable[[], tuple[int, int]] | None = None
        self.cap = min(n, _first_step())
        self.out, self.idx = _buffers(make, self.cap, dtype, output)

    def step(self, want: int) -> int:
        """How many of the next ``want`` input elements the loop may run now: as many as the
        buffers have room for (the loop may store up to one element per input element past
        ``k``), after growing them where that room is under a small step (from the second
        step on: the first measures the rate)."""
        if self.done and self.cap - self.k < min(want, _min_step()):
            self._grow()
        return min(want, self.cap - self.k)

    def _grow(self) -> None:
        # To the selection projected at the rate so far, with 1/16 to spare and a small step's
        # room past it (so an accurate projection is the last growth), or to twice the buffers
        # where that is more (a rate rising: a few growths), never past what the rest of the
        # input could select (``most``), and straight to that where the growth would pass a
        # quarter of it. So every buffer but the last is under a quarter of the call's length
        # n, and a call holds at most 1.25x its full-length buffers while both exist
        # (batch.plan.chunk_cost charges 1.5x; without the jump a selection rising late held
        # 1.93x, a search over step-shaped rates). The selection so far is copied over.
        # Where the last step (of at least :func:`_rate_sample` elements) selected at a higher
        # rate than the call so far, that rate is projected over the next segment too: a rate
        # rising along the call, projected at the call's rate, grew the buffers four times,
        # each growth copying the selection so far (2^24 float64, output="both": 0 then 1
        # halfway 29 ms, against 14 ms for one full-length buffer; a probe); over the whole
        # rest instead, a burst of 1-2% of the call took buffers of most of its length (a
        # review).
        left = self.n - self.done
        most = self.k + left
        got, ran = self.last
        rate = self.k / self.done if self.done else 1.0
        recent = got / ran if ran >= _rate_sample() else 0.0
        projected = (self.k + math.ceil(rate * left * 17 / 16)
                     + math.ceil(max(0.0, recent - rate) * min(left, _SEGMENT)) + _min_step())
        cap = min(most, max(2 * self.cap, projected))
        if 4 * cap > most and not self._kept_on_heap(cap, most, rate, recent):
            cap = self._sampled_cap(most) or most
        self.out = self._moved(self.out, cap)
        self.idx = self._moved(self.idx, cap)
        self.cap = cap

    def _kept_on_heap(self, cap: int, most: int, rate: float, recent: float) -> bool:
        """Whether buffers of ``cap`` elements keep their projected size past a quarter of
        ``most`` rather than go straight to it, so that they come from the heap's paged-in
        memory (see ``_HEAP_BYTES``): without a caller's alloc, under ``_HEAP_BYTES`` in all,
        grown from buffers under a quarter of the most (a later growth then goes to the most:
        the call holds at most its full-length buffers plus ``_HEAP_BYTES``), and with the
        last step's rate within the projection's 1/16 of the call's. A rising rate outgrew
        its projection again, one more copy of the selection so far (2026-12-04, the 2-core
        machine: a ramp of 6 Mi float32 indices 4.5 ms against 3.6, selected 0 then 1 2.6
        against 2.2 ms)."""
        return (self.make is _empty and cap * self.width < _HEAP_BYTES
                and 4 * self.cap <= most and 16 * recent <= 17 * rate)

    def _sampled_cap(self, most: int) -> int:
        """Buffers under ``_HEAP_BYTES`` for the selection that a sample of the rest of the
        input projects, where buffers of ``most`` elements would be mapped fresh and the
        projection from the rates so far (taken at the first growth past a quarter of the
        most) is not under it; else 0 (go to the most). The rates so far are those of the
        part already run: a rate falling along the call (all selected, then none) projected
        the whole length from its first step, and its full-length buffers, mapped fresh,
        faulted in every page the selection wrote, where NumPy's exact result came from the
        heap: 0.44-0.78x ``np.flatnonzero`` at 2^22-5 Mi float32 indices (2026-12-04, the
        2-core machine). The sample (:func:`_rest_sample`: :func:`_sample_size` elements
        spread over the rest) is taken once per call at most, without a caller's alloc, and
        only where a selection under ``_HEAP_BYTES`` is still possible. The projection takes the
        sample's rate plus two standard errors, with the same 1/16 to spare and a small
        step's room; a selection past it grows the buffers once more, to the most (the
        memory bound of :meth:`_kept_on_heap` holds: these buffers are under
        ``_HEAP_BYTES``)."""
        heap_room = _HEAP_BYTES // self.width
        if (self.rest is None or self.make is not _empty
                or most < heap_room or 4 * self.cap > most
                or self.k + _min_step() >= heap_room):
            return 0
        rest, self.rest = self.rest, None
        got, size = rest()
        if not size:
            return 0
        r = got / size
        r = min(1.0, r + 2 * math.sqrt(r * (1 - r) / size) + 1 / size)
        left = self.n - self.done
        cap = self.k + math.ceil(r * left * 17 / 16) + _min_step()
        return cap if cap < min(most, heap_room) else 0

    def _moved(self, buf: np.ndarray | None, cap: int) -> np.ndarray | None:
        if buf is None:
            return None
        new = self.make(cap, buf.dtype)
        new[: self.k] = buf[: self.k]
        return new

    def ran(self, m: int, got: int) -> None:
        """A loop call ran ``m`` more input elements and selected ``got`` of them."""
        self.k += got
        self.done += m
        self.last = (got, m)

    def window(self, buf: np.ndarray | None, m: int) -> np.ndarray | None:
        """Where the loop writes a step of ``m`` elements: ``m`` elements of ``buf`` from k."""
        return None if buf is None else buf[self.k : self.k + m]


def _rate_sample() -> int:
    # The least elements of a loop call whose own selection rate may raise the projection
    # (_Selection._grow): a shorter one is too few to tell a rate from chance. 4096 of a
    # 2^22 segment.
    return max(16, _SEGMENT // 1024)


def _min_step() -> int:
    # The least room the buffers keep before they grow, so a step may be shorter than a
    # segment: at most 16 loop calls a segment, a few microseconds each.
    return max(1, _SEGMENT // 16)


def _first_step() -> int:
    # The first step's length, and its buffers': 2^16 elements of a 2^22 segment, enough to
    # measure the rate. At 1/16 of a segment (2 MiB of fresh int64, paged in by the loop)
    # a 2^24 call at p = 0.5 took 1.05-1.08x the full-length buffer's time; at 1/64, 0.99x.
    return max(1, _SEGMENT // 64)


def _sample_size() -> int:
    # Elements of the sample of the rest of a call (_Selection._sampled_cap): 1024 of a 2^22
    # segment, whose rate's standard error is at most 1.6%; gathered from pages spread over
    # the call, they took 0.1 ms against the 1.5-4 ms of a call of 2^22 float32 elements.
    return max(64, _SEGMENT // 4096)


def _rest_sample(loop: Any, blocks: list[np.ndarray], start: tuple[int, int], params: tuple,
                 output: str) -> tuple[int, int]:
    """(selected, sampled) of :func:`_sample_size` elements spread over the elements of
    ``blocks`` (each in C order) from ``start`` = (block, flat offset in it) on, through
    ``loop``: one in each of as many equal strata of them, at a fraction of it that steps by
    the golden ratio from stratum to stratum (the same place in each would alias with a
    periodic selection: every other element selected counted all or none; a random
    generator took a third of the sample's time); gathered by index, so a non-contiguous
    block is not copied whole."""
    first, offset = start
    sizes = [b.size for b in blocks[first:]]
    sizes[0] -= offset
    left = sum(sizes)
    count = min(left, _sample_size())
    if count == 0:
        return 0, 0
    edges = np.arange(count + 1, dtype=np.int64) * left // count
    jitter = (np.arange(count) * 0.6180339887498949) % 1.0
    at = edges[:-1] + (jitter * np.diff(edges)).astype(np.int64)
    parts, lo = [], 0
    for b, size, skip in zip(blocks[first:], sizes, [offset] + [0] * len(sizes)):
        mine = at[(at >= lo) & (at < lo + size)] - lo + skip
        lo += size
        if mine.size:
            flat = b.reshape(-1) if b.flags.c_contiguous else None
            parts.append(flat[mine] if flat is not None else b[np.unravel_index(mine, b.shape)])
    sample = np.concatenate(parts)
    return int(loop(sample, *_buffers(_empty, count, sample.dtype, output), 0, params)), count


def _run_segmented(
    loop: Any, blocks: list[np.ndarray], bases: list[int], params: tuple, sel: _Selection
) -> _Selection:
    """Every chunk's segments through the loop into ``sel``'s buffers, each element read once
    and each selected one written straight into its place (copied again only when the buffers
    grow). Memory: the buffers, which end at about the selection and 1/16 of a segment plus,
    after a rise in the rate, up to a segment or twice the selection (the call's length where
    a growth passed a quarter of it), the old ones during a growth (under a quarter of the
    call's length), and one segment's copy of a non-contiguous chunk."""
    at = (0, 0)  # (block, flat offset in it) of the next element to run
    output = sel.output  # not sel itself: a cycle through sel kept its buffers until gc ran
    sel.rest = lambda: _rest_sample(loop, blocks, at, params, output)
    for i, (b, base) in enumerate(zip(blocks, bases)):
        for offset, seg in _segments(b, _SEGMENT):
            lo = 0
            while lo < seg.size:
                at = (i, offset + lo)
                m = sel.step(seg.size - lo)
                got = loop(
                    seg[lo : lo + m],
                    sel.window(sel.out, m),
                    sel.window(sel.idx, m),
                    int(base) + offset + lo,
                    params,
                )
                sel.ran(m, got)
                lo += m
    return sel


def compact_masked(
    a: np.ndarray, mask: np.ndarray, output: str = "values", index_base: int = 0
) -> Any:
    """Select the elements of ``a`` where the boolean array ``mask`` (``a``'s shape) is true."""
    _check_output(output)
    a = np.asarray(a)
    mask = np.asarray(mask)
    if mask.dtype != np.dtype(bool):
        raise TypeError(f"mask must be a boolean array, got dtype {mask.dtype}")
    if mask.shape != a.shape:
        raise ValueError(f"mask shape {mask.shape} does not match the chunk's shape {a.shape}")
    m = np.ravel(mask, order="C")
    values = np.ravel(a, order="C")[m] if output != "indices" else None
    indices = None
    if output != "values":
        indices = np.flatnonzero(m).astype(np.int64, copy=False)
        if index_base:
            indices += np.int64(index_base)
    return by_output(values, indices, output)


def compact_into(
    a: np.ndarray, pred: Predicate, output: str, out_values: np.ndarray | None,
    out_indices: np.ndarray | None, count: np.ndarray | None = None,
) -> np.ndarray:
    """The selection of ``a`` written into the caller's buffers (capacity >= ``a.size``, the
    arguments checked by :func:`dask_compact.compact_into`), its length into ``count[0]``
    (None: a new int64 array).

    The fused loop writes straight into the buffers; it stores every element at the running
    count before deciding whether to keep it, so the element just past the count may hold
    scratch. The mask path writes the selection only.
    """
    a = np.asarray(a)
    if count is None:
        count = np.empty(1, dtype=np.int64)
    if pred.path == "fused":
        try:
            tp = pred.typed(a.dtype)
            loop = fused_loop(tp, output)
            k = _loop_into(loop, a, out_values, out_indices, tp.bind(pred.params))
        except (UnsupportedPredicate, ParamOverflow, TypeError) as e:
            logger.debug("compact_into %s chunk %s: mask path (%s)", a.dtype, pred, e)
        else:
            count[0] = k
            return count
    m = np.ravel(np.asarray(pred.mask(a)), order="C")
    k = int(np.count_nonzero(m))
    if out_values is not None:
        np.compress(m, np.ravel(a, order="C"), out=out_values[:k])
    if out_indices is not None:
        out_indices[:k] = np.flatnonzero(m)
    count[0] = k
    return count


def _loop_into(
    loop: Any, a: np.ndarray, out: np.ndarray | None, idx: np.ndarray | None, params: tuple
) -> int:
    """The loop over ``a`` into the caller's buffers (capacity ``a.size``): in one call, but
    segment by segment for a non-contiguous ``a`` of more than a segment, which would
    otherwise be copied whole into C order first."""
    if a.flags.c_contiguous or a.size <= _SEGMENT:
        return loop(_flat(a), out, idx, 0, params)
    k = 0
    for offset, seg in _segments(a, _SEGMENT):
        outs = (None if out is None else out[k:], None if idx is None else idx[k:])
        k += loop(seg, *outs, offset, params)
    return k
