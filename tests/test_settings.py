"""dask-compact's settings read through dask's configuration, whatever happened to its
section: a ``dask.config.set`` block around a module's first import removed the defaults
that import registered (a new-user probe: every later ``sort`` raised ``KeyError: 'sort'``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask
import dask.array as da
import numpy as np
import pytest

import dask_compact
from dask_compact import settings


def test_a_block_around_the_first_sort_leaves_later_sorts_working():
    # the user's steps, in a fresh process: the first sort (its module's first import) runs
    # inside a block that sets one of its keys
    code = textwrap.dedent("""
        import dask, dask.array as da, numpy as np, dask_compact
        x = da.from_array(np.arange(10.0)[::-1], chunks=3)
        with dask.config.set({"dask-compact.sort.min-bucket": 4}):
            assert dask_compact.sort(x).compute().tolist() == sorted(range(10))
        assert dask_compact.sort(x).compute().tolist() == sorted(range(10))
        assert dask_compact.argsort(x).compute().tolist() == list(range(9, -1, -1))
        with dask.config.set({"dask-compact.cache.memory-entries": 3}):
            assert dask_compact.cache.memory_entries() == 3
        assert dask_compact.cache.memory_entries() == 64
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_every_setting_has_its_default_without_the_section(monkeypatch):
    monkeypatch.delitem(dask.config.config, "dask-compact", raising=False)
    # dask keeps a section read from the environment under "dask_compact": the suite's own
    # DASK_DASK_COMPACT__BATCH__TASK_BYTES (tests/conftest.py) is there
    monkeypatch.delitem(dask.config.config, "dask_compact", raising=False)
    assert settings.get("sort.min-bucket") == 2**16
    assert settings.get("sort.max-pieces") == 2**14
    assert settings.get("sort.exchange") == "auto"
    assert settings.get("direct") is True
    assert settings.get("cache.memory-entries") == 64
    assert settings.get("cache.disk-bytes") == 256 * 2**20
    assert settings.get("batch.task-bytes") == 8 * 2**20
    rng = np.random.default_rng(5)
    a = rng.random(1001)
    x = da.from_array(a, chunks=97)
    assert np.array_equal(dask_compact.sort(x).compute(), np.sort(a))
    assert np.array_equal(x.map_compact("x > 0.5").compute(), a[a > 0.5])


def test_a_set_value_wins_and_an_unknown_key_is_a_key_error():
    with dask.config.set({"dask-compact.sort.min-bucket": 5}):
        assert settings.get("sort.min-bucket") == 5
    assert settings.get("sort.min-bucket") == 2**16
    with pytest.raises(KeyError):
        settings.get("sort.no-such-key")


# --- every reader checks its value and names the key (a new-user probe, 2026-11-30: a bare
# int() failed late and unnamed, "1 GiB" only once a new structure compiled, and
# direct: "no" counted as true) ---

BAD_VALUES = [
    ("cache.memory-entries", "abc"), ("cache.memory-entries", None), ("cache.memory-entries", -1),
    ("cache.memory-entries", 2.5), ("cache.memory-entries", True),
    ("cache.disk-bytes", "1 Gibs"), ("cache.disk-bytes", None), ("cache.disk-bytes", -5),
    ("sort.min-bucket", "64 kiB"), ("sort.min-bucket", None), ("sort.max-pieces", "many"),
    ("direct", "no"), ("direct", "yes"), ("direct", "0ff"), ("direct", None), ("direct", 2),
    ("sort.exchange", "nvlink"), ("sort.exchange", None),
    ("batch.gpu-frame-bytes", "big"), ("batch.gpu-decode-wait", "soon"),
    ("batch.gpu-decode-wait", -1), ("batch.gpu-decode-tasks", "x"),
    # a string without a number: dask's parse_bytes reads "" as 1 byte and a bare unit as one
    # of it (until 2026-12-01, a new-user probe: DASK_DASK_COMPACT__CACHE__DISK_BYTES= left
    # a disk cache of 1 byte)
    ("cache.disk-bytes", ""), ("cache.disk-bytes", " "), ("cache.disk-bytes", "kB"),
    ("batch.gpu-frame-bytes", "MiB"), ("batch.task-bytes", "8 MiBs"), ("batch.task-bytes", -1),
    # a number too large for a float: parse_bytes raised OverflowError, which went out of
    # every public call instead of the refusal (until 2026-12-01 (thirteenth session))
    ("cache.disk-bytes", "1e999"), ("batch.gpu-frame-bytes", "1e400 kB"),
]


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
def test_a_bad_value_is_refused_naming_the_key_and_what_it_takes(key, value):
    with dask.config.set({f"dask-compact.{key}": value}):
        with pytest.raises(settings.SettingError) as err:
            settings.get(key)
        with pytest.raises(settings.SettingError):
            settings.check()
    text = str(err.value)
    assert f"dask-compact.{key}" in text and repr(value) in text
    assert settings.KINDS[key][1] in text and settings.env_name(key) in text


def test_sizes_take_byte_strings_and_booleans_take_what_dask_makes_of_the_environment():
    with dask.config.set({"dask-compact.cache.disk-bytes": "1 GiB",
                          "dask-compact.batch.gpu-frame-bytes": "64 kiB",
                          "dask-compact.batch.gpu-decode-wait": "250ms"}):
        assert dask_compact.cache.disk_bytes() == 2**30
        assert settings.get("batch.gpu-frame-bytes") == 64 * 2**10
        assert settings.get("batch.gpu-decode-wait") == 0.25
    for value, expected in [(False, False), (True, True), ("False", False), ("true", True),
                            (0, False)]:
        with dask.config.set({"dask-compact.direct": value}):
            assert settings.get("direct") is expected
    with dask.config.set({"dask-compact.sort.min-bucket": "4096",
                          "dask-compact.cache.memory-entries": 8.0}):
        assert settings.get("sort.min-bucket") == 4096
        assert dask_compact.cache.memory_entries() == 8


def test_every_public_call_fails_early_naming_a_bad_setting_and_works_with_a_byte_string():
    rng = np.random.default_rng(11)
    a = rng.normal(size=3001)
    x = da.from_array(a, chunks=301)
    with dask.config.set({"dask-compact.cache.memory-entries": "abc"}):
        with pytest.raises(settings.SettingError, match="dask-compact.cache.memory-entries"):
            x.map_compact(lambda v: (v * 1.5 > 0.1) & (v < 0.9)).compute()
    with dask.config.set({"dask-compact.sort.min-bucket": "many"}):
        with pytest.raises(settings.SettingError, match="dask-compact.sort.min-bucket"):
            dask_compact.sort(x).compute()
    # a new structure compiled (and the disk cache trimmed) under a byte-string cap
    with dask.config.set({"dask-compact.cache.disk-bytes": "1 GiB",
                          "dask-compact.sort.min-bucket": 64}):
        got = x.map_compact(lambda v: (v * 2.5 > 0.3) & (v < 0.7)).compute()
        assert np.array_equal(got, a[(a * 2.5 > 0.3) & (a < 0.7)])
        assert np.array_equal(dask_compact.sort(x).compute(), np.sort(a))


def _in_a_process(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})


def test_the_environment_s_values_are_checked_too():
    out = _in_a_process("""
        import dask_compact
        from dask_compact import settings
        assert settings.get("direct") is False
        assert settings.get("cache.disk-bytes") == 2**30
        try:
            settings.get("sort.min-bucket")
        except settings.SettingError as e:
            print(e)
    """, {"DASK_DASK_COMPACT__DIRECT": "False", "DASK_DASK_COMPACT__CACHE__DISK_BYTES": "1 GiB",
          "DASK_DASK_COMPACT__SORT__MIN_BUCKET": "lots"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dask-compact.sort.min-bucket is 'lots'" in out.stdout
    assert "DASK_DASK_COMPACT__SORT__MIN_BUCKET" in out.stdout
    out = _in_a_process("""
        from dask_compact import settings
        settings.get("direct")
    """, {"DASK_DASK_COMPACT__DIRECT": "no"})
    assert out.returncode != 0 and "dask-compact.direct is 'no'" in out.stderr


def test_the_cli_stops_at_the_start_naming_a_bad_setting(tmp_path):
    from click.testing import CliRunner

    from dask_compact import cli
    np.save(tmp_path / "in.npy", np.random.default_rng(3).normal(size=1000))
    with dask.config.set({"dask-compact.cache.memory-entries": "abc"}):
        result = CliRunner().invoke(cli.main, [str(tmp_path / "in.npy"),
                                               str(tmp_path / "out.zarr"), "--where", "x > 0.5"])
    assert result.exit_code != 0
    assert "dask-compact.cache.memory-entries is 'abc'" in result.output
    assert not (tmp_path / "out.zarr").exists()


# --- a misspelled key warns once, naming the closest known key (a new-user probe,
# 2026-11-30: dask-compact.sort.minbucket, .directt, .cache.memory_entry were silently
# ignored) ---


def test_an_unknown_key_warns_once_naming_the_closest_known_one(monkeypatch):
    import warnings

    monkeypatch.setattr(settings, "_unknown", settings._UnknownKeys())
    with dask.config.set({"dask-compact.sort.minbucket": 5, "dask-compact.directt": False,
                          "dask-compact.cache.memory_entry": 3,
                          "dask-compact.cache.memory_entries": 7}):  # dask reads it as -entries
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert settings.get("cache.memory-entries") == 7
            assert settings.get("sort.min-bucket") == 2**16
            settings.get("direct")
        texts = sorted(str(w.message) for w in caught if w.category is UserWarning)
        assert len(texts) == 3, texts
        for unknown, close in [("cache.memory_entry", "cache.memory-entries"),
                               ("directt", "direct"), ("sort.minbucket", "sort.min-bucket")]:
            assert any(f"dask-compact.{unknown} is ignored; did you mean dask-compact.{close}?"
                       in t for t in texts), (unknown, texts)
        assert not any("memory_entries" in t for t in texts)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process
            settings.get("sort.min-bucket")


def _unknown_warnings(caught: list) -> list[str]:
    return [str(w.message) for w in caught if "unknown setting" in str(w.message)]


def test_a_misspelling_set_after_the_first_call_warns_once_per_key():
    """A key that appears after the process's first settings read warns at the next call, once
    per key (a docs probe, 2026-11-30: only the keys present at the first read were checked,
    and a map_compact that reads no setting never looked). The keys are this test's own, so
    no earlier test has seen them."""
    import warnings

    a = np.random.default_rng(3).random(3000)
    x = da.from_array(a, chunks=300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(x.map_compact("x > 0.5").compute(), a[a > 0.5])
        assert _unknown_warnings(caught) == []
        with dask.config.set({"dask-compact.cache.memory-entires": 3}):
            np.testing.assert_array_equal(x.map_compact("x > 0.6").compute(), a[a > 0.6])
            first = _unknown_warnings(caught)
            x.map_compact("x > 0.7")  # the same key again: no second warning
        with dask.config.set({"dask-compact.cache.memory-entires": 4}):  # set once more
            x.map_compact("x > 0.8")
        assert _unknown_warnings(caught) == first
        assert len(first) == 1 and ("dask-compact.cache.memory-entires is ignored; did you "
                                    "mean dask-compact.cache.memory-entries?") in first[0]
        with dask.config.set({"dask-compact.sort.minbuckt": 5}):  # a new misspelling
            settings.get("direct")
        texts = _unknown_warnings(caught)
        assert len(texts) == 2 and "dask-compact.sort.minbuckt is ignored" in texts[1], texts
    # each names the user's line, not a line of the package
    assert {w.filename for w in caught if "unknown setting" in str(w.message)} == {__file__}


def _every_public_call() -> dict[str, object]:
    a = np.arange(20.0)
    x = da.from_array(a, chunks=5)
    f = {"m": a, "id": np.arange(20)}
    return {
        "map_compact": lambda: dask_compact.map_compact(x, "x > 3"),
        "compact": lambda: dask_compact.compact(x, x > 3),
        "flatnonzero": lambda: dask_compact.flatnonzero(x),
        "compact_array": lambda: dask_compact.compact_array(a, "x > 3"),
        "compact_into": lambda: dask_compact.compact_into(a, "x > 3", np.empty_like(a)),
        "compact_records": lambda: dask_compact.compact_records(f, "m > 3"),
        "compact_records_into": lambda: dask_compact.compact_records_into(
            f, "m > 3", {"id": np.empty(20, np.int64)}),
        "sort": lambda: dask_compact.sort(x),
        "argsort": lambda: dask_compact.argsort(x),
        "scan_array": lambda: dask_compact.scan_array(np.arange(20)),
        "cumsum": lambda: dask_compact.cumsum(x),
        "partition": lambda: dask_compact.partition(x, "x > 3"),
        "partition_array": lambda: dask_compact.partition_array(a, "x > 3"),
    }


@pytest.mark.parametrize("name", list(_every_public_call()))
def test_every_public_call_looks_for_new_misspellings(name):
    import warnings

    call = _every_public_call()[name]
    call()  # not the first call of the process: the settings were read before
    settings.get("direct")
    with dask.config.set({f"dask-compact.batch.gpu-decode-wiat-{name}": 1}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    texts = _unknown_warnings(caught)
    assert len(texts) == 1 and f"gpu-decode-wiat-{name} is ignored" in texts[0], texts


def test_known_keys_in_every_spelling_dask_reads_give_no_warning(monkeypatch):
    import warnings

    monkeypatch.setattr(settings, "_unknown", settings._UnknownKeys())
    with dask.config.set({"dask-compact.sort.min_bucket": 9, "dask_compact.cache.disk_bytes": 5,
                          "dask-compact.batch.gpu-decode-wait": 0.1}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert settings.get("sort.min-bucket") == 9
            assert settings.get("cache.disk-bytes") == 5


# a map_compact and a sort in a fresh process: the warnings whose text holds {match}, which
# must be {count}, printed
_TWO_CALLS = """
    import warnings
    import numpy as np, dask.array as da, dask_compact
    a = np.random.default_rng(2).normal(size=1001)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = da.from_array(a, chunks=100).map_compact("x > 0.1").compute()
        dask_compact.sort(da.from_array(a, chunks=100)).compute()
    assert np.array_equal(got, a[a > 0.1])
    texts = [str(w.message) for w in caught if {match!r} in str(w.message)]
    assert len(texts) == {count}, [str(w.message) for w in caught]
    print(texts)
"""


def _warned_in_two_calls(match: str, count: int, env: dict[str, str]) -> str:
    out = _in_a_process(_TWO_CALLS.format(match=match, count=count), env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_a_misspelled_environment_variable_warns_at_the_first_call():
    out = _warned_in_two_calls("unknown setting", 1, {
        "DASK_DASK_COMPACT__SORT__MINBUCKET": "5", "DASK_DASK_COMPACT__SORT__MAX_PIECES": "64"})
    assert "dask-compact.sort.minbucket is ignored; did you mean dask-compact.sort.min-bucket?" \
        in out


def test_a_variable_without_dask_s_own_prefix_warns_naming_the_one_dask_reads():
    # DASK_COMPACT__SORT__MIN_BUCKET (the package's name with dask's separator, as
    # DASK_COMPACT_CACHE_DIR suggests) is dask's key compact.sort.min-bucket: until 2026-12-01
    # (a new-user probe) it was silently ignored, the default used.
    out = _warned_in_two_calls("compact.sort.min-bucket", 1,
                               {"DASK_COMPACT__SORT__MIN_BUCKET": "5"})
    assert "DASK_DASK_COMPACT__SORT__MIN_BUCKET" in out and "ignored" in out
    # a section of that name holding nothing of ours is someone else's: no warning
    _warned_in_two_calls("setting compact.", 0, {"DASK_COMPACT__SOMETHING_ELSE": "5"})


@pytest.mark.parametrize(("env", "name"), [("DASK_DASK_COMPACT", "dask-compact"),
                                           ("DASK_DASK_COMPACT__SORT", "dask-compact.sort")])
def test_a_value_for_a_section_warns(env, name):
    # DASK_DASK_COMPACT=5 (a value where the section of settings belongs): registering the
    # defaults replaced it with theirs, so until 2026-12-01 (thirteenth session) it was
    # silently ignored; now the first call warns, naming it and a variable dask reads
    out = _warned_in_two_calls("a value where dask-compact takes a section", 1, {env: "5"})
    assert f"setting {name} is 5" in out and "DASK_DASK_COMPACT__SORT__" in out


def test_a_value_set_for_a_section_warns(monkeypatch):
    # the same, set once the package is imported: every key's default was used silently
    monkeypatch.setattr(settings, "_unknown", settings._UnknownKeys())
    for where, value in (("dask-compact", 5), ("dask-compact.cache", "big")):
        with dask.config.set({where: value}), pytest.warns(UserWarning) as caught:
            assert settings.get("sort.min-bucket") == settings.DEFAULTS["sort"]["min-bucket"]
        assert [str(w.message).split(",")[0] for w in caught] == [f"setting {where} is {value!r}"]


def test_a_bad_setting_on_one_worker_names_that_worker(tmp_path):
    """A bad value in one worker's environment (``DASK_DASK_COMPACT__CACHE__MEMORY_ENTRIES=abc``
    there only) raised a SettingError telling the user to change it "where it is set",
    though the client had no such setting (a probe, 2026-11-30). Now the error says it was
    read on that worker, naming it, and that it is that worker's process to change; calls
    over input held elsewhere work, exact; the client's own errors name no worker. Every
    call raises: the first had stored the worker's compiled loop before the setting was read
    (:meth:`BoundedCache.put`), so the next ones ran with it unchecked."""
    from cluster_helpers import worker_named, worker_process
    from conftest import local_process_cluster
    from distributed import wait

    a = np.random.default_rng(3).random(5_003)
    with local_process_cluster(1) as c:
        good = next(iter(c.nthreads()))
        with worker_process(c.scheduler.address, tmp_path, "misconfigured",
                            env={"DASK_DASK_COMPACT__CACHE__MEMORY_ENTRIES": "abc"}):
            bad = worker_named(c, "misconfigured")
            x = c.persist(da.from_array(a, chunks=1_000), workers=[bad])
            wait(x)
            for _ in range(2):  # the first call stored its compiled loop before it raised,
                # and the next one ran, the setting unchecked: now each raises
                with pytest.raises(settings.SettingError) as caught:
                    x.map_compact("x < 0.3").compute()
                message = str(caught.value)
                assert "dask-compact.cache.memory-entries is 'abc' on the dask worker " in message
                assert f"{bad} (name misconfigured, pid " in message
                assert "Change it where it is set in that worker's process" in message
            y = c.persist(da.from_array(a, chunks=999), workers=[good])
            wait(y)
            np.testing.assert_array_equal(y.map_compact("x < 0.3").compute(), a[a < 0.3])
    with dask.config.set({"dask-compact.cache.memory-entries": "abc"}):
        with pytest.raises(settings.SettingError) as caught:
            settings.get("cache.memory-entries")
    assert "worker" not in str(caught.value)


def test_a_closed_worker_of_this_process_is_not_named():
    """A worker of a closed in-process cluster stays in distributed's weak set of workers
    until collected: the client's own bad setting then named that closed worker (CI, the
    whole suite in one process). Only a serving worker is named."""
    import distributed

    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as c:
        with distributed.Client(c):
            closed = list(distributed.Worker._instances)  # kept alive past the close
    assert closed
    with dask.config.set({"dask-compact.cache.memory-entries": "abc"}):
        with pytest.raises(settings.SettingError) as caught:
            settings.get("cache.memory-entries")
    assert "worker" not in str(caught.value)
