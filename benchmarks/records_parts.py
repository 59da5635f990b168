"""Where the time of a GPU ``compact_records`` call goes: each kernel of the call timed alone on
the same buffers (internal entry points, labelled), beside the whole public call, the two-step
recipe (our indices, then ``cupy.take`` per field), a take of one field and a dense read of
one field, in one process.

The shape of the records issue: N rows of 4 float32 fields, ``a < p``. Every step is timed
with CUDA events over batches (the device time; no host sync inside a batch), median of the
batches; the public call and the recipe, which read a count back, are timed whole on the host.

    python benchmarks/records_parts.py [--log2n 28] [--ps 0.05,0.5,0.95] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import cupy
import numpy as np

from dask_compact import compact_array, compact_records
from dask_compact.backends import cupy_records as cr
from dask_compact.backends import cupy_tuning as tuning
from dask_compact.backends.cupy_modules import compiled
from dask_compact.records_check import check_record_predicate

sys.path.insert(0, str(Path(__file__).parent))
from bench_common import EventTimer, label, timed_ms  # noqa: E402

FIELDS = ("a", "b", "c", "d")


def parts(n: int, p: float, reps: int) -> dict[str, float]:
    rng = cupy.random.default_rng(0)
    f = {k: rng.random(n, dtype=np.float32) for k in FIELDS}
    text = f"a < {p!r}"
    sync = cupy.cuda.Device().synchronize
    ev = EventTimer(reps)
    row: dict[str, Any] = {}
    out = compact_records(f, text)
    k = int(out["a"].shape[0])
    row["selected"] = k
    row["public compact_records (host)"] = timed_ms(lambda: compact_records(f, text), sync, reps)

    def recipe():
        idx = compact_array(f["a"], text.replace("a", "x"), output="indices")
        return {kk: cupy.take(v, idx) for kk, v in f.items()}

    row["two-step recipe (host)"] = timed_ms(recipe, sync, reps)
    idx = compact_array(f["a"], text.replace("a", "x"), output="indices")
    dst = cupy.empty(k, dtype=np.float32)
    row["cupy.take one field"] = ev(lambda i: cupy.take(f["b"], idx, out=dst), 1)
    row["indices alone (compact_array)"] = ev(
        lambda i: compact_array(f["a"], text.replace("a", "x"), output="indices"), 1)
    acc = cupy.empty((), dtype=np.float32)
    row["dense read one field (sum)"] = ev(lambda i: cupy.sum(f["b"], out=acc), 1)
    del idx

    pred = check_record_predicate(text, f)
    row["flags + tile scan + spans (internal)"] = ev(lambda i: cr._Pass(f, pred, n), 1)
    row["flags + tile scan (internal)"] = ev(lambda i: cr._Pass(f, pred, n, spans=False), 1)
    passes = cr._Pass(f, pred, n, spans=False)
    for block, items in FLAGS_VARIANTS:  # the flags kernel alone, by tile shape
        spec_v = dataclasses.replace(passes.spec, block=block, items=items)
        flags_v = compiled(spec_v).kernel("flags")
        tiles = (n + spec_v.tile - 1) // spec_v.tile
        counts = cupy.empty(2 * tiles + 3, dtype=cupy.uint64)  # room for the zeroed tail
        offs = cupy.empty(tiles * (block // 32), dtype=cupy.uint32)
        fa = (np.int64(n), passes.words, counts, offs, *passes.args)
        row[f"flags kernel {block} x {items}"] = ev(
            lambda i: flags_v((tiles,), (block,), fa), 1)
    outs = {kk: cupy.empty(k, dtype=np.float32) for kk in FIELDS}
    stream = cupy.cuda.get_current_stream()
    default = tuning.REC_DENSE_FROM
    for name, dense_from in (("default split", default), ("every span listed", 2.0),
                             ("every span scattered", 0.0)):
        tuning.REC_DENSE_FROM = dense_from
        passes = cr._Pass(f, pred, n)
        total, dense, sparse = passes.read_back()
        row[f"dense / sparse spans, {name}"] = f"{dense} / {sparse}"
        table = cr.column_table(f, outs)
        d_table = cr.upload_table(table, stream)
        spec = passes.spec
        per = spec.span // spec.tile
        gather = passes.module.kernel("gather")
        scatter = passes.module.kernel("scatter")
        a = (np.int64(n), passes.words, passes.counts, passes.warp_offsets, d_table,
             np.int32(len(table)), cr.ptr_or_null(None), np.int64(0), passes.lists)
        g_grid, s_grid = (sparse,), (dense * per, len(table))
        s_args = (*a, np.int64(dense))
        if not sparse:  # as the public call: every span dense, the scatter reads no list
            s_grid, s_args = (passes.tiles, len(table)), (*a[:-1], cr.ptr_or_null(None),
                                                          np.int64(dense))
        row[f"gather kernel, {name}"] = ev(
            lambda i: gather(g_grid, (spec.block,), (*a, np.int64(sparse))), 1) if sparse else 0.0
        row[f"scatter kernel, {name}"] = ev(
            lambda i: scatter(s_grid, (spec.block,), s_args), 1) if dense else 0.0
        # the other form of the scatter's columns (staged through shared memory or per lane)
        other = compiled(dataclasses.replace(spec, stage=not spec.stage)).kernel("scatter")
        row[f"scatter kernel, stage={not spec.stage}, {name}"] = ev(
            lambda i: other(s_grid, (spec.block,), s_args), 1) if dense else 0.0
        row[f"copy, sync-free grids, {name}"] = ev(
            lambda i: passes.scatter(f, outs, None, 0, stream), 1)
        if name != "every span scattered":
            for mb, loads in GATHER_VARIANTS:
                spec_v = dataclasses.replace(spec, gather_min_blocks=mb, gather_loads=loads)
                gather_v = compiled(spec_v).kernel("gather")
                row[f"gather kernel {mb} blocks/SM x {loads} loads, {name}"] = ev(
                    lambda i: gather_v(g_grid, (spec.block,), (*a, np.int64(sparse))), 1)
    tuning.REC_DENSE_FROM = default
    sync()
    row.update(host_steps(f, pred, n, reps))
    return row


def host_steps(f: dict, pred: Any, n: int, reps: int) -> dict[str, float]:
    """The sized call's steps as compact_records runs them, each on the host clock (ms,
    medians): queueing passes 1-3, the read-back (waits for them), allocating the outputs,
    queueing the copy, and the wait for it."""
    import time

    from dask_compact.backends.cupy_device import output_empty

    stream = cupy.cuda.get_current_stream()
    steps: dict[str, list[float]] = {}
    for r in range(reps + 2):
        cupy.cuda.Device().synchronize()
        t = [time.perf_counter()]
        passes = cr._Pass(f, pred, n)
        t.append(time.perf_counter())
        total, dense, sparse = passes.read_back()
        t.append(time.perf_counter())
        out = {name: output_empty(total, a.dtype, a.shape[1:]) for name, a in f.items()}
        t.append(time.perf_counter())
        passes.scatter(f, out, None, 0, stream, (dense, sparse))
        t.append(time.perf_counter())
        stream.synchronize()
        t.append(time.perf_counter())
        if r >= 2:
            for name, a, b in zip(HOST_STEPS, t, t[1:]):
                steps.setdefault(name, []).append((b - a) * 1e3)
        del out, passes
    return {f"host: {k}": float(np.median(v)) for k, v in steps.items()}


HOST_STEPS = ("queue passes 1-3", "read back (waits for them)", "allocate outputs",
              "queue the copy", "wait for the copy")


# (resident blocks per SM, rows in flight per thread) of the list form, timed beside the default
GATHER_VARIANTS = ((2, 8), (4, 4), (4, 2), (8, 2))
# (threads, rows a thread) of the flags kernel, timed alone
FLAGS_VARIANTS = ((256, 16), (256, 8), (256, 32), (128, 32), (512, 16), (512, 8))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--ps", default="0.05,0.5,0.95")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sha")
    a = ap.parse_args()
    n = 1 << a.log2n
    ps = [float(x) for x in a.ps.split(",")]
    today, device, sha = label(True, a.sha)
    rows = {p: parts(n, p, a.reps) for p in ps}
    keys = list(next(iter(rows.values())))
    lines = [f"# compact_records parts {today}, {device}, sha {sha}, 2^{a.log2n} rows x 4 float32,"
             " `a < p`; ms (device time by events unless marked host)", "",
             "| step | " + " | ".join(f"p={p}" for p in ps) + " |",
             "|---|" + "---|" * len(ps)]
    for key in keys:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v)
                 for v in (rows[p][key] for p in ps)]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / f"records-parts-{today}-{device.replace(' ', '_')}-{sha}.md").write_text(
            "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
