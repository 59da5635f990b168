"""Reused traces (predicate.memo): a callable gets an earlier trace back only when nothing its
code can read has changed; every result is checked against NumPy."""

from __future__ import annotations

import datetime
import enum
import math
import operator
import pickle
import random
import time
import types

import cloudpickle
import dask
import dask.array as da
import numpy as np
import pytest

from dask_compact import compact_array
from dask_compact.predicate import as_predicate
from dask_compact.predicate.memo import trace_key

A = (np.random.default_rng(0).random(1031) * 10).astype(np.float64)
T = 3.0


class Cfg:
    T = 4.0


def check(pred, want_mask) -> None:
    np.testing.assert_array_equal(compact_array(A, pred), A[want_mask])


def test_a_lambda_in_a_loop_is_traced_once_per_closure_value():
    got = []
    for t in (2.0, 2.0, 5.0):
        p = as_predicate(lambda v: v < t)  # noqa: B023 -- the point: a new lambda each time
        got.append(p)
        check(lambda v: v < t, A < t)  # noqa: B023
    assert got[0] is got[1] and got[1] is not got[2]
    assert got[0].params == (2.0,) and got[2].params == (5.0,)


def test_rebinding_a_global_or_a_class_attribute_changes_the_predicate():
    global T
    old, old_cfg = T, Cfg.T
    try:
        first = [as_predicate(lambda v: v > T) for _ in range(2)]
        T = 7.0
        second = as_predicate(lambda v: v > T)
        check(lambda v: v > T, A > 7.0)
        Cfg.T = 4.0
        c1 = as_predicate(lambda v: v > Cfg.T)
        Cfg.T = 6.0
        c2 = as_predicate(lambda v: v > Cfg.T)
        check(lambda v: v > Cfg.T, A > 6.0)
    finally:
        T, Cfg.T = old, old_cfg
    assert first[0] is first[1] and second is not first[0] and second.params == (7.0,)
    assert c1 is not c2 and c2.params == (6.0,)


def test_a_module_attribute_read_by_the_code_is_in_the_key():
    mod = types.ModuleType("settings")
    mod.limit = 2.5
    f = eval("lambda v: v < settings.limit", {"settings": mod})
    k1 = trace_key(f)
    mod.limit = 8.5
    k2 = trace_key(f)
    assert k1 is not None and k1 != k2
    np.testing.assert_array_equal(compact_array(A, f), A[A < 8.5])


class Cuts:
    class E:
        class W:
            lo = 2.0


def _stale_after_a_change(pred, change) -> None:
    """``pred`` called, ``change()`` applied, ``pred`` called again: each result NumPy's for
    the state at its call (a new-user probe found the second call answering as the first)."""
    np.testing.assert_array_equal(compact_array(A, pred), A[pred(A)])
    change()
    np.testing.assert_array_equal(compact_array(A, pred), A[pred(A)])


def test_attributes_read_from_a_closure_a_default_or_deep_down_are_in_the_key():
    class Local:  # a class held in a closure (a config class made inside main(), say)
        T = 5.0

    _stale_after_a_change(lambda v: v > Local.T, lambda: setattr(Local, "T", 8.0))
    _stale_after_a_change(lambda v, c=Cfg: v > c.T, lambda: setattr(Cfg, "T", 8.5))
    Cfg.T = 4.0
    _stale_after_a_change(lambda v: v > Cuts.E.W.lo, lambda: setattr(Cuts.E.W, "lo", 6.0))
    mod = types.ModuleType("settings")  # a module held in a default, two levels down
    mod.sub = types.ModuleType("settings.sub")
    mod.sub.limit = 2.5

    def in_closure(v, mod=mod):
        return v < mod.sub.limit

    _stale_after_a_change(in_closure, lambda: setattr(mod.sub, "limit", 7.5))


def test_a_name_read_by_a_computed_name_is_traced_every_time():
    global T
    old = T
    try:
        preds = [
            lambda v: v > getattr(Cfg, "T"),  # noqa: B009 -- what is tested
            lambda v: v > globals()["T"],
            lambda v: v > vars(Cfg)["T"],
            lambda v: v > Cfg.__dict__["T"],
        ]
        for pred in preds:
            assert trace_key(pred) is None
            T, Cfg.T = 3.0, 4.0
            _stale_after_a_change(pred, lambda: (globals().__setitem__("T", 6.5),
                                                 setattr(Cfg, "T", 7.5)))
    finally:
        T, Cfg.T = old, 4.0


def test_a_numpy_function_is_keyed_by_identity():
    ps = [as_predicate(lambda v: np.sin(v) > 0.2) for _ in range(2)]
    assert ps[0] is ps[1]
    check(lambda v: np.sin(v) > 0.2, np.sin(A) > 0.2)


def helper(v):
    return v > 5


@pytest.mark.parametrize("make", [
    lambda: (lambda v: helper(v)),  # another Python function: its globals could change
    lambda: (lambda v: v > ARRAY[0]),  # an array: its contents could change
])
def test_what_could_change_unseen_is_traced_every_time(make):
    assert trace_key(make()) is None
    assert as_predicate(make()) is not as_predicate(make())


ARRAY = np.array([5.0])


def test_int_and_float_constants_are_different_predicates():
    ps = [as_predicate(lambda v, t=t: v > t) for t in (3, 3.0)]
    assert ps[0] is not ps[1]
    assert type(ps[0].params[0]) is int and type(ps[1].params[0]) is float
    ints = np.arange(-5, 10, dtype=np.int8)
    np.testing.assert_array_equal(compact_array(ints, lambda v: v > 3), ints[ints > 3])


def test_a_mask_path_hit_runs_the_callable_of_this_call():
    """An untraceable callable's reason is reused, but the mask comes from the new object."""
    fs = [lambda v, k=k: np.isin(v.astype(np.int64), [k]) for k in (1, 1)]
    ps = [as_predicate(f) for f in fs]
    assert ps[0].path == ps[1].path == "mask"
    assert ps[0].func is fs[0] and ps[1].func is fs[1]
    ints = np.arange(20) % 4
    np.testing.assert_array_equal(compact_array(ints, fs[1]), ints[ints == 1])


def test_strings_are_parsed_once():
    assert as_predicate("x < 0.5") is as_predicate("x < 0.5")
    check("x < 0.5", A < 0.5)


def test_what_a_predicate_remembers_is_not_pickled():
    p = as_predicate(lambda v: v < 4.5)
    compact_array(A, p)
    p.typed(np.float64)
    assert p.memo
    q = pickle.loads(cloudpickle.dumps(p))  # as dask sends it to a worker
    assert q.memo == {} and q.params == p.params
    np.testing.assert_array_equal(compact_array(A, q), A[A < 4.5])


def test_bound_constants_are_remembered_per_type_and_value():
    p = as_predicate("x > 1")
    tp = p.typed(np.int8)
    assert tp.bind((1,)) is tp.bind((1,))
    with pytest.raises(ValueError, match="does not fit"):
        tp.bind((1000,))
    assert tp.bind((2,)) == (np.int8(2),)


def test_signed_zeros_and_nans_are_different_constants():
    """-0.0 == 0.0, and NaNs of either sign, but signbit tells them apart: neither trace nor
    binding may mix them."""
    a = np.array([-1.0, -0.0, 0.0, 2.0, np.nan], dtype=np.float32)
    for z in (0.0, -0.0, np.float32(0.0), np.float32(-0.0), np.nan, -np.nan,
              np.float64(np.nan), np.float64(-np.nan)):
        want = np.signbit(np.maximum(a, z))
        np.testing.assert_array_equal(compact_array(a, lambda v: np.signbit(np.maximum(v, z))),
                                      a[want])
    p = as_predicate("signbit(x)")
    tp = as_predicate(lambda v, z=0.0: v > z).typed(np.float64)
    assert np.signbit(tp.bind((-0.0,))[0]) and not np.signbit(tp.bind((0.0,))[0])
    assert p is as_predicate("signbit(x)")


def test_a_passed_check_is_remembered_per_dtype_and_a_refusal_never_is():
    """``Predicate.check`` runs once per dtype for a repeated small call; a constant NumPy
    refuses for the dtype is refused at every call, and another dtype is still checked."""
    p = as_predicate("x + 1000 > 5")
    p.check(np.dtype(np.float64))
    assert ("checked", np.dtype(np.float64)) in p.memo
    for _ in range(2):
        with pytest.raises(ValueError, match="NumPy refuses"):
            p.check(np.dtype(np.int8))
        with pytest.raises(ValueError, match="NumPy refuses"):
            compact_array(np.arange(-5, 10, dtype=np.int8), p)
    assert ("checked", np.dtype(np.int8)) not in p.memo
    f = np.array([-2000.0, 1.0, -990.0])
    np.testing.assert_array_equal(compact_array(f, p), f[f + 1000 > 5])


def test_a_mask_path_function_of_a_module_is_tokenized_by_what_it_reads(monkeypatch):
    """dask tokenizes a function of an importable module by its name alone; the predicate's
    token also holds the globals it reads (and where those cannot be known, is new each
    call), so a call after such a global changed builds keys of its own."""
    import sys

    from dask.base import tokenize

    mod = types.ModuleType("dc_memo_preds")
    exec("import numpy as np\nG = 5.0\nL = [1.0]\n"
         "def fm(v):\n    return np.isin(v, [0.5]) | (v > G)\n"
         "def fl(v):\n    return np.isin(v, L)\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "dc_memo_preds", mod)
    p1 = as_predicate(mod.fm)
    assert p1.path == "mask"
    t1 = tokenize(p1)
    assert tokenize(as_predicate(mod.fm)) == t1  # nothing changed: the same keys
    mod.G = 8.0
    assert tokenize(as_predicate(mod.fm)) != t1
    assert trace_key(mod.fl) is None  # reads a list: new keys every call
    assert tokenize(as_predicate(mod.fl)) != tokenize(as_predicate(mod.fl))


# -- a constant rebound by another thread while a call traces (a new-user probe, 2026-11-30) --


def _rebinding_before_the_trace(monkeypatch, rebind) -> None:
    """The next trace runs after ``rebind()``: another thread rebinding a constant between the
    memo's key and the trace, deterministically."""
    import importlib

    # the module: dask_compact.predicate's attribute `trace` is the function
    trace_module = importlib.import_module("dask_compact.predicate.trace")
    real = trace_module.trace

    def trace(func, *args):
        monkeypatch.setattr(trace_module, "trace", real)
        rebind()
        return real(func, *args)

    monkeypatch.setattr(trace_module, "trace", trace)


def _either(got, *masks) -> None:
    """A call racing a rebind uses the old value or the new one, as Python would."""
    assert any(np.array_equal(got, A[m]) for m in masks), (len(got), [m.sum() for m in masks])


def test_a_global_rebound_while_tracing_is_never_kept_under_the_other_value(monkeypatch):
    global T
    old = T
    try:
        T = 2.125  # values no other test traces: the memo misses

        def rebind():
            global T
            T = 7.125

        pred = lambda v: v > T  # noqa: E731 -- one code object: one memo key per value
        _rebinding_before_the_trace(monkeypatch, rebind)
        _either(compact_array(A, pred), A > 2.125, A > 7.125)
        for t in (2.125, 7.125, 2.125):  # nothing running beside: each call its own value
            T = t
            check(pred, A > t)
    finally:
        T = old


def test_a_class_attribute_rebound_while_tracing_is_never_kept(monkeypatch):
    """An attribute is read as the trace runs (not copied): the key taken again differs."""
    old = Cfg.T
    try:
        Cfg.T = 2.375
        pred = lambda v: v > Cfg.T  # noqa: E731
        _rebinding_before_the_trace(monkeypatch, lambda: setattr(Cfg, "T", 6.375))
        _either(compact_array(A, pred), A > 2.375, A > 6.375)
        for t in (2.375, 6.375, 2.375):
            Cfg.T = t
            check(pred, A > t)
    finally:
        Cfg.T = old


def test_an_attribute_set_during_the_trace_and_set_back_after_it_is_never_kept(monkeypatch):
    """The same as a thread would do it, deterministically: the attribute is 6.875 only while
    the trace runs, 2.875 when the memo reads it before and after. Until 2026-12-01 the trace
    of 6.875 was kept under 2.875's key (a class's, a module's, one deep down)."""
    import importlib

    trace_module = importlib.import_module("dask_compact.predicate.trace")
    real = trace_module.trace
    mod = types.ModuleType("settings")
    cases = [(Cfg, "T", lambda v: v > Cfg.T),
             (mod, "limit", eval("lambda v: v > settings.limit", {"settings": mod})),
             (Cuts.E.W, "lo", lambda v: v > Cuts.E.W.lo)]
    for owner, name, pred in cases:
        old = getattr(owner, name, None)

        def trace(func, *args, owner=owner, name=name):
            monkeypatch.setattr(trace_module, "trace", real)
            setattr(owner, name, 6.875)
            try:
                return real(func, *args)
            finally:
                setattr(owner, name, 2.875)

        try:
            setattr(owner, name, 2.875)
            monkeypatch.setattr(trace_module, "trace", trace)
            _either(compact_array(A, pred), A > 2.875, A > 6.875)
            check(pred, A > 2.875)
        finally:
            setattr(owner, name, old)


class Toggled:
    T = 0.5


def _reads_toggled(k):
    # Toggled.T read many times over the trace, so that the trace meets a value the other
    # thread set between two of the memo's readings of it far more often than with one read
    # (k < 0, never in the data)
    return lambda v: ((v > Toggled.T) & (v < Toggled.T * 3) & (v > Toggled.T / 2)
                      & (v != Toggled.T + k) & (v != Toggled.T + 2 * k) & (v != Toggled.T + 3 * k)
                      & (v != Toggled.T + 4 * k) & (v != Toggled.T + 5 * k)
                      & (v != Toggled.T + 6 * k) & (v != Toggled.T + 7 * k)
                      & (v != Toggled.T + 8 * k) & (v != Toggled.T + 9 * k))


def test_a_class_attribute_set_and_set_back_by_another_thread_while_tracing():
    """A thread setting ``Toggled.T`` to 0.25 and back to 0.5 while calls trace: the memo
    read 0.5 before the trace and 0.5 after it, the trace read 0.25, and until 2026-12-01
    that trace was kept under 0.5's key, so a later call with ``Toggled.T == 0.5`` selected
    what 0.25 selects (a probe: 1-7 of 100 calls under forced thread switching). Each batch of
    50 new predicates (a new closure constant ``k``, never in the data) is traced while the
    thread runs, then called again with nothing running beside (on the code before the fix
    the first wrong answer came within 0.1-2 s on a loaded 2-core machine)."""
    import sys
    import threading

    want = A[(A > 0.5) & (A < 1.5)]
    stop = threading.Event()

    def toggle():
        while not stop.is_set():
            Toggled.T = 0.25
            time.sleep(0)  # lets the calling thread run with each value in turn
            Toggled.T = 0.5
            time.sleep(0)

    np.testing.assert_array_equal(compact_array(A, _reads_toggled(-0.5)), want)  # compiled
    old, start, n = sys.getswitchinterval(), time.perf_counter(), 0
    try:
        while time.perf_counter() - start < 4.0:
            ks = [-1.0 - n - i for i in range(50)]
            n += len(ks)
            stop.clear()
            thread = threading.Thread(target=toggle)
            sys.setswitchinterval(1e-6)
            thread.start()
            try:
                for k in ks:
                    as_predicate(_reads_toggled(k))
            finally:
                stop.set()
                thread.join()
                sys.setswitchinterval(old)
                Toggled.T = 0.5
            for k in ks:
                np.testing.assert_array_equal(compact_array(A, _reads_toggled(k)), want)
    finally:
        stop.set()
        sys.setswitchinterval(old)
        Toggled.T = 0.5


def test_a_closure_cell_rebound_while_tracing_a_record_predicate(monkeypatch):
    from dask_compact import compact_records

    fields = {"e": A, "i": np.arange(A.size)}
    limit = 3.625

    def rebind():
        nonlocal limit
        limit = 8.625

    pred = lambda e: e > limit  # noqa: E731
    _rebinding_before_the_trace(monkeypatch, rebind)
    got = compact_records(fields, pred)["i"]
    assert any(np.array_equal(got, np.flatnonzero(A > t)) for t in (3.625, 8.625))
    for limit in (3.625, 8.625, 3.625):  # noqa: B007 -- the closure reads it
        np.testing.assert_array_equal(compact_records(fields, pred)["i"],
                                      np.flatnonzero(A > limit))


def test_map_compact_after_a_rebind_while_tracing(monkeypatch):
    import dask.array as da

    from dask_compact import map_compact

    global T
    old = T
    try:
        T = 1.875

        def rebind():
            global T
            T = 5.875

        pred = lambda v: v > T  # noqa: E731
        _rebinding_before_the_trace(monkeypatch, rebind)
        compact_array(A, pred)
        T = 1.875
        got = map_compact(da.from_array(A, chunks=300), pred).compute()
        np.testing.assert_array_equal(got, A[A > 1.875])
    finally:
        T = old


def test_a_gpu_repeated_call_is_kept_only_under_its_predicates_trace_key():
    """repeat_keys.kept_key: the GPU repeated calls keep a call
    under the caller's function only while its key is the one the predicate the call ran was
    traced under; tests/gpu run the calls themselves."""
    from dask_compact.repeat_keys import caller_key, kept_key

    limit = 0.25
    pred = lambda v: v < limit  # noqa: E731
    p = as_predicate(pred)
    assert kept_key(pred, p) == caller_key(pred) is not None
    limit = 0.75  # rebound while the call ran: that call used 0.25
    assert kept_key(pred, p) is None
    assert kept_key(pred, as_predicate(pred)) == caller_key(pred)
    assert kept_key("x < 1", as_predicate("x < 1")) == "x < 1"
    q = as_predicate("x < 2")
    assert kept_key(q, q) == ("predicate", id(q))


def test_gpu_kept_calls_are_never_a_later_threads(monkeypatch):
    """The GPU calls keep their ready and repeated calls per thread (cupy_calls, the
    records' ready and repeated calls): each one's kept scratch, word sets and pinned words
    are reused in its stream's order only. Keyed by threading.get_ident() until 2026-12-01
    (thirteenth session, a concurrency probe of the GPU calls), a thread started after
    another had ended could be given its id, and so its kept calls: on the per-thread default
    stream (one pointer, 2, for every thread's own stream) its first launch wrote the kept
    scratch while the ended thread's last copy out of it could still be queued on another
    stream. Importable without CuPy: the keys, with a stand-in for CuPy's current stream."""
    import sys
    import threading

    from dask_compact.backends import cupy_calls, cupy_records_repeat

    stream = types.SimpleNamespace(ptr=2)  # cudaStreamPerThread: every thread's, one pointer
    cuda = types.SimpleNamespace(get_current_stream=lambda: stream)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    a = types.SimpleNamespace(dtype=np.dtype(np.float32), size=1024, shape=(1024,),
                              data=types.SimpleNamespace(device_id=0))
    keys, idents = [], []

    def call():
        idents.append(threading.get_ident())
        keys.append((cupy_calls._repeat_key(a, "x < 1", "values", True, "auto"),
                     cupy_records_repeat._repeat_key({"x": a}, "x < 1", False)))

    for _ in range(6):
        t = threading.Thread(target=call)
        t.start()
        t.join()
    if len(set(idents)) == len(idents):
        pytest.skip("no thread id was given again here")
    for part in (0, 1):
        assert len({k[part] for k in keys}) == len(keys), "a later thread met an ended one's"
    call()  # this thread's keys are the same at every call
    assert keys[-1] == (cupy_calls._repeat_key(a, "x < 1", "values", True, "auto"),
                        cupy_records_repeat._repeat_key({"x": a}, "x < 1", False))


# -- predicates that read the world, not only their argument --------------------------------------

class Stamp:
    """A class whose construction runs Python code: here it reads the clock."""

    def __init__(self):
        self.ns = time.monotonic_ns()


class Plain:
    limit = 3.0


class Level(enum.IntEnum):
    LOW = 2
    HIGH = 7


@pytest.mark.parametrize("make", [
    lambda: (lambda v: v < time.monotonic_ns()),
    lambda: (lambda v: v < random.random()),
    lambda: (lambda v: v < datetime.datetime.now().timestamp()),
    lambda: (lambda v: v < len(open(__file__).read())),
    lambda: (lambda v: v < np.empty(1)[0]),
    lambda: (lambda v: v < np.datetime64("now")),
    lambda: (lambda v: v < np.datetime64(" Today ")),
    lambda: (lambda v, when="now": v < np.datetime64(when)),
    lambda: (lambda v: v < Stamp().ns),
])
def test_a_predicate_reading_the_world_is_traced_every_time(make):
    assert trace_key(make()) is None


@pytest.mark.parametrize("make", [
    lambda: (lambda v: v < math.sqrt(2.0) + abs(-1) + len("ab") + max(1, 2)),
    lambda: (lambda v: operator.lt(v, 2.0)),
    lambda: (lambda v: v < Plain.limit),
    lambda: (lambda v: (v > Level.LOW) & (v < Level(7))),
    lambda: (lambda v: v < np.float32(2.5)),
    lambda: (lambda v: v < float("2.5")),
    lambda: (lambda v: v < np.arange(3)[2]),
    lambda: (lambda t: t < np.datetime64("2026-11-30")),
])
def test_pure_builtins_classes_and_enums_keep_their_key(make):
    assert trace_key(make()) is not None
    first, again = as_predicate(make()), as_predicate(make())
    # a mask-path trace (datetime64 constants) comes back as a new Predicate running this
    # call's callable; a traced one is the same object
    assert again is first or (first.expr is None and again.expr is None)


def test_a_clock_read_in_the_predicate_is_read_by_every_call():
    """``v < time.monotonic_ns()`` on times 1 ms apart: each call selects the times before
    its own clock reading (until 2026-11-30 every call kept the first call's reading)."""
    from dask_compact import compact_records, map_compact

    now = time.monotonic_ns()
    times = now + np.arange(-2_000, 2_000, dtype=np.int64) * 1_000_000
    times = np.random.default_rng(5).permutation(times)
    pred = lambda v: v < time.monotonic_ns()  # noqa: E731
    for _ in range(3):
        before = time.monotonic_ns()
        got = compact_array(times, pred)
        after = time.monotonic_ns()
        assert (times < before).sum() <= got.size <= (times < after).sum()
        np.testing.assert_array_equal(got, times[times < got.max() + 1])
        time.sleep(0.25)  # 250 more times selected by the next call
    before = time.monotonic_ns()
    got = map_compact(da.from_array(times, chunks=1000), pred).compute()
    assert (times < before).sum() <= got.size
    np.testing.assert_array_equal(got, times[times < got.max() + 1])
    time.sleep(0.25)
    before = time.monotonic_ns()
    got = compact_records({"t": times}, lambda t: t < time.monotonic_ns())["t"]
    assert (times < before).sum() <= got.size
    np.testing.assert_array_equal(got, times[times < got.max() + 1])


def test_a_datetime64_now_predicate_follows_the_clock():
    now = np.datetime64("now")
    stamps = now + np.arange(-30, 30) * np.timedelta64(1, "s")
    pred = lambda t: t <= np.datetime64("now")  # noqa: E731
    first = compact_array(stamps, pred)
    np.testing.assert_array_equal(first, stamps[stamps <= first.max()])
    time.sleep(1.1)  # the clock's next second
    second = compact_array(stamps, pred)
    assert second.size > first.size
    np.testing.assert_array_equal(second, stamps[stamps <= second.max()])


# -- keys too coarse (a new-user probe, 2026-12-01) ---------------------------------------------


def test_a_numpy_scalars_dtype_is_in_the_key(monkeypatch):
    """np.timedelta64(5, "m") and (5, "s") are one type with the same bytes: a closure constant
    changed from one to the other reused the first trace (100 values where NumPy chose 142)."""
    import sys

    from dask.base import tokenize

    from dask_compact.predicate.memo import value_key

    secs = np.arange(0, 1000, 7, dtype=np.float64)

    def newer_than(delta):
        return lambda v: v > delta / np.timedelta64(1, "s")

    for delta in (np.timedelta64(5, "m"), np.timedelta64(5, "s"), np.timedelta64(5, "m")):
        p = newer_than(delta)
        want = secs[p(secs)]
        np.testing.assert_array_equal(compact_array(secs, p), want)
        np.testing.assert_array_equal(
            da.from_array(secs, chunks=50).map_compact(p).compute(), want)
    # a mask-path function of a module: dask tokenizes it by its name, and the predicate's
    # token adds a hash of its trace key (np.dtype's hash leaves the unit out)
    mod = types.ModuleType("dc_memo_units")
    exec("import numpy as np\nD = np.timedelta64(5, 'm')\n"
         "def fm(v):\n    return np.isin(v, [7.0]) | (v > D / np.timedelta64(1, 's'))\n",
         mod.__dict__)
    monkeypatch.setitem(sys.modules, "dc_memo_units", mod)
    assert as_predicate(mod.fm).path == "mask"
    first = tokenize(as_predicate(mod.fm))
    mod.D = np.timedelta64(5, "s")
    assert tokenize(as_predicate(mod.fm)) != first
    # datetimes of other units, and records of other fields, with the same bytes
    assert value_key(np.datetime64(5, "D")) != value_key(np.datetime64(5, "h"))
    rec = [np.zeros((), dtype=[(name, "<i4")])[()] for name in ("a", "b")]
    assert rec[0].tobytes() == rec[1].tobytes() and value_key(rec[0]) != value_key(rec[1])


count = "".count  # a global rebound by the next test


def test_a_global_rebound_to_a_builtin_method_of_each_value():
    """``count = line.count`` for each line: the key held id() of the method, which CPython
    gave the next line's method once the last one was freed, and the first line's trace came
    back. A method of a value is keyed by the value and the method's name."""
    global count
    a = np.arange(10)
    pred = lambda v: v > count(",")  # noqa: E731
    try:
        for line in ["a,b,c", "a,b,c,d,e,f,g", "a", "a,b,c,d", "", "a,b"]:
            count = line.count
            np.testing.assert_array_equal(compact_array(a, pred), a[pred(a)])
        count = "".join(["a", ",b"]).count  # an equal value, another object: the same key
        key = trace_key(pred)
        count = "a,b".count
        assert trace_key(pred) == key
        count = "a,c".count
        assert trace_key(pred) != key
    finally:
        count = "".count


def test_a_class_or_module_in_a_key_lives_as_long_as_the_key():
    """A class or module keyed by identity is held by the key, so no other object can take
    its id (and its entry) while the key lives; the key held the id alone before."""
    import gc
    import weakref

    made = type("Made", (), {"T": 2.0})
    mod = types.ModuleType("made_module")
    mod.T = 3.0
    key = trace_key(lambda v: (v > made.T) & (v < mod.T))
    assert key is not None
    refs = [weakref.ref(made), weakref.ref(mod)]
    made, mod = None, None
    gc.collect()
    assert all(r() is not None for r in refs)
    del key
    gc.collect()
    assert all(r() is None for r in refs)

    class AllEqual(type):  # a metaclass whose == says any two of its classes are equal
        def __eq__(cls, other):
            return isinstance(other, AllEqual)

        def __hash__(cls):
            return 0

    # its classes never share an entry: since 2026-12-01 a metaclass with Python code of its
    # own (an __eq__ here; a __getitem__ could read anything) keeps its classes out of keys
    classes = (AllEqual("A", (), {"T": 1.0}), AllEqual("B", (), {"T": 3.0}))
    keys = [trace_key(lambda v, k=k: v > k.T) for k in classes]
    assert keys == [None, None]
    for k in classes:
        check(lambda v, k=k: v > k.T, A > k.T)
    # a method found under its name on the value, and one that is not (object's __format__
    # bound to a str: str's own under that name)
    methods = ["a".count, "a".__format__, object.__format__.__get__("a")]
    keys = [trace_key(lambda v, f=f: f) for f in methods]
    assert None not in keys and len(set(keys)) == 3


def test_predicates_differing_in_a_nans_sign_have_their_own_dask_keys():
    """dask's tokenize takes NaNs of either sign as equal: two fused predicates differing only
    in a NaN constant's sign had one key, and dask.compute of both gave the first result."""
    import dask
    from dask.base import tokenize

    from dask_compact import compact_records

    nan = float("nan")
    a = np.linspace(-1, 1, 101)
    x = da.from_array(a, chunks=25)
    preds = [lambda v, n=n: np.signbit(np.where(v > 0, n, 1.0)) for n in (nan, -nan)]
    assert [as_predicate(p).path for p in preds] == ["fused", "fused"]
    assert tokenize(as_predicate(preds[0])) != tokenize(as_predicate(preds[1]))
    ys = [x.map_compact(p, lazy=True) for p in preds]
    assert ys[0].name != ys[1].name
    for got, p in zip(dask.compute(*ys), preds):
        np.testing.assert_array_equal(got, a[p(a)])
    for n in (np.float32(nan), np.float64(nan)):
        pair = [as_predicate(lambda v, m=m: np.signbit(np.where(v > 0, m, 1.0))) for m in (n, -n)]
        assert tokenize(pair[0]) != tokenize(pair[1])
    recs = [compact_records({"t": x}, lambda t, n=n: np.signbit(np.where(t > 0, n, 1.0)),
                            lazy=True)["t"] for n in (nan, -nan)]
    for got, p in zip(dask.compute(*recs), preds):
        np.testing.assert_array_equal(got, a[p(a)])


# --- values whose own ==, hash or attributes are Python code (a new-user probe, 2026-12-01) ---

class AlwaysEqualInt(int):
    """An int subclass whose == calls every value equal (and hashes them alike)."""

    def __eq__(self, other):
        return True

    __hash__ = int.__hash__.__get__(0)  # one hash for all


class AlwaysEqualStr(str):
    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def test_a_subclass_constant_is_not_keyed_by_its_own_equality():
    """``t = AlwaysEqualInt(2)`` then ``AlwaysEqualInt(5)``: until 2026-12-01 the key held the
    constant and compared it with its own ==, and the second call got the first's trace."""
    for t in (AlwaysEqualInt(2), AlwaysEqualInt(5)):
        assert trace_key(lambda v: v < t) is None  # noqa: B023
        check(lambda v: v < t, A < int(t))  # noqa: B023
    for text in (AlwaysEqualStr("a"), AlwaysEqualStr("a,b,c,d")):
        assert trace_key(lambda v: v > len(text)) is None  # noqa: B023
        check(lambda v: v > len(text), A > len(str(text)))  # noqa: B023


def test_a_builtin_method_of_a_subclass_value_is_held_by_identity():
    """``count = line.count`` where line is a str subclass with its own ==: until 2026-12-01
    the method was keyed by the line's value under the subclass's ==, and a second line got
    the first line's count."""
    got = []
    for line in (AlwaysEqualStr("a,b"), AlwaysEqualStr("a,b,c,d,e")):
        count = line.count
        got.append(trace_key(lambda v: v > count(",")))  # noqa: B023
        check(lambda v: v > count(","), A > str(line).count(","))  # noqa: B023
    assert got[0] != got[1]


def test_enum_members_keep_their_key_and_tell_one_another_apart():
    class Flags(enum.IntFlag):
        A = 1
        B = 2

    keys = [trace_key(lambda v: v > f) for f in (Flags.A, Flags.B, Flags.A | Flags.B)]  # noqa: B023
    assert None not in keys and len(set(keys)) == 3
    for f in (Flags.A, Flags.B, Flags.A | Flags.B):
        check(lambda v: v > f, A > int(f))  # noqa: B023


class RaisingHash(str):
    def __hash__(self):
        raise RuntimeError("not hashable today")


class RaisingCount(type):
    @property
    def count(cls):
        raise RuntimeError("count is computed elsewhere")


class Holder(metaclass=RaisingCount):
    lo = 1.5


SEP = "a,b,c"


def test_taking_the_key_never_raises_what_the_predicate_does_not():
    """A str subclass whose hash raises, a class whose metaclass raises for an attribute the
    code names elsewhere (``SEP.count``): until 2026-12-01 the key's hash or getattr raised
    out of compact_array before the predicate ran."""
    s = RaisingHash("ab")
    check(lambda v: v > len(s), A > 2)
    check(lambda v: v > Holder.lo + SEP.count(","), A > 3.5)


def test_metaclasses_met_do_not_pile_up():
    """A program making classes of new metaclasses in a loop: until 2026-12-01 the table of
    which types compare by identity held every metaclass (and so every class) forever."""
    from dask_compact.predicate import memo

    for i in range(200):
        meta = type(f"Meta{i}", (type,), {})
        holder = meta(f"Cfg{i}", (), {"lo": float(i % 5)})
        assert trace_key(lambda v: v > holder.lo) is not None  # noqa: B023
    assert len(memo._IDENTITY_KINDS) <= 64


def test_an_object_field_of_a_record_constant_is_not_keyed_by_its_address():
    """An np.void with an object field: its bytes are the object's address, which stays the
    same while the object changes; until 2026-12-01 the key was those bytes."""
    cut = [3.0]
    rec = np.array([(0, cut)], dtype=[("a", "i8"), ("b", object)])[0]
    assert trace_key(lambda v: v > rec["b"][0]) is None
    check(lambda v: v > rec["b"][0], A > 3.0)
    cut[0] = 7.0
    check(lambda v: v > rec["b"][0], A > 7.0)


def test_mask_path_dask_names_differ_where_the_keys_differ(monkeypatch):
    """A mask-path function of a module reading a global K, K = -1 then K = -2 (one hash in
    CPython; dask tokenizes such a function by its name): until 2026-12-01 the token was
    hash(key), both lazy calls had one dask name, and a cluster still holding the first
    result gave it for the second."""
    import sys

    mod = types.ModuleType("dc_memo_hash")
    exec("import numpy as np\nK = -1\ndef f(v):\n    return np.isin(v, [K])\n", mod.__dict__)
    monkeypatch.setitem(sys.modules, "dc_memo_hash", mod)
    x = da.from_array(np.array([-2, -1, 0, 3, 4, 5, 6]), chunks=3)  # one chunk count either way
    assert as_predicate(mod.f).expr is None  # the mask path
    y1 = x.map_compact(mod.f, lazy=True).persist()
    mod.K = -2
    y2 = x.map_compact(mod.f, lazy=True)
    assert y1.name != y2.name
    got = dask.compute(y1, y2)
    np.testing.assert_array_equal(got[0], [-1])
    np.testing.assert_array_equal(got[1], [-2])


MASK_TOKEN = """
import numpy as np
from dask.base import tokenize
from dask_compact.predicate import as_predicate
label = "x"
print(tokenize(as_predicate(lambda v: np.isin(v, [len(label), 3]))))
"""


def test_a_mask_path_token_is_the_same_in_every_process():
    """dask names a computation alike in every process where it can; until 2026-12-01 a
    mask-path predicate's token was the hash of its key, which holds strings, whose hash
    changes with PYTHONHASHSEED."""
    import os
    import subprocess
    import sys

    tokens = {subprocess.run([sys.executable, "-c", MASK_TOKEN], capture_output=True, text=True,
                             check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
              for seed in ("1", "2")}
    assert len(tokens) == 1


# --- Python code a class runs without the predicate naming it (a new-user probe, 2026-12-01) ---

class Level8:
    """A class whose construction runs no Python code, but whose instances' float() does,
    reading an attribute the predicate never names."""

    level = 5.0

    def __float__(self):
        return Level8.level


class ByName(type):
    def __getitem__(cls, name):
        return cls.table[name]


class Table(metaclass=ByName):
    table = {"lo": 5.0}


class Scaled:
    factor = 2.0

    def __call__(self, v):
        return v * Scaled.factor


MIDS = {"LOW": 1.5}


class Band(enum.Enum):
    LOW = 1
    HIGH = 2

    @enum.property
    def mid(self):
        return MIDS[self.name]


class Bare(enum.Enum):
    LOW = 1


def test_a_class_running_its_own_code_unnamed_is_not_keyed():
    """``float(Level8())``, ``Table["lo"]``, ``Scaled()(v)``, an enum property: the trace runs
    the class's (or its metaclass's) Python code, which reads what the key does not hold; until
    2026-12-01 a later call after ``Level8.level = 8`` got the first trace (527 values where
    NumPy selected 212)."""
    preds = [lambda v: v > float(Level8()), lambda v: v > Table["lo"],
             lambda v: Scaled()(v) > 10.0, lambda v: v > Band.LOW.mid]
    for p in preds:
        assert trace_key(p) is None
    try:
        for value in (5.0, 8.0):
            Level8.level, Table.table["lo"], Scaled.factor, MIDS["LOW"] = (
                value, value, value / 2.5, value)
            check(preds[0], A > value)
            check(preds[1], A > value)
            check(preds[2], A * (value / 2.5) > 10.0)
            check(preds[3], A > value)
    finally:
        Level8.level, Table.table["lo"], Scaled.factor, MIDS["LOW"] = 5.0, 5.0, 2.0, 1.5


class Late(float):
    """No code of its own, until a test gives it some."""


def test_code_given_to_a_class_after_a_first_call_is_seen():
    pred = lambda v: v > float(Late())  # noqa: E731
    assert trace_key(pred) is not None
    check(pred, A > 0.0)
    Late.__float__ = lambda self: 5.0
    try:
        assert trace_key(pred) is None
        check(pred, A > 5.0)
    finally:
        del Late.__float__


def test_an_enum_members_own_attributes_and_clock_values_are_not_keyed_by_identity():
    """A member is one object, but not a constant: an attribute set on it (``Bare.LOW.lo``),
    or a value NumPy reads the clock from (``"now"``). Until 2026-12-01 the member was keyed
    by identity alone and ``Bare.LOW.lo = 4`` after a first call kept ``v > 0``."""
    pred = lambda v: v > Bare.LOW.lo  # noqa: E731
    try:
        for lo in (0.0, 4.0):
            Bare.LOW.lo = lo
            check(pred, A > lo)
    finally:
        del Bare.LOW.lo

    class When(enum.StrEnum):
        NOW = "now"

    assert trace_key(lambda t: t < np.datetime64(When.NOW, "s")) is None
    assert trace_key(lambda v: v > Bare.LOW.value) is not None  # a plain member still is


NOW_BYTES = b"now"
NOW_NP = np.array(["now", "2026-12-01"])[0]  # np.str_, as read from an array
TODAY_NP = np.bytes_(b" Today")


@pytest.mark.parametrize("make", [
    lambda: (lambda t, when=NOW_NP: t < np.datetime64(when, "s")),
    lambda: (lambda t, when=TODAY_NP: t < np.datetime64(when, "s")),
    lambda: (lambda t: t < np.datetime64(NOW_BYTES, "s")),
    lambda: (lambda t: t < np.datetime64(b"now", "s")),
])
def test_a_clock_string_of_numpy_or_bytes_is_traced_every_time(make):
    """NumPy reads the clock from ``np.str_("now")`` (a string read from an array) and from
    bytes as from a str: until 2026-12-01 only a str was looked at, and such a mask-path
    predicate had one dask name at every call, so a cluster still holding an earlier result
    gave it for a later clock (a new-user probe)."""
    from dask.base import tokenize

    pred = make()
    assert trace_key(pred) is None
    assert tokenize(as_predicate(pred)) != tokenize(as_predicate(pred))


FIRST_TOKEN = """
import numpy as np
from dask.base import tokenize
from dask_compact.predicate import as_predicate
class Cut:
    T = 3
f = lambda v: np.isin(v, [Cut.T])
print(len({tokenize(as_predicate(f)) for _ in range(3)}))
"""


def test_a_mask_path_predicate_reading_a_script_class_has_one_token_from_the_first_call():
    """dask's tokenize of a class gives it a ``__slotnames__`` the first time; the function's
    token, taken before it and pickling the class by value, then differed between the
    first call and the next ones (a new-user probe, 2026-12-01: a persisted first lazy
    result was never found again)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_TOKEN], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "1"


def test_a_class_of_a_reloaded_module_with_other_bases_gets_another_dask_name(monkeypatch):
    """``class K(float)`` edited to ``class K(int)`` and the module reloaded: the key held each
    class by identity, but the mask path's dask token named it by its import name alone, so
    a lazy call after the reload took the earlier call's name and ``dask.compute`` gave the
    persisted earlier result (``K(2.5) * 2`` as 5.0 where NumPy now gives 4; a new-user probe,
    2026-12-01). A class found by its name is named with its bases and metaclass too."""
    import sys

    src = ("import numpy as np\nclass K({}):\n    pass\n"
           "def f(v):\n    return np.isin(v, [K(2.5) * 2])\n")
    mod = types.ModuleType("dc_memo_reload")
    monkeypatch.setitem(sys.modules, "dc_memo_reload", mod)
    exec(src.format("float"), mod.__dict__)
    x = da.from_array(np.arange(10), chunks=3)
    y1 = x.map_compact(mod.f, lazy=True).persist()
    exec(src.format("int"), mod.__dict__)  # as importlib.reload does: the same namespace
    y2 = x.map_compact(mod.f, lazy=True)
    assert y1.name != y2.name
    got = dask.compute(y1, y2)
    np.testing.assert_array_equal(got[0], [5])
    np.testing.assert_array_equal(got[1], [4])


# -- a config class with methods beside its data (the eleventh session, 2026-12-01) ----------

UNSEEN = 5.0


class CfgM:
    """Data read as ``CfgM.T``, with code beside it that no predicate below runs unnamed."""

    T = 4.0

    def describe(self):
        return f"T={self.T}"

    def __float__(self):
        return UNSEEN

    @property
    def doubled(self):
        return 2 * self.T

    @classmethod
    def make(cls):
        return cls()


class _Unseen:
    """A descriptor: reading ``CfgD.T`` off the class runs this Python code."""

    def __get__(self, obj, cls):
        return UNSEEN


class CfgD:
    T = _Unseen()


def test_a_config_class_with_methods_read_only_by_attribute_is_keyed():
    """``CfgM.T`` beside a method: reading it off the class runs none of the class's code, so
    the key (the class, T's value) says all the trace depends on; until 2026-12-01 it was
    traced every call (+49-53% on a 2^10 CPU call)."""
    pred = lambda v: (v > CfgM.T) & (v < CfgM.T * 2)  # noqa: E731
    old = CfgM.T
    try:
        assert trace_key(pred) is not None
        assert as_predicate(pred) is as_predicate(pred)
        for t in (4.0, 2.5, 4.0):
            CfgM.T = t
            check(pred, (A > t) & (A < t * 2))
    finally:
        CfgM.T = old


@pytest.mark.parametrize("make", [
    lambda: (lambda v: v > float(CfgM())),  # made: __float__ runs unnamed
    lambda: (lambda v: v > float(CfgM.make())),  # a classmethod named: not a value
    lambda: (lambda v: v > CfgM().T),  # made
    lambda: (lambda v: v > [CfgM][0].T),  # the class itself goes somewhere
    lambda: (lambda v: v > float(operator.call(CfgM))),  # handed on, and called there
    lambda: (lambda v: v > len(CfgM.describe(CfgM))),  # a method named
    lambda: (lambda v: v > len(repr(CfgM.doubled))),  # a property named
    lambda: (lambda v: v > CfgD.T),  # a descriptor's Python __get__ runs on the read
    lambda C=CfgM: (lambda v: v > C.T),  # held in a closure: not looked at, refused as before
])
def test_a_class_with_code_the_predicate_can_reach_stays_unkeyed(make):
    global UNSEEN
    assert trace_key(make()) is None
    old = UNSEEN
    try:
        for UNSEEN in (5.0, 7.0):  # noqa: B007 -- what the code reads unnamed
            got = compact_array(A, make())
            np.testing.assert_array_equal(got, A[np.asarray(make()(A), bool)])
    finally:
        UNSEEN = old


# ---- recent keys (memo._RECENT): a function reading the same value objects gets its key at
# once (2026-12-02, seventeenth session); these check that nothing equal but not the same
# ever takes another value's key


def _fresh_key(f):
    from dask_compact.predicate.memo import _trace_key

    return _trace_key(f)


def test_recent_keys_tell_apart_values_that_compare_equal():
    from dask_compact.predicate import memo

    def make(t):
        return lambda v: v < t

    values = [0.0, -0.0, 1, 1.0, True, np.float32(1.0), np.float64(1.0), np.int8(1), 2**70,
              float("nan"), "a", None]
    for _ in range(3):  # the second and third rounds meet the kept entries
        for t in values:
            f = make(t)
            assert trace_key(f) == _fresh_key(f), t
    assert any(e[0] is make(0).__code__ for e in memo._RECENT.values())
    keys = {trace_key(make(t)) for t in (0.0, -0.0, 1, 1.0, True)}
    assert len(keys) == 5


def test_recent_keys_follow_rebound_globals_defaults_and_cells():
    global T
    old = T
    try:
        for t in (2.0, 6.0, 2.0, 6.0):
            T = t
            check(lambda v: v > T, A > t)
            check(lambda v, u=t: v > u, A > t)
            check(lambda v: v > t, A > t)  # noqa: B023 -- a cell rebound by the loop
    finally:
        T = old
    # an int and a float of one value, in a predicate whose result tells them apart
    a = np.array([127, 100, -5, 126], dtype=np.int8)
    for t in (1, 1.0, 1, 1.0):
        want = (a + t) > 100  # int8 wraps with a Python int (NEP 50), not with a float
        np.testing.assert_array_equal(compact_array(a, lambda v: (v + t) > 100), a[want])  # noqa: B023


def test_recent_keys_never_take_a_value_changed_in_place_or_a_freed_values_id():
    from dask_compact.predicate import memo

    arr = np.array([3.0])
    f = lambda v: v > arr[0]  # noqa: E731
    check(f, A > 3.0)
    arr[0] = 8.0
    check(f, A > 8.0)  # an array is not a recent value: traced again
    assert all(e[0] is not f.__code__ for e in memo._RECENT.values())
    # values made at run time (new objects, whose ids a freed one may have had): the entry
    # holds its values, so an id in it is never another object's
    def make(t):
        return lambda v: v < t

    for i in range(200):
        g = make(float(str(i % 7 + 0.5)))
        assert trace_key(g) == _fresh_key(g)
        del g


def test_recent_keys_follow_defaults_replaced_dropped_or_added_and_globals_deleted():
    """A kept key is compared value by value where the function reads it (memo._recent_key):
    a function of the kept code whose defaults were replaced, dropped or lengthened, or
    whose global was deleted or came back as another object, gets its own key, never the
    kept one; the same values again get the kept one."""
    from dask_compact.predicate import memo

    def make():
        return lambda v, w=1.5: v < w

    f = make()
    first = trace_key(f)
    assert any(e[0] is f.__code__ for e in memo._RECENT.values())
    assert trace_key(make()) is first  # the kept entry, the same default object
    for defaults in ((2.5,), None, (0.5, 2.5)):
        g = make()
        g.__defaults__ = defaults
        assert trace_key(g) == _fresh_key(g) != first, defaults
        if defaults is not None:
            check(g, A < defaults[-1])
    ns: dict = {"lim": 4.0}
    exec("h = lambda v: v < lim", ns)
    h = ns["h"]
    kept = trace_key(h)
    assert kept == _fresh_key(h)
    ns["lim"] = 6.0
    assert trace_key(h) == _fresh_key(h) != kept
    check(h, A < 6.0)
    del ns["lim"]
    assert trace_key(h) == _fresh_key(h) != kept
    ns["lim"] = 4.0
    assert trace_key(h) == kept
    check(h, A < 4.0)


def test_recent_keys_under_a_thread_rebinding_the_cell():
    import threading

    from dask_compact.predicate import memo

    t = 0.25
    stop = threading.Event()

    def rebind():
        nonlocal t
        while not stop.is_set():
            t = 0.75 if t == 0.25 else 0.25

    f = lambda v: v < t  # noqa: E731
    th = threading.Thread(target=rebind)
    old = memo.sys.getswitchinterval()
    memo.sys.setswitchinterval(1e-6)
    th.start()
    try:
        for _ in range(3000):
            memo.trace_key(f)
    finally:
        stop.set()
        th.join()
        memo.sys.setswitchinterval(old)
    # whatever the threads interleaved, every entry kept holds the key of its own values
    for code, g, _b, _bt, _names, values, key in list(memo._RECENT.values()):
        if code is f.__code__:
            snap = types.FunctionType(code, dict(g), "f", None,
                                      tuple(types.CellType(v) for v in values))
            assert memo._trace_key(snap) == key
    for t in (0.25, 0.75):
        assert trace_key(f) == _fresh_key(f)
        check(f, A < t)


def test_a_builtin_patched_or_another_functions_builtins_is_another_key():
    """A builtin the code reads (``abs``) is in the key as it is now: until 2026-12-02
    (seventeenth session, a review of the recent keys) names not in the globals were left
    out, and after ``builtins.abs`` was patched, or for a function of the same code with
    other ``__builtins__`` (exec), the first trace was reused."""
    import builtins

    a = np.array([-3.0, -1.5, -0.0, 0.5, 1.0, 2.0, 3.0])
    g: dict = {}
    exec("r = lambda v: abs(v) > 1", g)  # noqa: S102 -- the test's own code
    np.testing.assert_array_equal(compact_array(a, g["r"]), a[np.abs(a) > 1])
    orig = builtins.abs
    builtins.abs = lambda v: -v
    try:
        exec("r = lambda v: abs(v) > 1", g)  # noqa: S102
        np.testing.assert_array_equal(compact_array(a, g["r"]), a[-a > 1])
    finally:
        builtins.abs = orig
    np.testing.assert_array_equal(compact_array(a, g["r"]), a[np.abs(a) > 1])
    code = compile("lambda v: abs(v) > 1", "<test>", "eval").co_consts[0]
    first = types.FunctionType(code, {"__builtins__": {"abs": orig}})
    other = types.FunctionType(code, {"__builtins__": {"abs": lambda v: -v}})
    np.testing.assert_array_equal(compact_array(a, first), a[np.abs(a) > 1])
    np.testing.assert_array_equal(compact_array(a, other), a[-a > 1])
    assert trace_key(first) != trace_key(other)
