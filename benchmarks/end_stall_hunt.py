"""Run one batch command many times and find where a slow run's time went.

    python -P benchmarks/end_stall_hunt.py --input IN --work DIR --runs 20 [--where EXPR]
        [--dump-after S] [--out DIR] [-- extra dask compact options]

A diagnostic, not a benchmark (docs/design.md, "What is left": an intermittent stall of
1.3-6 s between a job's last write and its end, about one command in twenty on the GPU
hosts). Each run is a fresh `python -m dask_compact IN OUT --json` process; the table gives
its wall time and, from the summary's timeline (seconds since the process started), the
steps after the last piece: the last write, the loop's end (`streamed`), the thread pool
joined, the output committed, the job's end, and the process's exit (the wall time).

A run still going `--dump-after` seconds after it started writes every thread's stack to
its own file every 0.25 s (a watchdog thread in the command's process, plus faulthandler's
own thread in case the interpreter's lock is held): a stalled run shows what it waits on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The command's process: the watchdog, then the command as `python -m dask_compact` runs it.
WRAPPER = r"""
import faulthandler, os, sys, threading, time, runpy
after, path = float(sys.argv[1]), sys.argv[2]
f = open(path, "w")
def watch():
    time.sleep(after)
    while True:
        f.write(f"--- {time.time():.3f}\n"); f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        time.sleep(0.25)
threading.Thread(target=watch, daemon=True, name="stall-watchdog").start()
faulthandler.dump_traceback_later(after + 1.0, repeat=True, file=f)
sys.argv = ["dask_compact", *sys.argv[3:]]
runpy.run_module("dask_compact", run_name="__main__", alter_sys=True)
"""

STEPS = ("last_piece", "last_write", "stream_returned", "pool_emptied", "streamed",
         "threads_joined", "committed", "end")
SAVES = ("manifest_saves", "manifest_save_max_s")  # the loop's waits for its manifest


def one_run(args: argparse.Namespace, k: int, extra: list[str]) -> dict:
    out = Path(args.work) / f"out{k}"
    shutil.rmtree(out, ignore_errors=True)
    dump = Path(args.out) / f"stacks{('-' + args.label) if args.label else ''}-run{k}.txt"
    cmd = [sys.executable, "-P", "-c", WRAPPER, str(args.dump_after), str(dump),
           args.input, str(out), "--where", args.where, "--json", *extra]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    row: dict = {"run": k, "wall": wall, "rc": r.returncode}
    if r.returncode != 0:
        row["error"] = r.stderr.strip().splitlines()[-1:]
        return row
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    tl = summary.get("timeline", {})
    row["job"] = tl.get("job")
    for s in (*STEPS, *SAVES):
        row[s] = tl.get(s)
    row["process_seconds"] = summary.get("process_seconds")
    if dump.exists() and dump.stat().st_size == 0:
        dump.unlink()
    row["stacks"] = dump.name if dump.exists() else ""
    shutil.rmtree(out, ignore_errors=True)
    return row


def fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--work", required=True, help="folder for the outputs (each removed)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--where", default="x < 0.5")
    ap.add_argument("--dump-after", type=float, default=10.0,
                    help="seconds into a run after which its stacks are dumped")
    ap.add_argument("--out", default=".")
    ap.add_argument("--label", default="")
    args, extra = ap.parse_known_args()
    extra = [e for e in extra if e != "--"]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows = [one_run(args, k, extra) for k in range(args.runs)]
    walls = [r["wall"] for r in rows if r["rc"] == 0]
    med = statistics.median(walls) if walls else 0.0
    cols = ["run", "wall", "rc", "job", *STEPS, *SAVES, "stacks"]
    lines = [f"# end-stall hunt {args.label}: {args.runs} runs of `python -m dask_compact "
             f"{args.input} OUT --where {args.where!r} {' '.join(extra)}`", "",
             f"median wall {med:.3f} s; timeline columns in seconds since the process "
             "started; gaps after the last write in the second table", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    gaps = ["run", "wall - median", *(f"{a}->{b}" for a, b in zip(STEPS, STEPS[1:])),
            "end->exit"]
    lines += ["", "| " + " | ".join(gaps) + " |", "|" + "---|" * len(gaps)]
    for r in rows:
        if r["rc"] != 0 or r.get("end") is None:
            continue
        g = [r[b] - r[a] if r.get(a) is not None and r.get(b) is not None else None
             for a, b in zip(STEPS, STEPS[1:])]
        lines.append("| " + " | ".join(fmt(v) for v in [r["run"], r["wall"] - med, *g,
                                                        r["wall"] - r["end"]]) + " |")
    errors = [r for r in rows if r["rc"] != 0]
    for r in errors:
        lines.append(f"\nrun {r['run']} failed (rc {r['rc']}): {r.get('error')}")
    text = "\n".join(lines) + "\n"
    print(text)
    name = f"end-stall-hunt{('-' + args.label) if args.label else ''}.md"
    (Path(args.out) / name).write_text(text)
    if os.environ.get("STALL_HUNT_FAIL_ON_ERROR") and errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
