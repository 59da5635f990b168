"""Compiled code is cached in bounded LRUs in memory and under a size cap on disk."""

from __future__ import annotations

import os
import shutil
import sys
import time
import warnings

import dask
import numpy as np
import pytest

import dask_compact
from dask_compact.cache import BoundedCache, trim
from dask_compact.codegen import numba_loop
from dask_compact.predicate import as_predicate


def structures(n: int) -> list:
    """n predicates of different structure (a new constant would reuse the loop)."""
    out = []
    for k in range(n):
        text = " | ".join(["(x > 0.5)"] + [f"(x < -{j + 1})" for j in range(k)])
        out.append(as_predicate(text))
    return out


def _mask(a, k: int):
    """NumPy's mask of ``structures(n)[k]``."""
    m = a > 0.5
    for j in range(k):
        m |= a < -(j + 1)
    return m


def dir_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


@pytest.fixture(scope="module")
def built_loops(tmp_path_factory):
    """A cache directory holding the ``"values"`` loops of ``structures(12)`` for float64
    (the read-only specialization of ``structures(6)[-1]`` too), compiled once for the
    module: a test whose loops are among them starts from a copy (:func:`copy_built`) and
    loads them from numba's disk cache where each compiled the same loops into an empty
    directory of its own (26 compiles in the file before, 15 now; 2026-12-02, sixteenth
    session, CI time).
    What the tests check (builds and loads counted, eviction, damaged files, held loops) is
    the same for a loop loaded from disk: a load is a build of the loop (its module
    imported, its dispatcher made), the compile inside it the only difference."""
    cache = tmp_path_factory.mktemp("built-loops") / "cache"
    with pytest.MonkeyPatch.context() as m:
        m.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
        numba_loop.clear_cache()
        a = np.random.default_rng(0).standard_normal(1001) * 3
        for k, p in enumerate(structures(12)):
            np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, k)])
        ro = a.copy()
        ro.flags.writeable = False
        np.testing.assert_array_equal(dask_compact.compact_array(ro, structures(6)[-1]),
                                      a[_mask(a, 5)])
        numba_loop.clear_cache()
        numba_loop._sweep()  # as a new process: each test imports the loops from its copy
    return cache


def copy_built(built, tmp_path) -> str:
    """A copy of :func:`built_loops`'s directory in ``tmp_path`` (the files' times kept: numba's
    index checks the source's), for ``DASK_COMPACT_CACHE_DIR``."""
    return str(shutil.copytree(built, tmp_path / "cache"))


def test_lru_keeps_the_most_recently_used():
    evicted = []
    cache: BoundedCache[int, str] = BoundedCache("test", lambda k, v: evicted.append(k))
    with dask.config.set({"dask-compact.cache.memory-entries": 3}):
        for k in range(3):
            cache.put(k, str(k))
        assert cache.get(0) == "0"  # 0 is now the most recent
        cache.put(3, "3")
        assert evicted == [1] and cache.get(1) is None and len(cache) == 3
        assert cache.get_or_build(1, lambda: "again") == "again"
        assert evicted == [1, 2]
    cache.clear()
    assert len(cache) == 0 and sorted(evicted) == [0, 1, 1, 2, 3]


def test_numba_loops_cycled_past_memory_entries_stop_being_built(tmp_path, monkeypatch,
                                                                 built_loops):
    """A fixed set of structures larger than ``memory-entries``, cycled: each loop is built
    at most twice (the second time it is kept), then found. Until 2026-11-30 every call of
    such a cycle built an evicted loop again, and each build loaded a new copy of its machine
    code (numba never unloads it): memory grew without bound, ~48 ms a call (a new-user
    probe). Counted, not measured: RSS is noisy here. Structures used once are still evicted."""
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    numba_loop.clear_cache()
    numba_loop._sweep()
    loads = []
    load = numba_loop._load_from_file

    def counted(source, directory):
        loads.append(source)
        return load(source, directory)

    monkeypatch.setattr(numba_loop, "_load_from_file", counted)
    rng = np.random.default_rng(7)
    preds = structures(8)

    def cycle(rounds: int) -> None:
        for i in range(rounds * len(preds)):
            p = preds[i % len(preds)]
            a = rng.standard_normal(int(rng.integers(1, 3000))) * 3
            np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[p.mask(a)])

    with dask.config.set({"dask-compact.cache.memory-entries": 3}):
        cycle(2)  # each built once, evicted, built again and kept
        assert len(loads) == numba_loop.cache_info()["builds"] == 2 * len(preds)
        cycle(4)
        info = numba_loop.cache_info()
        assert len(loads) == info["builds"] == 2 * len(preds)  # none since
        assert info["kept"] == len(preds) and info["loops"] == 3
        once = structures(12)[8:]  # structures seen once: evicted, not kept
        gone = {numba_loop.fused_loop(p.typed(np.dtype(float)), "values").module for p in once}
        assert numba_loop.cache_info()["kept"] == len(preds)
        names = {numba_loop.fused_loop(p.typed(np.dtype(float)), "values").module
                 for p in preds}
    assert len(names) == len(preds) and all(n in sys.modules for n in names)
    numba_loop._sweep()  # the evicted ones' modules went with them
    assert len(gone) == len(once) and not any(n in sys.modules for n in gone)
    numba_loop.clear_cache()  # drops the kept ones too: their modules go once nothing holds them
    numba_loop._sweep()
    assert numba_loop.cache_info()["kept"] == 0
    assert not any(n in sys.modules for n in names)


def test_disk_cache_is_trimmed_to_its_cap(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    numba_loop.clear_cache()
    a = np.random.default_rng(1).standard_normal(100)
    preds = structures(6)
    numba_loop.fused_loop(preds[0].typed(a.dtype), "indices")
    one = dir_bytes(cache)  # one loop's source and numba's files
    assert one > 0
    cap = 3 * one
    with dask.config.set({"dask-compact.cache.disk-bytes": cap}):
        for p in preds[1:]:
            numba_loop.fused_loop(p.typed(a.dtype), "indices")
        assert dir_bytes(cache) <= cap + one  # trimmed as each loop is added
        sources = sorted(cache.glob("loop_*.py"))
        assert 1 <= len(sources) <= 4
    # the newest loop is never the one trimmed away
    newest = numba_loop.fused_loop(preds[-1].typed(a.dtype), "indices")
    assert newest.path is not None and os.path.exists(newest.path)
    dask_compact.clear_cache(disk=True)
    assert not cache.exists() and numba_loop.cache_info()["loops"] == 0


def test_trim_removes_whole_groups_oldest_first(tmp_path):
    stems = [f"loop_{c * 24}" for c in "abc"]
    (tmp_path / "__pycache__").mkdir()
    for i, stem in enumerate(stems):
        for f in (f"{stem}.py", f"__pycache__/{stem}.compact_loop-9.py312.nbi"):
            (tmp_path / f).write_bytes(b"x" * (100 if f.endswith(".py") else 50))
            os.utime(tmp_path / f, (1000 + i, 1000 + i))
    removed = trim(tmp_path, 200, lambda name: name.split(".")[0])
    assert removed == 300  # a and b, both files of each
    assert sorted(p.name for p in tmp_path.rglob("loop_*")) == [
        f"{stems[2]}.compact_loop-9.py312.nbi", f"{stems[2]}.py"]


def test_clear_cache_is_public_and_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "x"))
    assert dask_compact.cache_dir() == tmp_path / "x"
    dask_compact.clear_cache()


@pytest.mark.parametrize("key", ["memory-entries", "disk-bytes"])
def test_limits_have_defaults_in_dask_config(key):
    assert int(dask.config.get(f"dask-compact.cache.{key}")) > 0


def test_get_or_build_builds_a_key_once_while_other_keys_go_on():
    # A GPU module's build is a compile of seconds: threads asking for it wait for the one
    # build, while a hit or a build of another key does not wait for it.
    import threading

    cache: BoundedCache[str, str] = BoundedCache("test-build-once")
    started, release = threading.Event(), threading.Event()
    builds: list[str] = []

    def slow() -> str:
        builds.append("slow")
        started.set()
        assert release.wait(10)
        return "slow value"

    cache.put("hit", "cached")
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get_or_build("slow", slow)))
               for _ in range(8)]
    threads[0].start()
    assert started.wait(10)
    for t in threads[1:]:
        t.start()
    # while "slow" is being built: a hit and another key's build return at once
    others: list[str] = []
    t = threading.Thread(target=lambda: others.extend(
        [cache.get_or_build("hit", lambda: "never"), cache.get_or_build("other", lambda: "x")]))
    t.start()
    t.join(5)
    done = not t.is_alive()
    release.set()
    assert done and others == ["cached", "x"]
    for t in threads:
        t.join(10)
    assert builds == ["slow"] and results == ["slow value"] * 8
    assert cache._building == {}  # nothing left behind
    cache.clear()


def test_get_or_build_tries_again_after_a_failed_build():
    cache: BoundedCache[int, str] = BoundedCache("test-build-fails")

    def fail() -> str:
        raise RuntimeError("compile error")

    with pytest.raises(RuntimeError, match="compile error"):
        cache.get_or_build(1, fail)
    assert cache.get(1) is None and cache._building == {}
    assert cache.get_or_build(1, lambda: "ok") == "ok"
    cache.clear()


@pytest.mark.parametrize("disk", [False, True])
def test_a_held_loop_works_after_clear_cache_on_read_only_arrays(tmp_path, monkeypatch, disk,
                                                                 built_loops):
    """A task holding a loop while another thread runs clear_cache(): its call on a read-only
    array needs a specialization compiled then, which needs the loop's module. Until
    2026-11-30 eviction emptied it at once: ModuleNotFoundError (disk=True: NameError for
    `np`), a new-user probe. Deterministic: the loop is held, the cache cleared, then called.
    Its module goes once nothing holds it."""
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    numba_loop.clear_cache()
    rng = np.random.default_rng(int(disk))
    pred = structures(3 + int(disk))[-1]  # a structure of its own per case: built here (from
    # its copy of built_loops' files; the read-only specialization compiled at the call)
    a = rng.standard_normal(5003) * 3
    tp = pred.typed(a.dtype)
    loop = numba_loop.fused_loop(tp, "values")
    name = loop.module
    dask_compact.clear_cache(disk=disk)
    ro = a.copy()
    ro.flags.writeable = False
    out = np.empty_like(ro)
    k = loop(ro, out, None, 0, tp.bind(pred.params))
    np.testing.assert_array_equal(out[:k], a[pred.mask(a)])
    np.testing.assert_array_equal(dask_compact.compact_array(ro, pred), a[pred.mask(a)])
    assert name in sys.modules  # held (and the rebuilt loop took the same module back)
    del loop
    dask_compact.clear_cache()  # the rebuilt one evicted: nothing holds either now
    numba_loop._sweep()
    assert name not in sys.modules


def _damage(f, how: str, rng) -> None:
    data = f.read_bytes()
    if how == "truncated":  # an interrupted copy or sync of the cache directory
        f.write_bytes(data[:100])
    elif how == "random":
        f.write_bytes(rng.bytes(len(data)))
    else:  # "empty"
        f.write_bytes(b"")


@pytest.mark.parametrize("which, how", [
    ("nbc", "truncated"), ("nbc", "random"), ("nbi", "truncated"), ("nbi", "empty"),
    ("specialization", "truncated"),
])
def test_a_damaged_numba_cache_file_is_dropped_and_rebuilt(tmp_path, monkeypatch, which, how,
                                                           built_loops):
    """A damaged numba cache file of a loop made every later process's call fail
    (UnpicklingError: pickle data was truncated), and nothing rebuilt it (a new-user probe,
    2026-11-30). Now a warning names the files, they are removed and the loop compiled again;
    results exact. "specialization": the read-only array's, loaded at the call. Its sound
    files are a copy of built_loops' (both signatures), loaded by the first calls."""
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    numba_loop.clear_cache()
    rng = np.random.default_rng(len(which) + len(how))
    pred = structures(6)[-1]
    a = rng.standard_normal(4001) * 3
    ro = a.copy()
    ro.flags.writeable = False
    want = a[pred.mask(a)]
    np.testing.assert_array_equal(dask_compact.compact_array(a, pred), want)
    np.testing.assert_array_equal(dask_compact.compact_array(ro, pred), want)
    pycache = tmp_path / "cache" / "__pycache__"

    def fresh() -> None:  # as a new process would: the loop's module imported again
        numba_loop.clear_cache()
        numba_loop._sweep()

    fresh()
    if which == "specialization":  # the second data file: the read-only signature's
        targets = sorted(pycache.glob("*.2.nbc"))
    else:
        targets = sorted(pycache.glob(f"*.{which}"))
    assert targets
    for f in targets:
        _damage(f, how, rng)
    with pytest.warns(RuntimeWarning, match="could not be loaded.*removed the damaged cache"):
        np.testing.assert_array_equal(dask_compact.compact_array(a, pred), want)
        np.testing.assert_array_equal(dask_compact.compact_array(ro, pred), want)
    fresh()  # rebuilt: loaded with no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(dask_compact.compact_array(ro, pred), want)
        np.testing.assert_array_equal(dask_compact.compact_array(a, pred), want)


def _old(path, age: float = 86_400.0) -> None:
    """Make ``path`` older than anything the test writes after."""
    import time

    t = time.time() - age
    os.utime(path, (t, t))


def _user_files(cache) -> dict:
    """A user's files of every kind, older than any loop, in a directory they share with the
    cache (~/.cache, $TMPDIR, a data folder): none of them is the library's."""
    digest = "0123456789abcdef01234567"
    files = {
        "my_results.csv": b"x" * 5000,
        "notes.txt": b"mine",
        "tmpab12cd34.tmp": b"an editor's temporary file",
        "loop_results.py": b"# the user's own loop",
        f"loop_{digest}.pyc": b"not a generated source",
        "data.nbi": b"x",
        f"sub/loop_{digest}.py": b"# a user's folder: never entered",
        f"sub/__pycache__/loop_{digest}.compact_loop-1.py312.nbi": b"x",
        "__pycache__/helpers.cpython-312.pyc": b"x",
        "__pycache__/notes.nbc": b"x",
    }
    for name, data in files.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
        _old(cache / name)
    return files


def _ours(cache) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("loop_*")
                  if p.is_file() and "sub" not in p.parts
                  and p.name not in ("loop_results.py", "loop_0123456789abcdef01234567.pyc"))


def test_trim_and_clear_cache_touch_only_the_librarys_files(tmp_path, monkeypatch):
    """A cache directory shared with a user's files: trimming (at a cap that keeps nothing
    but the newest loop) and clear_cache(disk=True) remove the generated sources, numba's
    index and data files, Python's bytecode and the temporary files of interrupted writes,
    and nothing else. Until 2026-11-30 trim removed any file, oldest first (a user's older
    results went first), and clear_cache removed the whole directory (a new-user probe)."""
    cache = tmp_path / "shared"
    cache.mkdir()
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    user = _user_files(cache)
    # an interrupted write's leftovers, of ours: the source's and numba's temporary files
    stale = "loop_fedcba9876543210fedcba98"
    leftovers = [f"{stale}.k2j4h1ab.tmp", f"__pycache__/{stale}.compact_loop-17.py312.nbi",
                 f"__pycache__/{stale}.compact_loop-17.py312.1.nbc.tmp.0a1b2c3d4e5f6a7b"]
    for name in leftovers:
        (cache / name).write_bytes(b"y" * 100)
        _old(cache / name, 3600)
    numba_loop.clear_cache()
    a = np.random.default_rng(7).standard_normal(1000)
    with dask.config.set({"dask-compact.cache.disk-bytes": 1}):
        for k, p in enumerate(structures(3)):
            loop = numba_loop.fused_loop(p.typed(a.dtype), "values")
            np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, k)])
    # trimmed: no leftover, no older loop (at most the newest's files: a cap of 1 byte)
    digest = os.path.basename(loop.path)[: len("loop_") + 24]
    assert all(name.split("/")[-1].startswith(digest) for name in _ours(cache))
    for name, data in user.items():
        assert (cache / name).read_bytes() == data, name
    numba_loop.fused_loop(structures(4)[3].typed(a.dtype), "values")  # the default cap
    assert any(name.endswith(".nbi") for name in _ours(cache))
    dask_compact.clear_cache(disk=True)
    assert _ours(cache) == []
    for name, data in user.items():
        assert (cache / name).read_bytes() == data, name


def test_clear_cache_removes_the_folders_it_empties(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    numba_loop.clear_cache()
    numba_loop.fused_loop(structures(1)[0].typed(np.dtype("float64")), "indices")
    assert (cache / "__pycache__").is_dir()
    dask_compact.clear_cache(disk=True)
    assert not cache.exists()


def test_numba_cache_dir_files_are_trimmed_and_cleared_too(tmp_path, monkeypatch):
    """With NUMBA_CACHE_DIR set numba keeps its cache files of our sources there (in a folder
    named after the cache directory); until 2026-11-30 neither trim nor clear_cache saw them.
    Other files there stay."""
    from numba.core import config

    cache, numba_dir = tmp_path / "cache", tmp_path / "numba"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    monkeypatch.setattr(config, "CACHE_DIR", str(numba_dir))
    numba_dir.mkdir()
    (numba_dir / "other.nbi").write_bytes(b"another program's")
    numba_loop.clear_cache()
    a = np.random.default_rng(3).standard_normal(500)
    p = structures(2)[1]
    np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, 1)])
    theirs = [f for f in numba_dir.rglob("loop_*") if f.is_file()]
    assert any(f.suffix == ".nbi" for f in theirs)
    assert not list(cache.rglob("*.nb[ic]"))
    assert trim(cache, 0, numba_loop._group) > 0
    assert not [f for f in numba_dir.rglob("loop_*") if f.is_file()]
    numba_loop.clear_cache()
    numba_loop.fused_loop(p.typed(a.dtype), "indices")
    assert [f for f in numba_dir.rglob("loop_*") if f.is_file()]
    dask_compact.clear_cache(disk=True)
    assert not [f for f in numba_dir.rglob("loop_*") if f.is_file()]
    assert (numba_dir / "other.nbi").exists() and not cache.exists()


def test_cache_dir_expands_a_tilde_and_is_absolute_once(tmp_path, monkeypatch):
    """A quoted '~' (DASK_COMPACT_CACHE_DIR='~/c', left to the program by the shell) made a
    folder named '~' in the working directory, and a relative path followed later chdirs
    (until 2026-11-30)."""
    from dask_compact import cache
    from dask_compact.cache import cache_dir

    monkeypatch.setattr(cache, "_absolute", {})  # each setting is resolved once a process
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", "~/dc_cache")
    assert cache_dir() == tmp_path / "home" / "dc_cache"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", "rel_cache")
    first = cache_dir()
    assert first == tmp_path / "a" / "rel_cache"
    monkeypatch.chdir(tmp_path / "b")
    assert cache_dir() == first


@pytest.mark.parametrize("lost", [1, 2])
def test_a_source_lost_before_its_import_is_written_again(tmp_path, monkeypatch, lost):
    """Another process sharing the cache directory trims the source between its write and
    its import: numba's decorator raised "cannot cache function 'compact_loop': no locator
    available for file" to the caller until 2026-11-30 (a new-user probe of processes sharing
    a directory). Now it is written again; lost a second time, compiled in memory."""
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "cache"))
    numba_loop.clear_cache()
    import importlib.util

    imports = []
    real = importlib.util.spec_from_file_location

    def trimmed_first(name, path, *args, **kwargs):
        spec = real(name, path, *args, **kwargs)
        if name.startswith("_dask_compact_loop_"):
            imports.append(path)
            if len(imports) <= lost:  # the other process's trim, after the source is read
                get_code = spec.loader.get_code

                def read_then_trimmed(fullname):
                    code = get_code(fullname)
                    os.unlink(path)
                    return code

                spec.loader.get_code = read_then_trimmed
        return spec

    monkeypatch.setattr(importlib.util, "spec_from_file_location", trimmed_first)
    a = np.random.default_rng(11).standard_normal(2000)
    p = structures(3)[2]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="dask_compact")  # a lost file is no news
        np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, 2)])
    loop = numba_loop.fused_loop(p.typed(a.dtype), "values")
    assert len(imports) == 2
    assert (loop.path is None) == (lost == 2)


def _numba_save(monkeypatch, failure):
    """numba's cache saves of files in the cache directory (not the package's own compiled
    functions) go through ``failure(tmp_file)`` after the write."""
    import contextlib

    from numba.core import caching

    real = caching.IndexDataCacheFile._open_for_write
    ours = str(dask_compact.cache_dir())

    @contextlib.contextmanager
    def open_for_write(self, filepath):
        with real(self, filepath) as f:
            yield f
            if filepath.startswith(ours):
                failure(f.name)

    monkeypatch.setattr(caching.IndexDataCacheFile, "_open_for_write", open_for_write)


def test_numba_cache_files_lost_while_saved_mean_a_compile_in_memory(tmp_path, monkeypatch):
    """Another process's trim removes numba's temporary file before numba renames it:
    FileNotFoundError from the compile until 2026-11-30 (a new-user probe). Now the loop is
    compiled in memory, silently, and right."""
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "cache"))
    numba_loop.clear_cache()
    _numba_save(monkeypatch, os.unlink)
    a = np.random.default_rng(12).standard_normal(3000).astype(np.float32)
    p = as_predicate("(maximum(x, 0.25) > 0.5) | (x < -1)")  # a helper function, cached too
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="dask_compact")
        got = dask_compact.compact_array(a, p)
    np.testing.assert_array_equal(got, a[(np.maximum(a, np.float32(0.25)) > 0.5) | (a < -1)])
    assert numba_loop.fused_loop(p.typed(a.dtype), "values").path is None


def test_a_full_disk_compiles_in_memory_and_says_so_once(tmp_path, monkeypatch):
    """ENOSPC from numba's cache save failed every call until 2026-11-30 (a new-user probe
    on a full tmpfs). Now: compiled in memory, right, and one warning naming the directory
    and the reason, not one a call or a loop."""
    import errno

    cache = tmp_path / "cache"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    monkeypatch.setattr(numba_loop, "_warned", set(), raising=False)
    numba_loop.clear_cache()

    def full(_name):
        raise OSError(errno.ENOSPC, "No space left on device")

    _numba_save(monkeypatch, full)
    a = np.random.default_rng(13).standard_normal(3000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, p in enumerate(structures(3)):
            for _ in range(2):
                np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, k)])
    ours = [w for w in caught if "dask_compact" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert str(cache) in str(ours[0].message) and "No space left" in str(ours[0].message)
    assert ours[0].category is RuntimeWarning


def test_an_unusable_cache_dir_is_said_once(tmp_path, monkeypatch):
    """A cache directory that cannot be made (a file in the way): compiled in memory, with
    one warning naming it and the error (it was silent until 2026-11-30)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.setattr(numba_loop, "_warned", set(), raising=False)
    numba_loop.clear_cache()
    a = np.random.default_rng(14).standard_normal(1000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k, p in enumerate(structures(2)):
            np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[_mask(a, k)])
    ours = [str(w.message) for w in caught if "dask_compact" in str(w.message)]
    assert len(ours) == 1 and str(blocker / "sub") in ours[0] and "NotADirectoryError" in ours[0]


@pytest.mark.parametrize("how", ["lost", "full"])
def test_record_loops_compile_in_memory_when_a_save_fails(tmp_path, monkeypatch, how):
    """The record loops (numba_records) as the one-array loops: numba's cache file lost to
    another process while saved, or a full disk, is a compile in memory (both failed the call
    until 2026-11-30)."""
    import errno

    from dask_compact.codegen import numba_records

    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(numba_loop, "_warned", set(), raising=False)
    numba_records._loops.clear()

    def full(_name):
        raise OSError(errno.ENOSPC, "No space left on device")

    _numba_save(monkeypatch, os.unlink if how == "lost" else full)
    rng = np.random.default_rng(15)
    f = {"mass": rng.standard_normal(5000), "r": rng.random(5000).astype(np.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # a structure of each case's own (a module built before would have its code)
        if how == "lost":
            got = dask_compact.compact_records(f, lambda mass, r: (mass > 0.3) & (r < 0.7))
            keep = (f["mass"] > 0.3) & (f["r"] < np.float32(0.7))
        else:
            got = dask_compact.compact_records(f, lambda mass, r: (mass > 0.3) | (r < 0.7))
            keep = (f["mass"] > 0.3) | (f["r"] < np.float32(0.7))
    for name in f:
        np.testing.assert_array_equal(got[name], f[name][keep])
    ours = [str(w.message) for w in caught if "dask_compact" in str(w.message)]
    assert len(ours) == (how == "full")


def test_a_loop_whose_disk_cache_failed_leaves_no_module_for_a_later_build(tmp_path,
                                                                            monkeypatch):
    """A build whose numba cache save failed (a full disk) compiles the loop in memory; the
    module it had imported from the cache directory stayed in sys.modules, and a later build
    of the same source, after DASK_COMPACT_CACHE_DIR changed, took it up again: nothing was
    imported from the new directory nor cached there (the two tests above failed when run
    after the full-disk test). Now the failed build's module goes."""
    import errno
    from pathlib import Path

    monkeypatch.setattr(numba_loop, "_warned", set(), raising=False)
    a = np.random.default_rng(16).standard_normal(700)
    p = as_predicate("(x > 0.25) | (x < -3) | (x < -4) | (x < -5)")  # this test's structure

    def full(_name):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setenv("DASK_COMPACT_CACHE_DIR", str(tmp_path / "full"))
        numba_loop.clear_cache()
        _numba_save(m, full)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the full disk's warning (test above)
            got = dask_compact.compact_array(a, p)
        np.testing.assert_array_equal(got, a[(a > 0.25) | (a < -3)])
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(fresh))
    numba_loop.clear_cache()
    np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[(a > 0.25) | (a < -3)])
    loop = numba_loop.fused_loop(p.typed(a.dtype), "values")
    assert loop.path is not None and Path(loop.path).parent == fresh
    assert Path(sys.modules[loop.module].__file__).parent == fresh  # imported from there
    assert list((fresh / "__pycache__").glob("loop_*.nbi"))  # and numba's cache is there


def test_record_loops_keep_the_disk_cache_under_its_cap(tmp_path, monkeypatch):
    """A process building only record loops (compact_records, the records batch CLI) trims
    the disk cache as the one-array loops do. Until 2026-12-01 (fourteenth session, a
    long-running probe) only a one-array loop's build trimmed it: 18 record structures left
    607 kB under a 100 kB cap, and a worker of record jobs grew it without bound."""
    from dask_compact.codegen import numba_records

    cache = tmp_path / "cache"
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(cache))
    numba_records._loops.clear()
    rng = np.random.default_rng(16)
    f = {"mass": rng.standard_normal(2000), "r": rng.random(2000)}
    dask_compact.compact_records(f, "(mass > 0.5) | (r < -1)")
    one = dir_bytes(cache)  # one record loop's source and numba's files
    assert one > 0
    cap = 3 * one
    with dask.config.set({"dask-compact.cache.disk-bytes": cap}):
        for k in range(1, 6):  # a structure each: one more alternative
            text = " | ".join(["(mass > 0.5)"] + [f"(r < -{j + 1})" for j in range(k)])
            got = dask_compact.compact_records(f, text)
            keep = f["mass"] > 0.5
            for name in f:
                np.testing.assert_array_equal(got[name], f[name][keep])
            assert dir_bytes(cache) <= cap + one


_AT_ONCE = r"""
import sys, time
from pathlib import Path

import numpy as np

import dask_compact
from dask_compact.codegen import numba_loop
from dask_compact.predicate import as_predicate

import numba  # noqa: F401  (imported before the start: the race is the build's alone)

Path(sys.argv[2]).touch()
while not Path(sys.argv[1]).exists():
    time.sleep(0.002)
a = np.arange(-50.0, 50.0)
if sys.argv[3] == "records":
    from dask_compact.codegen import numba_records

    b = a[::-1].copy()
    got = dask_compact.compact_records({"a": a, "b": b}, "(a > 7.5) | (b < -40.5) | (a == 3)")
    assert np.array_equal(got["b"], b[(a > 7.5) | (b < -40.5) | (a == 3)])
    (func,) = numba_records._loops.values()
    stats = func.stats
else:
    pred = as_predicate("(x > 7.5) | (x < -40.5) | (x == 3)")
    want = a[(a > 7.5) | (a < -40.5) | (a == 3)]
    assert np.array_equal(dask_compact.compact_array(a, pred), want)
    stats = numba_loop.fused_loop(pred.typed(a.dtype), "values").func.stats
print(sum(stats.cache_misses.values()), sum(stats.cache_hits.values()))
"""


@pytest.mark.parametrize("kind", ["array", "records"])
def test_processes_building_one_new_loop_at_once_compile_it_once(tmp_path, kind):
    """Two processes sharing a cache directory (a host's dask workers) that need the same new
    loop at the same moment: one compiles it, the other waits and loads it from numba's disk
    cache. Until 2026-12-02 (sixteenth session, CI time) both compiled it (0.5-1 s of CPU
    each): every new predicate on a local cluster of n workers cost n compiles. The same for
    a record loop (``numba_records``)."""
    import subprocess

    env = {**os.environ, "DASK_COMPACT_CACHE_DIR": str(tmp_path / "cache")}
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{k}" for k in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", _AT_ONCE, str(go), str(r), kind], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r in ready]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):  # both past their imports
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    counts = [tuple(map(int, out.split())) for out, _ in outs]
    assert sorted(counts) == [(0, 1), (1, 0)], counts  # (compiled, loaded from disk)


_WAITS_HELD = r"""
import fcntl, os, signal, sys, time
from pathlib import Path

import numpy as np

import dask_compact
from dask_compact.codegen import numba_loop
from dask_compact.predicate import as_predicate

signal.signal(signal.SIGINT, signal.default_int_handler)
numba_loop.LOCK_WAIT_S = 60.0
pred = as_predicate("(x > 6.5) | (x < -41.5) | (x == 5)")
a = np.arange(-50.0, 50.0)
source = numba_loop.generate_source(pred.typed(a.dtype), "values", cache=True)
lock = numba_loop.cache_dir() / f"loop_{numba_loop._digest(source)}.lock"
held = os.open(lock, os.O_RDWR | os.O_CREAT)  # another open file: as another process's
fcntl.flock(held, fcntl.LOCK_EX)
Path(sys.argv[1]).touch()
t0 = time.monotonic()
try:
    dask_compact.compact_array(a, pred)
    print("finished", time.monotonic() - t0)
except KeyboardInterrupt:
    print("interrupted", time.monotonic() - t0)
"""


def test_ctrl_c_ends_the_wait_for_another_process_compile(tmp_path):
    """A build waiting for another process's compile of the same loop (its lock held: a
    process stopped with Ctrl-Z mid-compile, a debugger's) held Ctrl-C as numba's compile
    does (numba_held) for the whole wait, up to LOCK_WAIT_S (120 s), until 2026-12-02
    (seventeenth session, a regression review). Ctrl-C ends the wait now: the loop is
    compiled here, unlocked (a second at most), and KeyboardInterrupt raised after it."""
    import signal
    import subprocess

    env = {**os.environ, "DASK_COMPACT_CACHE_DIR": str(tmp_path / "cache")}
    (tmp_path / "cache").mkdir()
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", _WAITS_HELD, str(ready)], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.0)  # waiting for the lock by now
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    said, seconds = out.split()
    assert said == "interrupted" and float(seconds) < 30, (out, err)


_FORKED_WHILE_HELD = r"""
import os, sys, time
from pathlib import Path

from dask_compact.codegen import numba_loop

directory = Path(sys.argv[1])
with numba_loop.one_compile_at_a_time(directory, "0" * 24):
    child = os.fork()  # another thread's fork mid-compile (a fork-started pool's worker)
    if child == 0:
        time.sleep(60)
        os._exit(0)
numba_loop.LOCK_WAIT_S = 30.0
t0 = time.monotonic()
with numba_loop.one_compile_at_a_time(directory, "0" * 24):  # the next build of the loop
    waited = time.monotonic() - t0
os.kill(child, 9)
os.waitpid(child, 0)
print(waited)
"""


def test_a_process_forked_during_a_compile_does_not_hold_its_lock(tmp_path):
    """A process forked while a thread compiles a loop (one_compile_at_a_time's flock held)
    inherited the lock's open file, and with it the lock, for its whole life: until
    2026-12-02 (seventeenth session, a regression review) every build of that loop after the
    compile, in any process of the host, even a load of the compiled loop, waited
    LOCK_WAIT_S (120 s) while the child lived. A forked child closes the locks it inherits."""
    import subprocess

    res = subprocess.run([sys.executable, "-c", _FORKED_WHILE_HELD, str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert float(res.stdout) < 5, res.stdout


def test_a_compiled_loop_is_not_held_up_by_a_wait_for_another_process_compile(
        tmp_path, monkeypatch, built_loops):
    """A thread building loop X while another process compiles X (its lock held: a process
    stopped mid-compile) waits for it, up to LOCK_WAIT_S (120 s). Until 2026-12-02
    (seventeenth session, a regression review) it waited holding the in-process cache's
    lock, so every other thread's call of an already compiled one-array loop, which looks it
    up under that lock, stalled for the whole wait (19.5 s with the wait set to 20 s). The
    wait comes before that lock now."""
    import subprocess
    import threading

    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    monkeypatch.setattr(numba_loop, "LOCK_WAIT_S", 10.0)
    numba_loop.clear_cache()
    numba_loop._sweep()
    a = np.random.default_rng(1).standard_normal(10_007) * 3
    px, py = structures(12)[5], structures(12)[3]
    np.testing.assert_array_equal(dask_compact.compact_array(a, py), a[_mask(a, 3)])
    source = numba_loop.generate_source(px.typed(a.dtype), "values", cache=True)
    lock = numba_loop.cache_dir() / f"loop_{numba_loop._digest(source)}.lock"
    holder = subprocess.Popen(  # another process compiling X, stopped (for 10 s at most)
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(10)",
         str(lock)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        waiting = threading.Event()
        asked = numba_loop.held_signal

        def held_signal() -> bool:  # asked at each turn of the wait for the lock
            waiting.set()
            return asked()

        monkeypatch.setattr(numba_loop, "held_signal", held_signal)
        got_x: list = []
        thread = threading.Thread(target=lambda: got_x.append(dask_compact.compact_array(a, px)))
        thread.start()
        assert waiting.wait(30)
        t0 = time.monotonic()
        got_y = dask_compact.compact_array(a, py)  # already compiled in this process
        took = time.monotonic() - t0
        assert thread.is_alive()  # still waiting for X's lock meanwhile
    finally:
        holder.kill()
        holder.wait()
    thread.join(60)
    np.testing.assert_array_equal(got_y, a[_mask(a, 3)])
    assert took < 2, took
    np.testing.assert_array_equal(got_x[0], a[_mask(a, 5)])


def test_a_compiled_loop_is_not_held_up_by_another_threads_build(
        tmp_path, monkeypatch, built_loops):
    """A thread building loop X (0.5-1 s of numba's compile; held here for 3 s) while
    another thread calls loop Y, already compiled in this process: Y's call runs at once.
    Until 2026-12-02 (eighteenth session) a build held the in-process cache's lock, under
    which every call looks its loop up, so Y's call waited for X's whole build. Both results
    NumPy's."""
    import threading

    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    numba_loop.clear_cache()
    numba_loop._sweep()
    a = np.random.default_rng(2).standard_normal(10_007) * 3
    px, py = structures(12)[7], structures(12)[2]
    np.testing.assert_array_equal(dask_compact.compact_array(a, py), a[_mask(a, 2)])
    building = threading.Event()
    real = numba_loop._build_held

    def slow_build(*args, **kwargs):
        building.set()
        time.sleep(3)
        return real(*args, **kwargs)

    monkeypatch.setattr(numba_loop, "_build_held", slow_build)
    got_x: list = []
    thread = threading.Thread(target=lambda: got_x.append(dask_compact.compact_array(a, px)))
    thread.start()
    assert building.wait(30)
    t0 = time.monotonic()
    got_y = dask_compact.compact_array(a, py)
    took = time.monotonic() - t0
    alive = thread.is_alive()
    thread.join(60)
    np.testing.assert_array_equal(got_y, a[_mask(a, 2)])
    assert alive  # X still building meanwhile
    assert took < 1.5, took
    np.testing.assert_array_equal(got_x[0], a[_mask(a, 7)])


_FORKED_DURING_A_BUILD = r"""
import os, sys, threading, time

import numpy as np

import dask_compact
from dask_compact.codegen import numba_loop, numba_records

a = np.random.default_rng(0).standard_normal(1001) * 3
building = threading.Event()
if sys.argv[1] == "loop":  # a one-array loop's build: numba_loop._build_lock held
    module, name = numba_loop, "_build_held"
    text, call = "(x > 0.5) | (x < -1)", dask_compact.compact_array
    expected = a[(a > 0.5) | (a < -1)]
else:  # a record loop's: its BoundedCache's lock for the key (get_or_build) held
    module, name = numba_records, "_compile"
    text = "(e > 0.5) & (f < 2)"
    call = lambda fields, t: dask_compact.compact_records(fields, t)["e"]  # noqa: E731
    expected = a[(a > 0.5) & (a < 2)]
arg = a if sys.argv[1] == "loop" else {"e": a, "f": a}
real = getattr(module, name)


def slow(*args, **kwargs):  # the build's lock held for a while (a slow compile)
    building.set()
    time.sleep(3)
    return real(*args, **kwargs)


setattr(module, name, slow)
thread = threading.Thread(target=lambda: call(arg, text))
thread.start()
assert building.wait(60)
child = os.fork()  # another thread's fork mid-build (a fork-started pool's worker)
if child == 0:
    setattr(module, name, real)
    got = call(arg, text)  # the child's own build of the loop
    os._exit(0 if np.array_equal(got, expected) else 3)
thread.join()
deadline = time.monotonic() + 30  # the build takes a second or two
while time.monotonic() < deadline:
    pid, status = os.waitpid(child, os.WNOHANG)
    if pid:
        print("exit", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.05)
else:
    os.kill(child, 9)
    os.waitpid(child, 0)
    print("hung")
"""


@pytest.mark.parametrize("kind", ["loop", "record"])
def test_a_process_forked_during_another_threads_build_builds_its_own(tmp_path, kind):
    """A process forked while another thread builds a loop (a fork-started pool's worker)
    inherits the build's in-process lock held by a thread it does not have: until 2026-12-02
    (eighteenth session, a lock review) its own build of a loop waited for ever
    (numba_loop._build_lock for a one-array loop; the record loops' BoundedCache's lock for
    the key, held for the whole build). A forked child takes fresh locks; its result is
    NumPy's. (numba's own compiler lock, held through a compile: a fork waits for it since
    2026-12-02, nineteenth session, tests/test_numba_fork.py.)"""
    import subprocess

    env = {**os.environ, "DASK_COMPACT_CACHE_DIR": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", _FORKED_DURING_A_BUILD, kind], env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["exit", "0"], (res.stdout, res.stderr)


def test_the_gpu_shaped_calls_runs_go_with_their_entries():
    """backends/cupy_shaped.py keeps the runs of texts it served (``_runs``, a plain dict)
    beside its BoundedCache of calls: until 2026-12-02 (seventeenth session, a regression
    review) they held their calls (each its module, scratch up to 8 MiB, pinned word) past
    an eviction and past ``clear_cache()``, up to 1,024 calls against ``memory-entries``.
    Plain Python bookkeeping: stand-in entries, no GPU."""
    from dask_compact.backends import cupy_shaped as cs

    cs.forget()
    try:
        with dask.config.set({"dask-compact.cache.memory-entries": 2}):
            entries = []
            for j in range(3):
                entry = [0, object(), None, None]
                cs.shaped_calls.put(("thread", ("shape", j)), entry)
                entries.append(entry)
                for t in range(2):
                    cs._runs[("thread", f"text {j} {t}")] = cs.ShapedRun(entry, (t,), (t,))
            # the first entry was evicted by the third: its runs with it, the others kept
            assert cs.shaped_calls.get(("thread", ("shape", 0))) is None
            assert all(r.entry is not entries[0] for r in cs._runs.values())
            assert len(cs._runs) == 4
        dask_compact.clear_cache()
        assert not cs._runs and len(cs.shaped_calls) == 0
    finally:
        cs.forget()


def test_a_shaped_run_interrupted_in_its_rebinding_rebinds_at_the_next_run():
    """A ShapedRun rewrites its call's constant slots one by one, then notes whose they are:
    until 2026-12-02 (seventeenth session, a regression review) a Ctrl-C between the two
    left the note of the text that ran before over slots partly rewritten, and that text's
    next call ran with the other's constants. Stand-in call, no GPU."""
    from dask_compact.backends import cupy_shaped as cs

    class Kernel:
        def __init__(self) -> None:
            self.slots = [0.25, 1.5]
            self.interrupt = False

        def rebind(self, params: tuple) -> None:
            for i, v in enumerate(params):
                self.slots[i] = v
                if self.interrupt:
                    raise KeyboardInterrupt

    class Call:
        def __init__(self) -> None:
            self.kernel = Kernel()

        def __call__(self, a, base):
            return list(self.kernel.slots)

    entry = [0, Call(), None, None]
    first = cs.ShapedRun(entry, (("f", 1),), (0.25, 1.5))
    other = cs.ShapedRun(entry, (("f", 2),), (0.75, 2.5))
    assert first(None, 0) == [0.25, 1.5]
    entry[1].kernel.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        other(None, 0)
    entry[1].kernel.interrupt = False
    assert first(None, 0) == [0.25, 1.5]
    assert other(None, 0) == [0.75, 2.5]


def _run_threads(targets: list, timeout: float) -> None:
    """Run ``targets`` each in a daemon thread; fail, with every thread's stack, where one is
    still running after ``timeout`` seconds (a deadlock: daemon threads, so that pytest ends)."""
    import faulthandler
    import threading

    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        faulthandler.dump_traceback(all_threads=True)
        pytest.fail(f"threads still running after {timeout} s: a deadlock (stacks above)")


def test_threads_calling_loops_while_another_clears_and_evicts_get_numpys_results(
        tmp_path, monkeypatch, built_loops):
    """Change e93857f (2026-12-02, eighteenth session: a build holds _build_lock, lookups and
    sweeps _loops.lock, an eviction's sweep only where no other thread builds), under load:
    three threads call eight structures (read-only arrays a third of the time: a held loop
    compiles a specialization at its call, which needs its module; values and indices) with
    ``memory-entries`` 2 (an eviction at most calls), while a fourth calls
    ``dask_compact.clear_cache()`` every few ms. Every result NumPy's, no deadlock (a lock
    taken in the other order: a thread under ``_loops.lock`` waiting for ``_build_lock``),
    no ModuleNotFoundError or NameError from a module swept while a loop used it. Loads from
    built_loops' copy: a few seconds. (A mutant of _forget taking _build_lock blocking
    deadlocked here. One sweeping the modules of held loops passed: that window, a lookup to
    numba's compile at the call, is too short to meet by chance;
    test_a_held_loop_works_after_clear_cache_on_read_only_arrays holds it open.)"""
    import random

    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", copy_built(built_loops, tmp_path))
    numba_loop.clear_cache()
    numba_loop._sweep()
    preds = structures(8)
    errors: list[str] = []
    finished: list[int] = []

    def caller(seed: int) -> None:
        import traceback

        rng = random.Random(seed)
        nrng = np.random.default_rng(seed)
        try:
            for _ in range(60):
                k = rng.randrange(len(preds))
                a = nrng.standard_normal(rng.randrange(1, 3000)) * 3
                a.flags.writeable = rng.random() > 0.3
                if rng.random() < 0.5:
                    got = dask_compact.compact_array(a, preds[k])
                    np.testing.assert_array_equal(got, a[_mask(a, k)])
                else:
                    got = dask_compact.compact_array(a, preds[k], output="indices")
                    np.testing.assert_array_equal(got, np.flatnonzero(_mask(a, k)))
        except Exception:
            errors.append(traceback.format_exc())
        finally:
            finished.append(seed)

    def clearer() -> None:
        rng = random.Random(5)
        while len(finished) < 3:
            time.sleep(rng.random() * 0.02)
            dask_compact.clear_cache()

    with dask.config.set({"dask-compact.cache.memory-entries": 2}):
        _run_threads([lambda: caller(0), lambda: caller(1), lambda: caller(2), clearer], 150)
    assert not errors, errors[0]
    numba_loop.clear_cache()
    numba_loop._sweep()
