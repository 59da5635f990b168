"""With numba's JIT disabled (``NUMBA_DISABLE_JIT=1``) every public call still gives NumPy's
answers: the predicate loops are not compiled (the NumPy mask path runs instead) and the
record gathers run in NumPy. A new-user probe (2026-11-30): compact_array, map_compact and
compact_records raised ``AttributeError: 'function' object has no attribute 'compile'``, and
the CLI failed. numba reads the variable at its import, so each check runs in a new process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import zarr

ROOT = str(Path(__file__).resolve().parents[1])

CALLS = """
    import numpy as np, dask.array as da, dask_compact
    from numba.core import config
    assert config.DISABLE_JIT
    rng = np.random.default_rng(int(SEED))
    a = rng.normal(size=4001)
    x = da.from_array(a, chunks=397)
    m = (a * 2 > 0.3) & (a < 1.2)
    pred = lambda v: (v * 2 > 0.3) & (v < 1.2)
    eq = np.array_equal
    assert eq(dask_compact.compact_array(a, pred), a[m])
    v, i = dask_compact.compact_array(a, pred, output="both")
    assert eq(v, a[m]) and eq(i, np.flatnonzero(m))
    assert eq(x.map_compact(pred).compute(), a[m])
    assert eq(x.map_compact("x > 0.5", output="indices").compute(), np.flatnonzero(a > 0.5))
    assert eq(dask_compact.compact(x, x > 0.5).compute(), a[a > 0.5])
    assert eq(dask_compact.flatnonzero(x > 0).compute(), np.flatnonzero(a > 0))
    w = rng.random((4001, 3)).astype(np.float32)
    b = rng.integers(-9, 9, 4001).astype(np.int8)
    fields = {"u": a, "w": w, "b": b}
    r = dask_compact.compact_records(fields, lambda u, b: (u > 0.2) & (b != 3), indices=True)
    k = (a > 0.2) & (b != 3)
    assert eq(r["u"], a[k]) and eq(r["w"], w[k]) and eq(r["b"], b[k])
    assert eq(r["indices"], np.flatnonzero(k))
    lazy = {n: da.from_array(f, chunks=500) for n, f in fields.items()}
    r = dask_compact.compact_records(lazy, "u > 0.2", lazy=False)
    assert eq(np.asarray(r["w"]), w[a > 0.2])
    assert eq(dask_compact.sort(x).compute(), np.sort(a))
    assert eq(dask_compact.argsort(x).compute(), np.argsort(a, kind="stable"))
    assert np.allclose(dask_compact.cumsum(x).compute(), np.cumsum(a))
    assert np.allclose(dask_compact.scan_array(a), np.cumsum(a) - a)
    split, n = dask_compact.partition_array(a, "x > 0")
    assert eq(split, np.concatenate([a[a > 0], a[a <= 0]])) and n == (a > 0).sum()
    split, n = dask_compact.partition(x, "x > 0")
    assert eq(split.compute(), np.concatenate([a[a > 0], a[a <= 0]])) and n == (a > 0).sum()
    print("ok")
"""


def _run(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": ROOT,
           "DASK_COMPACT_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, *args] if args else [sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)


def test_every_public_cpu_call_gives_numpy_s_answers_with_the_jit_disabled(tmp_path):
    seed = str(np.random.default_rng().integers(1000))
    code = textwrap.dedent(CALLS).replace("int(SEED)", seed)
    out = _run(code, tmp_path)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-4000:]


def test_the_cli_compacts_with_the_jit_disabled(tmp_path):
    a = np.random.default_rng().normal(size=20011)
    np.save(tmp_path / "in.npy", a)
    out = _run("", tmp_path, "-m", "dask_compact", "in.npy", "out.zarr", "--where", "x > 0.5")
    assert out.returncode == 0, out.stderr[-4000:]
    assert np.array_equal(zarr.open_group(str(tmp_path / "out.zarr"), mode="r")["values"][:],
                          a[a > 0.5])
