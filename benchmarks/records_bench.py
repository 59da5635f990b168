"""compact_records as a user times it, beside what that user would write instead.

The shape of issue 11: N rows of 4 float32 fields (a, b, c, d), the predicate on one field
(``a < p``) or on two (``(a < q) & (b < q)`` with q*q = p), p = .05 / .5 / .95, uniform random
data. Every call is timed whole on the host (call, then a device synchronisation), median of
several repetitions after warm-up, peers in the same process on the same data.

GPU (``--device gpu``, N = 2^28 by default):

* ours: ``compact_records(fields, pred)`` on CuPy arrays (exact-size outputs, known count),
  and ``compact_records_into`` into buffers of N rows kept across calls, its count read
  (a table of its own);
* CuPy boolean indexing per field (``m = a < p; {k: v[m]}``), ``torch.masked_select`` per
  field (same mask), the two-step recipe (``compact_array(a, pred, output="indices")`` then
  ``cupy.take`` per field);
* the bytes floor: a device copy moving the bytes the selection must move at least (read the
  predicate's fields, read the selected rows of the others, write every selected row);
* Dask, one GPU, threaded scheduler, chunks of N/4: ours on dask arrays of CuPy chunks
  against ``m = pred(...); {k: v[m]}`` + ``compute_chunk_sizes()`` per field, persisted.

CPU (``--device cpu``, N = 2^24): ours against NumPy ``m = pred(...); {k: v[m]}`` and the
copy floor (the selected volume of every field copied from contiguous rows into new arrays),
and on dask arrays (threaded, chunks of N/8) against the same with ``compute_chunk_sizes()``.

With ``--rays`` the fields are a path tracer's ray batch instead: a and b (float32, the
predicate's), pixel (int32), origin, direction and throughput ((n, 3) float32 each: rows of
several units, 48 bytes a row in all); the peers index rows the same way (``take(axis=0)``,
torch's boolean indexing where ``masked_select`` would flatten).

    python benchmarks/records_bench.py --device gpu --out DIR --sha SHA

Prints a table (ms, ratios), saves it (markdown, CSV) and a chart (PNG) under --out.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import file_stem, label, plot_vs_p, save, timed_ms

from dask_compact import compact_array, compact_records, compact_records_into

FIELDS = ("a", "b", "c", "d")
# --rays: a path tracer's ray batch, rows of several units (a and b as the predicate fields)
RAYS = {"a": ((), np.float32), "b": ((), np.float32), "origin": ((3,), np.float32),
        "direction": ((3,), np.float32), "throughput": ((3,), np.float32),
        "pixel": ((), np.int32)}


def make_fields(rng: Any, n: int, rays: bool) -> dict:
    """The benchmark's fields from a NumPy or CuPy generator: 4 float32 columns, or rays."""
    if not rays:
        return {k: rng.random(n, dtype=np.float32) for k in FIELDS}
    return {k: (rng.integers(0, 1 << 20, size=(n, *shape), dtype=dt) if dt == np.int32
                else rng.random((n, *shape), dtype=dt)) for k, (shape, dt) in RAYS.items()}


def row_bytes(v: Any) -> int:
    return v.itemsize * (math.prod(v.shape[1:]) if v.ndim > 1 else 1)


def predicates(p: float, two: bool) -> tuple[str, Any]:
    """(our string, the mask function a user writes) selecting about a fraction p."""
    if not two:
        return f"a < {p!r}", lambda f: f["a"] < p
    q = math.sqrt(p)
    return f"(a < {q!r}) & (b < {q!r})", lambda f: (f["a"] < q) & (f["b"] < q)


def mask_recipe(f: dict, mask_of: Any) -> dict:
    """What an in-memory user writes: the mask once, boolean indexing per field."""
    m = mask_of(f)
    return {k: v[m] for k, v in f.items()}


def dask_recipe(d: dict, mask_of: Any) -> dict:
    """What a dask user writes today: a mask, boolean indexing per field, chunk sizes computed
    (one pass each), the result persisted."""
    m = mask_of(d)
    out = {}
    for k, v in d.items():
        y = v[m]
        y.compute_chunk_sizes()
        out[k] = y.persist()
    return out


def gpu_rows(n: int, ps: list[float], reps: int, rays: bool = False) -> list[dict]:
    import cupy

    import dask_compact.backends.cupy_backend  # noqa: F401 -- the dispatch registers it

    try:
        import torch
    except Exception:  # noqa: BLE001 -- an optional peer
        torch = None
    sync = cupy.cuda.Device().synchronize
    f = make_fields(cupy.random.default_rng(0), n, rays)
    t = {k: torch.as_tensor(v, device="cuda") for k, v in f.items()} if torch else None
    rows = []
    for two in (False, True):
        for p in ps:
            text, mask_of = predicates(p, two)
            m = mask_of(f)
            k = int(cupy.count_nonzero(m))
            del m
            row: dict = {"n": n, "p": p, "pred_fields": 2 if two else 1, "selected": k}
            row["ours"] = timed_ms(lambda: compact_records(f, text), sync, reps)
            bufs = {kk: cupy.empty_like(v) for kk, v in f.items()}
            count = cupy.empty(1, dtype=np.int64)
            # the sync-free call into buffers kept across calls, its count read (one sync)
            into = timed_ms(lambda: compact_records_into(f, text, bufs, count=count).get(),
                            sync, reps)
            del bufs
            row["cupy bool index"] = timed_ms(lambda: mask_recipe(f, mask_of), sync, reps)
            if torch is not None:
                def tmask():
                    tm = mask_of(t)
                    # rows of several units: boolean indexing (masked_select flattens)
                    return {kk: torch.masked_select(v, tm) if v.ndim == 1 else v[tm]
                            for kk, v in t.items()}
                row["torch masked_select"] = timed_ms(tmask, sync, reps)

            def two_step():
                # the recipe before records: our indices, then a take per field (a predicate
                # over two fields is a mask first, whose set positions are the indices)
                if two:
                    idx = compact_array(mask_of(f), "x", output="indices")
                else:
                    idx = compact_array(f["a"], f"x < {p!r}", output="indices")
                return {kk: cupy.take(v, idx, axis=0) for kk, v in f.items()}

            row["two-step recipe"] = timed_ms(two_step, sync, reps)
            read = ("a", "b") if two else ("a",)
            pred_bytes = n * sum(row_bytes(f[kk]) for kk in read)
            moved = (pred_bytes + k * sum(row_bytes(v) for kk, v in f.items() if kk not in read)
                     + k * sum(row_bytes(v) for v in f.values()))
            src = cupy.empty(moved // 2 + 16, dtype=np.uint8)
            dst = cupy.empty_like(src)
            row["bytes floor"] = timed_ms(lambda: dst.__setitem__(slice(None), src), sync, reps)
            del src, dst
            row[INTO] = into  # last: the in-memory table's ratios are against "ours"
            rows.append(row)
    return rows


def gpu_dask_rows(n: int, ps: list[float], reps: int, rays: bool = False) -> list[dict]:
    import cupy

    sync = cupy.cuda.Device().synchronize
    chunk = n // 4
    host = make_fields(np.random.default_rng(1), n, rays)
    d = {k: da.from_array(v, chunks=chunk).map_blocks(cupy.asarray).persist()
         for k, v in host.items()}  # fmt: skip
    del host
    rows = []
    with dask.config.set(scheduler="threads"):
        for p in ps:
            text, mask_of = predicates(p, False)

            def ours():
                return compact_records(d, text)

            def naive():
                return dask_recipe(d, mask_of)

            rows.append({"n": n, "p": p, "pred_fields": 1, "chunks": 4,
                         "dask ours": timed_ms(ours, sync, reps, 1),
                         "dask mask + ccs + persist": timed_ms(naive, sync, reps, 1)})
    return rows


def cpu_rows(n: int, ps: list[float], reps: int, rays: bool = False,
             with_dask: bool = True) -> list[dict]:
    f = make_fields(np.random.default_rng(0), n, rays)
    rows = []
    for two in (False, True):
        for p in ps:
            text, mask_of = predicates(p, two)
            row: dict = {"n": n, "p": p, "pred_fields": 2 if two else 1}
            row["ours"] = timed_ms(lambda: compact_records(f, text), lambda: None, reps)
            row["numpy mask + index"] = timed_ms(lambda: mask_recipe(f, mask_of), lambda: None,
                                                 reps)
            k = int(np.count_nonzero(mask_of(f)))
            # the copy floor: the selected volume of every field copied from contiguous rows
            # into new arrays (what the output costs to write, fresh pages included)
            row["copy floor"] = timed_ms(
                lambda: {kk: v[:k].copy() for kk, v in f.items()}, lambda: None, reps)
            rows.append(row)
    if not with_dask:
        return rows
    d = {k: da.from_array(v, chunks=n // 8) for k, v in f.items()}
    with dask.config.set(scheduler="threads"):
        for p in ps:
            text, mask_of = predicates(p, False)

            def naive():
                return dask_recipe(d, mask_of)

            rows.append({"n": n, "p": p, "pred_fields": 1, "chunks": 8,
                         "dask ours": timed_ms(lambda: compact_records(d, text), lambda: None,
                                               max(3, reps // 2), 1),
                         "dask mask + ccs + persist": timed_ms(naive, lambda: None,
                                                               max(3, reps // 2), 1)})
    return rows


RAYS_TEXT = ("a ray batch: a, b float32, pixel int32, origin, direction, throughput (n, 3) "
             "float32")
INTO = "ours into buffers"  # compact_records_into, its count read: a table of its own


def into_table(rows: list[dict]) -> list[str]:
    """compact_records_into (buffers of n rows kept across calls) against the recipe and the
    bytes floor: ratios are their time / its time."""
    lines = ["| n | p | predicate fields | into ms | vs two-step recipe | vs bytes floor |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| 2^{int(math.log2(r['n']))} | {r['p']} | {r['pred_fields']} | "
                     f"{r[INTO]:.3f} | **{r['two-step recipe'] / r[INTO]:.2f}x** | "
                     f"**{r['bytes floor'] / r[INTO]:.0%}** of floor |")
    return lines


def table(rows: list[dict]) -> list[str]:
    lines = []
    cols = [c for c in rows[0] if c not in ("n", "p", "pred_fields", "selected", "chunks", INTO)]
    lines.append("| n | p | predicate fields | " + " | ".join(f"{c} ms" for c in cols)
                 + " | " + " | ".join(f"ours vs {c}" for c in cols[1:]) + " |")
    lines.append("|" + "---|" * (3 + 2 * len(cols) - 1))
    for r in rows:
        ours = r[cols[0]]
        ratios = []
        for c in cols[1:]:
            if c in ("bytes floor", "copy floor"):
                ratios.append(f"**{r[c] / ours:.0%}** of floor")
            else:
                ratios.append(f"**{r[c] / ours:.2f}x**")
        lines.append(f"| 2^{int(math.log2(r['n']))} | {r['p']} | {r['pred_fields']} | "
                     + " | ".join(f"{r[c]:.3f}" for c in cols) + " | " + " | ".join(ratios)
                     + " |")
    return lines


def plot(rows: list[dict], path: Path, title: str) -> None:
    cols = [c for c in rows[0] if c not in ("n", "p", "pred_fields", "selected", "chunks")]
    series = {}
    for pf in sorted({r["pred_fields"] for r in rows}):
        sub = [r for r in rows if r["pred_fields"] == pf]
        for c in cols:
            series[f"{c} ({pf} predicate field{'s' if pf > 1 else ''})"] = (
                [r["p"] for r in sub], [r["n"] / r[c] / 1e6 for r in sub])
    plot_vs_p(series, path, title, "rows")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--log2n", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--rays", action="store_true",
                    help="a ray batch (a, b, pixel; origin, direction, throughput as (n, 3) "
                         "float32) instead of 4 float32 columns")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    args = ap.parse_args()
    ps = [0.05, 0.5, 0.95]
    gpu = args.device == "gpu"
    today, device, sha = label(gpu, args.sha)
    if gpu:
        n = 1 << (args.log2n or 28)
        reps = args.reps or 10
        tables = [("in memory", gpu_rows(n, ps, reps, args.rays))]
        if not args.no_dask:
            tables.append(("dask, one GPU",
                           gpu_dask_rows(max(n, 1 << 28), ps, max(3, reps // 2), args.rays)))
    else:
        n = 1 << (args.log2n or 24)
        rows = cpu_rows(n, ps, args.reps or 5, args.rays, not args.no_dask)
        tables = [("in memory", [r for r in rows if "ours" in r])]
        if not args.no_dask:
            tables.append(("dask", [r for r in rows if "dask ours" in r]))
    head = [f"# compact_records benchmark, {today}, {device}, git {sha}",
            "", (RAYS_TEXT if args.rays else "4 float32 fields")
            + "; median ms of whole calls (host wall, device synced); ratios "
            "are peer time / our time (floor: floor time / our time).", ""]
    text = list(head)
    for name, rows in tables:
        text += [f"## {name}", "", *table(rows), ""]
        if rows and INTO in rows[0]:
            text += [f"## {name}: compact_records_into (caller buffers, count read)", "",
                     *into_table(rows), ""]
    print("\n".join(text))
    if args.out:
        stem = file_stem("records-rays" if args.rays else "records", today, device, sha, gpu)
        save(args.out, stem, text, [dict(r, table=name) for name, rows in tables for r in rows])
        plot(tables[0][1], args.out / f"{stem}.png", f"compact_records, {device}, git {sha}")

if __name__ == "__main__":
    main()
