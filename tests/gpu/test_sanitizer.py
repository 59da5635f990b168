"""compute-sanitizer finds no memory errors, shared-memory races or uninitialised reads in the
kernels (small sizes, all algorithms and outputs; tests/gpu/sanitize_driver.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")
pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SANITIZER = shutil.which("compute-sanitizer")
DRIVER = Path(__file__).with_name("sanitize_driver.py")


@pytest.mark.skipif(SANITIZER is None, reason="compute-sanitizer not on PATH")
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "initcheck", "synccheck"])
def test_sanitizer_clean(tool: str) -> None:
    args = [SANITIZER, "--tool", tool, "--error-exitcode", "99"]
    if tool == "memcheck":
        args += ["--leak-check", "no"]
    quick = [] if tool == "memcheck" else ["--quick"]
    r = subprocess.run(args + [sys.executable, "-P", str(DRIVER), *quick], capture_output=True,
                       text=True, env=os.environ.copy(), timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-8000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-4000:]
