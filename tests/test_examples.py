"""examples/multi_gpu.py in its CPU mode (LocalCluster, 2 worker processes, NumPy chunks)."""

from __future__ import annotations

import re
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
