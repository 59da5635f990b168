"""What a predicate's first GPU use costs in compilation, and how its modules could be built:
the measurements behind docs/design.md's notes on a batch job's first run ("Caches").

    python -P benchmarks/compile_probe.py [--out DIR]

Each step runs in a fresh process with its own CuPy kernel cache (``CUPY_CACHE_DIR``):

- ``prepare``: ``cupy_backend.prepare`` of float32 values (what the batch job's GPU warm-up
  runs) with an empty cache (a machine's first run), again with that cache (a warm run), and
  with a structurally different predicate on the same cache (a user's new predicate: CuPy's
  own kernels already cached). Every NVRTC compile is logged with its time and what it built.
- ``modules``: the kernels of one output and group (``values``/``compact``) built as one
  RawModule, as one RawModule per kernel one after another, as one per kernel from a thread
  each, and by the library's ``cupy_modules.build_modules``, each variant from a cold cache.

- ``first``: a public call's first use of a predicate, ``compact_array`` (float32, 2^20) and
  ``compact_records`` (float32, int64 and (n, 3) float64 fields, 2^20 rows): wall time of the
  first call and of a second, with an empty cache, again with that cache, and with a new
  predicate structure on it (a user's new cut in a new session).

Prints one JSON line per process and a summary table; ``--out`` keeps them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PREDICATES = {"P1": "x < 0.5", "P2": "(x > 0.25) & (x < 0.75)"}
RECORD_PREDICATES = {"P1": "a < 0.5", "P2": "(a > 0.25) & (b != 3)"}


def _log_compiles(log: list) -> None:
    """Wrap CuPy's compile-or-load-from-its-disk-cache step so that every module built is
    timed (callers look it up at call time in cupy.cuda.compiler's globals)."""
    import re

    from cupy.cuda import compiler

    inner = compiler._compile_module_with_cache

    def timed(source, *args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(source, *args, **kwargs)
        finally:
            tail = re.findall(r"// kernels?: ([^\n]*)", source)
            what = tail[-1] if tail else (re.findall(r"void\s+(\w+)\s*\(", source) or ["?"])[0]
            log.append({"s": round(time.perf_counter() - t, 4), "what": what,
                        "thread": threading.current_thread().name[:20]})

    compiler._compile_module_with_cache = timed


def child_prepare(where: str) -> dict:
    t0 = time.perf_counter()
    import cupy

    t_import = time.perf_counter() - t0
    t = time.perf_counter()
    cupy.cuda.runtime.free(0)
    t_ctx = time.perf_counter() - t
    import numpy as np

    from dask_compact.backends.cupy_backend import prepare
    from dask_compact.predicate import as_predicate

    log: list = []
    _log_compiles(log)
    pred = as_predicate(where)
    t = time.perf_counter()
    prepare(pred, np.dtype("float32"), "values")
    t_prep = time.perf_counter() - t
    return {"step": "prepare", "where": where, "import_cupy_s": round(t_import, 3),
            "context_s": round(t_ctx, 3), "prepare_s": round(t_prep, 3),
            "compiles": log, "compile_s": round(sum(c["s"] for c in log), 3)}


def child_modules(variant: str) -> dict:
    import cupy
    import numpy as np

    cupy.cuda.runtime.free(0)
    from dask_compact.backends.cupy_source import NVRTC_OPTIONS, ModuleSpec
    from dask_compact.backends.cupy_tuning import tuning_for
    from dask_compact.codegen.cuda_functor import generate_functor
    from dask_compact.predicate import as_predicate

    log: list = []
    _log_compiles(log)
    functor = generate_functor(as_predicate(PREDICATES["P1"]).typed("float32"))
    spec = ModuleSpec(np.dtype("float32"), "single-pass", functor, tuning_for("single-pass", 4))
    names = spec.group_names("values", "compact")
    src = spec.group_source("values", "compact") + f"\n// probe {variant} {time.time_ns()}\n"

    def build(ns: list[str], tag: str) -> None:
        m = cupy.RawModule(code=src + f"// {tag}\n", options=NVRTC_OPTIONS,
                           name_expressions=ns)
        m.compile()

    t = time.perf_counter()
    if variant == "one":
        build(list(names.values()), "all")
    elif variant == "each":
        for role, n in names.items():
            build([n], role)
    elif variant == "threads":
        threads = [threading.Thread(target=build, args=([n], role), name=role)
                   for role, n in names.items()]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    else:  # the library's build (cupy_modules.build_modules)
        from dask_compact.backends.cupy_modules import build_modules

        build_modules(src, names)
    return {"step": "modules", "variant": variant, "kernels": list(names),
            "wall_s": round(time.perf_counter() - t, 3), "compiles": log}


def child_first(kind: str, key: str) -> dict:
    """The first and second public call of ``kind`` with predicate ``key`` in this process."""
    import cupy
    import numpy as np

    import dask_compact

    cupy.cuda.runtime.free(0)
    log: list = []
    _log_compiles(log)
    rng = np.random.default_rng(0)
    n = 1 << 20
    a = cupy.asarray(rng.random(n, dtype=np.float32))
    if kind == "records":
        fields = {"a": a, "b": cupy.asarray(rng.integers(0, 9, n)),
                  "c": cupy.asarray(rng.random((n, 3)))}
        where = RECORD_PREDICATES[key]

        def call() -> None:
            dask_compact.compact_records(fields, where)
    else:
        where = PREDICATES[key]

        def call() -> None:
            dask_compact.compact_array(a, where)

    walls = []
    for _ in range(2):
        t = time.perf_counter()
        call()
        cupy.cuda.runtime.deviceSynchronize()
        walls.append(time.perf_counter() - t)
    return {"step": f"first {kind}", "where": where, "first_s": round(walls[0], 3),
            "second_s": round(walls[1], 4), "compiles": log,
            "compile_s": round(sum(c["s"] for c in log), 3)}


def run_child(args: list[str], cache: Path) -> dict:
    env = dict(os.environ, CUPY_CACHE_DIR=str(cache))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-P", __file__, *args], env=env, capture_output=True,
                       text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"{args}: {r.stderr[-3000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = round(time.perf_counter() - t, 3)
    out["cache_files"] = sum(1 for p in cache.rglob("*") if p.is_file())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--first", nargs="*", default=["values", "records"],
                    help="public calls whose first use is timed")
    ap.add_argument("--first-only", action="store_true",
                    help="only the public calls' first use (no prepare or module variants)")
    a = ap.parse_args()
    if a.child:
        kind, arg = a.child[0], a.child[1]
        if kind == "first":
            res = child_first(arg, a.child[2])
        elif kind == "prepare":
            res = child_prepare(PREDICATES[arg])
        else:
            res = child_modules(arg)
        print(json.dumps(res))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            cache = Path(tmp) / f"prep{r}"
            for label, pk in (("cold cache", "P1"), ("warm cache", "P1"),
                              ("new predicate", "P2")) if not a.first_only else ():
                res = run_child(["--child", "prepare", pk], cache)
                res["case"] = label
                rows.append(res)
                print(json.dumps(res), flush=True)
            for kind in a.first:
                for label, pk in (("cold cache", "P1"), ("warm cache", "P1"),
                                  ("new predicate", "P2")):
                    res = run_child(["--child", "first", kind, pk], Path(tmp) / f"{kind}{r}")
                    res["case"] = label
                    rows.append(res)
                    print(json.dumps(res), flush=True)
            if a.first_only:
                continue
            for v in ("one", "each", "threads", "build_modules"):
                res = run_child(["--child", "modules", v], Path(tmp) / f"mod{r}{v}")
                rows.append(res)
                print(json.dumps(res), flush=True)
    print("\n| step | case | prepare / build / first call wall s | second call s | process s "
          "| NVRTC compiles (s each) |")
    print("|---|---|---|---|---|---|")
    for res in rows:
        comp = ", ".join(f"{c['what'][-28:]} {c['s']:.2f}" for c in res["compiles"])
        wall = res.get("prepare_s", res.get("wall_s", res.get("first_s")))
        print(f"| {res['step']} | {res.get('case', res.get('variant'))} | {wall} "
              f"| {res.get('second_s', '')} | {res['process_s']} | {comp} |")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "compile_probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
