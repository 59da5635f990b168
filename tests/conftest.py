"""Shared test set-up: a private numba cache and dask scratch space removed at the end, a check
that nothing else was left in the temporary directory, the `gpu` marker, random data helpers."""

from __future__ import annotations

import contextlib
import gc
import os
import random
import shutil
import string
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
import pytest

# What the package, dask and these tests may leave in the temporary directory.
_LITTER = ("dask-compact", "dask_compact", ".dask-compact", "dask-scratch-space", "dask-worker")

# Set when the session starts (pytest_configure), not at import: a worker process of a local
# cluster that unpickles a function of a test module imports this file as a plain module too,
# and made a session folder there that nothing removed.
_SESSION_DIR = ""
_TMP = ""


def _make_session_dir() -> str:
    """A new folder ``dask-compact-tests-<letters>`` in the temporary directory.

    Letters only, unlike ``tempfile.mkdtemp``'s names: dask reads every ``DASK_*`` variable
    with ``ast.literal_eval``, and a digit before a keyword in its value (a CI run drew
    ``-0inyrtoq``) makes Python print "SyntaxWarning: invalid decimal literal" in every
    process that imports dask, which broke the CLI tests that expect one line on stderr."""
    rng = random.SystemRandom()
    for _ in range(100):
        name = "dask-compact-tests-" + "".join(rng.choices(string.ascii_lowercase, k=10))
        path = os.path.join(tempfile.gettempdir(), name)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            return path
    raise FileExistsError(f"no free name for a session folder in {tempfile.gettempdir()}")


def pytest_configure(config):
    """Compiled loops go to a fresh cache per test session, and distributed's workers put
    their scratch space beside it (both also for worker processes and CLI subprocesses, which
    inherit the environment): a stale cache from another checkout can never hide a bug, and
    the whole folder goes at the end of the session.

    The session's temporary directory is a folder of its own too (for this process and
    everything it starts), so what the tests leave there is this session's alone, whatever
    other sessions run on the machine at the same time (a shared /tmp counted theirs as ours).
    A pytest-xdist worker keeps its controller's, which checks it once all workers are done."""
    global _SESSION_DIR, _TMP
    _SESSION_DIR = _make_session_dir()
    os.environ.setdefault("DASK_COMPACT_CACHE_DIR", os.path.join(_SESSION_DIR, "cache"))
    os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", os.path.join(_SESSION_DIR, "dask"))
    # One input chunk a batch-job task (dask-compact.batch.task-bytes 0): the suite's inputs
    # are a few MiB in small chunks, which the default (8 MiB a task) would read in one task,
    # and its tests of windows, budgets, resume and faults are about many tasks. The tests of
    # the default set it back (test_batch_stream.py::test_tasks_read_several_small_chunks...).
    os.environ.setdefault("DASK_DASK_COMPACT__BATCH__TASK_BYTES", "0")
    if hasattr(config, "workerinput"):
        _TMP = tempfile.gettempdir()
        return
    _TMP = os.path.join(_SESSION_DIR, "tmp")
    os.mkdir(_TMP)
    os.environ["TMPDIR"] = _TMP
    tempfile.tempdir = _TMP


_AHEAD_MODULES: list = []  # test modules whose start_ahead ran (pytest_collection_finish)


def _ours_in_tmp() -> list[str]:
    return sorted(n for n in os.listdir(_TMP) if n.startswith(_LITTER))


def pytest_collection_finish(session):
    """Start building, in the background on the core the rest of the suite leaves idle, the
    numba loops of the heaviest predicate tests (tests/numba_ahead.py; a module offers them
    by ``numba_ahead_loops(name, params)``), then the selected kernel compile tests' nvcc
    units (tests/compile_ahead.py: they take a quarter of CI's time; a module offers them by
    ``compile_ahead_jobs(name, params)`` and the command line by ``compile_command``), and
    what a module starts by its ``start_ahead`` (the docker demo). Not in
    a pytest-xdist worker (each collects every test: the work would be done once per worker)
    nor for --collect-only."""
    if hasattr(session.config, "workerinput") or session.config.option.collectonly:
        return
    loops = []  # the predicate tests whose numba loops tests/numba_ahead.py builds ahead
    for item in session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "numba_ahead_loops"):
            params = getattr(getattr(item, "callspec", None), "params", {})
            loops.append((module.__name__, item.originalname, params))
    after = None
    if loops:
        from numba_ahead import NUMBA_AHEAD  # beside those tests (not where conftest is copied)

        NUMBA_AHEAD.start(loops)
        after = NUMBA_AHEAD.wait  # nvcc's units are needed last: they start after the loops
    builders, command = [], None
    for item in session.items:
        module = getattr(item, "module", None)
        ahead = getattr(module, "compile_ahead_jobs", None)
        if ahead is None:
            continue
        build = ahead(item.originalname, getattr(getattr(item, "callspec", None), "params", {}))
        if build is not None:
            builders.append(build)
            command = module.compile_command
    if builders:
        from compile_ahead import AHEAD  # beside the compile tests (not where conftest is copied)

        AHEAD.start(builders, command, after=after)
    # A module's own background work (``start_ahead(names)`` with its selected tests' names,
    # ``stop_ahead()`` at the session's end): the docker demo, mostly waiting, beside the suite.
    selected: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if hasattr(module, "start_ahead"):
            selected.setdefault(module, []).append(item.originalname)
    for module, names in selected.items():
        _AHEAD_MODULES.append(module)
        module.start_ahead(names)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_node_collection_finished(node, ids):
    """In pytest-xdist's controller, once a worker has collected: a module's work started
    once for the whole run (``start_in_controller(ids, testrunuid)``: the docker demo, mostly
    waiting), in the process that outlives every worker, which stops it at the session's end
    (``stop_ahead``). A worker's own run would be one per worker, and holding it in the test
    kept one of CI's two cores idle for most of it."""
    import test_docker_demo  # beside the tests (not where conftest is copied)

    if test_docker_demo not in _AHEAD_MODULES and test_docker_demo.start_in_controller(
            list(ids), node.workerinput["testrunuid"]):  # fmt: skip
        _AHEAD_MODULES.append(test_docker_demo)


def pytest_sessionfinish(session, exitstatus):
    numba_ahead = sys.modules.get("numba_ahead")
    if numba_ahead is not None:  # first: the nvcc thread may still be waiting for it
        numba_ahead.NUMBA_AHEAD.stop()
    ahead = sys.modules.get("compile_ahead")
    if ahead is not None:
        ahead.AHEAD.stop()
    for module in _AHEAD_MODULES:
        module.stop_ahead()
    # a pytest-xdist worker: the controller checks once all are done
    left = [] if hasattr(session.config, "workerinput") else _ours_in_tmp()
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)  # _TMP with it, unless a worker's
    if left:
        print(f"\ntests left {len(left)} entries in {_TMP}: {', '.join(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]


@pytest.fixture(autouse=True, scope="module")
def _dask_scheduler_setting_restored():
    """Each test module leaves dask's global ``scheduler`` setting as it found it.

    distributed sets it when a Client starts and puts it back when that client closes with no
    other client around; a client closed late (by its ``__del__`` at a garbage collection)
    puts back its own snapshot at that moment. In a fresh CI run that left
    ``scheduler="dask.distributed"`` with no client after tests/test_distributed.py, and every
    later module's threaded computation failed. The modules are meant to be independent.
    """
    before = dask_config_scheduler()
    yield
    gc.collect()  # late closes happen here, inside the module that made the client
    after = dask_config_scheduler()
    if after != before:
        import dask

        warnings.warn(f"dask scheduler setting left as {after!r} (was {before!r}); restored",
                      stacklevel=1)
        if before is None:
            dask.config.config.pop("scheduler", None)
        else:
            dask.config.set(scheduler=before)


@contextlib.contextmanager
def device_pool_capped(limit_bytes: int):
    """Device allocations inside come from a new CuPy memory pool of at most ``limit_bytes``
    (the tests of out-of-memory paths): the room a call has is then exactly that, whatever
    the default pool holds.

    Why not the default pool with its limit set to the bytes in use plus the room (until
    2026-11-28): what it held decided the room. A block an earlier test freed but that
    shares its device allocation with an array still alive (CuPy splits large free blocks
    for small requests, and ``free_all_blocks`` releases only whole allocations) is free
    within the limit, and cached scratch that a cache evicts mid-call goes back to it: with
    the garbage collector off as well, a records call given 8 MiB of room for 61 MiB of rows
    answered instead of raising (4x H200, its file and the reliability file at -n 8, once in
    two rounds; the same at -n 14 in the whole GPU suite on one H200; which of the two it
    was is not known)."""
    import cupy

    pool = cupy.cuda.MemoryPool()
    pool.set_limit(size=limit_bytes)
    with cupy.cuda.using_allocator(pool.malloc):
        yield pool


@contextlib.contextmanager
def local_process_cluster(n_workers: int, threads_per_worker: int = 1,
                          set_as_default: bool = True):
    """A distributed LocalCluster of ``n_workers`` worker processes (single-threaded unless
    told, no dashboards) and its Client, the default scheduler while it is open (unless
    ``set_as_default`` is False: see :func:`client_as_default`)."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True,
                     dashboard_address=":0", worker_dashboard_address=None) as cluster,
        Client(cluster, set_as_default=set_as_default) as c,
    ):  # fmt: skip
        yield c


@contextlib.contextmanager
def client_as_default(client):
    """``client`` (made with ``set_as_default=False``) as the default scheduler inside, as a
    default client is (dask's ``scheduler`` setting and distributed's current client), and
    not after: a module's cluster then serves only the tests that ask for it. Made the
    default for the module's life, it served every later test of the module too: those
    that count calls in this process or measure its memory failed when run after a cluster
    test (the module in reverse order: 4 tests of test_sort.py and one of
    test_predicate_trace.py, whose predicate cannot be pickled)."""
    import dask

    with client.as_current(), dask.config.set(scheduler="dask.distributed"):
        yield client


@pytest.fixture
def client(_cluster):
    """The requesting module's cluster (its module-scoped ``_cluster`` fixture: a client made
    with ``set_as_default=False``), the default scheduler of the tests that ask for it alone
    (it was every later test's too: :func:`client_as_default`)."""
    with client_as_default(_cluster) as c:
        yield c


def assert_no_client_is_the_default() -> None:
    """No distributed client is the default here: dask's scheduler is not one, none is
    current or registered as the default, and a computation runs in this process. Each
    module with a cluster fixture checks it in a test after its cluster tests (the module's
    cluster stayed the default until the module ended: :func:`client_as_default`)."""
    import dask
    import dask.array as da
    import distributed

    get = dask.base.get_scheduler()
    assert not isinstance(getattr(get, "__self__", None), distributed.Client), (
        f"dask's scheduler is {get}"
    )
    assert dask.config.get("scheduler", None) is None
    with pytest.raises(ValueError, match="No clients found"):
        distributed.default_client()
    ran_in = da.zeros(4, int, chunks=2).map_blocks(lambda b: b + os.getpid()).compute()
    assert set(ran_in) == {os.getpid()}


@pytest.fixture
def big_device_memory():
    """One test at a time, across pytest-xdist's workers, of those that need tens of GiB of
    device memory (arrays beyond 2^31 elements). Each checks its free memory, but two of them
    at once with others on an 80 GB H100 ran out (12 workers: a 17 GB allocation failed).
    The lock file is in the session's temporary folder, which every worker shares (removed
    with the session)."""
    import fcntl

    with open(os.path.join(_TMP, "big-device-memory.lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(ImportError):
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()  # this process's cached blocks
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def _process_cluster():
    with local_process_cluster(2, set_as_default=False) as c:
        yield c


@pytest.fixture
def process_client(_process_cluster):
    """local_process_cluster(2), started once per module, the default scheduler of the tests
    that ask for it alone (:func:`client_as_default`)."""
    with client_as_default(_process_cluster) as c:
        yield c


def dask_config_scheduler():
    import dask

    return dask.config.get("scheduler", None)


def _gpu_available() -> str | None:
    """None if a CUDA device and CuPy are usable, else the reason to skip."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        return f"cupy not importable ({type(e).__name__})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as e:
        return f"no CUDA device ({e})"
    return None


def pytest_collection_modifyitems(config, items):
    # The kernel compile tests last (in their order): their units compile in the background
    # from the start of the session (pytest_collection_finish), and the later the tests come,
    # the more of that work the core the rest of the suite leaves idle has done. Under
    # pytest-xdist (CI's command: every core runs tests, and nothing compiles in the
    # background) first instead: minutes of nvcc at the end of the list were the run's tail,
    # where worksteal has nothing small left to even out with.
    ahead = [hasattr(getattr(item, "module", None), "compile_ahead_jobs") for item in items]
    rest = [i for i, a in zip(items, ahead, strict=True) if not a]
    compile_tests = [i for i, a in zip(items, ahead, strict=True) if a]
    items[:] = compile_tests + rest if hasattr(config, "workerinput") else rest + compile_tests
    reason = _gpu_available()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class HeldChunks:
    """A dask local-scheduler callback (``with HeldChunks(name):``): the most chunks of the
    array ``name`` held at once (``most``), to tell whether a graph releases each input chunk
    once its own task has run or holds them all for a task over every chunk."""

    def __init__(self, name: str) -> None:
        from dask.callbacks import Callback

        self.name, self.most = name, 0
        self._callback = Callback(posttask=self._posttask)

    def _posttask(self, key, result, dsk, state, worker_id) -> None:
        held = sum(isinstance(k, tuple) and k[0] == self.name for k in state["cache"])
        self.most = max(self.most, held)

    def __enter__(self) -> HeldChunks:
        self._callback.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._callback.__exit__(*exc)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Random data of any supported dtype, never all zeros, with repeated values for ints."""
    dtype = np.dtype(dtype)
    if dtype == np.dtype(bool):
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -1000), min(info.max, 1000)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 10).astype(dtype)
    real = rng.standard_normal(shape) * 10
    imag = rng.standard_normal(shape) * 10
    return (real + 1j * imag).astype(dtype)


def scan_data(dtype: str, n: int, seed: int = 0) -> np.ndarray:
    """Scan input: integers over the dtype's whole range (so sums wrap), signed normals for
    floats, bools."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.5
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    return (rng.standard_normal(n) * 100).astype(dt)


def scan_reference(a: np.ndarray, exclusive: bool, dtype=None) -> np.ndarray:
    """NumPy's cumsum, shifted right by one (a leading 0) for the exclusive scan."""
    with np.errstate(over="ignore"):
        inc = np.cumsum(a, dtype=dtype)
    if not exclusive:
        return inc
    return np.concatenate([np.zeros(1, inc.dtype), inc[:-1]]) if inc.size else inc


@pytest.fixture
def one_bucket_per_chunk():
    """dask_compact.sort's default of one bucket per input chunk whatever the size, as before
    the default was capped (sort_graph.default_buckets): the sort tests' small arrays then
    run the exchange of many buckets, not a single one. On a cluster of CPU workers they are
    still no more than the workers (sort_cluster)."""
    import dask

    with dask.config.set({"dask-compact.sort.min-bucket": 1,
                          "dask-compact.sort.max-pieces": 2**62,
                          "dask-compact.sort.one-bucket-bytes": 0}):
        yield


def sort_input(rng: np.random.Generator, n: int, dtype) -> np.ndarray:
    """Data that sorting gets wrong first, of any sortable dtype: integers over their whole
    range with both extremes and a run of small repeated values, shuffled; floats with repeats
    (rounded), NaNs of both signs, -0.0 beside 0.0, -inf; bools mostly False."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.4
    if dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        k = n // 20
        a[:k], a[k : 2 * k], a[2 * k : 8 * k] = info.min, info.max, rng.integers(0, 5, 6 * k)
        rng.shuffle(a)
        return a
    a = (rng.standard_normal(n) * 50).round(0).astype(dt)
    a[::13] = np.nan
    a[::41] = np.copysign(np.array(np.nan, dt), np.array(-1, dt))  # what inf - inf gives
    a[3:6] = [-0.0, 0.0, -np.inf][: max(0, min(3, n - 3))]
    return a


def key_predicate(key: np.ndarray) -> tuple[str, np.ndarray]:
    """A record predicate string over the field ``key`` (random_array data of any dtype) that
    selects some rows but not all, and its NumPy mask."""
    if key.dtype == np.dtype(bool):
        return "key", key
    if key.dtype.kind == "c":
        return "real(key) < 0.5", key.real < 0.5
    return "key < 3", key < 3


def threshold_predicate(a: np.ndarray, p: float):
    """A predicate selecting about a fraction p of `a` (exactly none at p=0, all at p=1)."""
    dtype = a.dtype
    if dtype == np.dtype(bool):
        if p == 0:
            return lambda v: v & ~v
        if p == 1:
            return lambda v: v | ~v
        return lambda v: v if p < 0.5 else ~v
    key = a.real if dtype.kind == "c" else a
    flat = np.sort(np.asarray(key, dtype=np.float64).ravel())
    if p == 0 or p == 1 or flat.size == 0:
        # Out of every dtype's range: ints take the NumPy fallback for out-of-bound literals.
        inf = -np.inf if p == 0 else np.inf
        t = inf if dtype.kind in "fc" else (-(2**70) if p == 0 else 2**70)
    else:
        t = flat[min(int(p * flat.size), flat.size - 1)]
        t = int(t) if dtype.kind in "iu" else float(t)
    if dtype.kind == "c":
        return lambda v: v.real < t
    return lambda v: v < t


def until(cond, timeout: float = 20.0) -> None:
    """Wait until ``cond()`` is true (a test's other threads make it so), failing after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the condition never came"
        time.sleep(0.002)


def after_next_call(monkeypatch, owner, name: str, then) -> None:
    """``owner.name`` (a function) runs ``then()`` after its next call returns, once: what
    another thread could do while that call runs, made deterministic."""
    real = getattr(owner, name)

    def once(*args, **kwargs):
        monkeypatch.setattr(owner, name, real)
        out = real(*args, **kwargs)
        then()
        return out

    monkeypatch.setattr(owner, name, once)


def in_threads(work, n: int) -> None:
    """``work(i)`` for i in range(n), each in a thread of its own, all at once; the first
    exception any of them raised is raised here once all have ended."""
    errors: list[BaseException] = []

    def run(i):
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 -- raised in the calling thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# chunks that hold another unit or byte order than their dask array declares (map_blocks(f,
# dtype=...)): (the chunks' dtype, the declared one), each chunk cast to the declared dtype
# exactly (a coarser unit, the other byte order, and a finer unit whose values, whole seconds
# here, the declared unit holds: validate.as_declared looks at them)
HIDDEN_TIMES = [("M8[s]", "M8[ms]"), (">M8[s]", "M8[s]"), ("m8[s]", "m8[us]"),
                (">m8[s]", "m8[s]"), ("M8[ms]", "M8[s]"), ("m8[us]", "m8[s]")]
# chunks of a finer unit than declared, one instant with a fraction of a second
# (hidden_times(..., fraction=True)): a cast would drop it, so they are refused
LOSSY_TIMES = [("M8[ms]", "M8[s]"), ("m8[us]", "m8[s]")]


def chunk_dtypes(x) -> set:
    """The dtypes of a dask array's computed chunks, each computed on its own (``compute()``
    concatenates, and NumPy's concatenate hides a chunk of another dtype in the promotion)."""
    return {b.compute().dtype for b in x.to_delayed().ravel()}


def hidden_times(chunk_dtype: str, declared: str, fraction: bool = False) -> tuple:
    """NumPy's values in the declared dtype (NaT among them), and a dask array of them whose
    chunks are ``chunk_dtype`` (chunks of 2). ``fraction``: element 3 (element 1 of chunk 1)
    is one unit of ``chunk_dtype`` later, a fraction of a second the declared seconds do not
    hold (the NumPy values are then those without it)."""
    import dask.array as da

    s = np.array([10, 7200, 86400, 30, -5, 61, 59, 3600 * 24 * 400, -86400], "i8")
    s = s.view(f"{np.dtype(chunk_dtype).kind}8[s]")
    s[4] = np.array("NaT", s.dtype)
    a = s.astype(declared)
    chunks = s.astype(chunk_dtype)
    if fraction:
        chunks[3] += np.timedelta64(1, np.datetime_data(chunks.dtype)[0])
    x = da.from_array(chunks, chunks=2).map_blocks(lambda b: b, dtype=declared)
    return a, x


# (the chunks' dtype, the declared one) of numeric chunks that cast to the declared dtype
# exactly by their dtypes (np.can_cast(..., "safe")): taken, cast, nothing per element
EXACT_CHUNK_DTYPES = [("float32", "float64"), ("int16", "int64"), ("uint8", "int16"),
                      ("bool", "int64"), ("bool", "float32"), (">f8", "float64"),
                      ("int32", "float64")]
# ... and of chunks whose dtype could lose values, but whose values (hidden_dtype's small whole
# numbers) the declared dtype holds: taken, cast (validate.as_declared looks at the values)
EXACT_VALUE_CHUNK_DTYPES = [("float64", "float32"), ("int64", "int32"), ("int32", "uint32"),
                            ("int64", "bool"), ("complex64", "float64"), ("int64", "float64")]
# (the chunks' dtype, the declared one, a value of the chunks' dtype that the declared one
# does not hold): chunks holding it are refused, naming it (validate.as_declared)
LOSSY_CHUNK_DTYPES = [("float64", "float32", 0.1), ("int64", "int32", 2**31),
                      ("uint32", "int32", 2**31), ("int32", "uint32", -1), ("int64", "bool", 2),
                      ("float32", "bool", 0.5), ("float64", "int64", np.nan),
                      ("complex64", "float64", 1j),
                      ("int64", "float64", 2**53 + 1)]  # NumPy calls it safe: exact to 2^53


def odd_chunks_as(b: np.ndarray, chunk_dtype: str, planted=None, block_id=None) -> np.ndarray:
    """Chunk ``b`` as it was, or in ``chunk_dtype`` where its index is odd: what a
    ``map_blocks(f, dtype=...)`` whose ``f`` returns another dtype for some chunks makes.
    ``planted``: a value put in the middle of each odd chunk (element ``b.size // 2``)."""
    if not block_id[0] % 2:
        return b
    c = b.astype(chunk_dtype)
    if planted is not None and c.size:
        c.flat[c.size // 2] = planted
    return c


def hidden_dtype(chunk_dtype: str, declared: str, n: int = 100, chunk: int = 10,
                 planted=None) -> tuple:
    """NumPy's values in the declared dtype (small whole numbers, 0 and 1 where a side is
    bool, so every dtype holds them), and a dask array declaring that dtype whose odd chunks
    are ``chunk_dtype`` (holding ``planted`` in their middle where given, which NumPy's values
    do not)."""
    import dask.array as da

    v = (np.arange(n) * 7) % 37
    if "bool" in (np.dtype(chunk_dtype).name, np.dtype(declared).name):
        v = v % 2
    a = v.astype(declared)
    x = da.from_array(a, chunks=chunk).map_blocks(odd_chunks_as, chunk_dtype, planted,
                                                  dtype=declared)
    return a, x


def misfit_text(chunk_dtype: str, value) -> str:
    """How a refusal names ``value`` of a chunk of ``chunk_dtype`` (NumPy's str of it)."""
    return str(np.array(value).astype(chunk_dtype)[()])


def hidden_dtype_pred(declared: str):
    """A predicate for a ``hidden_dtype`` array of ``declared`` (booleans select themselves)."""
    return (lambda v: v) if np.dtype(declared) == np.dtype(bool) else (lambda v: v > 3)
