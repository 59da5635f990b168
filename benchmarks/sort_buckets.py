"""How many buckets a CPU cluster's sort should cut by default: ``dask_compact.sort(x,
buckets=b)`` for several ``b`` beside the default and the naive ``np.sort(x.compute())``, on
a LocalCluster of worker processes (and the threaded scheduler), NumPy chunks.

x: 2^k float32 for each ``--sizes`` k, in chunks of 2^``--chunk-log2``, generated on the
workers and persisted; each call's result persisted and waited (median of ``--reps`` after a
warm-up). Also the selection ``x[x < 0.5]`` (unknown chunk sizes), default against one bucket.

    python benchmarks/sort_buckets.py --workers 4 --threads 1 --out benchmarks/results

Writes ``sort-buckets-DATE-cpu-SHA-WxT.{md,csv}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import file_stem, label, random_array, save


def _median_s(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()  # its result is let go at once: the next call computes it again
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def run(sizes: list[int], chunk_log2: int, buckets: list[str], reps: int, scheduler: str,
        client) -> list[dict]:
    import dask
    from distributed import wait

    import dask_compact

    def persisted(y):
        if client is None:
            return y.persist()
        y = y.persist()
        wait(y)
        return y

    rows = []
    with dask.config.set(scheduler=scheduler) if client is None else contextlib.nullcontext():
        for k in sizes:
            x = persisted(random_array(2**k, 2**min(chunk_log2, k), 7, False, f"sb-{k}"))
            want = np.sort(x.compute())
            peer = _median_s(lambda: np.sort(x.compute()), reps)
            rows.append(dict(log2n=k, input="x", call="np.sort(x.compute())", s=peer))
            for b in buckets:
                kw = {} if b == "default" else {"buckets": int(b)}
                got = persisted(dask_compact.sort(x, **kw))
                np.testing.assert_array_equal(got.compute(), want)
                made = got.numblocks[0]
                # released before the timed calls: a call's result is persisted under keys
                # named by its input and buckets, so one still held is found in memory, not
                # computed again (a first version of this script timed that: ~0 s)
                del got
                s = _median_s(lambda kw=kw: persisted(dask_compact.sort(x, **kw)), reps)
                rows.append(dict(log2n=k, input="x", call=f"sort, buckets={b}", s=s,
                                 nbuckets=made))
            sel = x[x < 0.5]
            peer = _median_s(lambda: np.sort(sel.compute()), reps)
            rows.append(dict(log2n=k, input="x[x < 0.5]", call="np.sort(sel.compute())", s=peer))
            for b in ("default", "1"):
                kw = {} if b == "default" else {"buckets": int(b)}
                s = _median_s(lambda kw=kw: persisted(dask_compact.sort(sel, **kw)), reps)
                rows.append(dict(log2n=k, input="x[x < 0.5]", call=f"sort, buckets={b}", s=s))
            print(f"2^{k} done", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[22, 24, 26])
    ap.add_argument("--chunk-log2", type=int, default=21)
    ap.add_argument("--buckets", nargs="+", default=["default", "1", "2", "4", "8", "16"])
    ap.add_argument("--workers", type=int, default=4, help="0: the threaded scheduler")
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    a = ap.parse_args()
    today, device, sha = label(False, a.sha)
    client = cluster = None
    if a.workers:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=a.workers, threads_per_worker=a.threads,
                               processes=True, dashboard_address=None)
        client = Client(cluster)
        where = f"LocalCluster of {a.workers} processes x {a.threads} threads"
    else:
        where = "threaded scheduler"
    try:
        rows = run(a.sizes, a.chunk_log2, a.buckets, a.reps, "threads", client)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    text = [f"# Sort buckets on CPUs, {device}, {today}, git {sha}", "",
            f"{where}; float32 in chunks of 2^{a.chunk_log2}; median s of {a.reps} calls "
            "(result persisted); `vs peer`: the naive line's time over the row's (above 1: "
            "faster than the naive line).", "",
            "| n | input | call | buckets made | s | vs peer |", "|---|---|---|---|---|---|"]
    peer = {}
    for r in rows:
        if r["call"].startswith("np.sort"):
            peer[(r["log2n"], r["input"])] = r["s"]
        ratio = peer[(r["log2n"], r["input"])] / r["s"]
        text.append(f"| 2^{r['log2n']} | {r['input']} | `{r['call']}` | {r.get('nbuckets', '')} "
                    f"| {r['s']:.3f} | {ratio:.2f} |")
    print("\n".join(text))
    tag = f"{a.workers}x{a.threads}" if a.workers else "threads"
    save(a.out, file_stem("sort-buckets", today, device, sha, False) + f"-{tag}", text, rows)
    os._exit(0)  # the cluster's teardown can hang on a loaded machine; nothing is left to write


if __name__ == "__main__":
    main()
