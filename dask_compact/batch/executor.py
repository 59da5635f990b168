"""One interface over the two places a streaming job's tasks run: a local thread pool, or a
distributed cluster through its client. ``submit(fn, *args)`` takes futures of the same
executor as arguments (a task runs once they are done, with their results); ``on_done``
reports each finished future to the scheduling loop; ``stop`` cancels what has not run and
returns only once nothing started still runs (a late write must not recreate a removed
temporary group)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

_worker = threading.local()

# A cluster that has had no workers this long while the job waits is said on stderr, and
# again at twice, four times... that wait (ClientExecutor.idle).
NO_WORKERS_SAY_S = 30.0


class NoWorkers(RuntimeError):
    """The cluster has had no workers for ``--no-workers-timeout`` seconds."""


def spare_threads() -> int:
    """Threads of the pool running this task that have nothing to do (nothing queued, nothing
    running): a task may use that many more threads of its own (see
    :func:`.tasks.write_chunk_file`). 0 outside a :class:`ThreadExecutor` (a distributed
    worker's other threads are not known to be idle)."""
    ex = getattr(_worker, "executor", None)
    return 0 if ex is None else ex.spare()


class ThreadExecutor:
    """Tasks in a pool of threads in this process; results stay in memory, nothing pickled.

    A task whose arguments are futures is queued only once they are done (callbacks, not a
    blocked pool thread), so no thread waits on another. Queued tasks run by priority, then in
    order: writes (priority 1) go before reads, so memory is freed before more is taken.
    """

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._stopped = False
        self._running = 0
        self._workers = [
            threading.Thread(target=self._work, name=f"dask-compact-{k}", daemon=True)
            for k in range(threads)
        ]
        for t in self._workers:
            t.start()

    def _work(self) -> None:
        _worker.executor = self
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            fut, fn, args = item
            if self._stopped or not fut.set_running_or_notify_cancel():
                if not fut.done():
                    fut.cancel()
                continue
            with self._lock:
                self._running += 1
            try:
                result = fn(*args)
            except BaseException as e:  # noqa: BLE001 -- handed to whoever waits on it
                fut.set_exception(e)
            else:
                fut.set_result(result)
            finally:
                with self._lock:
                    self._running -= 1

    def spare(self) -> int:
        """Threads with nothing to run now (none while anything is queued)."""
        with self._lock:
            running = self._running
        return 0 if self._queue.qsize() else max(0, self.threads - running)

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = 0) -> Future:
        out: Future = Future()
        deps = [a for a in args if isinstance(a, Future)]
        remaining = [len(deps)]

        def start() -> None:
            for d in deps:
                if d.cancelled() or d.exception() is not None:
                    exc = d.exception() if not d.cancelled() else RuntimeError("cancelled")
                    out.set_exception(exc)
                    return
            if self._stopped:
                out.cancel()
                return
            real = tuple(a.result() if isinstance(a, Future) else a for a in args)
            self._queue.put((-priority, next(self._order), (out, fn, real)))

        def dep_done(_: Future) -> None:
            with self._lock:
                remaining[0] -= 1
                ready = remaining[0] == 0
            if ready:
                start()

        if not deps:
            start()
        for d in deps:
            d.add_done_callback(dep_done)
        return out

    def derive(self, fn: Callable[[Any], Any], fut: Future) -> Future:
        """``fn(result)`` for a cheap ``fn``, run as ``fut`` completes (never queued)."""
        out: Future = Future()

        def done(f: Future) -> None:
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())
            else:
                out.set_result(fn(f.result()))

        fut.add_done_callback(done)
        return out

    @staticmethod
    def result(fut: Future) -> Any:
        return fut.result()

    @staticmethod
    def failed(fut: Future) -> bool:
        return fut.cancelled() or fut.exception() is not None

    @staticmethod
    def on_done(fut: Future, callback: Callable[[Any], None]) -> None:
        fut.add_done_callback(callback)

    def release(self, fut: Future) -> None:
        """Nothing to do: a result nobody references is freed."""

    def idle(self) -> None:
        """Nothing to watch: this process's threads do not go away (see ClientExecutor)."""

    def busy(self) -> None:
        """Nothing to watch."""

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel what is queued; return once the running tasks have ended."""
        self._stopped = True
        self.close()

    def close(self) -> None:
        for _ in self._workers:
            self._queue.put((1 << 30, next(self._order), None))  # after everything queued
        for t in self._workers:
            t.join()


class ClientExecutor:
    """Tasks on a distributed cluster; a task that takes a future runs where its data is."""

    def __init__(self, client: Any, no_workers_timeout: float | None = None) -> None:
        self.client = client
        self.no_workers_timeout = no_workers_timeout
        self._alone_since: float | None = None  # when idle() first saw no workers
        self._say_at = NO_WORKERS_SAY_S
        self._next_look = 0.0
        # Futures that may still run (for stop()); a done one is dropped at once, since holding
        # it would keep its result (a piece) in the cluster's memory.
        self._live: set[Any] = set()
        self._keys: set[Any] = set()
        self.threads = sum(w["nthreads"] for w in client.scheduler_info()["workers"].values())

    def submit(self, fn: Callable[..., Any], *args: Any, priority: int = 0) -> Any:
        fut = self.client.submit(fn, *args, pure=False, priority=priority)
        self._live.add(fut)
        self._keys.add(fut.key)
        fut.add_done_callback(self._live.discard)
        return fut

    def derive(self, fn: Callable[[Any], Any], fut: Any) -> Any:
        """``fn(result)`` as a task where ``fut``'s result is (only ``fn``'s result travels)."""
        return self.submit(fn, fut, priority=1)

    def result(self, fut: Any) -> Any:
        """The result of a future reported done. It may have been lost since (its worker died
        with it: the scheduler computes it again), so the wait goes on in steps, watching the
        workers between them (:meth:`idle`): a worker killed just after its task reported
        back left the job waiting here, where no message was ever said (2026-12-01)."""
        while True:
            try:
                return fut.result(timeout=0.5)
            except TimeoutError:
                self.idle()

    @staticmethod
    def failed(fut: Any) -> bool:
        return fut.status in ("error", "cancelled")

    @staticmethod
    def on_done(fut: Any, callback: Callable[[Any], None]) -> None:
        fut.add_done_callback(callback)

    def release(self, fut: Any) -> None:
        fut.release()

    def busy(self) -> None:
        """A task reported back: the cluster works."""
        self._alone_since = None

    def idle(self) -> None:
        """Called by the job's loop while no task reports back: where the cluster has had no
        workers for ``NO_WORKERS_SAY_S`` (then twice that, four times...) say so on stderr;
        past ``no_workers_timeout`` raise :class:`NoWorkers`. One look at the scheduler's
        worker count every half second (a message of a few bytes), only while idle.

        Until 2026-12-01 (a probe) a ``--scheduler`` job whose every worker died for good
        (workers without nannies) waited without a word until Ctrl-C. Waiting suits an
        autoscaling cluster, whose workers come back; a fixed one is better failed, as
        distributed's own ``scheduler.no-workers-timeout`` fails tasks that no worker can
        run."""
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + 0.5
        if int(self.client.scheduler_info(n_workers=0).get("n_workers", 1)):
            self._alone_since = None
            return
        if self._alone_since is None:
            self._alone_since = now
            self._say_at = NO_WORKERS_SAY_S
            return
        alone = now - self._alone_since
        where = self.client.scheduler.address
        if self.no_workers_timeout is not None and alone >= self.no_workers_timeout:
            raise NoWorkers(f"no workers on {where} for {self.no_workers_timeout:g} s "
                            "(--no-workers-timeout)")
        if alone >= self._say_at:
            import click

            click.echo(f"dask compact: no workers on {where} for {self._say_at:g} s; waiting "
                       "for workers (Ctrl-C stops the job and removes what it wrote; "
                       "--no-workers-timeout SECONDS fails it keeping that for --resume)",
                       err=True)
            self._say_at *= 2

    def stop(self, timeout: float = 60.0) -> None:
        from .runner import drain

        futures = [f for f in list(self._live) if not f.done()]
        if futures:
            self.client.cancel(futures)
        deadline = time.monotonic() + timeout
        drain(self.client, self._keys, max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._live.clear()


Executor = ThreadExecutor | ClientExecutor
