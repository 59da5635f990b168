"""Distributed sort: dask_compact.sort (and argsort) on a cluster vs the only way Dask offers.

CPU (default): a LocalCluster of ``--workers`` processes (one thread each), 2^``--log2n``
float32 born on the workers and persisted; timed: ``dask_compact.sort(x)`` until its output
is in memory, and the peer ``np.sort(x.compute())`` (gather everything to the client, sort
there), then argsort vs ``np.argsort(x.compute(), kind="stable")``. The output is checked
against the peer's.

GPU (``--gpu``): a dask_cuda.LocalCUDACluster of 1, 2, 4 GPUs (``--gpus``), 2^``--log2n``
float32 PER GPU (weak scaling: 2^32 by default), generated on each GPU in chunks of
2^``--chunk-log2`` and persisted. Timed: ``dask_compact.sort`` until every output chunk is
in memory and every GPU has synchronised. Reported: time, GB/s of input, weak-scaling
efficiency (time on 1 GPU / time on k GPUs), and the peer ``cupy.sort`` of one chunk on one
worker (and the same times the chunks per GPU: the local sort alone, no exchange). The
output is checked on the workers: each chunk sorted, chunk boundaries in order, total size.
``x.compute()`` + sort is not a peer here: 2^32 float32 per GPU does not fit one GPU.
``--protocol tcp ucx`` measures the cluster over each protocol in turn (UCX through
distributed-ucxx, the ``ucx`` extra: GPU-to-GPU transfers of the exchanged pieces).

    python benchmarks/sort_bench.py --out benchmarks/results --sha SHA
    python benchmarks/sort_bench.py --gpu --gpus 1 2 4 --log2n 32 --out benchmarks/results

Writes ``sort-DATE-DEVICE-SHA.{md,csv,png}`` under ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import datetime as dt
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import git_sha
from bench_common import random_array as generated
from bench_common import sync_device as _sync_device


def random_array(n: int, chunk: int, seed: int, gpu: bool):
    """``n`` float32 generated on the workers (each chunk where its task runs), persisted."""
    from distributed import wait

    x = generated(n, chunk, seed, gpu, f"sort-bench-input-{n}-{chunk}-{seed}").persist()
    wait(x)
    return x


def _summary(b) -> Any:
    """(length, sorted?, first, last) of one output chunk (NumPy or CuPy), as a tiny NumPy
    array (the benchmark's data has no NaNs)."""
    if len(b) == 0:
        return np.array([[0, 1, np.nan, np.nan]])
    ok = len(b) < 2 or bool((b[1:] >= b[:-1]).all())
    return np.array([[len(b), float(ok), float(b[0]), float(b[-1])]])


def check_sorted(y, n: int) -> None:
    """On the workers: every chunk sorted, in order across chunks, n elements in all."""
    s = y.map_blocks(_summary, new_axis=1, chunks=((1,) * y.numblocks[0], (4,)), dtype=float,
                     meta=np.empty((0, 4))).compute()  # fmt: skip
    assert int(s[:, 0].sum()) == n, (s[:, 0].sum(), n)
    assert s[:, 1].all(), "a chunk is not sorted"
    assert np.all(s[1:, 2] >= s[:-1, 3]), "chunks out of order"


def _elements(n: int) -> str:
    """``2^k`` for a power of two, else the count (a selection's)."""
    return f"2^{n.bit_length() - 1}" if n and n & (n - 1) == 0 else f"{n:,}"


def _held(dask_worker=None) -> int:
    return len(dask_worker.data)


def _settle(client, nkeys: int, timeout: float = 30.0) -> None:
    """Wait until the workers hold only the input's chunks: released results are freed
    asynchronously, and the next repetition must not run short of memory beside them."""
    t0 = time.perf_counter()
    while sum(client.run(_held).values()) > nkeys and time.perf_counter() - t0 < timeout:
        time.sleep(0.05)


def _time(f, reps: int, client, nkeys: int) -> tuple[float, Any]:
    times, out = [], None
    for r in range(reps + 1):
        out = None
        _settle(client, nkeys)
        t0 = time.perf_counter()
        out = f()
        client.run(_sync_device)
        if r:  # round 0 warms up (imports, CuPy kernels, NumPy's threads)
            times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _sorted_and_held(fn, x, phases: list | None = None):
    """``fn(x)`` until its output is held; with ``phases``, appends the seconds of its three
    steps as the client sees them: local sorts and the sample back (until the splitters are
    computed), the histogram back (until the exchange is planned), exchange and merges."""
    from distributed import wait

    from dask_compact import sort_graph

    marks = [time.perf_counter()]
    saved = sort_graph.splitters, sort_graph.exchange_groups

    def mark(f):
        def call(*a, **k):
            marks.append(time.perf_counter())
            return f(*a, **k)

        return call

    if phases is not None:
        sort_graph.splitters, sort_graph.exchange_groups = map(mark, saved)
    try:
        y = fn(x)
        wait(y)
    finally:
        sort_graph.splitters, sort_graph.exchange_groups = saved
    if phases is not None and len(marks) == 3:
        marks.append(time.perf_counter())
        phases.append(np.diff(marks))
    return y


def run_cpu(log2n: int, chunk_log2: int, workers: int, reps: int) -> list[dict]:
    from distributed import Client, LocalCluster

    import dask_compact

    n = 2**log2n
    rows = []
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        x = random_array(n, 2**chunk_log2, 7, False)
        # a selection's chunk sizes are unknown: sort reads them from its local sorts (until
        # 2026-12-07 it asked for y.compute_chunk_sizes() first, a second run of the graph)
        sel = x[x < 0.5]
        for name, fn, inp, peer, label in (
            ("sort", dask_compact.sort, x, lambda: np.sort(x.compute()), "np.sort(x.compute())"),
            ("argsort", dask_compact.argsort, x, lambda: np.argsort(x.compute(), kind="stable"),
             'np.argsort(x.compute(), kind="stable")'),
            ("sort of x[x < 0.5]", dask_compact.sort, sel, lambda: np.sort(sel.compute()),
             "np.sort(x[x < 0.5].compute())"),
        ):  # fmt: skip
            nk = x.numblocks[0]
            t_ours, y = _time(lambda fn=fn, inp=inp: _sorted_and_held(fn, inp), reps, client, nk)
            if name.startswith("sort"):
                check_sorted(y, sum(y.chunks[0]))
            got, nout = y.compute(), y.numblocks[0]
            del y
            t_peer, want = _time(peer, reps, client, nk)
            np.testing.assert_array_equal(got, want)
            rows.append(dict(op=name, gpus=0, workers=workers, n=len(want), chunk=2**chunk_log2,
                             chunks_in=x.numblocks[0], chunks_out=nout,
                             ours_s=t_ours, peer=label, peer_s=t_peer,
                             speedup=t_peer / t_ours, GBps=n * 4 / t_ours / 1e9))  # fmt: skip
            print(rows[-1], flush=True)
            del got, want
    return rows


def _cupy_sort_chunk(key, reps: int, dask_worker=None) -> float:
    """On a worker: median seconds of cupy.sort of one chunk it holds (synchronised)."""
    import cupy

    a = dask_worker.data[key]
    times = []
    for r in range(reps + 1):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        out = cupy.sort(a)
        cupy.cuda.runtime.deviceSynchronize()
        if r:
            times.append(time.perf_counter() - t0)
        del out
    return statistics.median(times)


def _task_breakdown(client, call) -> None:
    """One more call under distributed's task stream: per kind of task (key prefix), how
    many, their summed compute seconds, and when the first began and the last ended, in
    seconds from the call's start (prints)."""
    from distributed import get_task_stream

    t0 = time.time()
    with get_task_stream(client) as ts:
        y = call()
    t1 = time.time()
    del y
    kinds: dict[str, list] = {}
    for t in ts.data:
        key = t["key"][0] if isinstance(t["key"], tuple) else str(t["key"])
        prefix = "-".join(p for p in key.split("-") if not (len(p) >= 12 and p.isalnum()))
        for s in t["startstops"]:
            if s["action"] != "compute":
                continue
            k = kinds.setdefault(prefix, [0, 0.0, float("inf"), 0.0])
            k[0] += 1
            k[1] += s["stop"] - s["start"]
            k[2], k[3] = min(k[2], s["start"] - t0), max(k[3], s["stop"] - t0)
    print(f"task stream of one call ({t1 - t0:.3f} s): "
          + "; ".join(f"{p}: {n} tasks, {busy:.3f} s computing, {a:.3f}-{b:.3f} s"
                      for p, (n, busy, a, b) in sorted(kinds.items(), key=lambda kv: kv[1][2])),
          flush=True)  # fmt: skip


def _ipc_stats(client) -> dict:
    """The CUDA IPC joins' counts and seconds, summed over the workers."""
    from dask_compact.backends import cuda_ipc

    per = client.run(cuda_ipc.piece_counts).values()
    return {k: sum(p[k] for p in per) for k in next(iter(per))}


def run_gpu(k: int, log2n: int, chunk_log2: int, reps: int, protocol: str = "tcp",
            rmm_pool: str | None = None, exchanges: tuple[str, ...] = ("auto",),
            layout: str = "dask", task_stream: bool = False) -> list[dict]:
    """One row per exchange (``dask-compact.sort.exchange``), each timed on the same cluster
    and data; one worker has no exchange, so 1 GPU gives one row (exchange "-"). ``layout``:
    the input where Dask's own scheduling put it ("dask"), or one slab of 2^log2n per GPU
    ("slabs")."""
    import dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client, futures_of
    from multi_gpu_scaling import generate

    import dask_compact

    n = k * 2**log2n
    used = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split("\n")
    print(f"GPU memory in use before the {k}-GPU cluster starts: {used}", flush=True)
    # protocol "ucx": distributed-ucxx moves the exchanged pieces GPU to GPU (NVLink where the
    # GPUs have it); "tcp" (dask-cuda's default) stages them through host memory and sockets
    cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=list(range(k)), threads_per_worker=1,
                               dashboard_address=None, device_memory_limit=None,
                               protocol=protocol, rmm_pool_size=rmm_pool)  # fmt: skip
    rows = []
    with cluster, Client(cluster) as client:
        if layout == "dask":
            x = random_array(n, 2**chunk_log2, 7, True)
        else:
            x = generate(client, n, 2**chunk_log2, "slabs", 7, True)
        nk = x.numblocks[0]
        held = collections.Counter(ws[0] for ws in client.who_has(futures_of(x)).values())
        print(f"{k} GPUs, layout {layout}: chunks per worker {sorted(held.values())}", flush=True)
        first = futures_of(x)[0]
        holder = client.who_has([first])[first.key][0]
        t_peer = client.run(_cupy_sort_chunk, first.key, reps, workers=[holder])[holder]
        for exchange in exchanges if k > 1 else ("-",):
            phases: list = []
            ipc_before = _ipc_stats(client)
            try:
                with dask.config.set({"dask-compact.sort.exchange":
                                      "auto" if exchange == "-" else exchange}):  # fmt: skip
                    t_ours, y = _time(lambda: _sorted_and_held(dask_compact.sort, x, phases),
                                      reps, client, nk)  # fmt: skip
            except Exception as e:  # noqa: BLE001 -- e.g. "ipc" refused here: keep the rest
                print(f"exchange {exchange} on {k} GPUs failed: {type(e).__name__}: {e}",
                      flush=True)  # fmt: skip
                _settle(client, nk)
                continue
            steps = np.median(phases[1:], axis=0) if len(phases) > 1 else [float("nan")] * 3
            ipc = {k: v - ipc_before[k] for k, v in _ipc_stats(client).items()}
            print(f"{exchange} on {k} GPUs, CUDA IPC joins over all workers and repetitions: "
                  + ", ".join(f"{name} {v:.3f}" for name, v in ipc.items()), flush=True)
            check_sorted(y, n)
            nout = y.numblocks[0]
            del y
            _settle(client, nk)
            if task_stream:
                with dask.config.set({"dask-compact.sort.exchange":
                                      "auto" if exchange == "-" else exchange}):  # fmt: skip
                    _task_breakdown(client, lambda: _sorted_and_held(dask_compact.sort, x))
                _settle(client, nk)
            per_gpu_chunks = x.numblocks[0] / k
            rows.append(dict(
                op="sort", protocol=protocol + (f", RMM pool {rmm_pool}" if rmm_pool else ""),
                exchange=exchange, layout=layout, gpus=k, workers=k, n=n, chunk=2**chunk_log2,
                chunks_in=x.numblocks[0], chunks_out=nout, ours_s=t_ours,
                peer="cupy.sort(one chunk)", peer_s=t_peer,
                local_floor_s=t_peer * per_gpu_chunks, GBps=n * 4 / t_ours / 1e9,
                local_s=steps[0], histogram_s=steps[1], exchange_s=steps[2]))  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def report(rows: list[dict], out: Path, device: str, sha: str, gpu: bool) -> None:
    stamp = f"{dt.date.today().isoformat()}-{device}-{sha}"
    out.mkdir(parents=True, exist_ok=True)
    if gpu:
        base = {(r["op"], r["protocol"]): r["ours_s"] for r in rows if r["gpus"] == 1}
        for r in rows:
            b = base.get((r["op"], r["protocol"]))
            r["weak_efficiency"] = b / r["ours_s"] if b else float("nan")
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / f"sort-{stamp}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# dask_compact.sort, {device}, {dt.date.today()}, git {sha}, "
             f"{platform.machine()}, float32 random", ""]  # fmt: skip
    if gpu:
        lines += [
            "Weak scaling: 2^log2n float32 per GPU; time = call until every output chunk is in "
            "memory and every GPU synchronised. Floor = cupy.sort of one chunk x chunks per "
            "GPU (the local sort alone, no exchange).", "",
            "Steps (median s, as the client sees them): local sorts until the sample is back; "
            "splitters and the histogram back; exchange and merges until held.", "",
            "Exchange: the config dask-compact.sort.exchange (ipc: merges copy their pieces "
            "from the other GPUs over CUDA IPC; worker / bucket: pieces sent by Dask's comm; "
            "auto: ipc where it can run); 1 GPU has none.", "",
            f"Input layout: {rows[0].get('layout', 'dask') if rows else 'dask'} (dask: where "
            "Dask's scheduling put the generated chunks; slabs: 2^log2n on each GPU).", "",
            "| protocol | exchange | GPUs | elements | chunks in/out | sort s | GB/s | "
            "weak efficiency | cupy.sort one chunk ms | local floor s | "
            "steps: local / histogram / exchange s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for r in rows:
            lines.append(
                f"| {r['protocol']} | {r['exchange']} | {r['gpus']} | 2^{int(np.log2(r['n']))} | "
                f"{r['chunks_in']}/{r['chunks_out']}"
                f" | {r['ours_s']:.2f} | {r['GBps']:.2f} | {100 * r['weak_efficiency']:.0f}% | "
                f"{1e3 * r['peer_s']:.1f} | {r['local_floor_s']:.2f} | "
                f"{r['local_s']:.2f} / {r['histogram_s']:.2f} / {r['exchange_s']:.2f} |"
            )
    else:
        lines += [
            "Time = call until the output is in the workers' memory (ours); the peer gathers "
            "the array to the client and sorts it there. Median of the repetitions.", "",
            "| op | workers | elements | chunks in/out | ours s | peer | peer s | speed-up |",
            "|---|---|---|---|---|---|---|---|",
        ]  # fmt: skip
        for r in rows:
            lines.append(
                f"| {r['op']} | {r['workers']} | {_elements(r['n'])} | "
                f"{r['chunks_in']}/{r['chunks_out']} | {r['ours_s']:.3f} | `{r['peer']}` | "
                f"{r['peer_s']:.3f} | {r['speedup']:.2f}x |"
            )
    (out / f"sort-{stamp}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if gpu:
        for proto in dict.fromkeys(r["protocol"] for r in rows):
            one = [r for r in rows if r["protocol"] == proto and r["gpus"] == 1]
            for ex in dict.fromkeys(r["exchange"] for r in rows if r["gpus"] > 1):
                mine = one + [r for r in rows if r["protocol"] == proto and r["exchange"] == ex]
                ax.plot([r["gpus"] for r in mine], [r["ours_s"] for r in mine], "-o",
                        label=f"dask_compact.sort ({proto}, {ex})")
        ks = sorted({r["gpus"] for r in rows})
        floor = {r["gpus"]: r["local_floor_s"] for r in rows}
        ax.plot(ks, [floor[k] for k in ks], "--x", label="local sort floor")
        ax.plot(ks, [min(r["ours_s"] for r in rows if r["gpus"] == ks[0])] * len(ks), ":",
                color="gray", label="ideal weak scaling")
        per = int(np.log2(rows[0]["n"] // rows[0]["gpus"]))
        ax.set_xlabel(f"GPUs (2^{per} float32 each)")
        ax.set_xticks(ks)
    else:
        ops = [r["op"] for r in rows]
        pos = np.arange(len(ops))
        ax.bar(pos - 0.2, [r["ours_s"] for r in rows], 0.4, label="dask_compact")
        ax.bar(pos + 0.2, [r["peer_s"] for r in rows], 0.4, label="NumPy after x.compute()")
        ax.set_xticks(pos, ops)
    ax.set_ylabel("seconds")
    ax.set_title(f"distributed sort, float32, {device}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"sort-{stamp}.png", dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="store_true", help="dask-cuda, CuPy chunks")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--log2n", type=int, default=None,
                    help="elements: 2^log2n (CPU: in all, default 24; GPU: per GPU, default 32)")
    ap.add_argument("--chunk-log2", type=int, default=None,
                    help="chunk size 2^k (default 21 on the CPU, 28 on the GPU)")
    ap.add_argument("--workers", type=int, default=4, help="CPU worker processes")
    ap.add_argument("--protocol", nargs="+", default=["tcp"], choices=["tcp", "ucx"],
                    help="GPU: the LocalCUDACluster's protocol(s), each measured in turn "
                    "(ucx needs distributed-ucxx: the ucx extra)")
    ap.add_argument("--rmm-pool", nargs="+", default=["none"], metavar="SIZE",
                    help="GPU: the workers' RMM pool size(s), each measured in turn ('none': "
                    "no pool; UCX allocates every received buffer with RMM)")
    ap.add_argument("--exchange", nargs="+", default=["auto"],
                    choices=["auto", "ipc", "worker", "bucket"],
                    help="GPU: the exchange(s) timed in turn on each cluster of 2 GPUs or more")
    ap.add_argument("--layout", default="dask", choices=["dask", "slabs"],
                    help="GPU: the input where Dask put it, or one slab per GPU (weak scaling)")
    ap.add_argument("--task-stream", action="store_true",
                    help="GPU: one more call per exchange under the task stream, broken down "
                    "by kind of task")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    args = ap.parse_args()
    sha = args.sha or git_sha()
    if args.gpu:
        import cupy

        ngpu = cupy.cuda.runtime.getDeviceCount()
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode().replace(" ", "_")
        device = f"{ngpu}x{name}"
        rows = []
        for protocol, pool in [(p, r) for p in args.protocol for r in args.rmm_pool]:
            for k in args.gpus:
                if k > ngpu:
                    print(f"skip {k} GPUs: only {ngpu} present", flush=True)
                    continue
                try:
                    rows += run_gpu(k, args.log2n or 32, args.chunk_log2 or 28, args.reps,
                                    protocol, None if pool == "none" else pool,
                                    tuple(args.exchange), args.layout,
                                    args.task_stream)  # fmt: skip
                except Exception as e:  # noqa: BLE001 -- e.g. UCX not usable: keep the rest
                    print(f"{protocol} on {k} GPUs failed: {type(e).__name__}: {e}", flush=True)
    else:
        device = "cpu"
        rows = run_cpu(args.log2n or 24, args.chunk_log2 or 21, args.workers, args.reps)
    report(rows, args.out, device, sha, args.gpu)


if __name__ == "__main__":
    main()
