"""The streaming job: the three phases run over a sliding window of input chunks whose memory
fits a budget, each output chunk written at its global offset as soon as the pieces that fill
it are known.

The loop runs on the client. It keeps as many input chunks in flight as the budget allows
(a chunk is charged its decoded size plus a full selection until its count is known, then its
actual output until that is written), so reading the next chunks overlaps compacting and
writing earlier ones, and memory does not grow with the input. Counts arrive in any order; the
exclusive scan advances over the contiguous prefix of known counts (the running offset), and
every output chunk that prefix fills is written by one task from the slices of the pieces that
make it up: no two tasks ever write one Zarr chunk, and a piece is dropped as soon as the writes
that use it are done. The output arrays are created at the input's length and cut to the
selected length at the end (a metadata change).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import early_read, tasks
from . import manifest as manifest_io
from .executor import ClientExecutor, Executor, NoWorkers
from .manifest import Manifest
from .plan import (
    Layout,
    Part,
    chunk_cost,
    job_minimum,
    out_chunks_total,
    parts_of,
    piece_charge,
    thread_cost,
)
from .reader import Reader
from .record_tasks import RecordReader
from .signals import raise_if_interrupted
from .tasks import OutputArrays, PieceInfo, info, take

MANIFEST_EVERY_S = 1.0  # a manifest a second behind only means a little recomputation

# The most input chunks being read and compacted at once (their counts not yet known),
# beside the budget's bytes: each costs some kilobytes of bookkeeping (its futures,
# callbacks, the executor's and the scheduler's task state) that the budget does not see.
# With tiny tasks (`--chunks 7`) the budget admitted every task at once: 37,450 in flight and
# 349 MB at 2^18 elements, 3.4 GB after 10 minutes at 2^22. Far more than the threads can
# use: a task's read ahead of its turn only needs to cover the others' latency. Only reads
# count: the pieces read and waiting for the rest of their output chunk are as many as a
# sparse selection needs to fill one (1/p chunks at selectivity p, the output chunk being
# one input chunk's elements), so counting them made a job of `x > 0.9999` read one chunk
# at a time once that many waited (a review, the same day: 14.5 s against 9.0 s at 2^20).
TASKS_AHEAD_MIN = 1024
TASKS_AHEAD_PER_THREAD = 16


def tasks_ahead(threads: int) -> int:
    """How many input chunks a job of ``threads`` threads reads at once at most (see
    TASKS_AHEAD_MIN)."""
    return max(TASKS_AHEAD_MIN, TASKS_AHEAD_PER_THREAD * threads)


@dataclass
class Stats:
    """What the summary reports of the tasks (seconds summed over all tasks)."""

    read_s: float = 0.0
    compact_s: float = 0.0
    write_s: float = 0.0
    chunks: int = 0
    gpu_chunks: int = 0
    gpu_decoded: int = 0
    gpu_encoded: int = 0  # output chunks (of each array) encoded on a GPU
    write_tasks: int = 0  # the tasks that wrote them (several chunks a task: .plan.writes_per_task)
    peak_reserved: int = 0  # the most charged to pieces at once (see _Stream.admit)
    peak_reading: int = 0  # the most input chunks being read at once (see tasks_ahead)
    fixed: int = 0  # the threads' own buffers, charged for the whole job (charge_threads)
    minimum: int = 0  # the least the job can run in (plan.job_minimum)
    pool_peak: int = 0  # the most the selections' pool held, idle buffers included
    resumed_from_chunk: int = 0
    skipped_bytes: int = 0
    # time.perf_counter() of the loop's start and of its first and last pieces and writes
    # (the summary's timeline: where a job's wall time goes beside the tasks' own seconds)
    marks: dict[str, float] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)  # the first piece's read, compact

    @property
    def in_flight(self) -> int:
        """An upper bound of the memory the job held beyond the process's baseline: the
        threads' buffers and the pieces' (or the pool's, its idle buffers included, where it
        held more)."""
        return self.fixed + max(self.peak_reserved, self.pool_peak)

    def mark(self, event: str) -> None:
        now = time.perf_counter()
        self.marks.setdefault(f"first_{event}", now)
        self.marks[f"last_{event}"] = now


@dataclass
class Job:
    reader: Reader | RecordReader
    layout: Layout
    where: str
    mode: str
    device: str  # "cpu", "gpu" or "gpu-all": where the chunk tasks compact (tasks.read_compact)
    dest: OutputArrays
    budget: int
    manifest: Manifest
    manifest_dir: str | None  # None: no resume (an fsspec URL output)
    decode: str = "cpu"  # "gpu": nvCOMP decodes the chunks on the device
    encode: str = "cpu"  # "gpu": selections stay on the device, nvCOMP encodes output chunks
    stats: Stats = field(default_factory=Stats)
    # The chunk task, called as tasks.read_compact is; None: tasks.read_compact (looked up
    # when the job runs). A record's job reads several fields (.record_tasks).
    task: Callable[..., Any] | None = None
    # Output chunks a write task writes at most (.plan.writes_per_task). 2-core machine, 512
    # output chunks of 64 KiB, 128 a task against one a task: under --local processes
    # 2.25-2.36 s against 3.04 s; under threads, alternating, 1.17-1.26 s against 1.26-1.32 s.
    writes_per_task: int = 1


def charge_threads(ex: Executor, job: Job) -> int:
    """Charge the job's budget with every thread's buffers (:func:`.plan.thread_cost`), held
    whatever the pieces; note the least the job can run in. Returns the threads' charge."""
    copies = isinstance(ex, ClientExecutor)
    job.stats.fixed = ex.threads * thread_cost(job.layout, job.mode, copies)
    job.stats.minimum = job_minimum(job.layout, job.mode, ex.threads, copies)
    return job.stats.fixed


def run_stream(ex: Executor, job: Job, progress: Callable[[int], None] | None = None) -> int:
    """Run the job on ``ex``; return the number of selected elements. Raises the first task's
    error (the caller stops the executor and removes the temporary group)."""
    return _Stream(ex, job, progress).run()


class _Stream:
    def __init__(self, ex: Executor, job: Job, progress: Callable[[int], None] | None) -> None:
        self.ex, self.job, self.progress = ex, job, progress
        self.layout = job.layout
        self.C = job.layout.out_chunk
        self.events: queue.Queue[tuple[str, int, Any, Any]] = queue.Queue()
        m = job.manifest
        first, offset = m.resume_point(self.C) if m.written else (0, 0)
        first = min(first, self.layout.nchunks)
        self.counts: dict[int, int] = {k: m.counts[k] for k in range(first)}
        # Beyond the resume point, a chunk whose output chunks are all on disk is not read
        # again (writes finish out of order, so the written chunks need not be contiguous).
        self.skippable = self._skippable(m, first)
        self.offsets: dict[int, int] = {}
        self.next_submit = first  # the next input chunk to read
        self.next_scan = first  # offsets are known below it
        self.running = offset  # the offset of chunk next_scan
        self.lo_chunk = first  # pieces below it are no longer needed
        self.next_out = offset // self.C  # output chunks below it are scheduled or written
        self.pieces: dict[int, Any] = {}
        self.users: dict[int, int] = {}  # input chunk -> writes in flight that read its piece
        self.copies = isinstance(ex, ClientExecutor)  # slices copied for the writers
        self.fixed = charge_threads(ex, job)
        self.reserved = 0  # charged to pieces; the budget holds it and the threads' buffers
        self.charged: dict[int, int] = {}
        self.held = 0  # input chunks read or being read whose pieces some write may still need
        self.max_reading = tasks_ahead(ex.threads)
        self.refilling = True  # False from reaching the cap until half the reads have ended
        self.reading = 0  # input chunks being read and compacted (count not yet known)
        self.writes = 0  # output chunks being written
        self.last_save = 0.0
        job.stats.resumed_from_chunk = first
        job.stats.skipped_bytes = sum(self.layout.in_bytes(k) for k in range(first))

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        nchunks = self.layout.nchunks
        if self.progress and self.job.stats.skipped_bytes:
            self.progress(self.job.stats.skipped_bytes)
        self.job.stats.marks["loop"] = time.perf_counter()
        first = True
        while True:
            self.admit()
            if first:
                # The first window is admitted: chunks read early outside it are dropped and
                # no more are started (the tasks read the rest; see .early_read).
                early_read.stop(keep_below=self.next_submit)
                first = False
            if self.held == 0 and self.writes == 0 and self.next_submit >= nchunks:
                break
            raise_if_interrupted()  # one lost in a finalizer: stop now, not at the commit
            try:
                kind, key, fut, extra = self.events.get(timeout=0.2)
            except queue.Empty:
                try:
                    self.ex.idle()  # a cluster without workers: said, or past its timeout
                except NoWorkers:
                    self.save_manifest(force=True)  # what was written, for --resume
                    raise
                continue
            self.ex.busy()
            if self.ex.failed(fut):
                self.ex.result(fut)  # raises the task's exception
                raise RuntimeError(f"a task of the job was cancelled ({kind} {key})")
            if kind == "piece":
                self.piece_done(key, self.ex.result(fut))
            elif kind == "writes":  # several output chunks of one task, each as its own
                for (j, chunks), done in zip(extra, self.ex.result(fut)):
                    self.write_done(j, done, chunks)
            else:
                self.write_done(key, self.ex.result(fut), extra)
        # No last save: the commit that follows removes the manifest, and a job killed before
        # it resumes from the last periodic one. A save here, just after the job's last writes,
        # stalled the end of 2 commands in 26 of 8 GiB on the H100 (0.32 and 0.65 s; most
        # likely its few bytes waited behind the output's gigabytes of dirty pages).
        return self.running

    def _skippable(self, m: Manifest, first: int) -> dict[int, int]:
        if not m.written:
            return {}
        out, offset = {}, sum(m.counts[:first])
        for i in range(first, len(m.counts)):
            c = m.counts[i]
            lo, hi = offset // self.C, (offset + c - 1) // self.C
            if c == 0 or all(j in m.written for j in range(lo, hi + 1)):
                out[i] = c
            offset += c
        return out

    def admit(self) -> None:
        """Start reading input chunks while the budget allows (the threads' buffers and the
        pieces' charges) and fewer than ``max_reading`` are read (:func:`tasks_ahead`), and
        always one if nothing runs (no read, no write): pieces waiting for the rest of their
        output chunk must not stall the job. So a budget below the job's
        minimum (:func:`.plan.job_minimum`) runs one task at a time and holds at most that
        minimum, which the summary then shows above the budget."""
        while self.next_submit < self.layout.nchunks:
            i = self.next_submit
            if i in self.skippable:
                self.held += 1
                self.reading += 1
                self.next_submit += 1
                self.charged[i] = 0
                self.piece_done(i, PieceInfo(self.skippable[i], 0, 0.0, 0.0, "skipped"))
                continue
            # checked first: the loop asks at every event. Once at the cap, reads start
            # again when half of them have ended, in a burst (see TASKS_AHEAD_MIN)
            if self.reading >= self.max_reading:
                self.refilling = False
                return
            if not self.refilling and self.reading > self.max_reading // 2:
                return
            self.refilling = True
            cost = chunk_cost(self.layout, i, self.job.mode, self.copies)
            early = early_read.active()
            if early is not None and i < early.count:  # decoded outside the threads' buffers
                cost = max(cost, early_read.early_cost(self.layout, i, self.job.mode))
            if (self.reading or self.writes) and (
                    self.fixed + self.reserved + cost > self.job.budget):
                return
            r0, r1 = self.layout.rows[i], self.layout.rows[i + 1]
            task = self.job.task or tasks.read_compact
            piece = self.ex.submit(task, self.job.reader, i, r0, r1, self.layout.start(i),
                                   self.job.where, self.job.mode, self.job.device,
                                   self.job.decode, self.job.encode)
            summary = self.ex.derive(info, piece)
            self.pieces[i] = piece
            self.charged[i] = cost
            self.reserved += cost
            self.job.stats.peak_reserved = max(self.job.stats.peak_reserved, self.reserved)
            self.held += 1
            self.reading += 1
            self.job.stats.peak_reading = max(self.job.stats.peak_reading, self.reading)
            self.next_submit += 1
            self.ex.on_done(summary, self._event("piece", i))

    def _event(self, kind: str, key: int, extra: Any = None) -> Callable[[Any], None]:
        return lambda fut: self.events.put((kind, key, fut, extra))

    # -- a chunk was read and compacted ---------------------------------------------------------

    def piece_done(self, i: int, pinfo: Any) -> None:
        st = self.job.stats
        st.mark("piece")
        skipped = pinfo.device == "skipped"
        if not skipped and "first_piece_read_s" not in st.durations:
            st.durations["first_piece_read_s"] = pinfo.read_s
            st.durations["first_piece_compact_s"] = pinfo.compact_s
        if skipped:
            st.skipped_bytes += self.layout.in_bytes(i)
        st.read_s += pinfo.read_s
        st.compact_s += pinfo.compact_s
        st.chunks += not skipped
        st.gpu_chunks += pinfo.device == "gpu"
        st.gpu_decoded += pinfo.decode == "gpu"
        if self.progress:
            self.progress(self.layout.in_bytes(i))
        self.reading -= 1
        self.counts[i] = pinfo.count
        # The decoded chunk is gone; only its output is held until written.
        held = 0 if skipped else piece_charge(pinfo.nbytes, pinfo.count, self.layout,
                                              self.job.mode, self.copies)
        self.reserved -= self.charged[i] - held
        self.charged[i] = held
        self.users.setdefault(i, 0)
        while self.next_scan in self.counts:
            k = self.next_scan
            self.offsets[k] = self.running
            self.running += self.counts[k]
            self.next_scan += 1
        self.schedule_writes()

    def schedule_writes(self) -> None:
        done_reading = self.next_scan >= self.layout.nchunks
        limit = (out_chunks_total(self.running, self.C) if done_reading
                 else self.running // self.C)
        last = self.next_scan - 1
        group: list[tuple[int, list[Part]]] = []
        for j in range(self.next_out, limit):
            parts = parts_of(j, self.C, self.offsets, self.counts, self.lo_chunk, last)
            if j in self.job.manifest.written or not parts:
                continue
            group.append((j, parts))
            if len(group) >= self.job.writes_per_task:
                self.submit_writes(group)
                group = []
        if group:
            self.submit_writes(group)
        self.next_out = max(self.next_out, limit)
        # Pieces wholly inside scheduled output chunks are needed by no later write.
        edge = self.next_out * self.C
        while self.lo_chunk < self.next_scan and (
            self.offsets[self.lo_chunk] + self.counts[self.lo_chunk] <= edge or done_reading
        ):
            k = self.lo_chunk
            self.lo_chunk += 1
            self.held -= 1
            if self.users.get(k, 0) == 0:
                self.drop(k)

    def submit_writes(self, group: list[tuple[int, list[Part]]]) -> None:
        """Output chunks ``(j, parts)`` written by one task (one: :meth:`submit_write`). Each
        is accounted as a write of its own (``writes``, its pieces' ``users``), and done as
        such (:meth:`write_done`) when the task ends."""
        if len(group) == 1:
            self.submit_write(*group[0])
            return
        chunks = sorted({p.chunk for _, parts in group for p in parts})
        which = {k: w for w, k in enumerate(chunks)}
        pieces = [self.pieces[k] for k in chunks]
        shift = dict.fromkeys(chunks, 0)
        if isinstance(self.ex, ClientExecutor) and len(chunks) > 1:
            # Move only the spans the writes use, as submit_write moves its slices
            span = {k: (min(p.lo for _, ps in group for p in ps if p.chunk == k),
                        max(p.hi for _, ps in group for p in ps if p.chunk == k))
                    for k in chunks}
            pieces = [self.ex.submit(take, f, *span[k], priority=1)
                      for f, k in zip(pieces, chunks)]
            shift = {k: span[k][0] for k in chunks}
        plan = [(j, [which[p.chunk] for p in parts], [p.lo - shift[p.chunk] for p in parts],
                 [p.hi - shift[p.chunk] for p in parts]) for j, parts in group]
        fut = self.ex.submit(tasks.write_chunks, self.job.dest, plan, *pieces, priority=1)
        self.job.stats.write_tasks += 1
        for _, parts in group:
            for p in parts:
                self.users[p.chunk] = self.users.get(p.chunk, 0) + 1
        self.writes += len(group)
        self.ex.on_done(fut, self._event("writes", group[0][0],
                                         [(j, [p.chunk for p in parts]) for j, parts in group]))

    def submit_write(self, j: int, parts: list[Part]) -> None:
        pieces = [self.pieces[p.chunk] for p in parts]
        los, his = [p.lo for p in parts], [p.hi for p in parts]
        if isinstance(self.ex, ClientExecutor) and len(parts) > 1:
            # Move only the slices to the writer, not whole pieces (each slice is cut on the
            # worker that holds its piece).
            pieces = [self.ex.submit(take, f, lo, hi, priority=1)
                      for f, lo, hi in zip(pieces, los, his)]
            los, his = [0] * len(parts), [p.hi - p.lo for p in parts]
        fut = self.ex.submit(tasks.write_chunk, self.job.dest, j, los, his, *pieces, priority=1)
        self.job.stats.write_tasks += 1
        for p in parts:
            self.users[p.chunk] = self.users.get(p.chunk, 0) + 1
        self.writes += 1
        self.ex.on_done(fut, self._event("write", j, [p.chunk for p in parts]))

    def drop(self, k: int) -> None:
        piece = self.pieces.pop(k, None)
        if piece is not None:
            self.ex.release(piece)
        self.reserved -= self.charged.pop(k, 0)

    # -- an output chunk was written --------------------------------------------------------------

    def write_done(self, j: int, done: tuple[float, int, dict[str, list[int]]],
                   chunks: list[int]) -> None:
        seconds, on_gpu, files = done
        self.job.stats.write_s += seconds
        self.job.stats.mark("write")
        self.job.stats.gpu_encoded += on_gpu
        self.writes -= 1
        self.job.manifest.written.add(j)
        self.job.manifest.files[j] = files  # what --resume checks before it trusts `written`
        for k in chunks:
            self.users[k] -= 1
            if self.users[k] == 0 and k < self.lo_chunk:
                self.drop(k)
        self.save_manifest()

    def save_manifest(self, force: bool = False) -> None:
        """Save the manifest if the last save is MANIFEST_EVERY_S old (``force``: now)."""
        if self.job.manifest_dir is None:
            return
        now = time.monotonic()
        if not force and now - self.last_save < MANIFEST_EVERY_S:
            return
        m = self.job.manifest
        m.counts = [self.counts[k] for k in range(self.next_scan)]
        manifest_io.save(self.job.manifest_dir, m)
        self.last_save = time.monotonic()
        # the loop's thread waits for each save (the summary's timeline reports them)
        d = self.job.stats.durations
        d["manifest_saves"] = d.get("manifest_saves", 0) + 1
        d["manifest_save_max_s"] = max(d.get("manifest_save_max_s", 0.0), self.last_save - now)
