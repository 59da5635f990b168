"""Phase 1 over a persisted input, run by the workers that hold it, asked directly.

A Dask task goes client -> scheduler -> worker -> scheduler -> client over batched streams,
and the client then asks the scheduler for the counts: measured on one H100 host, 20-22 ms
for a call whose GPU work is 4-7 ms (``benchmarks/call_timeline.py``). Here the client asks
each worker that holds chunks of the input, over a direct connection (the way
``Client.scatter`` sends data), to compact them; the worker keeps the output pieces under new
keys, as scattered data is kept, tells the scheduler where they are (scatter's
``update_data``) and how to make each of them (its run spec: the compaction of its chunks,
the input's futures as dependencies), so a piece lost with its worker is recomputed from the
input as a task's result would be, and answers with their counts. The client makes the
futures. A call is one round trip to the workers, in parallel, each with one to the scheduler
inside it, made while the worker computes (the pieces' sizes follow on the worker's stream).

Why the run specs go with the registration rather than as a graph behind it (``client.map``,
until 2026-11-27): the scheduler answers a graph by reporting every key it touches that is
already held, the pieces and every input chunk they depend on, one message each to the
client, and it does so on the event loop a LocalCluster's client shares, where the caller's
next step (a ``wait`` on the result, a device sync through ``client.run``) waited behind it.
4x H200, 2^32 float32 per GPU: 20-21 against 24-26 ms a call on 4 GPUs with one run per GPU,
22-26 against 30-31 ms with Dask's placement (60 pieces); no change on one GPU. Why each
worker registers its own pieces rather than the client all of them once every worker has
answered: a worker's registration then overlaps the other workers' compaction, where the
client's waited for the last of them (on 4x H200 with Dask's placement it took 3-6.5 ms);
and why while it computes rather than after: its round trip, 1.6-3.0 ms on 4x H200, was then
on the path of every call. Why the messages are bytes: see :func:`_shared`.

The workers serve this through a worker plugin (:class:`DirectPhase1`, registered once per
client) that adds a handler to each worker's server. A worker runs its chunks in one job
per thread of its own executor, as the grouped tasks did, or in one job where they are on a
GPU.

Anything unexpected (a chunk no longer where the placement said, a worker gone, the plugin
refused, the compaction raising, the scheduler refusing a registration) drops the pieces
already made (a worker keeps none of a call it does not answer OK; the client asks the
scheduler to forget the registered ones, which frees them on their workers) and returns
None: the caller then runs
phase 1 as Dask tasks, which handle all of it (and raise a task's error there).
``dask.config.set({"dask-compact.direct": False})`` always takes the tasks.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import uuid
import weakref
from time import monotonic  # not time.monotonic: a test replaces this module's time
from typing import Any

import dask
import dask.array as da
import numpy as np

from . import client_stream, settings
from .cache import BoundedCache
from .chunk import compact_blocks, compact_held_runs
from .placement import forget, group_tasks, over_budget, placement
from .remade import expect
from .workers_installed import WorkerWithoutDaskCompact as WorkerWithoutDaskCompact  # its home
from .workers_installed import cannot_import

PLUGIN_NAME = "dask-compact-direct"
SERVE = "dask_compact_phase1"  # the workers' handler
REGISTER = "dask_compact_register"  # the scheduler's
SIZES = "dask_compact_sizes"  # the scheduler's, on a worker's stream


async def _serve(worker: Any, request: dict) -> dict:
    """On a worker: compact the chunks ``request`` names, keep the pieces, return counts.

    ``request["groups"]`` (pickled, see :func:`_shared`): one entry per job, a list of runs,
    each ``(input keys, their global starts, output keys, their declared shapes)``; the
    output keys are one list per part the run's output is cut into (:func:`_bounds`), of
    one key, or two for ``output="both"``; ``request["shared"]``: the predicate and
    options. The inputs are read from the worker's data on its event loop, as Dask reads a
    task's inputs; each job runs in the worker's executor (all of them in one job where the
    chunks are on a GPU).
    The pieces are registered with the scheduler while they are computed
    (:func:`_register_from`; ``request["client"]``: who wants them), and the answer waits
    for both. Nothing is kept unless every job succeeded and the scheduler took the pieces
    (where it took them and a job failed, the client's fallback releases them); they are
    kept as the answer leaves (:func:`_keep`)."""
    from distributed.protocol.pickle import loads

    data = worker.data
    groups = pickle.loads(request["groups"])
    if _spilled(data, [k for runs in groups for keys, *_ in runs for k in keys]):
        return {"status": "spilled"}  # before anything is read or registered
    try:
        jobs = [[[data[k] for k in keys] for keys, *_ in runs] for runs in groups]
    except KeyError:  # moved or released since the placement was read
        return {"status": "missing"}
    pred, output, stable, algorithm, declared = loads(request["shared"])
    wants = ("values", "indices") if output == "both" else (output,)
    # What remakes each piece, (key, output, input keys, starts, part, parts, shapes): it
    # needs no size, so the registration goes now and the scheduler takes it while the job
    # runs; only the pieces' sizes follow (:func:`_sizes_to`). Registered after the job, its
    # round trip was on every call's path (4x H200, 64 pieces: 1.6-3.0 ms of 9-14).
    made = [(k, w, inputs, starts, part, len(cuts), shapes) for runs in groups
            for inputs, starts, cuts, shapes in runs for part, keys in enumerate(cuts)
            for k, w in zip(keys, wants)]
    registration = pickle.dumps(({m[0]: [worker.address] for m in made}, made), protocol=5)
    registering = asyncio.ensure_future(
        _register_from(worker, registration, request["shared"], request["client"]))
    if jobs and not isinstance(jobs[0][0][0], np.ndarray):
        # Device chunks: one job. The GPU runs a job's chunks in parallel already, and all of
        # them are counted with one host sync (compact_runs); jobs on several threads would
        # each sync and contend for the GIL (one H100, 4 chunks of 2^28 on 4 threads: the
        # worker took 4.0 ms against 3.0 ms in one job).
        jobs = [[run for job in jobs for run in job]]
        groups = [[run for runs in groups for run in runs]]
    loop = asyncio.get_running_loop()
    executor = worker.executors["default"]
    try:
        pieces = await asyncio.gather(*(
            loop.run_in_executor(executor, compact_held_runs, blocks, pred, output, stable,
                                 algorithm, [run[1] for run in runs], declared,
                                 [_first(run[0]) for run in runs], [run[3] for run in runs])
            for blocks, runs in zip(jobs, groups)))
    except Exception:  # noqa: BLE001 -- the tasks the client falls back to raise it there
        await registering  # whatever it registered, the client releases (_exchange)
        return {"status": "failed"}
    held: dict = {}
    counts = []
    for runs, out in zip(groups, pieces):
        for (_, _, cuts, _), piece in zip(runs, out):
            whole = piece if output == "both" else (piece,)
            bounds = _bounds(len(whole[0]), len(cuts))
            for keys, lo, hi in zip(cuts, bounds, bounds[1:]):
                held.update(zip(keys, (w[lo:hi] for w in whole)))  # views: nothing copied
                counts.append(hi - lo)
    if not await registering:
        return {"status": "refused"}  # nothing kept
    # The pieces go into the worker's data at the loop's next turn, as this answer leaves
    # (4x H200, 16 pieces a worker: 0.3-1.0 ms of the worker's state machine, which was on
    # the call's path). Nothing can ask for them before: only this answer tells anyone their
    # keys, so whatever it prompts (a task using them, a transfer, their release) reaches
    # this worker in a later turn of its loop, after this callback.
    asyncio.get_running_loop().call_soon(_keep, worker, held)
    return {"status": "OK", "counts": counts}


def _spilled(data: Any, keys: list) -> bool:
    """Whether any of ``keys`` that the worker's ``data`` holds is spilled to disk (a
    SpillBuffer's ``slow``): the direct path then declines, and the call runs as tasks.

    Why: this path reads all of a call's chunks at once (reading a spilled chunk brings it
    back into memory) and holds every output until it answers; on a worker whose memory is
    full enough to spill, that killed the worker (2 workers of 400 MiB, a persisted 1 GiB
    input: both restarted, a probe). Dask's tasks read a few chunks each, as the worker's
    memory allows. A lookup per chunk; other stores (dask-cuda's) are not asked."""
    from distributed.spill import SpillBuffer

    if not isinstance(data, SpillBuffer):
        return False
    fast = data.fast
    return any(k not in fast and k in data for k in keys)


def _keep(worker: Any, held: dict) -> None:
    """On a worker: hold the pieces it answered for (:func:`_serve`), as scattered data, and
    send their sizes to the scheduler (:func:`_sizes_to`)."""
    nbytes = worker.update_data(data=held, stimulus_id=f"dask-compact-direct-{uuid.uuid4()}")
    _sizes_to(worker, nbytes["nbytes"], {k: len(v) for k, v in held.items()})


async def _register_from(worker: Any, registration: bytes, shared: bytes, client: str) -> bool:
    """From a worker: register its pieces with the scheduler (:func:`_register`, through the
    handler :class:`DirectRegistration` adds), while it computes them (the other workers
    may still be computing theirs). ``registration``: the pieces' ``who_has`` and what
    remakes each of them, pickled; ``shared``: the call's predicate and options, as the
    client pickled them (see :func:`_shared`)."""
    try:
        return await getattr(worker.scheduler, REGISTER)(
            registration=registration, shared=shared, client=client) is True
    except Exception:  # noqa: BLE001 -- no scheduler to take them: the client uses tasks
        return False


def _sizes_to(worker: Any, nbytes: dict, lengths: dict) -> None:
    """From a worker: its registered pieces' sizes (bytes, and items: ``lengths``), on its
    stream to the scheduler (:func:`_set_sizes`); nothing waits for them. Until they arrive
    the scheduler counts the pieces as 0 bytes (registered so: no drift in its per-worker
    totals)."""
    worker.batched_send({"op": SIZES, "nbytes": pickle.dumps((nbytes, lengths), protocol=5)})


def _set_sizes(nbytes: dict, lengths: dict, worker: str, dask_scheduler: Any) -> None:
    """On the scheduler: the sizes of pieces ``worker`` holds (:func:`_sizes_to`), for those
    still held there (a piece released meanwhile is gone); their run specs then check that a
    remade piece has the length the client was answered (:func:`.remade.expect`)."""
    s = dask_scheduler
    ws = s.workers.get(worker)
    held = {}
    for key, n in nbytes.items():
        ts = s.tasks.get(key)
        if ts is not None and ws is not None and ts.who_has and ws in ts.who_has:
            ts.set_nbytes(n)
            held[key] = int(lengths[key])
    expect(held, dask_scheduler=s)


def _run_specs(made: list, pred: Any, stable: bool, algorithm: str,
               declared: np.dtype | None = None) -> dict:
    """On the scheduler: each piece's run spec, from what its worker sent
    (``made``: key, output, input keys, their starts, ``part``, ``parts``, their declared
    shapes): the compaction of its run's chunks, part ``part`` of ``parts`` of it, each chunk
    in the input's ``declared`` dtype and checked against its declared shape."""
    from dask._task_spec import Task, TaskRef

    # positional arguments, the chunks last: a list of TaskRefs (dask's container) made each
    # Task 3x slower to build, on the scheduler's event loop (4.4 against 1.3 us)
    return {k: Task(k, _recompute, starts, part, parts, pred, w, stable, algorithm, declared,
                    _first(inputs), shapes, *(TaskRef(i) for i in inputs))
            for k, w, inputs, starts, part, parts, shapes in made}


def _first(keys: list) -> int:
    """The chunk index of a run's first input key, ``(name, i)`` or ``(name, i, 0, ...)``
    (:meth:`.graph.Plan.block_keys`): what a refused chunk's message names."""
    return int(keys[0][1])


def _bounds(n: int, parts: int) -> list[int]:
    """Where a run's output of ``n`` items is cut into ``parts`` output chunks (each part's
    run spec remakes the run and takes the same items, ``lo:hi``)."""
    return [n * k // parts for k in range(parts + 1)]


# A worker's answer where dask_compact does not import there (:func:`_plugin_class`)
NOT_INSTALLED = "not-installed"


def _plugin_class() -> type:
    """The workers' plugin class, sent by value (a class local to this function), whose
    unpickling and setup need only distributed: dask_compact is imported in ``setup``.

    Why: the scheduler sends its worker plugins to every worker, those that join later too.
    Where the class was unpickled by reference to this module, a worker without dask_compact
    could not load it: the registration failed, and a worker that joined later failed to
    start (2026-11-30, a probe: the scheduler keeps the plugin). Now such a worker takes it,
    keeps serving its other work, and answers a direct call with :data:`NOT_INSTALLED` and
    the import's error, which the client raises naming the worker (:func:`_exchange`)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class DirectPhase1(WorkerPlugin):
        """Adds the handler of :func:`_serve` to a worker's server."""

        name = PLUGIN_NAME
        idempotent = True  # a second client on the cluster keeps the one there (no warning)

        def setup(self, worker: Any) -> None:
            self.worker = worker
            self.serve = None
            self.missing = ""
            try:
                from dask_compact.direct import _serve
            except Exception as e:  # noqa: BLE001 -- never fail the worker's start
                self.missing = f"{type(e).__name__}: {e}"
            else:
                self.serve = _serve
            worker.handlers[SERVE] = self.dask_compact_phase1

        def teardown(self, worker: Any) -> None:
            worker.handlers.pop(SERVE, None)

        # named methods: the server logs a handler by its __name__
        async def dask_compact_phase1(self, request: dict) -> dict:
            if self.serve is None:
                return {"status": NOT_INSTALLED, "error": self.missing}
            return await self.serve(self.worker, request)

    return DirectPhase1


def _scheduler_plugin_class() -> type:
    from distributed.diagnostics.plugin import SchedulerPlugin

    class DirectRegistration(SchedulerPlugin):
        """Adds the handler of :func:`_register` to the scheduler's server (a handler of our
        own rather than ``run_function``, which logs every call at INFO and which
        deployments may block)."""

        name = PLUGIN_NAME
        # a second client's registration keeps the one there: distributed warned "Scheduler
        # already contains a plugin with name dask-compact-direct; overwriting" (a probe)
        idempotent = True

        async def start(self, scheduler: Any) -> None:
            self.scheduler = scheduler
            scheduler.handlers[REGISTER] = self.dask_compact_register
            scheduler.stream_handlers[SIZES] = self.dask_compact_sizes

        async def close(self) -> None:
            self.scheduler.handlers.pop(REGISTER, None)
            self.scheduler.stream_handlers.pop(SIZES, None)

        # a named method: the server logs a handler by its __name__
        def dask_compact_register(self, registration: bytes, shared: bytes,
                                  client: str) -> bool:
            from distributed.protocol.pickle import loads

            who_has, made = pickle.loads(registration)
            pred, _, stable, algorithm, declared = loads(shared)
            return _register(who_has, dict.fromkeys(who_has, 0),
                             _run_specs(made, pred, stable, algorithm, declared), client,
                             dask_scheduler=self.scheduler)

        def dask_compact_sizes(self, nbytes: bytes, worker: str) -> None:
            sizes, lengths = pickle.loads(nbytes)
            _set_sizes(sizes, lengths, worker, dask_scheduler=self.scheduler)

    return DirectRegistration


# id(client) -> a weak reference to the client whose workers have the plugin
_registered: BoundedCache[int, Any] = BoundedCache("direct phase-1 plugins")


def _ready(client: Any) -> bool:
    """Whether ``client``'s workers serve direct phase 1 (the plugin registered once)."""
    hit = _registered.get(id(client))
    if hit is not None and hit() is client:
        return True
    try:
        # the scheduler's first: the workers' handler registers with it
        client.register_plugin(_scheduler_plugin_class()(), name=PLUGIN_NAME)
        client.register_plugin(_plugin_class()(), name=PLUGIN_NAME)
    except Exception:  # noqa: BLE001 -- e.g. a cluster without dask_compact: use tasks
        return False
    _registered.put(id(client), weakref.ref(client))
    return True


# Seconds a connection to a worker may take before the call falls back to tasks (at most
# distributed.comm.timeouts.connect). Distributed retries a refused connection until that
# timeout, 30 s by default: a worker lost or retired since the placement was read cost every
# call 30 s (2026-11-30, a probe). A worker that answers connects in milliseconds (the pool
# keeps the connection of the call before); a slower one costs only the direct path.
CONNECT_TIMEOUT = 5.0

# Seconds a connect may take before the scheduler is asked whether the worker is still one
# of its own. Distributed retries a refused connection (a worker retired or lost since the
# cached placement was read) until the timeout above, so a call after an adaptive cluster
# scaled down waited 5 s even on a LocalCluster (2026-11-30, a probe: 5.05-5.08 s, plain
# Dask 0.1 s). A live worker connects well within this (the pool keeps the connection of
# the call before); a slow one costs one scheduler round trip, answered beside the connect.
LIVENESS_CHECK_AFTER = 0.05


# Seconds a worker that the client could not connect to, while the scheduler still counted it
# as one of its own, is left to the tasks before the direct path tries it again. A client
# that reaches only the scheduler (an SSH tunnel, a gateway: the workers' addresses are not
# routable from it) waited CONNECT_TIMEOUT on every call, 5.0 s against 0.1 s for plain
# Dask (2026-11-30, a probe): now it pays it once, then once per worker address and this
# interval. A worker that answers again (a restart at the same address, a passing stall of
# its event loop) is asked again after it; a new worker, at a new address, at once.
UNREACHABLE_RETRY = 300.0


class _Reach:
    """What one client learned of its direct connections to workers: the addresses it could
    not connect to while the scheduler had them (-> when), and whether it ever connected to
    one. Where it never did, a failure stands for every worker (the tunnel's case: a worker
    that joins later is no more reachable)."""

    def __init__(self) -> None:
        self.failed: dict[str, float] = {}
        self.reached = False

    def blocks(self, addresses: Any, now: float) -> bool:
        """Whether a call asking ``addresses`` should go to the tasks at once."""
        recent = {a for a, t in self.failed.items() if now - t < UNREACHABLE_RETRY}
        if not self.reached and recent:
            return True
        return any(a in recent for a in addresses)


_reach_lock = threading.Lock()
_reach: weakref.WeakKeyDictionary[Any, _Reach] = weakref.WeakKeyDictionary()


def _reach_of(client: Any) -> _Reach:
    """``client``'s entry (made on first use); the caller holds :data:`_reach_lock`."""
    state = _reach.get(client)
    if state is None:
        state = _reach[client] = _Reach()
    return state


def _unreachable(client: Any, addresses: Any) -> bool:
    """Whether the direct path should not ask ``addresses`` for ``client`` now: one of them (or,
    for a client that never connected to a worker, any worker) could not be connected to
    within the last :data:`UNREACHABLE_RETRY` seconds though the scheduler had it."""
    with _reach_lock:
        state = _reach.get(client)
        return state is not None and state.blocks(addresses, monotonic())


def _note_connected(client: Any, addr: str) -> None:
    with _reach_lock:  # the client's loop writes, a caller's thread reads (_unreachable)
        state = _reach_of(client)
        state.reached = True
        state.failed.pop(addr, None)


def _note_unreachable(client: Any, addr: str) -> None:
    with _reach_lock:
        _reach_of(client).failed[addr] = monotonic()


def _connect_timeout() -> float:
    from dask.utils import parse_timedelta

    configured = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    return min(CONNECT_TIMEOUT, configured or CONNECT_TIMEOUT)


async def _connect(client: Any, addr: str, timeout: float) -> Any:
    """A comm to the worker at ``addr`` from the client's pool; OSError at once where a
    connect slower than :data:`LIVENESS_CHECK_AFTER` is to a worker the scheduler no longer
    knows (retired or lost), instead of waiting out ``timeout``. The scheduler's answer is
    awaited beside the connect: whichever comes first decides, so neither a connect that
    ends a little later nor a slow scheduler holds the call longer than the connect would."""
    pool = client.rpc
    if any(not comm.closed() for comm in pool.available.get(addr, ())):
        # an open connection to reuse (the call before's): nothing to wait for, and no task
        # or timer on the client's event loop (15 us a worker, a review)
        return await pool.connect(addr, timeout=timeout)
    connecting = asyncio.ensure_future(pool.connect(addr, timeout=timeout))
    done, _ = await asyncio.wait({connecting}, timeout=LIVENESS_CHECK_AFTER)
    if done:
        return connecting.result()
    checking = asyncio.ensure_future(client._run_on_scheduler(_is_worker, addr))
    done, _ = await asyncio.wait({connecting, checking}, return_when=asyncio.FIRST_COMPLETED)
    if connecting in done:
        # the check left to end on its own: a request cancelled midway closes its pooled
        # connection to the scheduler (distributed 2026.7; a review)
        checking.add_done_callback(_quiet)
        return connecting.result()
    try:
        known = checking.result()
    except Exception:  # noqa: BLE001 -- no answer: the connect's own timeout decides
        known = True
    if not known:
        connecting.cancel()
        raise _Gone(f"worker {addr} is no longer in the cluster")
    return await connecting


class _Gone(OSError):
    """The worker a connect was for is no longer one of the scheduler's."""


def _quiet(future: Any) -> None:
    """Take a finished background task's outcome (nobody awaits it), so that asyncio does not
    log an exception nobody retrieved."""
    if not future.cancelled():
        future.exception()


def _is_worker(addr: str, dask_scheduler: Any = None) -> bool:
    """On the scheduler: whether ``addr`` is one of its workers."""
    return addr in dask_scheduler.workers


async def _ask(client: Any, requests: dict) -> dict:
    """Every worker's answer to its request (an exception where it raised), in parallel;
    a worker that cannot be reached within :data:`CONNECT_TIMEOUT` answers with the error."""
    from distributed.core import send_recv

    timeout = _connect_timeout()

    async def one(addr: str, request: dict) -> Any:
        try:
            comm = await _connect(client, addr, timeout)
        except Exception as e:  # noqa: BLE001 -- a lost worker: fall back
            if not isinstance(e, _Gone) and await _still_a_worker(client, addr):
                _note_unreachable(client, addr)  # alive, yet not reachable from here
            return e
        _note_connected(client, addr)
        try:
            return await send_recv(comm=comm, op=SERVE, request=request)
        except Exception as e:  # noqa: BLE001 -- a lost worker, a missing handler: fall back
            return e
        finally:
            client.rpc.reuse(addr, comm)

    answers = await asyncio.gather(*(one(a, r) for a, r in requests.items()))
    return dict(zip(requests, answers))


async def _still_a_worker(client: Any, addr: str) -> bool:
    """After a failed connect: whether the scheduler still has the worker at ``addr`` (then
    the client cannot reach it; a worker killed meanwhile is gone from the scheduler by the
    time the connect gives up, its stream to it closed). False where it does not answer."""
    try:
        return bool(await client._run_on_scheduler(_is_worker, addr))
    except Exception:  # noqa: BLE001 -- no answer: nothing learned
        return False


def _shared(plan: Any) -> bytes:
    """What every worker's request shares: the predicate and options, pickled once a call.

    Why pickled here, and each worker's runs as bytes too (:func:`_exchange`): the comm
    sizes a message by walking its objects, then pickles them, per worker; on the 2-core CI
    machine a request of 16 runs took 230 us of the client's event loop, against 10 us as
    bytes (and the predicate, 25-60 us to pickle, once). The worker passes these bytes on
    with its registration (:func:`_register_from`)."""
    from distributed.protocol.pickle import dumps

    return dumps((plan.pred, plan.output, plan.stable, plan.algorithm, plan.x.dtype))


async def _exchange(client: Any, asked: dict, shared: bytes) -> dict | None:
    """Ask the workers (:func:`_ask`; ``asked``: each worker's jobs, ``shared``: see
    :func:`_shared`), each of which registers its pieces before it answers: every output
    chunk's count, or None after releasing whatever was registered where a worker did not
    answer with its pieces (the scheduler then frees them on their workers)."""
    requests = {a: {"groups": pickle.dumps(jobs, protocol=5), "shared": shared,
                    "client": client.id} for a, jobs in asked.items()}
    answers = await _ask(client, requests)
    ok = {a: r for a, r in answers.items() if isinstance(r, dict) and r.get("status") == "OK"}
    # each worker's parts (one key per output), in the order it answers their counts
    parts = {a: [ks for runs in asked[a] for _, _, cuts, _ in runs for ks in cuts] for a in ok}
    if len(ok) < len(answers):
        # every key asked for, not only those answered: a worker lost after registering its
        # pieces, before its answer arrived, would leave them wanted (and remade) for nobody
        keys = [k for jobs in asked.values() for runs in jobs for _, _, cuts, _ in runs
                for ks in cuts for k in ks]
        try:
            await client._run_on_scheduler(_unregister, keys, client.id)
        except Exception:  # noqa: BLE001 -- a scheduler gone took them with it
            pass
        _raise_not_installed(answers)
        return None
    counts: dict[int, int] = {}
    for addr in ok:
        counts.update((ks[0][1], int(c)) for ks, c in zip(parts[addr], ok[addr]["counts"]))
    return counts


def _raise_not_installed(answers: dict) -> None:
    """Raise :class:`.workers_installed.WorkerWithoutDaskCompact` naming the workers that
    answered :data:`NOT_INSTALLED`: the tasks the call would fall back to cannot run there
    either (such a worker stops at the first of them, see :mod:`.workers_installed`)."""
    missing = {a: r.get("error", "") for a, r in answers.items()
               if isinstance(r, dict) and r.get("status") == NOT_INSTALLED}
    if missing:
        raise cannot_import(missing)


def _unregister(keys: list, client: str, dask_scheduler: Any = None) -> None:
    """On the scheduler: ``client`` no longer wants the pieces it was registered for (a call
    that fell back to tasks); the scheduler forgets them and frees them on their workers."""
    keys = [k for k in keys if k in dask_scheduler.tasks]
    if keys and client in dask_scheduler.clients:
        dask_scheduler.client_releases_keys(keys=keys, client=client,
                                            stimulus_id=f"dask-compact-unregister-{uuid.uuid4()}")


def _register(who_has: dict, nbytes: dict, specs: dict, client: str,
              dask_scheduler: Any) -> bool:
    """On the scheduler: the pieces are held where ``who_has`` says, are made by
    ``specs`` (key -> run spec) and are wanted by ``client``; all or none: False, with
    nothing changed, where a worker is not known (``update_data`` would fail halfway), nor
    the client, a run spec's dependency is no longer known, or a key is known already.

    What ``update_graph`` would do for these keys, less its reports: the run specs and
    dependencies (what remakes a lost piece), the client's wanting them, priorities, the
    span. These are the scheduler's internals (distributed is pinned, see pyproject.toml):
    where one of them fails, what was done is undone and the call runs as tasks. Called by
    each worker for its own pieces (:func:`_register_from`); the client makes the futures
    and marks them finished itself."""
    s = dask_scheduler
    cs = s.clients.get(client)
    if (cs is None or any(w not in s.workers for ws in who_has.values() for w in ws)
            or any(k in s.tasks for k in who_has) or set(specs) != set(who_has)
            or any(d not in s.tasks for spec in specs.values() for d in spec.dependencies)):
        return False
    s.update_data(who_has=who_has, nbytes=nbytes)  # no client: nobody to report them to yet
    try:
        held = []
        for key, spec in specs.items():
            ts = s.tasks[key]
            ts.run_spec = spec
            for dep in spec.dependencies:
                ts.add_dependency(s.tasks[dep])
            if ts.who_wants is None:
                ts.who_wants = set()
            ts.who_wants.add(cs)
            cs.wants_what.add(ts)
            held.append(ts)
        s._set_priorities(internal_priority={k: i for i, k in enumerate(specs)},
                          submitting_task=None, user_priority=0, fifo_timeout=0,
                          start=time.time(), tasks=held)
        spans = s.extensions.get("spans")
        if spans is not None:  # a task it runs must belong to a span (a remade piece's does)
            spans.observe_tasks(held, code=(), span_metadata={})
    except Exception:  # noqa: BLE001 -- scheduler internals this release lacks: use tasks
        # undone as a client's release would: the scheduler forgets them (the worker, told
        # False, keeps none)
        s.client_desires_keys(keys=list(who_has), client=client)
        s.client_releases_keys(keys=list(who_has), client=client,
                               stimulus_id=f"dask-compact-unregister-{uuid.uuid4()}")
        return False
    return True


def _recompute(bases: list[int], part: int, parts: int, pred: Any, output: str, stable: bool,
               algorithm: str, declared: np.dtype | None, first: int,
               shapes: list[tuple[int, ...]] | None, *blocks: Any) -> Any:
    """A piece's run spec: what remakes it if its worker is lost (part ``part`` of
    ``parts`` of its run's output, cut as the worker cut it, :func:`_bounds`; a copy where
    that is a part, so the rest of the run is freed)."""
    whole = compact_blocks(list(blocks), pred, output, stable, algorithm, bases, True,
                           declared, first, shapes)
    if parts == 1:
        return whole
    bounds = _bounds(len(whole), parts)
    return whole[bounds[part]:bounds[part + 1]].copy()


def run(plan: Any, blocks: list, meta: dict[str, Any]) -> dict[str, da.Array] | None:
    """Eager phase 1 of ``plan`` over its persisted input (``blocks``: the futures of
    ``plan.block_keys()``), asked of the workers directly; one output chunk per run of
    consecutive chunks a worker thread holds (or a few, see :func:`_parts`), in the input's
    order, of known sizes. ``meta``: each output's meta. None where this does not apply or
    did not work (see the module)."""
    if not settings.get("direct") or not plan.by_worker:
        return None
    if not plan.known_input or plan.mask is not None or not blocks:
        return None
    if plan.output == "both" and not plan.stable:
        # values and indices are remade by one task each after a loss: in the unordered
        # kernel's order (not repeatable) a remade pair would no longer match
        return None
    client = blocks[0].client
    if getattr(client, "direct_to_workers", None) is False:
        # distributed's own switch for a client that cannot (or must not) connect to the
        # workers (``Client(direct_to_workers=False)``, ``distributed.client.direct-to-workers``):
        # its gather and scatter go through the scheduler, and so does this call, as tasks.
        # Its default, None, leaves the direct path on.
        return None
    if not hasattr(client, "rpc") or not _ready(client):
        return None
    keys = plan.block_keys()
    holders, nthreads, rootish, limits = placement(client, keys, blocks)
    if any(h is None for h in holders):
        return None
    if _unreachable(client, set(holders)):
        return None  # a holder this client could not connect to, lately: see UNREACHABLE_RETRY
    nbytes = plan.host_nbytes
    if over_budget(holders, nthreads, nbytes, limits):
        # A worker holds every input and output of its share of the call at once here; past
        # half its target memory, the tasks (groups within the budget, run as the worker's
        # memory allows: it spills and pauses between them) take the call.
        return None
    groups = group_tasks(holders, nthreads, nbytes, limits)
    runs_in_order = sorted((run for runs in groups for run in runs), key=lambda r: r[0])
    parts = _parts(len(runs_in_order), rootish, plan)
    wants = ("values", "indices") if plan.output == "both" else (plan.output,)
    token = uuid.uuid4().hex  # a call's pieces are its own: scattered keys never collide
    names = {w: plan.name(f"{w}-direct-{plan.path}-{token}") for w in wants}
    first = {run[0]: j * parts for j, run in enumerate(runs_in_order)}  # its first chunk
    starts, shapes = plan.starts, plan.block_shapes()
    asked: dict[str, list] = {}  # worker -> its jobs, each a list of runs
    for runs in groups:
        asked.setdefault(holders[runs[0][0]], []).append(
            [([keys[i] for i in run], [int(starts[i]) for i in run],
              [[(names[w], first[run[0]] + k) for w in wants] for k in range(parts)],
              [shapes[i] for i in run])
             for run in runs])
    counts = client.sync(_exchange, client, asked, _shared(plan))
    if counts is None:
        forget(client, keys)  # a holder gone or moved: the next call asks where they are
        return None
    order = range(len(runs_in_order) * parts)
    sizes = tuple(counts[j] for j in order)
    from distributed import Future

    out: dict[str, da.Array] = {}
    made: list = []
    for w in wants:
        futures: list = [Future((names[w], j), client) for j in order]
        made += futures
        out[w] = da.Array({f.key: f for f in futures}, names[w], chunks=(sizes,),
                          meta=meta[w])
    # Held and registered: finished now, as Client.scatter marks its futures (the scheduler
    # has no reason to report them: nothing it runs makes them).
    client_stream.made(made)
    states = [client.futures.get(f.key) for f in made]
    client.loop.add_callback(_finish, states)
    return out


def _parts(runs: int, rootish: int, plan: Any) -> int:
    """Output chunks per run: 1, or enough for ``rootish`` chunks in all.

    Why: what uses fewer chunks than the scheduler's root-ish threshold (5 dependency tasks)
    and has more than twice the cluster's threads of tasks (a rechunk, say) is placed by the
    scheduler for balance, not where its data is: 4x H200, slabs (one run per GPU), a
    rebalanced result (``chunks=2^26``, 2^30 per GPU) took 2104 / 6785 ms at 2 / 4 GPUs
    against 265 / 403 ms for boolean indexing + ``rechunk``, moving whole pieces between
    workers. A run's output cut into views costs nothing and keeps every part where it is.
    Not where a part remade after a loss could differ from the part it replaces: GPU chunks
    compacted ``stable=False`` come out in an order that a second run need not repeat."""
    if runs >= rootish:
        return 1
    if not plan.stable and not isinstance(plan.x._meta, np.ndarray):
        return 1
    return -(-rootish // runs)


def _finish(states: list) -> None:
    for state in states:
        if state is not None and state.status == "pending":
            state.finish()
