"""Where one eager ``map_compact`` call's time goes on a one-GPU Dask cluster.

A diagnostic (docs/design.md, issue 12's "What is left"), not a peer comparison
(``dask_gpu.py`` is the benchmark). On a ``LocalCUDACluster`` of one worker (``--cpu``: a
``LocalCluster`` of NumPy chunks) holding 2^30 float32 (2^22 with ``--cpu``) in 4 persisted
chunks, it times in each *mode* (a fresh cluster each):

- median ms of ``map_compact`` alone, of ``map_compact(...).persist()`` waited (what
  ``dask_gpu.py`` times), of ``map_blocks(b[b < p]).persist()`` waited, of
  ``client.submit(f).result()``, of one trivial task per chunk persisted and waited, and of
  the same tasks submitted by ``client.map`` over the chunks' futures (no array graph);
- with ``--timeline``, each call's events in ms from its start: the client's (``persist>`` /
  ``persist<`` around phase 1's persist, ``wait<`` when its futures are done, ``rpc>`` /
  ``rpc<`` around the question to the scheduler), the scheduler's (``S:update_graph`` as the
  graph arrives, ``S:processing`` as a task is sent to the worker, ``S:memory``), the
  worker's (``W:executing``, ``W:memory``) and the tasks' compute span (task stream), each
  event's first occurrence.

Modes: ``base`` (Dask as configured), ``unbatched`` (``dask_compact.low_latency(client)``:
every batched stream -- client to scheduler, scheduler to workers and clients, worker to
scheduler -- with its interval at 0, so nothing waits for the next 2-10 ms batch),
``switch`` (the GIL's switch interval at 0.1 ms in the client/scheduler process and the
worker), ``unbatched+switch``.

    python benchmarks/call_timeline.py [--cpu] [--reps 15] [--rounds 2] [--timeline 8]
        [--modes base,unbatched,switch,unbatched+switch] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin


def _ours(key) -> bool:
    k = key[0] if isinstance(key, tuple) else key
    return isinstance(k, str) and k.startswith("compact-")


class TraceScheduler(SchedulerPlugin):
    """Times of the scheduler's events for the calls' phase-1 keys."""

    name = "call-timeline-trace"

    def __init__(self) -> None:
        self.events: list = []

    def update_graph(self, scheduler, *, tasks=(), **kw) -> None:
        if any(_ours(k) for k in tasks):
            self.events.append(("S:update_graph", time.time()))

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if _ours(key):
            self.events.append((f"S:{finish}", time.time()))


class TraceWorker(WorkerPlugin):
    """Times of the worker's transitions of the calls' phase-1 keys."""

    name = "call-timeline-trace"

    def setup(self, worker) -> None:
        self.events: list = []

    def transition(self, key, start, finish, **kw) -> None:
        if _ours(key):
            self.events.append((f"W:{finish}", time.time()))


def _sched_events(dask_scheduler=None) -> list:
    p = dask_scheduler.plugins[TraceScheduler.name]
    ev, p.events = p.events, []
    return ev


def _worker_events(dask_worker=None) -> list:
    p = dask_worker.plugins[TraceWorker.name]
    ev, p.events = p.events, []
    return ev


def _switch(v: float) -> None:
    sys.setswitchinterval(v)


def _one() -> int:
    return 1


def _head(b, k: float):
    return b[:1]


def run_mode(mode: str, args) -> tuple[dict, list[str]]:
    import dask.array as da
    import distributed
    from dask.core import flatten
    from distributed import Client, wait

    import dask_compact
    from dask_compact import graph

    if args.cpu:
        from distributed import LocalCluster

        cluster = LocalCluster(n_workers=1, threads_per_worker=4, dashboard_address=None)
        n = 2**22
    else:
        import cupy
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=1, threads_per_worker=4)
        n = 2**30
    marks: list = []

    def mark(what: str) -> None:
        marks.append((what, time.time()))

    real_persist, real_wait = graph.client_stream.persist, distributed.wait

    def persist(*a, **k):
        mark("persist>")
        r = real_persist(*a, **k)
        mark("persist<")
        return r

    def traced_wait(*a, **k):
        r = real_wait(*a, **k)
        mark("wait<")
        return r

    lines: list[str] = []
    with cluster, Client(cluster) as client:
        if args.cpu:
            x = da.random.random(n, chunks=n // 4).astype(np.float32)
        else:
            rs = da.random.RandomState(RandomState=cupy.random.RandomState)
            x = rs.random_sample(size=n, chunks=n // 4, dtype=np.float32)
        x = x.persist()
        wait(x)
        if "unbatched" in mode:
            dask_compact.low_latency(client)
        if "switch" in mode:
            sys.setswitchinterval(1e-4)
            client.run(_switch, 1e-4)

        def mc_persist(p):
            wait(x.map_compact(lambda v: v < p).persist())

        def mc(p):
            x.map_compact(lambda v: v < p)

        def mb_persist(p):
            meta = x._meta[:0]
            wait(x.map_blocks(lambda b: b[b < p], chunks=((np.nan,) * x.numblocks[0],),
                              dtype=x.dtype, meta=meta).persist())

        def submit(p):
            client.submit(_one, pure=False).result()

        def trivial(p):
            wait(x.map_blocks(lambda b, k=p: b[:1], chunks=((1,) * x.numblocks[0],),
                              dtype=x.dtype, meta=x._meta).persist())

        blocks = [x.dask[k] for k in flatten(x.__dask_keys__())]

        def trivial_futures(p):
            wait(client.map(_head, blocks, k=p, pure=False))

        res = {}
        for i, (name, fn) in enumerate((("map_compact", mc), ("map_compact+persist", mc_persist),
                                        ("map_blocks+persist", mb_persist), ("submit", submit),
                                        ("trivial task per chunk", trivial),
                                        ("the same by client.map", trivial_futures))):
            ts = []
            for r in range(args.reps + 3):  # 3 warm-up calls
                p = 0.5 + i * 1e-3 + (r + 1) * 1e-7  # a new threshold: new keys every call
                t0 = time.perf_counter()
                fn(p)
                if r >= 3:
                    ts.append(time.perf_counter() - t0)
            res[name] = 1e3 * statistics.median(ts)
        if args.timeline:
            client.register_plugin(TraceScheduler())
            client.register_plugin(TraceWorker())
            real_ros = client.run_on_scheduler

            def ros(*a, **k):
                mark("rpc>")
                r = real_ros(*a, **k)
                mark("rpc<")
                return r

            graph.client_stream.persist, distributed.wait = persist, traced_wait
            client.run_on_scheduler = ros
            try:
                with distributed.get_task_stream(client) as stream:
                    calls = []
                    for r in range(args.timeline):
                        marks.clear()
                        p = 0.4 + r * 1e-7
                        t0 = time.time()
                        x.map_compact(lambda v: v < p)
                        t1 = time.time()
                        se = real_ros(_sched_events)
                        we = [e for v in client.run(_worker_events).values() for e in v]
                        calls.append((t0, t1, list(marks), se + we))
                        time.sleep(0.05)
            finally:
                graph.client_stream.persist, distributed.wait = real_persist, real_wait
                client.run_on_scheduler = real_ros
            for t0, t1, mk, ev in calls:
                comp = [(ss["start"], ss["stop"]) for rec in stream.data for ss in rec["startstops"]
                        if ss["action"] == "compute" and t0 <= ss["start"] <= t1]
                first: dict = {}
                for w, t in sorted(ev, key=lambda e: e[1]):
                    if t0 <= t <= t1:
                        first.setdefault(w, t)
                parts = [f"{w} {1e3 * (t - t0):.1f}" for w, t in mk]
                if comp:
                    parts.append(f"compute {1e3 * (min(c[0] for c in comp) - t0):.1f}.."
                                 f"{1e3 * (max(c[1] for c in comp) - t0):.1f} ({len(comp)} tasks)")
                parts += [f"{w} {1e3 * (t - t0):.1f}" for w, t in
                          sorted(first.items(), key=lambda e: e[1])]
                lines.append(f"{mode}: call {1e3 * (t1 - t0):.1f} ms: " + ", ".join(parts))
    sys.setswitchinterval(0.005)
    return res, lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="LocalCluster and NumPy chunks")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeline", type=int, default=0, help="calls traced per mode, last round")
    ap.add_argument("--modes", default="base,unbatched,switch,unbatched+switch")
    ap.add_argument("--out", help="directory for call_timeline.md")
    args = ap.parse_args()
    modes = args.modes.split(",")
    rows, lines = [], []
    for rnd in range(args.rounds):
        for mode in modes:
            traced = args.timeline if rnd == args.rounds - 1 else 0
            res, tl = run_mode(mode, argparse.Namespace(**{**vars(args), "timeline": traced}))
            rows.append((rnd, mode, res))
            lines += tl
            print(f"round {rnd} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()),
                  flush=True)
            for line in tl:
                print("  " + line, flush=True)
    if args.out:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        names = list(dict.fromkeys(k for _, _, res in rows for k in res))
        md = [f"# call_timeline.py, {time.strftime('%Y-%m-%d')}, sha {sha}, "
              f"{'CPU LocalCluster' if args.cpu else 'one GPU, LocalCUDACluster'}", "",
              "Median ms per call (" + str(args.reps) + " calls after 3 warm-up calls), "
              "a fresh cluster per mode, modes in turn:", "",
              "| round | mode | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
        md += [f"| {r} | {m} | " + " | ".join(f"{res[k]:.2f}" if k in res else "" for k in names)
               + " |"
               for r, m, res in rows]
        if lines:
            md += ["", "Traced calls (ms from the call's start; first occurrence of each event):",
                   "", "```", *lines, "```"]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "call_timeline.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
