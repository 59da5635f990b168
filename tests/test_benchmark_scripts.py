"""The benchmark scripts find their sibling modules (``bench_common``, ``gpu_kernels``...) also
when run as ``python -P``, which the GPU host's sessions use so that the checkout's own
folder does not shadow the installed wheel: until 2026-12-06 fifteen scripts relied on the
script's folder being ``sys.path[0]`` and failed there with ``ModuleNotFoundError``.

The scripts time GPUs and clusters, so this checks their imports, not their runs: each
import of a sibling module must come after the script puts its folder on ``sys.path`` (at
the top of the module, or before it in the same function), and the scripts that start on a
machine without a GPU are run with ``--help`` under ``-P``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
SIBLINGS = {p.stem for p in SCRIPTS}


def _puts_folder_on_path(node: ast.stmt) -> bool:
    """``sys.path.insert(0, str(Path(__file__).parent))``, the form every script uses."""
    return (
        isinstance(node, ast.Expr)
        and ast.unparse(node.value) == "sys.path.insert(0, str(Path(__file__).parent))"
    )


def _sibling_imports_before_the_path(body: list[ast.stmt], on_path: bool) -> list[int]:
    """Line numbers of sibling imports in ``body`` (and the functions and blocks in it) that
    run before the folder is on ``sys.path``."""
    bad: list[int] = []
    for node in body:
        if _puts_folder_on_path(node):
            on_path = True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names]  # fmt: skip
            if not on_path and any((n or "").split(".")[0] in SIBLINGS for n in names):
                bad.append(node.lineno)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list) and inner:
                    if field == "handlers":
                        for h in inner:
                            bad += _sibling_imports_before_the_path(h.body, on_path)
                    else:
                        bad += _sibling_imports_before_the_path(inner, on_path)
    return bad


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_sibling_imports_follow_the_folder_on_sys_path(script: Path) -> None:
    tree = ast.parse(script.read_text(), str(script))
    bad = _sibling_imports_before_the_path(tree.body, on_path=False)
    assert not bad, f"{script.name}: sibling modules imported at lines {bad} before " \
        "sys.path.insert(0, str(Path(__file__).parent))"  # fmt: skip


def test_the_check_finds_an_import_without_the_path() -> None:
    """The check itself: a function importing ``bench_common`` first is caught, one that puts
    the folder on the path first is not."""
    src = (
        "import sys\nfrom pathlib import Path\n"
        "def a():\n    from bench_common import label\n"
        "def b():\n    sys.path.insert(0, str(Path(__file__).parent))\n"
        "    from bench_common import label\n"
    )
    assert _sibling_imports_before_the_path(ast.parse(src).body, False) == [4]


# Scripts that start without a GPU and import siblings at their top: run as the GPU host does.
CPU_STARTERS = ["batch_records.py", "records_bench.py", "sort_beyond_gpu.py"]


@pytest.mark.parametrize("name", CPU_STARTERS)
def test_scripts_start_under_python_dash_p(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-P", str(BENCHMARKS / name), "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "usage" in proc.stdout
