"""Multi-GPU scaling: map_compact on 1, 2, 4 GPUs of one host (dask-cuda, one worker per GPU).

Random float32 data is generated ON the workers and persisted, in one of two layouts:

* ``slabs``: one contiguous slab per worker, as data born on the GPUs by domain decomposition
  (rank k owns the k-th part). Each worker's chunks form one run: one task per GPU.
* ``interleaved``: Dask's own placement of a generated array (chunks handed to whichever worker
  is free), so a run is a chunk or two and there is about one task per chunk.

Cases: strong scaling (a fixed total of 2^S elements on 1, 2, 4 GPUs) and weak scaling (2^W
elements per GPU). Every repetition runs ``map_compact`` with a new threshold (new keys) and
ends when every GPU has finished (a device synchronisation on each worker is part of the time,
so asynchronous kernels are not left out); the peer, ``x[x < p]`` + ``compute_chunk_sizes()`` +
persist, runs on the same cluster and data, timed the same way. Also reported: the GPU floor
(the same chunk function called directly on each worker, no Dask, slowest worker), the Dask
overhead of one call (wall time minus that floor), and Dask's own floor on the same cluster (a
bare ``client.submit(f).result()`` and one trivial task per worker persisted and waited).

    python benchmarks/multi_gpu_scaling.py --strong-log2n 33 34 --weak-log2n 32 --gpus 1 2 4
    python benchmarks/multi_gpu_scaling.py --cpu --strong-log2n 22 --weak-log2n 21 --gpus 1 2

``--cpu`` runs the same protocol on a LocalCluster with NumPy chunks (a smoke test of the
script on machines without a GPU; its numbers say nothing about GPUs). ``--low-latency`` calls
``dask_compact.low_latency(client)`` on each cluster first (the report's protocol then reads
``tcp+low-latency``).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import floor_on_worker, git_sha
from bench_common import random_array as generated
from bench_common import sync_device as _sync_device


def random_array(n: int, chunk: int, seed: int, gpu: bool):
    return generated(n, chunk, seed, gpu, f"random-{n}-{chunk}-{seed}-{gpu}")


def generate(client, n: int, chunk: int, layout: str, seed: int, gpu: bool):
    """``n`` float32 born on the workers, persisted in ``layout`` (see the module docstring)."""
    import dask.array as da
    from distributed import wait

    if layout == "interleaved":
        x = random_array(n, chunk, seed, gpu).persist()
    else:
        workers = sorted(client.nthreads())
        per = -(-n // len(workers) // chunk) * chunk  # whole chunks per slab
        parts = []
        for k, w in enumerate(workers):
            lo, hi = k * per, min(n, (k + 1) * per)
            if hi > lo:
                parts.append(
                    client.persist(random_array(hi - lo, chunk, seed + 1000 * k, gpu), workers=[w])
                )
        x = da.concatenate(parts).persist()
    wait(x)
    return x


def _held(dask_worker=None) -> int:
    return len(dask_worker.data)


def _settle(client, nkeys: int, timeout: float = 30.0) -> None:
    """Wait until the workers hold only the input's chunks: released results are freed
    asynchronously, and the floor must not run out of memory beside them."""
    t0 = time.perf_counter()
    while sum(client.run(_held).values()) > nkeys and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)


def breakdown(client, x, p: float, reps: int) -> dict[str, float]:
    """Where one map_compact call's wall time goes with phase 1 as Dask tasks
    (``dask-compact.direct`` off by the caller; median ms over ``reps``), by timing the steps of
    dask_compact.graph in place: the placement query, building and submitting the
    graph, waiting for the phase-1 tasks, reading the counts, and the device sync after."""
    import dask
    import distributed

    from dask_compact import graph

    spans: dict[str, list[float]] = {}
    names = ("_groups_by_worker", "_held_counts", "_reported_counts")
    saved = {n: getattr(graph, n) for n in names}
    saved_persist, saved_wait = dask.persist, distributed.wait

    def timed(name, f):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t0

        return run

    graph._groups_by_worker = timed("placement query", saved["_groups_by_worker"])
    dask.persist = timed("build+submit", saved_persist)
    graph._held_counts = timed("wait + read counts", saved["_held_counts"])
    graph._reported_counts = timed("wait + read counts", saved["_reported_counts"])
    distributed.wait = timed("wait for tasks", saved_wait)
    try:
        for r in range(reps + 1):
            cur: dict[str, float] = {}
            t = p + 0.01 + r * 1e-7
            t0 = time.perf_counter()
            y = x.map_compact(lambda v, t=t: v < t)
            t1 = time.perf_counter()
            client.run(_sync_device)
            t2 = time.perf_counter()
            cur.setdefault("wait for tasks", 0.0)  # (includes the instant wait on the input)
            cur["read counts (client.run)"] = cur.pop("wait + read counts") - cur["wait for tasks"]
            cur["device sync (client.run)"] = t2 - t1
            cur["total"] = t2 - t0
            cur["rest (client-side graph code)"] = cur["total"] - sum(
                v for k, v in cur.items() if k != "total"
            )
            del y
            if r:
                for k, v in cur.items():
                    spans.setdefault(k, []).append(v)
    finally:
        for n, f in saved.items():
            setattr(graph, n, f)
        dask.persist, distributed.wait = saved_persist, saved_wait
    return {k: 1e3 * statistics.median(v) for k, v in spans.items()}


def _noop(i: int) -> int:
    return i


def dask_floor(client, reps: int) -> dict[str, float]:
    """Dask's own cost on this cluster, timed like our calls (each ends with the same device
    sync on every worker): a bare ``client.submit(f).result()``, and a trivial graph of one
    task per worker persisted and waited (median ms of ``reps``)."""
    from distributed import wait

    workers = sorted(client.nthreads())
    bare, per_worker = [], []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        client.submit(_noop, r, pure=False).result()
        client.run(_sync_device)
        t1 = time.perf_counter()
        futures = [client.submit(_noop, r, workers=[w], pure=False) for w in workers]
        wait(futures)
        client.run(_sync_device)
        t2 = time.perf_counter()
        del futures
        if r:
            bare.append(t1 - t0)
            per_worker.append(t2 - t1)
    return dict(dask_submit_ms=1e3 * statistics.median(bare),
                dask_per_worker_ms=1e3 * statistics.median(per_worker))


def phase1_tasks(y) -> int:
    """Phase-1 tasks behind a map_compact result: none where the workers were asked directly,
    else its own blocks, or, where one task compacted several runs (Dask's placement), the
    group tasks its blocks are taken from (not the anchors they also depend on)."""
    if "-direct-" in y.name:
        return 0
    name = y.name
    if name.endswith("-skipempty"):  # blocks that alias the non-empty ones of the layer below
        (name,) = y.dask.dependencies[name]
    deps = {d for d in y.dask.dependencies.get(name, set()) if "-anchor-" not in d}
    return len(y.dask.layers[next(iter(deps))]) if deps else len(y.dask.layers[name])


def rebalanced(client, x, p: float, reps: int, out_chunk: int) -> dict[str, float]:
    """The rebalanced-output case: ``map_compact(..., chunks=out_chunk)`` (the selection moved
    into uniform chunks, so between workers: where the protocol matters) against
    ``x[x < p]`` + ``compute_chunk_sizes()`` + ``rechunk(out_chunk)`` + persist; median s."""
    from distributed import futures_of, wait

    def ours(t: float):
        y = x.map_compact(lambda v, t=t: v < t, chunks=out_chunk)
        wait(futures_of(y))
        return y

    def peer(t: float):
        z = x[x < t]
        z.compute_chunk_sizes()
        z = z.rechunk(out_chunk).persist()
        wait(z)
        return z

    return dict(rebalanced_s=_median_s(client, x, p, reps, ours),
                peer_rebalanced_s=_median_s(client, x, p, reps, peer))


def used(client, x, p: float, reps: int) -> dict[str, float]:
    """The result used right after the call, as users do: persisted again (nothing runs
    where its chunks are futures already, tasks where they are taken from a larger result
    when used) and summed, against the sum of boolean indexing (which needs no chunk
    sizes); median s."""
    from distributed import wait

    def persisted(t: float):
        y = x.map_compact(lambda v, t=t: v < t).persist()
        wait(y)
        return y

    return dict(
        then_persist_s=_median_s(client, x, p, reps, persisted),
        then_sum_s=_median_s(client, x, p, reps,
                             lambda t: float(x.map_compact(lambda v: v < t).sum().compute())),
        peer_sum_s=_median_s(client, x, p, reps, lambda t: float(x[x < t].sum().compute())),
    )


def _median_s(client, x, p: float, reps: int, call) -> float:
    """Median seconds of ``call(threshold)`` until every GPU is done, over ``reps`` after one
    warm-up, each with a threshold of its own (new keys); the cluster settles after."""
    times = []
    for r in range(reps + 1):
        t0 = time.perf_counter()
        out = call(p + 0.02 + r * 1e-7)
        client.run(_sync_device)
        t1 = time.perf_counter()
        del out
        if r:
            times.append(t1 - t0)
    _settle(client, x.numblocks[0])
    return statistics.median(times)


def measure(client, x, p: float, reps: int) -> dict[str, Any]:
    from dask.core import flatten
    from distributed import wait

    ours, peer, tasks, sizes = [], [], 0, {}
    # All of ours first, then all of the peer's: interleaving them would make each one's
    # allocations fight the other's cached blocks in the CuPy pool near full memory.
    for r in range(reps + 1):
        t = p + r * 1e-7  # a new threshold each time: new keys, nothing reused
        t0 = time.perf_counter()
        y = x.map_compact(lambda v, t=t: v < t)
        client.run(_sync_device)
        t1 = time.perf_counter()
        tasks, sizes[r] = phase1_tasks(y), y.shape[0]
        del y
        if r:  # round 0 compiles the kernels on every worker
            ours.append(t1 - t0)
    _settle(client, x.numblocks[0])
    import dask

    # internal: phase 1 as Dask tasks (the direct path's fallback), the same protocol
    with dask.config.set({"dask-compact.direct": False}):
        as_tasks = _median_s(client, x, p + 3e-5, reps, lambda t: x.map_compact(lambda v: v < t))
    for r in range(reps + 1):
        t = p + r * 1e-7  # ours' thresholds again (new keys each time), sizes compared
        t1 = time.perf_counter()
        z = x[x < t]
        z.compute_chunk_sizes()
        z = z.persist()
        wait(z)
        client.run(_sync_device)
        t2 = time.perf_counter()
        assert z.shape[0] == sizes[r], (z.shape, sizes[r])
        del z
        if r:
            peer.append(t2 - t1)
    keys = list(flatten(x.__dask_keys__()))
    _settle(client, len(keys))
    held = placement(client, x)
    try:
        floors = client.run(floor_on_worker, keys, p, 3)
    except Exception as e:  # noqa: BLE001 -- e.g. out of memory: report the floor as unknown
        print(f"floor not measured: {type(e).__name__}: {str(e)[:200]}", flush=True)
        floors = {"-": float("nan")}
    return dict(
        map_compact_s=statistics.median(ours),
        # the spread, not only the median: a case whose calls split into fast and slow ones
        # (a pool flush, a late release) shows it here
        map_compact_min_s=min(ours),
        map_compact_max_s=max(ours),
        as_tasks_s=as_tasks,
        peer_s=statistics.median(peer),
        floor_s=max(floors.values()),
        phase1_tasks=tasks,
        chunks_per_worker=held,
    )


def placement(client, x) -> str:
    """The input's chunks per worker, most first ("17/16/16/15"): the slowest worker's share
    bounds the efficiency of any call that leaves every chunk where it lies (a worker holding
    17 of 64 chunks on 4 GPUs does 17/16 of a balanced share)."""
    counts: dict[str, int] = {}
    # who_has wants the persisted collection (or futures): given a list of keys it finds none
    for who in client.who_has(x).values():
        for w in who[:1]:  # a chunk held twice is compacted once
            counts[w] = counts.get(w, 0) + 1
    workers = list(client.nthreads())
    return "/".join(str(c) for c in sorted((counts.get(w, 0) for w in workers), reverse=True))


def run_k(
    k: int,
    cases: list[tuple[str, int]],
    chunk: int,
    layouts: list[str],
    reps: int,
    p: float,
    gpu: bool,
    breakdowns: list[dict] | None = None,
    protocol: str = "tcp",
    rebalance: bool = False,
    low_latency: bool = False,
    use: bool = False,
) -> list[dict]:
    from distributed import Client

    import dask_compact

    if gpu:
        from dask_cuda import LocalCUDACluster

        # Spilling off: the peer's temporaries must not be timed as device-to-host copies.
        cluster = LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=list(range(k)),
            dashboard_address=None,
            threads_per_worker=1,
            device_memory_limit=None,
            protocol=protocol,
        )
    else:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=k, threads_per_worker=1, dashboard_address=None)
    rows = []
    with cluster, Client(cluster) as client:
        if low_latency:  # before the floor: Dask's floor is measured the same way
            dask_compact.low_latency(client)
        floor = dask_floor(client, max(reps, 5))
        print(f"Dask's floor on {k} workers: {floor}", flush=True)
        for case, n in cases:
            for layout in layouts:
                x = generate(client, n, chunk, layout, seed=7, gpu=gpu)
                row = dict(
                    case=case, layout=layout, gpus=k, n=n, chunk=chunk, chunks=x.numblocks[0], p=p,
                    **floor,
                )
                try:
                    row.update(measure(client, x, p, reps))
                except Exception as e:  # noqa: BLE001 -- one case failing must not lose the rest
                    print(
                        f"{case} {layout} on {k} GPUs failed: {type(e).__name__}: {e}", flush=True
                    )
                    del x
                    continue
                if use:
                    row.update(used(client, x, p, reps))
                    print("used", {k: row[k] for k in ("then_persist_s", "then_sum_s",
                                                       "peer_sum_s")}, flush=True)
                if rebalance:
                    row.update(rebalanced(client, x, p, reps, chunk))
                    print("rebalanced", {k: row[k] for k in ("rebalanced_s", "peer_rebalanced_s")},
                          flush=True)
                if case.startswith("strong") and breakdowns is not None:
                    import dask

                    with dask.config.set({"dask-compact.direct": False}):  # tasks' steps
                        parts = breakdown(client, x, p, reps)
                    breakdowns.append(dict(case=case, layout=layout, gpus=k, **parts))
                    print("breakdown", breakdowns[-1], flush=True)
                row["GBps_input"] = n * 4 / row["map_compact_s"] / 1e9
                row["overhead_ms"] = 1e3 * (row["map_compact_s"] - row["floor_s"])
                row["speedup_vs_peer"] = row["peer_s"] / row["map_compact_s"]
                rows.append(row)
                print(row, flush=True)
                del x
    return rows


def _efficiency(rows: list[dict]) -> None:
    """throughput_k / (k * throughput_1) within each (case, layout); weak cases grow n with k."""
    base = {(r["case"], r["layout"]): r["GBps_input"] for r in rows if r["gpus"] == 1}
    for r in rows:
        b = base.get((r["case"], r["layout"]))
        r["efficiency"] = r["GBps_input"] / (r["gpus"] * b) if b else float("nan")


def _sha() -> str:
    """The commit measured: GIT_SHA (the GPU host's copy of the tree may carry a stale HEAD),
    else the checkout's."""
    return os.environ.get("GIT_SHA") or git_sha()


def report(
    rows: list[dict],
    out: Path,
    device: str,
    ngpu: int,
    chunk_log2: int,
    p: float,
    breakdowns: list[dict],
    protocol: str = "tcp",
) -> None:
    sha = _sha()
    stamp = f"{dt.date.today().isoformat()}-{ngpu}x{device.replace(' ', '_')}-{sha}"
    if protocol != "tcp":
        stamp += f"-{protocol}"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"multi-gpu-{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [
        f"# map_compact scaling, {device}, {dt.date.today()}, git {sha}, float32 in chunks "
        f"of 2^{chunk_log2}, p={p}, protocol {protocol}",
        "",
        "Time = call until every GPU is done (device sync on each worker included). Floor = "
        "the chunk function called on each worker without Dask (slowest worker). Input "
        "chunks per worker: where the layout put them, most first (the slowest worker's "
        "share bounds any call that leaves every chunk where it lies).",
        "",
        "Dask's floor (same cluster, same run, each ending with the same device sync on every "
        "worker): a bare `client.submit(f).result()`, and one trivial task per worker persisted "
        "and waited; 'overhead / floor' is our Dask overhead over the latter.",
        "",
        "| case | layout | GPUs | elements | phase-1 tasks | map_compact ms (min-max) | "
        "input GB/s | "
        "efficiency | GPU floor ms | Dask overhead ms | Dask floor ms: submit / per worker | "
        "overhead / floor | x[x<p]+ccs+persist ms | speed-up | internal: phase 1 as tasks ms | "
        "input chunks per worker |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['layout']} | {r['gpus']} | 2^{int(np.log2(r['n']))} | "
            f"{r['phase1_tasks']} | {1e3 * r['map_compact_s']:.1f} "
            f"({1e3 * r['map_compact_min_s']:.1f}-{1e3 * r['map_compact_max_s']:.1f}) | "
            f"{r['GBps_input']:.3g} | "
            f"{100 * r['efficiency']:.0f}% | {1e3 * r['floor_s']:.1f} | {r['overhead_ms']:.1f} | "
            f"{r['dask_submit_ms']:.1f} / {r['dask_per_worker_ms']:.1f} | "
            f"{r['overhead_ms'] / r['dask_per_worker_ms']:.2f}x | "
            f"{1e3 * r['peer_s']:.1f} | {r['speedup_vs_peer']:.2f}x | "
            f"{1e3 * r['as_tasks_s']:.1f} | {r.get('chunks_per_worker', '')} |"
        )
    if any("then_sum_s" in r for r in rows):
        lines += [
            "",
            "The result used right after the call (each timed until every GPU is done): "
            "persisted again, and summed, against `x[x<p].sum().compute()`:",
            "",
            "| case | layout | GPUs | map_compact ms | + .persist() ms | + .sum().compute() ms | "
            "x[x<p].sum().compute() ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if "then_sum_s" in r:
                lines.append(
                    f"| {r['case']} | {r['layout']} | {r['gpus']} | "
                    f"{1e3 * r['map_compact_s']:.1f} | {1e3 * r['then_persist_s']:.1f} | "
                    f"{1e3 * r['then_sum_s']:.1f} | {1e3 * r['peer_sum_s']:.1f} |"
                )
    if any("rebalanced_s" in r for r in rows):
        lines += [
            "",
            "Rebalanced output (`map_compact(..., chunks=chunk)`: the selection moved into "
            f"uniform chunks, between workers) against `x[x<p]` + `compute_chunk_sizes()` + "
            f"`rechunk(chunk)` + persist, protocol {protocol}:",
            "",
            "| case | layout | GPUs | map_compact(chunks=) ms | peer ms | speed-up |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            if "rebalanced_s" in r:
                lines.append(
                    f"| {r['case']} | {r['layout']} | {r['gpus']} | {1e3 * r['rebalanced_s']:.1f} "
                    f"| {1e3 * r['peer_rebalanced_s']:.1f} | "
                    f"{r['peer_rebalanced_s'] / r['rebalanced_s']:.2f}x |"
                )
    if breakdowns:
        cols = [c for c in breakdowns[0] if c not in ("case", "layout", "gpus")]
        lines += [
            "",
            "Where one call's time goes with phase 1 as Dask tasks (`dask-compact.direct` off; "
            "median ms; `wait for tasks` is the phase-1 tasks from submission to the client "
            "hearing they finished):",
            "",
            "| case | layout | GPUs | " + " | ".join(cols) + " |",
            "|---|---|---|" + "---|" * len(cols),
        ]
        for b in breakdowns:
            lines.append(
                f"| {b['case']} | {b['layout']} | {b['gpus']} | "
                + " | ".join(f"{b[c]:.1f}" for c in cols) + " |"
            )
    (out / f"multi-gpu-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({r["case"] for r in rows})
    fig, axes = plt.subplots(1, len(cases), figsize=(5.5 * len(cases), 4), squeeze=False)
    for ax, case in zip(axes[0], cases):
        for layout, style in (("slabs", "-o"), ("interleaved", "-s")):
            rs = sorted(
                (r for r in rows if r["case"] == case and r["layout"] == layout),
                key=lambda r: r["gpus"],
            )
            if not rs:
                continue
            ks = [r["gpus"] for r in rs]
            ax.plot(ks, [r["GBps_input"] for r in rs], style, label=f"map_compact, {layout}")
            ax.plot(
                ks,
                [r["n"] * 4 / r["peer_s"] / 1e9 for r in rs],
                "--x",
                alpha=0.6,
                label=f"x[x<p]+ccs+persist, {layout}",
            )
            if layout == "slabs":
                ax.plot(
                    ks,
                    [rs[0]["GBps_input"] * k for k in ks],
                    ":",
                    color="gray",
                    label="linear from 1 GPU (slabs)",
                )
        ax.set_xlabel("GPUs (one dask-cuda worker each)")
        ax.set_ylabel("input GB/s")
        ax.set_xticks(sorted({r["gpus"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.set_title(case)
        ax.legend(fontsize=7)
    fig.suptitle(f"map_compact scaling, float32, p={p}, {device}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / f"multi-gpu-{stamp}.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strong-log2n", type=int, nargs="*", default=[33])
    ap.add_argument("--weak-log2n", type=int, nargs="*", default=[32], help="per GPU")
    ap.add_argument("--chunk-log2", type=int, default=28)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument(
        "--layouts", nargs="+", default=["slabs", "interleaved"], choices=["slabs", "interleaved"]
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--p", type=float, default=0.5)
    ap.add_argument("--cpu", action="store_true", help="LocalCluster + NumPy (script smoke test)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--protocol", choices=["tcp", "ucx"], default="tcp",
                    help="the LocalCUDACluster's protocol (ucx: distributed-ucxx, the ucx extra)")
    ap.add_argument("--rebalance", action="store_true",
                    help="also time the rebalanced output (chunks=2^chunk-log2) against its peer")
    ap.add_argument("--low-latency", action="store_true",
                    help="dask_compact.low_latency(client) on each cluster before anything runs")
    ap.add_argument("--use", action="store_true",
                    help="also time the result used right after: persisted again, and summed")
    args = ap.parse_args()
    if args.cpu:
        ngpu, device = max(args.gpus), "CPU-LocalCluster"
    else:
        import cupy

        ngpu = cupy.cuda.runtime.getDeviceCount()
        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows: list[dict] = []
    breakdowns: list[dict] = []
    for k in args.gpus:
        if k > ngpu:
            print(f"skip {k} GPUs: only {ngpu} present", flush=True)
            continue
        cases = [(f"strong 2^{s}", 2**s) for s in args.strong_log2n]
        cases += [(f"weak 2^{w}/GPU", k * 2**w) for w in args.weak_log2n]
        rows += run_k(
            k, cases, 2**args.chunk_log2, args.layouts, args.reps, args.p, not args.cpu, breakdowns,
            args.protocol, args.rebalance, args.low_latency, args.use,
        )
    _efficiency(rows)
    protocol = args.protocol + ("+low-latency" if args.low_latency else "")
    report(rows, args.out, device, ngpu, args.chunk_log2, args.p, breakdowns, protocol)


if __name__ == "__main__":
    main()
