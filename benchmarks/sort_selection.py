"""Sorting a selection (``x[x < p]``: chunk sizes unknown) as a user writes it, one device.

Before 2026-12-07 ``dask_compact.sort`` refused such input ("compute_chunk_sizes() first");
it now reads the sizes from its local sorts. Timed side by side on the same data, under the
threaded scheduler (the one-GPU user's default), median of ``--reps`` after a warm-up:

* ``sort(x[x < p])`` / ``argsort(...)``: ours, the result persisted (in memory, synchronised);
* the way before: ``y = x[x < p].persist(); y.compute_chunk_sizes(); sort(y)``;
* the naive way: ``cupy.sort(x[x < p].compute())`` (NumPy's sort on the CPU), one array;
* the floor: the library sort of the selected elements already in one array in memory;
* ours and the naive way again where x is a graph to compute, not persisted.

x: 2^``--log2n`` float32 in chunks of 2^``--chunk-log2``, generated on the device, persisted.

    python benchmarks/sort_selection.py --gpu --out benchmarks/results
    python benchmarks/sort_selection.py --log2n 24 --chunk-log2 21   # NumPy chunks

Writes ``sort-selection-DATE-DEVICE-SHA.{md,csv}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import file_stem, label, random_array, save, sync_device, timed_ms


def run(log2n: int, chunk_log2: int, p: float, gpu: bool, reps: int) -> list[dict]:
    import dask_compact

    xp = np
    if gpu:
        import cupy as xp
    x = random_array(2**log2n, 2**chunk_log2, 11, gpu, f"sort-selection-{log2n}").persist()
    # as users write it: dask's boolean indexing declares NumPy chunks whatever they are
    # (until 2026-12-07 this script re-declared them CuPy by hand, which the one-device
    # sort then needed; it now finds the CuPy chunks the persisted x holds)
    sel = x[x < p]
    whole = sel.compute()
    # the same data as a graph to compute (each call generates it again): nothing tells its
    # chunk type before the local sorts have run (sort_graph.build_sort)
    xg = random_array(2**log2n, 2**chunk_log2, 11, gpu, f"sort-selection-{log2n}")
    selg = xg[xg < p]
    rows = []
    for op, ours, lib in (("sort", dask_compact.sort, xp.sort),
                          ("argsort", dask_compact.argsort, xp.argsort)):
        def before(fn=ours):
            y = sel.persist()
            y.compute_chunk_sizes()
            return fn(y)

        # ours returns its result persisted (in memory): timed_ms then syncs the device
        cases = {
            f"dask_compact.{op}(x[x < p])": lambda fn=ours: fn(sel),
            f"compute_chunk_sizes() then {op}": before,
            f"{lib.__module__.split('.')[0]}.{op}(x[x < p].compute())":
                lambda lib=lib: lib(sel.compute()),
            f"floor: {lib.__module__.split('.')[0]}.{op} of the selection in memory":
                lambda lib=lib: lib(whole),
            f"dask_compact.{op}(x[x < p]), x not persisted": lambda fn=ours: fn(selg),
            f"{lib.__module__.split('.')[0]}.{op}(x[x < p].compute()), x not persisted":
                lambda lib=lib: lib(selg.compute()),
        }  # fmt: skip
        times = {name: timed_ms(f, sync_device, reps) for name, f in cases.items()}
        host = xp.asnumpy if gpu else np.asarray
        want = lib(whole) if gpu else lib(whole, kind="stable")  # CuPy's sorts are stable
        np.testing.assert_array_equal(host(ours(sel).compute()), host(want))
        np.testing.assert_array_equal(host(ours(selg).compute()), host(want))
        ref = times[f"dask_compact.{op}(x[x < p])"]
        for name, ms in times.items():
            rows.append(dict(op=op, call=name, n=2**log2n, selected=int(whole.size),
                             chunks=x.numblocks[0], ms=ms, ours_vs=ms / ref))  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="CuPy chunks on device 0")
    ap.add_argument("--log2n", type=int, default=None, help="default 28 (GPU), 24 (CPU)")
    ap.add_argument("--chunk-log2", type=int, default=None, help="default 25 (GPU), 21 (CPU)")
    ap.add_argument("--p", type=float, default=0.5, help="the selected fraction")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    a = ap.parse_args()
    log2n = a.log2n or (28 if a.gpu else 24)
    chunk_log2 = a.chunk_log2 or (25 if a.gpu else 21)
    import dask

    with dask.config.set(scheduler="threads"):
        rows = run(log2n, chunk_log2, a.p, a.gpu, a.reps)
    today, device, sha = label(a.gpu, a.sha)
    text = [f"# Sorting a selection x[x < {a.p}], {device}, {today}, git {sha}", "",
            f"2^{log2n} float32 in {rows[0]['chunks']} chunks, {rows[0]['selected']:,} "
            "selected; threaded scheduler; median ms of the call until its result is in "
            "memory; `ours_vs`: the row's time over `dask_compact`'s (above 1: ours faster).",
            "", "| op | call | ms | time / ours |", "|---|---|---|---|"]  # fmt: skip
    text += [f"| {r['op']} | `{r['call']}` | {r['ms']:.2f} | {r['ours_vs']:.2f} |"
             for r in rows]
    save(a.out, file_stem("sort-selection", today, device, sha, a.gpu), text, rows)
    print("\n".join(text))


if __name__ == "__main__":
    main()
