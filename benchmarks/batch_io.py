"""Batch benchmark: the `dask compact` command as users run it, against the three lines of plain
Dask they would write instead, and against the I/O floors, on the same Zarr input in one run.

Every command is timed whole (a subprocess: imports, cluster start, read, compact, write,
commit), as a user's shell would see it. The input is generated first (float32 uniform in
[0, 1), zarr's default zstd unless --codec none), so every run reads it from the page cache.

* ``cli <mode>``: ``dask compact IN OUT --where "x < P"`` (as ``python -m dask compact``:
  dask's CLI, finding the command by its entry point as the ``dask`` script does) in each
  mode this machine has: threads, local processes, and on a GPU host the LocalCUDACluster
  and the threaded scheduler driving the GPUs, each with GPU (nvCOMP) and CPU decode and
  encode (the default on the threaded scheduler: nvCOMP where installed). ``cli default`` is
  the command with no mode flag;
  ``cli default, dask-compact script`` the same through the ``dask-compact`` script.
* ``plain dask threads|cluster``: ``y = x[x < P]; y.compute_chunk_sizes();
  y.rechunk(C).to_zarr(OUT)`` on the threaded scheduler and on a LocalCluster.
* floors: ``read`` decodes every input chunk once (zarr's reads in a thread pool and in a
  process pool, and our chunk-file reader in a thread pool, on the CPU and on a GPU host with
  nvCOMP: the fastest counts); ``write`` encodes and writes the expected output bytes as a
  Zarr array (thread pool; on a GPU host also encoded by nvCOMP from device memory: the
  fastest counts).

    python benchmarks/batch_io.py --log2n 31 --chunk-log2 25 --p 0.5 --out DIR

Prints a table of wall times with ratios to plain Dask (threads) and to the sum of the floors,
and saves it (markdown, JSON) and a bar chart (PNG) under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

PY = [sys.executable, "-P"] if sys.version_info >= (3, 11) else [sys.executable]
# The command users type, `dask compact`, through dask's own CLI (its plugin discovery included)
CLI = [*PY, "-m", "dask", "compact"]
# The same command as the `dask-compact` script runs it: without dask's CLI, which imports
# every dask CLI plugin installed (distributed's, dask-cuda's) before it runs one
SCRIPT = [*PY, "-m", "dask_compact"]

PLAIN_DASK = """
import sys, dask, dask.array as da
src, out, p, c, where = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if where == "cluster":
    from distributed import Client, LocalCluster
    cluster = LocalCluster(dashboard_address=":0"); client = Client(cluster)
else:
    dask.config.set(scheduler="threads")
x = da.from_zarr(src)
y = x[x < p]
y.compute_chunk_sizes()
y.rechunk(c).to_zarr(out)
"""


def gpu_host() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 -- no CuPy or no driver
        return False


def sha_and_device(sha: str | None) -> tuple[str, str]:
    """The commit measured (``sha``, else git's HEAD) and the machine's GPUs ("cpu" if none),
    as the tables and file names give them."""
    sha = sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
    if not gpu_host():
        return sha, "cpu"
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return sha, f"{cupy.cuda.runtime.getDeviceCount()}x {name}"


def has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def make_input(path: Path, n: int, chunk: int, codec: str, values: str = "uniform") -> None:
    """The input: float32 in [0, 1), ``uniform`` (zstd keeps ~89% of its bytes: its decode
    is about a copy) or ``quantized`` to steps of 1/256, as an 8-bit sensor's readings (zstd
    keeps ~40%: its decode is real work)."""
    import zarr

    kw = {} if codec == "zstd" else {"compressors": None}
    z = zarr.create_array(store=str(path), shape=(n,), dtype=np.float32, chunks=(chunk,), **kw)

    def fill(k: int) -> None:
        rng = np.random.default_rng(k)
        lo = k * chunk
        v = rng.random(min(chunk, n - lo), dtype=np.float32)
        if values == "quantized":
            v = np.floor(v * 256, out=v) / np.float32(256)
        z[lo : min(n, lo + chunk)] = v

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(fill, range(-(-n // chunk))))


CMD_TIMEOUT: float | None = None  # --cmd-timeout
# The floors that run on a GPU host, by their keys in read_floor / write_floor (their rows are
# "read floor (KEY)" and "write floor (KEY)"; --skip and --skip-re name the rows)
GPU_DECODE = "chunk files threads, GPU decode"
GPU_ENCODE = "chunk files threads, GPU encode from device memory"


ENV_FLAG = re.compile(r"[A-Z_][A-Z0-9_]*=")  # an extra mode's VAR=VALUE: its environment


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=CMD_TIMEOUT,
                           env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{' '.join(cmd)} gave up after {CMD_TIMEOUT} s") from None
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return wall, r.stdout


def read_floor(src: Path, n: int, chunk: int, skip: set[str]) -> dict[str, float]:
    """Seconds to read and decode every chunk, each way this machine has (a way whose row name
    is in ``skip`` is not run: the GPU decode of a large input takes minutes). The GPU decode
    reads the job's task blocks, the others one chunk a read."""
    import zarr

    from dask_compact.batch.reader import chunk_files_reader

    blocks = [(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]
    z = zarr.open_array(str(src), mode="r")
    out = {}
    t = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda b: z[b[0] : b[1]].sum(dtype=np.float64) * 0, blocks))
    out["zarr threads"] = time.perf_counter() - t
    t = time.perf_counter()
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(_read_block, [str(src)] * len(blocks), blocks))
    out["zarr processes"] = time.perf_counter() - t
    reader, why = chunk_files_reader(z, str(src), "", False)
    if reader is not None:
        from dask_compact.batch.host_buffers import thread_host

        t = time.perf_counter()
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda b: reader.read(*b).sum(dtype=np.float64) * 0, blocks))
        out["chunk files threads"] = time.perf_counter() - t
        # each thread decoding into one reused buffer, as the job's tasks do
        t = time.perf_counter()
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda b: reader.read(
                *b, out=thread_host((b[1] - b[0],), z.dtype)).sum(dtype=np.float64) * 0, blocks))
        out["chunk files threads, reused buffers"] = time.perf_counter() - t
        if gpu_host() and not gpu_zstd_unavailable() and f"read floor ({GPU_DECODE})" not in skip:
            # nvCOMP decoding each chunk on the device (the reader's GPU path, as the job's
            # tasks call it), from a thread pool as large as the job's
            import cupy

            from dask_compact import settings
            from dask_compact.batch.gpu_zstd import decode_threads
            from dask_compact.batch.plan import row_bytes, task_rows

            # The job's tasks read whole chunks, as many as make dask-compact.batch.task-bytes
            # (plan.task_rows); this floor reads the same blocks, as nvCOMP's calls cost ~8 ms
            # each whatever they hold (one H100, 2026-12-05: 2,048 frames of 256 KiB in 0.99 s
            # 16 a call, 0.012 s in one call): one chunk a read measured the calls.
            rows = task_rows(chunk, row_bytes(z.shape, z.dtype), n,
                             int(settings.get("batch.task-bytes")))
            tasks = [(lo, min(n, lo + rows)) for lo in range(0, n, rows)]

            threads = (os.cpu_count() or 1) + decode_threads(cupy.cuda.runtime.getDeviceCount())
            t = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda b: reader.read_device(*b)[:1].get(), tasks))
            out[GPU_DECODE] = time.perf_counter() - t
    return out


def _read_block(src: str, b: tuple[int, int]) -> float:
    import zarr

    return float(zarr.open_array(src, mode="r")[b[0] : b[1]][:1].sum())


def write_floor(dst: Path, values: np.ndarray, chunk: int, codec: str,
                skip: set[str]) -> dict[str, float]:
    """Encode and write ``values`` as a Zarr array: zarr's writes from a thread pool, and (zstd)
    the chunk files encoded by numcodecs and written directly, the same bytes."""
    import zarr

    kw = {} if codec == "zstd" else {"compressors": None}
    out = {}
    blocks = range(0, len(values), chunk)
    t = time.perf_counter()
    z = zarr.create_array(store=str(dst), shape=values.shape, dtype=values.dtype,
                          chunks=(chunk,), **kw)
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda lo: z.__setitem__(slice(lo, lo + chunk), values[lo : lo + chunk]),
                      blocks))
    out["zarr threads"] = time.perf_counter() - t
    shutil.rmtree(dst)
    if codec == "zstd":
        from dask_compact.batch.tasks import write_chunk_file

        t = time.perf_counter()
        zarr.create_array(store=str(dst), shape=values.shape, dtype=values.dtype,
                          chunks=(chunk,))
        os.makedirs(dst / "c", exist_ok=True)
        with ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda lo: write_chunk_file(str(dst), lo // chunk,
                                                      values[lo : lo + chunk], chunk), blocks))
        out["chunk files threads"] = time.perf_counter() - t
        shutil.rmtree(dst)
        # The same through the job's own pool, where the threads left idle by the last chunks
        # help encode them (zstd's multi-threaded encoder, see tasks.zstd_encode)
        from dask_compact.batch.executor import ThreadExecutor

        zarr.create_array(store=str(dst), shape=values.shape, dtype=values.dtype,
                          chunks=(chunk,))
        os.makedirs(dst / "c", exist_ok=True)
        t = time.perf_counter()
        ex = ThreadExecutor(os.cpu_count() or 1)
        futures = [ex.submit(write_chunk_file, str(dst), lo // chunk, values[lo : lo + chunk],
                             chunk) for lo in blocks]
        [f.result() for f in futures]
        out["chunk files, job's pool"] = time.perf_counter() - t
        ex.close()
        shutil.rmtree(dst)
        if gpu_host() and not gpu_zstd_unavailable() and f"write floor ({GPU_ENCODE})" not in skip:
            # The same chunks from device memory (where a GPU compaction leaves them), encoded
            # by nvCOMP and only the frames copied back: the floor of the GPU-encode path.
            import cupy

            from dask_compact.batch.tasks import write_chunk_file_gpu

            dev = cupy.asarray(values)
            cupy.cuda.Device().synchronize()
            zarr.create_array(store=str(dst), shape=values.shape, dtype=values.dtype,
                              chunks=(chunk,))
            os.makedirs(dst / "c", exist_ok=True)
            t = time.perf_counter()
            with ThreadPoolExecutor(os.cpu_count()) as pool:
                list(pool.map(lambda lo: write_chunk_file_gpu(
                    str(dst), lo // chunk, [dev[lo : lo + chunk]], chunk), blocks))
            out[GPU_ENCODE] = time.perf_counter() - t
            del dev
            shutil.rmtree(dst)
    return out


def gpu_zstd_unavailable() -> str:
    from dask_compact.batch.gpu_zstd import unavailable

    return unavailable()


def expected_values(src: Path, p: float) -> np.ndarray:
    import zarr

    z = zarr.open_array(str(src), mode="r")

    def select(lo: int) -> np.ndarray:
        b = z[lo : lo + z.chunks[0]]
        return b[b < p]

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        parts = list(pool.map(select, range(0, z.shape[0], z.chunks[0])))
    return np.concatenate(parts) if parts else np.empty(0, np.float32)


def check_output(path: Path, expect: np.ndarray, name: str = "values") -> None:
    """Same length and equal values in 16 random windows (reading it all would double the
    benchmark's time on large inputs)."""
    import zarr

    node = zarr.open(str(path), mode="r")
    a = node[name] if isinstance(node, zarr.Group) else node
    assert a.shape == expect.shape, (path, a.shape, expect.shape)
    rng = np.random.default_rng(0)
    for lo in rng.integers(0, max(1, len(expect) - 4096), 16):
        np.testing.assert_array_equal(a[lo : lo + 4096], expect[lo : lo + 4096])


def cli_modes(gpu: bool, workers: int | None) -> dict[str, list[str]]:
    w = ["--workers", str(workers)] if workers else []
    modes = {
        "cli default": [],
        "cli default, dask-compact script": [],
        "cli default, dask-compact script, no read-ahead": ["--no-read-ahead"],
        "cli threads (cpu)": ["--local", "threads", "--device", "cpu"],
        "cli processes (cpu)": ["--local", "processes", "--device", "cpu", *w],
    }
    if gpu:
        if has("dask_cuda"):
            modes["cli cuda cluster, gpu decode"] = ["--local", "cuda", "--decode", "gpu",
                                                     "--encode", "cpu"]
            modes["cli cuda cluster, cpu decode"] = ["--local", "cuda", "--decode", "cpu",
                                                     "--encode", "cpu"]
        modes["cli threads+gpu, gpu decode"] = ["--local", "threads", "--device", "gpu",
                                               "--decode", "gpu", "--encode", "cpu"]
        modes["cli threads+gpu, cpu decode"] = ["--local", "threads", "--device", "gpu",
                                               "--decode", "cpu", "--encode", "cpu"]
        modes["cli threads+gpu, cpu decode, gpu encode"] = [
            "--local", "threads", "--device", "gpu", "--decode", "cpu", "--encode", "gpu"]
        modes["cli threads+gpu, gpu decode, gpu encode"] = [
            "--local", "threads", "--device", "gpu", "--decode", "gpu", "--encode", "gpu"]
        if has("dask_cuda"):
            modes["cli cuda cluster, cpu decode, gpu encode"] = [
                "--local", "cuda", "--decode", "cpu", "--encode", "gpu"]
    return modes


def plot_title(n: int, p: float, device: str, date: str, sha: str) -> str:
    return (f"dask compact batch, 2^{n.bit_length() - 1} float32, x < {p}\n{device}, {date}, "
            f"sha {sha}")


def redraw(json_path: Path) -> None:
    """Draw a saved run's chart again from its JSON (its date from the file's name, which
    :func:`main` gives as ``batch-<date>-...``)."""
    j = json.loads(json_path.read_text())
    date = json_path.name[len("batch-"):][:10]
    save_plot(j["rows"], j["n"] * 4, json_path.with_suffix(".png"),
              plot_title(j["n"], j["p"], j["device"], date, j["sha"]))


def save_plot(rows: list[dict], nbytes: int, path: Path, title: str) -> bool:
    """A bar chart of each run's GB/s of input (the start-up runs left out: a 2^16 input's
    GB/s says nothing); False where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [r for r in rows if r["kind"] != "start-up"]
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(bars) + 1.8))
    colors = {"floor": "0.6", "plain dask": "tab:orange", "cli": "tab:blue"}
    names = [r["run"] for r in bars][::-1]
    gbs = [nbytes / 1e9 / r["seconds"] for r in bars][::-1]
    ax.barh(names, gbs, color=[colors[r["kind"]] for r in bars][::-1])
    ax.set_xlabel("GB/s of input (whole command)")
    # The figure's title, not the axes': the run names take the left of the figure, and a
    # title centred over the bars alone ran off its right edge.
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--log2n", type=int, default=28, help="input elements (2^N float32)")
    ap.add_argument("--chunk-log2", type=int, default=24, help="elements per Zarr chunk (2^N)")
    ap.add_argument("--p", type=float, default=0.5, help="selected fraction (x < P)")
    ap.add_argument("--codec", choices=["zstd", "none"], default="zstd")
    ap.add_argument("--values", choices=["uniform", "quantized"], default="uniform",
                    help="uniform float32, or quantized to steps of 1/256 (compressible)")
    ap.add_argument("--workers", type=int, help="workers of the local processes cluster")
    ap.add_argument("--skip", action="append", default=[],
                    help="a run name to skip (repeat the option for several)")
    ap.add_argument("--skip-re", metavar="REGEX",
                    help="skip every run whose name matches (case-insensitive), e.g. gpu.decode")
    ap.add_argument("--cmd-timeout", type=float, default=None, metavar="S",
                    help="give up a timed command after S seconds (reported as failed)")
    ap.add_argument("--extra-mode", action="append", default=[], metavar="NAME=FLAGS",
                    help="another CLI mode to time, e.g. 'script, 8 early threads="
                    "--read-ahead-threads 8' (through the dask-compact script when NAME "
                    "contains 'script', else through dask compact); FLAGS of the form "
                    "VAR=VALUE set an environment variable for that mode's command, e.g. "
                    "DASK_DASK_COMPACT__BATCH__GPU_ENCODE_BACKLOG=-1 (a dask config value)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the CLI modes this many times, in turn (rows of later rounds "
                    "are named '... (round K)'): same-run A/B of modes")
    ap.add_argument("--work", help="directory for the data (default: a temporary one)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    ap.add_argument("--sha", help="the commit measured (default: git rev-parse HEAD)")
    args = ap.parse_args()

    n, chunk, p = 1 << args.log2n, 1 << args.chunk_log2, args.p
    work = Path(args.work or tempfile.mkdtemp(prefix="batch_io_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "in.zarr"
    gpu = gpu_host()
    sha, device = sha_and_device(args.sha)
    print(f"# batch_io: 2^{args.log2n} float32 ({n * 4 / 2**30:.2f} GiB), chunks 2^"
          f"{args.chunk_log2}, codec {args.codec}, x < {p}; {os.cpu_count()} cores, {device}, "
          f"sha {sha}", flush=True)

    t = time.perf_counter()
    make_input(src, n, chunk, args.codec, args.values)
    print(f"input written in {time.perf_counter() - t:.1f} s", flush=True)
    expect = expected_values(src, p)
    names = [*cli_modes(gpu, args.workers), "plain dask threads", "plain dask cluster",
             f"read floor ({GPU_DECODE})", f"write floor ({GPU_ENCODE})"]
    skip = set(args.skip) | {m for m in names
                             if args.skip_re and re.search(args.skip_re, m, re.IGNORECASE)}
    global CMD_TIMEOUT
    CMD_TIMEOUT = args.cmd_timeout
    rows: list[dict] = []

    def record(name: str, seconds: float, kind: str, extra: dict | None = None) -> None:
        rows.append({"run": name, "seconds": seconds, "kind": kind, **(extra or {})})
        print(f"{name:34s} {seconds:8.2f} s", flush=True)

    # floors
    floors = read_floor(src, n, chunk, skip)
    for k, v in floors.items():
        record(f"read floor ({k})", v, "floor")
    writes = write_floor(work / "floor_out.zarr", expect, chunk, args.codec, skip)
    for k, v in writes.items():
        record(f"write floor ({k})", v, "floor")
    wf = min(writes.values())

    # plain Dask
    for where in ("threads", "cluster"):
        name = f"plain dask {where}"
        if name in skip:
            continue
        out = work / f"dask_{where}.zarr"
        try:
            sec, _ = timed([*PY, "-c", PLAIN_DASK, str(src), str(out), str(p), str(chunk),
                            where])
        except RuntimeError as e:  # reported as failed; the runs after it still run
            print(f"{name}: FAILED\n{e}", flush=True)
            rows.append({"run": name, "seconds": float("nan"), "kind": "plain dask",
                         "error": str(e)})
            shutil.rmtree(out, ignore_errors=True)
            continue
        check_output(out, expect)
        shutil.rmtree(out)
        record(name, sec, "plain dask")

    # the CLI; first an untimed run on a small input, so that the predicate's compiled loop
    # (and GPU kernel) is in the on-disk cache as on any run but a user's very first
    small = work / "warm.zarr"
    make_input(small, 1 << 16, 1 << 14, args.codec)
    for flags in ([], ["--local", "threads", "--device", "gpu"]) if gpu else ([],):
        timed([*CLI, str(small), str(work / "warm_out.zarr"), "--where",
               f"x < {p}", "--overwrite", *flags])
    # The fixed cost of a command (interpreter, imports, CUDA's start, the output group and its
    # commit) on an input of 2^16 elements, where reading and writing take nothing.
    shutil.rmtree(work / "warm_out.zarr", ignore_errors=True)
    sec, _ = timed([*CLI, str(small), str(work / "warm_out.zarr"),
                    "--where", f"x < {p}"])
    record("cli default, 2^16 elements (start-up)", sec, "start-up")
    shutil.rmtree(work / "warm_out.zarr", ignore_errors=True)
    sec, _ = timed([*SCRIPT, str(small), str(work / "warm_out.zarr"), "--where", f"x < {p}"])
    record("cli default, dask-compact script, 2^16 elements (start-up)", sec, "start-up")
    modes = cli_modes(gpu, args.workers)
    for spec in args.extra_mode:
        name, _, flags = spec.partition("=")
        modes[("cli " + name.replace("script", "dask-compact script")).strip()] = flags.split()
    runs = [(name if k == 1 else f"{name} (round {k})", name, flags)
            for k in range(1, args.rounds + 1) for name, flags in modes.items()]
    for label, name, flags in runs:
        if name in skip:
            continue
        out = work / "cli_out.zarr"
        try:
            entry = SCRIPT if "dask-compact script" in name else CLI
            env = dict(f.split("=", 1) for f in flags if ENV_FLAG.match(f))
            sec, stdout = timed([*entry, str(src), str(out), "--where", f"x < {p}", "--json",
                                 *(f for f in flags if not ENV_FLAG.match(f))], env)
        except RuntimeError as e:  # report the mode as failed, go on with the others
            print(f"{label}: FAILED\n{e}", flush=True)
            rows.append({"run": label, "seconds": float("nan"), "kind": "cli", "error": str(e)})
            shutil.rmtree(out, ignore_errors=True)
            continue
        summary = json.loads(stdout)
        check_output(out, expect)
        shutil.rmtree(out)
        ts = summary.get("task_seconds", {})
        print(f"    job {summary['seconds']:.2f} s of {summary.get('process_seconds', 0):.2f} s "
              f"in the process; task s: " + ", ".join(f"{k} {v:.2f}" for k, v in ts.items())
              + f"; {summary.get('threads')} threads, decode {summary.get('decode')}, encode "
              f"{summary.get('encode')} ({summary.get('gpu_encoded')} chunks on the GPU"
              + (f", {summary.get('encode_moved')} moved from its queue, shared by rates "
                 f"{summary.get('encode_rates')}"
                 if summary.get("encode_shared") else "")
              + f"); read ahead {summary.get('read_ahead')}; timeline "
              + ", ".join(f"{k} {v:.2f}" for k, v in (summary.get("timeline") or {}).items()),
              flush=True)
        record(label, sec, "cli", {"scheduler": summary["scheduler"],
                                  "job_seconds": summary["seconds"],
                                  "decode": summary.get("decode"),
                                  "encode": summary.get("encode"),
                                  "gpu_encoded": summary.get("gpu_encoded"),
                                  "encode_shared": summary.get("encode_shared"),
                                  "encode_rates": summary.get("encode_rates"),
                                  "encode_moved": summary.get("encode_moved"),
                                  "task_seconds": summary.get("task_seconds"),
                                  "peak_memory": summary.get("peak_memory"),
                                  "memory_budget": summary.get("memory_budget"),
                                  "read_ahead": summary.get("read_ahead")})

    read_best = min(floors.values())
    floor_sum = read_best + wf
    base = next((r["seconds"] for r in rows if r["run"] == "plain dask threads"), None)
    lines = [
        f"# Batch benchmark {dt.date.today()} — {device}, {os.cpu_count()} cores, "
        f"{platform.python_version()}, sha {sha}{' ' + args.tag if args.tag else ''}",
        "",
        f"Input: 2^{args.log2n} float32 ({n * 4 / 2**30:.2f} GiB) in Zarr chunks of "
        f"2^{args.chunk_log2}, codec {args.codec}, {args.values} values, page cache warm; "
        f"`x < {p}` selects "
        f"{len(expect):,}. Wall time of each whole command (a subprocess), "
        + ("one run each" if args.rounds == 1 else
           f"the CLI modes run {args.rounds} times in turn (rounds), the rest once")
        + "; the compiled predicate cached on disk by an untimed run first (a user's very "
        "first run also compiles it, about a second).",
        "",
        "| run | wall s | vs plain Dask (threads) | vs read+write floor | job s (CLI) | "
        "task s: read / compact / write |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        timed_run = r["kind"] in ("cli", "plain dask")
        vs_dask = f"{base / r['seconds']:.2f}x" if base and timed_run else ""
        vs_floor = f"{r['seconds'] / floor_sum:.2f}" if timed_run else ""
        job = f"{r['job_seconds']:.2f}" if "job_seconds" in r else ""
        ts = r.get("task_seconds") or {}
        split = " / ".join(f"{v:.1f}" for v in ts.values())
        lines.append(f"| {r['run']} | {r['seconds']:.2f} | {vs_dask} | {vs_floor} | {job} | "
                     f"{split} |")
    lines += ["", f"Floor used: best read {read_best:.2f} s + best write {wf:.2f} s = "
              f"{floor_sum:.2f} s. 'vs plain Dask' > 1 is faster than plain Dask; 'vs floor' "
              "is the command's time over the floor (1.0 = at the floor)."]
    table = "\n".join(lines)
    print("\n" + table)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"batch-{dt.date.today()}-{device.replace(' ', '_')}-{sha}{args.tag}"
    (out_dir / f"{stem}.md").write_text(table + "\n")
    (out_dir / f"{stem}.json").write_text(json.dumps(
        {"n": n, "chunk": chunk, "p": p, "codec": args.codec, "values": args.values,
         "device": device, "sha": sha,
         "cores": os.cpu_count(), "rows": rows, "floor": floor_sum}, indent=1, default=str))
    title = plot_title(n, p, device, str(dt.date.today()), sha)
    if not save_plot(rows, n * 4, out_dir / f"{stem}.png", title):
        print("matplotlib not installed: no plot")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
