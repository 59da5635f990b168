"""examples/multi_gpu.py in its CPU mode (LocalCluster, 2 worker processes, NumPy chunks)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_gpu.py"


def test_multi_gpu_example_cpu_mode():
    size, chunk, seed, p = 1_000_003, 125_000, 11, 0.3
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--cpu", "--workers", "2", "--size", str(size),
         "--chunk", str(chunk), "--seed", str(seed), "--threshold", str(p), "--check"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "2 worker processes" in out
    assert "check:     OK" in out
    # Each worker asked for its slab (one run of chunks) directly, no task, and no chunk
    # moved between workers; 2 runs, each output cut in 3 (5 chunks at least: see direct.py).
    nchunks = -(-size // chunk)
    assert (f"phase 1:   2 workers asked directly for their {nchunks} chunks, 0 compaction "
            "tasks, 6 output chunks") in out
    assert "locality:  0 chunk transfers between workers" in out
    # The count, against data regenerated here the way the workers generate it (per-chunk seeds).
    data = np.concatenate([
        np.random.default_rng(seed + i).random(min(chunk, size - i * chunk), dtype=np.float32)
        for i in range(nchunks)
    ])
    selected = int(re.search(r"selected:\s+([\d,]+)", out).group(1).replace(",", ""))
    assert selected == int((data < p).sum())


README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_batch_example_runs_as_written(tmp_path):
    """The README's `dask compact` example, run as written (its optional [...] options left
    out) after the command the README gives to make its input: a new-user probe (2026-12-01,
    fourteenth session) found no way given to make `data.zarr/x`."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Batch jobs"):]
    block = section[section.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    lines = [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
    make = [ln for ln in lines if ln.startswith("python -c ")]
    assert make, "the README gives no command that makes data.zarr"
    (command,) = [re.sub(r"\s*\[[^\]]*\]", "", ln) for ln in lines if ln.startswith("dask compact")]
    for ln in make:
        code = shlex.split(ln, comments=True)[2]
        subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=120)
    args = shlex.split(command)[2:]
    proc = subprocess.run([sys.executable, "-m", "dask_compact", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import zarr

    a = zarr.open_array(str(tmp_path / "data.zarr" / "x"))[:]
    out = zarr.open_group(str(tmp_path / "selected.zarr"), mode="r")
    m = (a > 0.2) & (a < 0.3)
    np.testing.assert_array_equal(out["values"][:], a[m])
    np.testing.assert_array_equal(out["indices"][:], np.flatnonzero(m))
