"""Scan benchmark: our scans (``dask_compact.scan_array``) against the peers, in one process on
the same data, time against size with one line per algorithm.

GPU (``--device gpu``, the default): every GPU algorithm (lookback, shared, thread-efficient,
work-efficient, naive) at sizes 2^10 .. 2^28 with non-powers of two between them, float32 into
float32; at 2^28 also int32 into int32 and int32 into int64 (``--cases``). Peers in the same
run: ``cupy.cumsum``, ``torch.cumsum`` (if torch imports), CUB ``DeviceScan::ExclusiveSum``
(``ExclusiveScan`` with an output-typed initial value where the output is wider: CUB's sum
adds in the input type) through the peer library, a device copy of the input (the copy
floor), and where the output is of another width, CuPy's cast of the input into it (the
same bytes as the scan, with no sum). Timing: CUDA events around batches of 4 calls after
warm-up, median of the batches, inputs rotated over buffers that together exceed L2; our
calls are the public call (a new output each call, as a user calls it); CUB writes into a
preallocated output, as CUB is used. Each implementation's result is checked once against a
float64 (or exact integer) reference.

    nvcc -O3 -arch=sm_90 -std=c++17 -shared -Xcompiler -fPIC -o /tmp/cub_peer.so \\
        benchmarks/peers/cub_peer.cu
    python benchmarks/scan_bench.py --peer-lib /tmp/cub_peer.so --out benchmarks/results --sha SHA

CPU (``--device cpu``): ``scan_array`` (the sequential loop) against ``np.cumsum`` and a copy
of the input (``np.copyto``), float32 and int32 -> int64, 2^10 .. 2^26, timed on the host.

    python benchmarks/scan_bench.py --device cpu --out benchmarks/results

Writes under --out, with date, device and sha in the names: ``scan-DATE-DEVICE-SHA.md`` (the
time table of every size, and the ratio table at the largest size: peer time / ours, and our
bandwidth as a share of the copy's for the bytes each moves), ``.csv`` (every measurement) and
``.png`` (throughput in elements per second against size, one line per implementation).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import datetime as dt
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import EventTimer

from dask_compact import scan_array

GPU_ALGS = ("lookback", "shared", "thread-efficient", "work-efficient", "naive")
# launches per call of each algorithm at n elements (what dominates small sizes)
LAUNCHES = {
    "lookback": lambda n: 2,  # status memset + the kernel
    "shared": lambda n: 1 + 2 * max(0, math.ceil(math.log(max(n, 1), 512)) - 1),
    "thread-efficient": lambda n: 3 + 2 * max(0, (n - 1).bit_length()),
    "work-efficient": lambda n: 3 + 2 * max(0, (n - 1).bit_length()),
    "naive": lambda n: 1 + max(1, (n - 1).bit_length()),
}


def model_bytes(alg: str, n: int, isz: int, osz: int) -> int:
    """The bytes an algorithm must move through DRAM at least (its passes over the data),
    ignoring caches: the model the ordering of the seed algorithms follows at large sizes."""
    levels = max(1, (n - 1).bit_length())
    m = 1 << levels
    if alg == "lookback":
        return n * (isz + osz)
    if alg == "shared":  # block scans (read in, write out), then the add pass (read + write)
        return n * (isz + osz) + 2 * n * osz
    if alg == "naive":  # every level reads and writes the whole buffer
        return n * (isz + osz) + (levels - 1) * 2 * n * osz + 2 * n * osz
    # Blelloch: pad (read in, write m), up and down sweeps touch m/2^k nodes per level (a
    # 32-byte sector each once the stride passes a sector), finish (read in + buffer, write)
    tree = sum(3 * (m >> (k + 1)) * max(osz, min(32, (1 << k) * osz)) for k in range(levels))
    return n * isz + m * osz + 2 * tree + n * (isz + 2 * osz)


def sizes_default() -> list[int]:
    out = []
    for k in range(10, 29, 2):
        out.append(1 << k)
        if k < 28:
            out.append(int(2 ** (k + 1.3)) | 1)  # a non-power of two (odd) between
    return sorted(out)


# ------------------------------------------------------------------------------ GPU ---------


class CubScan:
    """cub_exclusive_sum_<in>_<out> of benchmarks/peers/cub_peer.cu, loaded with ctypes."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)

    def _fn(self, i: np.dtype, o: np.dtype) -> Any:
        f = getattr(self.lib, f"cub_exclusive_sum_{i.name}_{o.name}", None)
        if f is not None:
            f.restype = ctypes.c_int
        return f

    def available(self, i: np.dtype, o: np.dtype) -> bool:
        return self._fn(i, o) is not None

    def temp_bytes(self, i: np.dtype, o: np.dtype, n: int) -> int:
        import cupy

        out = ctypes.c_size_t(0)
        vp = ctypes.c_void_p
        r = self._fn(i, o)(vp(0), vp(0), ctypes.c_longlong(n), vp(0), ctypes.c_size_t(0),
                           ctypes.byref(out), vp(cupy.cuda.get_current_stream().ptr))
        assert r == 0, r
        return max(1, out.value)

    def __call__(self, a: Any, out: Any, temp: Any) -> None:
        import cupy

        vp = ctypes.c_void_p
        r = self._fn(a.dtype, out.dtype)(
            vp(a.data.ptr), vp(out.data.ptr), ctypes.c_longlong(a.size), vp(temp.data.ptr),
            ctypes.c_size_t(temp.nbytes), None, vp(cupy.cuda.get_current_stream().ptr))
        assert r == 0, r


def _gpu_input(n: int, dtype: np.dtype, seed: int) -> Any:
    import cupy

    rs = cupy.random.RandomState(seed)
    if dtype.kind == "f":
        return rs.standard_normal(n, dtype=dtype)
    info = np.iinfo(dtype)  # within the dtype's range (int8, uint16: refused past it)
    return rs.randint(max(-1000, info.min), min(1000, info.max), size=n, dtype=dtype)


def _gpu_check(got: Any, ref: Any, exclusive: bool) -> str:
    """ok/WRONG against the reference (inclusive, float64 or exact integers)."""
    import cupy

    want = ref if not exclusive else cupy.concatenate([cupy.zeros(1, ref.dtype), ref[:-1]])
    if got.dtype.kind == "f":
        scale = cupy.cumsum(cupy.abs(want)) + 1  # loose: magnitudes of the prefixes
        ok = bool(cupy.all(cupy.abs(got.astype(np.float64) - want) <= 1e-3 * scale))
    else:
        ok = bool(cupy.all(got == want.astype(got.dtype)))
    return "ok" if ok else "WRONG"


def gpu_rows(cases: list[tuple[np.dtype, np.dtype, list[int]]], peer: CubScan | None,
             reps: int, algs: tuple[str, ...]) -> list[dict]:
    import cupy

    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    rows: list[dict] = []
    for idt, odt, sizes in cases:
        for n in sizes:
            isz, osz = idt.itemsize, odt.itemsize
            nbuf = max(1, min(8, -(-(256 * 2**20) // (n * isz))))
            bufs = [_gpu_input(n, idt, 17 * i + n % 1000) for i in range(nbuf)]
            ref = cupy.cumsum(bufs[0].astype(np.float64 if odt.kind == "f" else odt))
            out = cupy.empty(n, dtype=odt)
            r = reps if n < 2**26 else max(3, reps // 2)

            def rec(impl: str, ms: float, nbytes: int, chk: str = "", **extra: Any) -> None:
                row = dict(impl=impl, case=f"{idt.name}->{odt.name}", n=n, ms=round(ms, 5),
                           Gelem_s=round(n / ms / 1e6, 3), GBps=round(nbytes / ms / 1e6, 1),
                           check=chk, **extra)
                rows.append(row)
                print(f"{impl:26s} {row['case']:16s} n={n:>10d} {ms:9.4f} ms "
                      f"{row['GBps']:8.1f} GB/s {chk}", flush=True)

            # the copy floor into a buffer of the input's size (``out`` is smaller where the
            # output is narrower: uint16 into uint8 failed, cudaErrorInvalidValue)
            dst = out if osz >= isz else cupy.empty(n, dtype=idt)
            ms = EventTimer(r)(lambda k: cupy.cuda.runtime.memcpyAsync(
                dst.data.ptr, bufs[k].data.ptr, n * isz, cupy.cuda.runtime.memcpyDeviceToDevice,
                cupy.cuda.get_current_stream().ptr), nbuf)
            rec("copy", ms, 2 * n * isz)
            del dst
            if osz != isz:
                # the same bytes as the scan (n input read, n outputs written) with no sum:
                # CuPy's elementwise cast into the preallocated output, the floor of a
                # scan into another width where the copy's 1:1 bytes are not
                ms = EventTimer(r)(lambda k: cupy.copyto(out, bufs[k], casting="unsafe"), nbuf)
                rec("cast_copy", ms, n * (isz + osz))
            for alg in algs:
                reps_a = r if alg in ("lookback", "shared") or n <= 2**22 else max(3, r // 3)
                ms = EventTimer(reps_a)(lambda k, alg=alg: scan_array(
                    bufs[k], exclusive=True, algorithm=alg, dtype=odt), nbuf)
                got = scan_array(bufs[0], exclusive=True, algorithm=alg, dtype=odt)
                rec(f"ours_{alg}", ms, n * (isz + osz), _gpu_check(got, ref, True),
                    launches=LAUNCHES[alg](n), model_bytes=model_bytes(alg, n, isz, osz))
                del got
            if peer is not None and peer.available(idt, odt):
                temp = cupy.empty(peer.temp_bytes(idt, odt, n), dtype=np.uint8)
                ms = EventTimer(r)(lambda k: peer(bufs[k], out, temp), nbuf)
                peer(bufs[0], out, temp)
                rec("cub_exclusive_sum", ms, n * (isz + osz), _gpu_check(out, ref, True))
                del temp
            ms = EventTimer(r)(lambda k: cupy.cumsum(bufs[k], dtype=odt), nbuf)
            rec("cupy_cumsum", ms, n * (isz + osz),
                _gpu_check(cupy.cumsum(bufs[0], dtype=odt), ref, False))
            if torch is not None:
                tb = [torch.as_tensor(b, device="cuda") for b in bufs]
                tdt = getattr(torch, odt.name)
                ms = EventTimer(r)(lambda k: torch.cumsum(tb[k], 0, dtype=tdt), nbuf)
                got = cupy.asarray(torch.cumsum(tb[0], 0, dtype=tdt))
                rec("torch_cumsum", ms, n * (isz + osz), _gpu_check(got, ref, False))
                del tb, got
            del bufs, ref, out
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


# ------------------------------------------------------------------------------ CPU ---------


def cpu_rows(cases: list[tuple[np.dtype, np.dtype, list[int]]], reps: int) -> list[dict]:
    rows: list[dict] = []
    rng = np.random.default_rng(0)
    for idt, odt, sizes in cases:
        for n in sizes:
            a = (rng.standard_normal(n) * 100).astype(idt) if idt.kind == "f" else \
                rng.integers(-1000, 1000, n, dtype=idt)
            out = np.empty(n, dtype=idt)
            r = reps if n < 2**24 else max(3, reps // 3)

            def timed(fn) -> float:
                fn()
                ts = []
                for _ in range(r):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                return float(np.median(ts)) * 1e3

            isz, osz = idt.itemsize, odt.itemsize
            want = np.cumsum(a, dtype=odt)
            got = scan_array(a, exclusive=False, dtype=odt)
            chk = "ok" if np.allclose(got, want, rtol=1e-4) else "WRONG"
            for impl, fn, nbytes, c in (
                ("copy", lambda: np.copyto(out, a), 2 * n * isz, ""),
                ("ours_sequential", lambda: scan_array(a, exclusive=False, dtype=odt),
                 n * (isz + osz), chk),
                ("numpy_cumsum", lambda: np.cumsum(a, dtype=odt), n * (isz + osz), "ok"),
            ):
                ms = timed(fn)
                rows.append(dict(impl=impl, case=f"{idt.name}->{odt.name}", n=n,
                                 ms=round(ms, 5), Gelem_s=round(n / ms / 1e6, 3),
                                 GBps=round(nbytes / ms / 1e6, 1), check=c))
                print(f"{impl:26s} {idt.name}->{odt.name:8s} n={n:>10d} {ms:9.4f} ms", flush=True)
    return rows


# --------------------------------------------------------------------------- report ---------

PEERS = ("cub_exclusive_sum", "torch_cumsum", "cupy_cumsum", "numpy_cumsum")


def tables(rows: list[dict]) -> list[str]:
    lines: list[str] = []
    for case in dict.fromkeys(r["case"] for r in rows):
        sel = [r for r in rows if r["case"] == case]
        impls = list(dict.fromkeys(r["impl"] for r in sel))
        ns = sorted({r["n"] for r in sel})
        lines += [f"## {case}: ms per call", "", "| n | " + " | ".join(impls) + " |",
                  "|---|" + "---|" * len(impls)]
        for n in ns:
            cells = []
            for impl in impls:
                r = next((q for q in sel if q["n"] == n and q["impl"] == impl), None)
                cells.append("" if r is None else f"{r['ms']:.4f}"
                             + ("" if r["check"] in ("", "ok") else " WRONG"))
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        top = ns[-1]
        at = {r["impl"]: r for r in sel if r["n"] == top}
        copy = at.get("copy")
        peers = [p for p in PEERS if p in at]
        lines += ["", f"### {case}, n = {top}: ratios (peer time / ours), bandwidth", "",
                  "| ours | ms | GB/s (bytes it must move) | % of copy GB/s | launches | "
                  "model bytes / minimum | " + " | ".join(f"x {p}" for p in peers) + " |",
                  "|---|---|---|---|---|---|" + "---|" * len(peers)]
        for impl, r in at.items():
            if not impl.startswith("ours"):
                continue
            pc = f"{100 * r['GBps'] / copy['GBps']:.0f}" if copy else ""
            mb = r.get("model_bytes")
            minimum = top * (np.dtype(case.split("->")[0]).itemsize
                             + np.dtype(case.split("->")[1]).itemsize)
            ratios = " | ".join(f"{at[p]['ms'] / r['ms']:.2f}" for p in peers)
            lines.append(f"| {impl} | {r['ms']:.4f} | {r['GBps']:.0f} | {pc} | "
                         f"{r.get('launches', '')} | "
                         f"{'' if not mb else f'{mb / minimum:.1f}'} | {ratios} |")
        if copy:
            lines.append(f"\n(copy of the input: {copy['ms']:.4f} ms, {copy['GBps']:.0f} GB/s)")
        cast = at.get("cast_copy")
        if cast:
            lines.append(f"(the cast into the output's dtype, no sum, the same bytes as the scan: "
                         f"{cast['ms']:.4f} ms, {cast['GBps']:.0f} GB/s)")
        lines.append("")
    return lines


def plot(rows: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover - matplotlib is optional
        print("no plot:", e)
        return
    cases = list(dict.fromkeys(r["case"] for r in rows))
    multi = [c for c in cases if len({r["n"] for r in rows if r["case"] == c}) > 1] or cases
    fig, axes = plt.subplots(1, len(multi), figsize=(7 * len(multi), 4.8), squeeze=False)
    for ax, case in zip(axes[0], multi):
        for impl in dict.fromkeys(r["impl"] for r in rows if r["case"] == case):
            pts = sorted((r["n"], r["Gelem_s"]) for r in rows
                         if r["case"] == case and r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    label=impl, linestyle="-" if impl.startswith("ours") else "--",
                    color="k" if impl == "copy" else None)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (elements)")
        ax.set_ylabel("G elements / s")
        ax.set_title(f"{case}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--sizes", default="", help="comma-separated n (default: 2^10..2^28 with "
                    "non-powers of two; CPU: up to 2^26)")
    ap.add_argument("--cases", default="", help='comma-separated "in:out[@log2n]"; default '
                    "float32:float32 over the sizes, int32:int32@28, int32:int64@28 (CPU: "
                    "float32:float32, int32:int64 over the sizes)")
    ap.add_argument("--algorithms", default=",".join(GPU_ALGS))
    ap.add_argument("--peer-lib", default=None, help="cub_peer.so (benchmarks/peers/cub_peer.cu)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    args = ap.parse_args()
    sha = args.sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "unknown"
    today = dt.date.today().isoformat()
    sizes = [int(s) for s in args.sizes.split(",") if s] or sizes_default()
    if args.device == "cpu":
        sizes = [s for s in sizes if s <= 2**26] if not args.sizes else sizes
    top = max(sizes)
    if args.cases:
        cases = []
        for c in args.cases.split(","):
            spec, _, at = c.partition("@")
            i, o = spec.split(":")
            cases.append((np.dtype(i), np.dtype(o), [1 << int(at)] if at else sizes))
    elif args.device == "gpu":
        cases = [(np.dtype("float32"), np.dtype("float32"), sizes),
                 (np.dtype("int32"), np.dtype("int32"), [top]),
                 (np.dtype("int32"), np.dtype("int64"), [top])]
    else:
        cases = [(np.dtype("float32"), np.dtype("float32"), sizes),
                 (np.dtype("int32"), np.dtype("int64"), sizes)]
    if args.device == "gpu":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        device = name.decode() if isinstance(name, bytes) else name
        peer = CubScan(args.peer_lib) if args.peer_lib else None
        rows = gpu_rows(cases, peer, args.reps, tuple(args.algorithms.split(",")))
    else:
        device = f"cpu ({platform.machine()}, {len(os.sched_getaffinity(0))} cores)"
        rows = cpu_rows(cases, args.reps)
    head = [f"# scan benchmark, {today}, {device}, git {sha}", "",
            "Exclusive scans (ours, CUB) and inclusive cumsums (CuPy, PyTorch, NumPy): the same "
            "bytes. Ratio = peer time / our time. GB/s counts the input read once and the output "
            "written once (the copy: read and write of the input). `launches` and `model bytes / "
            "minimum` (each algorithm's passes over the data, relative to one read and one "
            "write) are what order the seed algorithms: small sizes pay per launch, large ones "
            "per byte.", ""]
    text = head + tables(rows)
    print("\n".join(text))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        safe = device.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
        stem = f"scan-{today}-{safe if args.device == 'gpu' else 'cpu'}-{sha}"
        (args.out / f"{stem}.md").write_text("\n".join(text) + "\n")
        with open(args.out / f"{stem}.csv", "w", newline="") as fh:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
        plot(rows, args.out / f"{stem}.png", f"scan, {device}, git {sha}")
        print(f"wrote {args.out / stem}.md/.csv/.png")


if __name__ == "__main__":
    main()
