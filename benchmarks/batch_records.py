"""Batch benchmark on a Zarr group: `dask compact GROUP OUT --where EXPR -o both` as users run
it, against the plain Dask a user would write instead, and against the I/O floors, on the same
particle-like group in one run.

The group holds ``x, y, z, mass`` (float32), ``id`` (int64) and ``pos`` (float32, 3 per row),
each chunked ``2^chunk-log2`` rows with zarr's default zstd; ``--where "mass < P"`` selects a
fraction P of the rows, and every field plus the row indices is written. Every command is a
subprocess timed whole (imports, scheduler, read, compact, write, commit).

* ``cli default``: the command with no mode flag (on a GPU host the threaded scheduler driving
  the GPUs); ``cli cpu threads``: ``--device cpu --local threads``; ``cli processes``:
  ``--device cpu --local processes``.
* ``plain dask``: persist the mask, then every field's ``v[mask]`` and the indices persisted
  together, their chunk sizes computed (from the persisted pieces), rechunked and stored, on
  the threaded scheduler.
* floors: ``read`` decodes every chunk of every field once (our chunk-file reader in a thread
  pool); ``write`` encodes and writes the expected output arrays (chunk files, thread pool).

    python benchmarks/batch_records.py --log2n 26 --chunk-log2 22 --p 0.5 --out DIR

Prints the table (ratios to plain Dask and to the floors' sum) and saves it as markdown and
JSON under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from batch_io import sha_and_device, timed

PY = [sys.executable, "-P"]
CLI = [*PY, "-m", "dask_compact"]
FIELDS = {"x": ("f4", ()), "y": ("f4", ()), "z": ("f4", ()), "mass": ("f4", ()),
          "id": ("i8", ()), "pos": ("f4", (3,))}

PLAIN_DASK = """
import sys, dask, dask.array as da, numpy as np, zarr
src, out, p, c = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
dask.config.set(scheduler="threads")
g = zarr.open_group(src, mode="r")
f = {k: da.from_zarr(a) for k, a in g.arrays()}
m = (f["mass"] < p).persist()
cols = {k: v[m] for k, v in f.items()}
cols["indices"] = da.arange(m.shape[0], chunks=m.chunks)[m]
cols = dict(zip(cols, dask.persist(*cols.values())))
for v in cols.values():
    v.compute_chunk_sizes()
o = zarr.open_group(out, mode="w")
targets = [o.create_array(k, shape=v.shape, dtype=v.dtype, chunks=(c, *v.shape[1:]))
           for k, v in cols.items()]
da.store([v.rechunk((c, *v.shape[1:])) for v in cols.values()], targets, lock=False)
"""


def make_group(path: Path, n: int, chunk: int) -> None:
    import zarr

    g = zarr.open_group(store=str(path), mode="w")
    arrays = {k: g.create_array(k, shape=(n, *tail), dtype=dt, chunks=(chunk, *tail))
              for k, (dt, tail) in FIELDS.items()}

    def fill(k: int) -> None:
        rng = np.random.default_rng(k)
        lo, hi = k * chunk, min(n, (k + 1) * chunk)
        for name, a in arrays.items():
            dt, tail = FIELDS[name]
            if name == "id":
                a[lo:hi] = np.arange(lo, hi, dtype=np.int64) * 7
            else:
                a[lo:hi] = rng.random((hi - lo, *tail), dtype=np.float32)

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(fill, range(-(-n // chunk))))


def expected(src: Path, p: float) -> dict[str, np.ndarray]:
    import zarr

    g = zarr.open_group(str(src), mode="r")
    m = g["mass"][:] < np.float32(p)
    out = {k: a[:][m] for k, a in g.arrays()}
    out["indices"] = np.flatnonzero(m)
    return out


def check(out: Path, expect: dict[str, np.ndarray]) -> None:
    import zarr

    g = zarr.open_group(str(out), mode="r")
    for k, v in expect.items():
        got = g[k][:]
        if got.shape != v.shape or not np.array_equal(got, v):
            raise AssertionError(f"{out}: {k} differs from NumPy's")


def read_floor(src: Path) -> float:
    """Every chunk of every field decoded once (threads, each into its own reused buffer)."""
    import zarr

    from dask_compact.batch.host_buffers import thread_host
    from dask_compact.batch.reader import chunk_files_reader

    g = zarr.open_group(str(src), mode="r")
    work = []
    for name, z in g.arrays():
        reader, why = chunk_files_reader(z, str(src / name), "", False)
        assert reader is not None, why
        c = int(z.chunks[0])
        work += [(reader, lo, min(z.shape[0], lo + c)) for lo in range(0, z.shape[0], c)]
    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda w: w[0].read(w[1], w[2], out=thread_host(
            (w[2] - w[1], *w[0].shape[1:]), w[0].dtype))[:1].sum(), work))
    return time.perf_counter() - t


def write_floor(dst: Path, expect: dict[str, np.ndarray], chunk: int) -> float:
    """The expected output arrays encoded and written as chunk files (threads)."""
    import zarr

    from dask_compact.batch.tasks import write_chunk_file

    g = zarr.open_group(store=str(dst), mode="w")
    work = []
    for name, v in expect.items():
        g.create_array(name, shape=v.shape, dtype=v.dtype, chunks=(chunk, *v.shape[1:]))
        os.makedirs(dst / name / "c", exist_ok=True)
        work += [(str(dst / name), lo // chunk, v[lo : lo + chunk])
                 for lo in range(0, len(v), chunk)]
    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda w: write_chunk_file(w[0], w[1], w[2], chunk), work))
    sec = time.perf_counter() - t
    shutil.rmtree(dst)
    return sec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--log2n", type=int, default=26, help="rows (2^N)")
    ap.add_argument("--chunk-log2", type=int, default=22, help="rows per Zarr chunk (2^N)")
    ap.add_argument("--p", type=float, default=0.5, help="selected fraction (mass < P)")
    ap.add_argument("--work", help="directory for the data (default: a temporary one)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--sha", help="the commit measured (default: git rev-parse HEAD)")
    args = ap.parse_args()

    n, chunk, p = 1 << args.log2n, 1 << args.chunk_log2, args.p
    work = Path(args.work or tempfile.mkdtemp(prefix="batch_records_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "particles.zarr"
    sha, device = sha_and_device(args.sha)
    row_bytes = sum(np.dtype(dt).itemsize * int(np.prod(tail)) for dt, tail in FIELDS.values())
    nbytes = n * row_bytes
    print(f"# batch_records: 2^{args.log2n} rows x {len(FIELDS)} fields ({nbytes / 2**30:.2f} "
          f"GiB), chunks 2^{args.chunk_log2} rows, mass < {p}; {os.cpu_count()} cores, "
          f"{device}, sha {sha}", flush=True)
    t = time.perf_counter()
    make_group(src, n, chunk)
    print(f"input written in {time.perf_counter() - t:.1f} s", flush=True)
    expect = expected(src, p)
    where = f"mass < {p}"
    rows: list[dict] = []

    def record(name: str, seconds: float, kind: str, extra: dict | None = None) -> None:
        rows.append({"run": name, "seconds": seconds, "kind": kind, **(extra or {})})
        print(f"{name:28s} {seconds:8.2f} s", flush=True)

    record("read floor", read_floor(src), "floor")
    record("write floor", write_floor(work / "floor.zarr", expect, chunk), "floor")
    out = work / "dask_out.zarr"
    sec, _ = timed([*PY, "-c", PLAIN_DASK, str(src), str(out), str(p), str(chunk)])
    check(out, expect)
    shutil.rmtree(out)
    record("plain dask threads", sec, "plain dask")
    # an untimed run first: the predicate's compiled loop (and GPU kernels) in the disk cache
    timed([*CLI, str(src), str(work / "warm.zarr"), "-w", where, "-o", "both"])
    shutil.rmtree(work / "warm.zarr")
    modes = {"cli default": [], "cli cpu threads": ["--device", "cpu", "--local", "threads"],
             "cli cpu processes": ["--device", "cpu", "--local", "processes"]}
    for name, flags in modes.items():
        out = work / "cli_out.zarr"
        sec, stdout = timed([*CLI, str(src), str(out), "-w", where, "-o", "both", "--json",
                             "--output-chunks", str(chunk), *flags])
        summary = json.loads(stdout)
        check(out, expect)
        shutil.rmtree(out)
        ts = summary["task_seconds"]
        print(f"    job {summary['seconds']:.2f} s of {summary['process_seconds']:.2f} s; "
              f"task s: " + ", ".join(f"{k} {v:.2f}" for k, v in ts.items())
              + f"; {summary['threads']} threads, gpu {summary['gpu']}, peak in flight "
              f"{summary['peak_reserved'] / 2**30:.2f} GiB of budget "
              f"{summary['memory_budget'] / 2**30:.2f} GiB", flush=True)
        record(name, sec, "cli", {"job_seconds": summary["seconds"], "gpu": summary["gpu"],
                                  "task_seconds": ts, "peak_reserved": summary["peak_reserved"],
                                  "peak_memory": summary["peak_memory"],
                                  "scheduler": summary["scheduler"]})

    floor = sum(r["seconds"] for r in rows if r["kind"] == "floor")
    base = next(r["seconds"] for r in rows if r["run"] == "plain dask threads")
    lines = [
        f"# Batch benchmark, Zarr group {dt.date.today()} — {device}, {os.cpu_count()} cores, "
        f"{platform.python_version()}, sha {sha}{' ' + args.tag if args.tag else ''}",
        "",
        f"Input: 2^{args.log2n} rows of {', '.join(FIELDS)} ({row_bytes} bytes a row, "
        f"{nbytes / 2**30:.2f} GiB), Zarr chunks of 2^{args.chunk_log2} rows, zstd, page cache "
        f"warm; `mass < {p}` selects {len(expect['indices']):,} rows; every field and the "
        "indices written. Wall time of each whole command, one run each.",
        "",
        "| run | wall s | vs plain Dask | vs read+write floor | job s | "
        "task s: read / compact / write |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        timed_run = r["kind"] != "floor"
        vs_dask = f"{base / r['seconds']:.2f}x" if timed_run else ""
        vs_floor = f"{r['seconds'] / floor:.2f}" if timed_run else ""
        job = f"{r['job_seconds']:.2f}" if "job_seconds" in r else ""
        split = " / ".join(f"{v:.1f}" for v in (r.get("task_seconds") or {}).values())
        lines.append(f"| {r['run']} | {r['seconds']:.2f} | {vs_dask} | {vs_floor} | {job} | "
                     f"{split} |")
    lines += ["", f"Floor: read {rows[0]['seconds']:.2f} s + write {rows[1]['seconds']:.2f} s "
              f"= {floor:.2f} s."]
    table = "\n".join(lines)
    print("\n" + table)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"batch-records-{dt.date.today()}-{device.replace(' ', '_')}-{sha}{args.tag}"
    (out_dir / f"{stem}.md").write_text(table + "\n")
    (out_dir / f"{stem}.json").write_text(json.dumps(
        {"n": n, "chunk": chunk, "p": p, "device": device, "sha": sha, "cores": os.cpu_count(),
         "rows": rows, "floor": floor}, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
