"""GPU kernel benchmark: our three algorithms against CUB, CuPy, PyTorch and a device copy.

All implementations run in one process on the same device buffers (rotated so that small sizes
do not measure L2), timed with CUDA events after warm-up, median of many repetitions, random
data. Selection is ``x < t`` with t chosen for a fraction p.

    python benchmarks/gpu_kernels.py --peer-lib build/cub_peer.so --out results/
    (build the peer: nvcc -O3 -arch=sm_90 -std=c++17 -shared -Xcompiler -fPIC \
         -o build/cub_peer.so benchmarks/peers/cub_peer.cu)

Writes ``gpu_kernels.csv`` (every measurement), ``summary.md`` (2^28 tables with ratios) and
PNG plots to --out. Effective GB/s counts the bytes a compaction must move: the input read
once plus the output written (values: p*n*itemsize, indices: p*n*8); the copy counts 2*n*itemsize.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import EventTimer

from dask_compact.backends import cupy_backend as cb
from dask_compact.backends import cupy_tuning
from dask_compact.predicate.core import Predicate
from dask_compact.predicate.expr import Call, Param, Var

try:
    import torch
except Exception:  # torch is optional
    torch = None

OURS = ("single-pass", "three-pass", "hybrid")
# compact_into runs: impl name stem -> (algorithm, single-pass look-back schedule)
INTO = {
    "single-pass": ("single-pass", "early"),
    "single-pass-classic": ("single-pass", "classic"),
    "three-pass": ("three-pass", None),
    "hybrid": ("hybrid", None),
}
# exact-size path (compact(): count, read it, allocate, compact): name -> (algorithm, output,
# single-pass exact mode, look-back schedule)
EXACT = {
    "ours_exact_single-pass_values": ("single-pass", "values", "prefix", None),
    "ours_exact_single-pass-lookback-classic_values": (
        "single-pass",
        "values",
        "lookback",
        "classic",
    ),
    "ours_exact_single-pass-lookback-early_values": ("single-pass", "values", "lookback", "early"),
    "ours_exact_hybrid_values": ("hybrid", "values", "prefix", None),
    "ours_exact_single-pass_indices": ("single-pass", "indices", "prefix", None),
    "ours_exact_three-pass_values": ("three-pass", "values", "prefix", None),
    "ours_exact_three-pass_indices": ("three-pass", "indices", "prefix", None),
}


def threshold(dtype: np.dtype, p: float) -> float:
    if dtype.kind == "f":
        return float(p)  # data uniform in [0, 1)
    if dtype == np.int8:
        return float(int(round(p * 256)) - 128)  # data uniform in [-128, 127]
    return float(int(p * 2**31))  # int32 data uniform in [0, 2^31)


def make_input(n: int, dtype: np.dtype, rs: cupy.random.RandomState) -> cupy.ndarray:
    if dtype.kind == "f":
        return rs.random_sample(n, dtype=np.float64 if dtype == np.float64 else np.float32).astype(
            dtype, copy=False
        )
    if dtype == np.int8:
        return rs.randint(-128, 128, size=n, dtype=np.int8)
    return rs.randint(0, 2**31 - 1, size=n, dtype=np.int32)


class CubPeer:
    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        for name in ("float32", "float64", "int32", "int8"):
            for kind in ("select_if", "flagged_idx"):
                f = getattr(self.lib, f"cub_{kind}_{name}")
                f.restype = ctypes.c_int

    def _stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(cupy.cuda.get_current_stream().ptr)

    def temp_bytes(self, dtype: str, n: int) -> int:
        out = ctypes.c_size_t(0)
        vp = ctypes.c_void_p
        r1 = getattr(self.lib, f"cub_select_if_{dtype}")(
            vp(0),
            vp(0),
            vp(0),
            ctypes.c_longlong(n),
            ctypes.c_double(0),
            vp(0),
            ctypes.c_size_t(0),
            ctypes.byref(out),
            self._stream(),
        )
        a = out.value
        r2 = getattr(self.lib, f"cub_flagged_idx_{dtype}")(
            vp(0),
            vp(0),
            vp(0),
            vp(0),
            ctypes.c_longlong(n),
            ctypes.c_double(0),
            vp(0),
            ctypes.c_size_t(0),
            ctypes.byref(out),
            self._stream(),
        )
        assert r1 == 0 and r2 == 0, (r1, r2)
        return max(a, out.value, 1)

    def select_if(self, dtype, a, out, count, t, temp) -> None:
        vp = ctypes.c_void_p
        r = getattr(self.lib, f"cub_select_if_{dtype}")(
            vp(a.data.ptr),
            vp(out.data.ptr),
            vp(count.data.ptr),
            ctypes.c_longlong(a.size),
            ctypes.c_double(t),
            vp(temp.data.ptr),
            ctypes.c_size_t(temp.nbytes),
            None,
            self._stream(),
        )
        assert r == 0, r

    def flagged_idx(self, dtype, a, flags, out, count, t, temp) -> None:
        vp = ctypes.c_void_p
        r = getattr(self.lib, f"cub_flagged_idx_{dtype}")(
            vp(a.data.ptr),
            vp(flags.data.ptr),
            vp(out.data.ptr),
            vp(count.data.ptr),
            ctypes.c_longlong(a.size),
            ctypes.c_double(t),
            vp(temp.data.ptr),
            ctypes.c_size_t(temp.nbytes),
            None,
            self._stream(),
        )
        assert r == 0, r


def bench_config(
    dtype: np.dtype, log2n: int, ps, peer: CubPeer | None, timer_reps, impls, rows, check=True
):
    n = 2**log2n
    isz = dtype.itemsize
    nbuf = max(1, min(8, -(-(256 * 2**20) // (n * isz))))  # > 5x L2 of input across the rotation
    rs = cupy.random.RandomState(log2n * 131 + isz)
    bufs = [make_input(n, dtype, rs) for _ in range(nbuf)]
    out_v = cupy.empty(n, dtype=dtype)
    out_i = cupy.empty(n, dtype=np.int64)
    count = cupy.zeros(1, dtype=np.uint64)
    flags = cupy.empty(n, dtype=np.uint8) if peer else None
    temp = cupy.empty(peer.temp_bytes(dtype.name, n), dtype=np.uint8) if peer else None
    tbufs = [torch.as_tensor(b, device="cuda") for b in bufs] if torch is not None else None
    reps = timer_reps(n)
    timer = EventTimer(reps)

    def record(impl, p, ms, sel, out_bytes, chk=""):
        read = n * isz
        gbps = (read + out_bytes) / (ms * 1e-3) / 1e9
        rows.append(
            dict(
                impl=impl,
                dtype=dtype.name,
                log2n=log2n,
                p=p,
                ms=round(ms, 5),
                GBps=round(gbps, 1),
                selected=sel,
                check=chk,
            )
        )
        print(
            f"{impl:34s} {dtype.name:8s} 2^{log2n} p={p:<5} {ms:9.4f} ms {gbps:8.1f} GB/s {chk}",
            flush=True,
        )

    if "copy" in impls:
        ms = timer(
            lambda k: cupy.cuda.runtime.memcpyAsync(
                out_v.data.ptr,
                bufs[k].data.ptr,
                n * isz,
                cupy.cuda.runtime.memcpyDeviceToDevice,
                cupy.cuda.get_current_stream().ptr,
            ),
            nbuf,
        )
        record("memcpy_d2d", "-", ms, n, n * isz)

    for p in ps:
        t = threshold(dtype, p)
        kind = "float" if dtype.kind == "f" else "int"
        tval = t if kind == "float" else int(t)
        pred = Predicate(Call("less", (Var(), Param(0, kind))), (tval,), None, "x < t")
        sels = [int(cupy.count_nonzero(b < dtype.type(tval))) for b in bufs]
        sel = sels[0]
        ref_sum = (
            float(cupy.sum(bufs[0][bufs[0] < dtype.type(tval)], dtype=np.float64))
            if check
            else None
        )
        for stem, (alg, var) in INTO.items():
            for output in ("values", "indices"):
                name = f"ours_{stem}_{output}"
                if name not in impls and f"ours_{output}" not in impls:
                    continue
                ov = out_v if output == "values" else None
                oi = out_i if output == "indices" else None
                ms = timer(
                    lambda k: cb.compact_into(bufs[k], pred, ov, oi, algorithm=alg, variant=var),
                    nbuf,
                )
                chk = ""
                if check:
                    c = int(
                        cb.compact_into(bufs[0], pred, ov, oi, algorithm=alg, variant=var).get()[0]
                    )
                    ok = c == sel
                    if ok and output == "values":
                        ok = abs(
                            float(cupy.sum(out_v[:c], dtype=np.float64)) - ref_sum
                        ) <= 1e-6 * max(1.0, abs(ref_sum))
                    if ok and output == "indices" and alg != "hybrid":
                        ok = bool(cupy.all(bufs[0][out_i[:c]] < dtype.type(tval))) and bool(
                            cupy.all(cupy.diff(out_i[:c]) > 0)
                        )
                    chk = "ok" if ok else "WRONG"
                record(name, p, ms, sel, sel * (isz if output == "values" else 8), chk)
        for name, (alg, output, mode, var) in EXACT.items():
            # the exact-size chunk path of map_compact: count, read it, allocate, compact
            if "ours_exact" not in impls and name not in impls:
                continue
            ms = timer(
                lambda k: cb.compact(
                    bufs[k], pred, output, alg != "hybrid", alg, 0, variant=var, exact_mode=mode
                ),
                nbuf,
            )
            chk = ""
            if check:
                got = cb.compact(
                    bufs[0], pred, output, alg != "hybrid", alg, 0, variant=var, exact_mode=mode
                )
                ok = got.size == sel
                if ok and output == "values":
                    ok = abs(float(cupy.sum(got, dtype=np.float64)) - ref_sum) <= 1e-6 * max(
                        1.0, abs(ref_sum)
                    )
                    if alg != "hybrid":
                        ok = ok and bool(cupy.array_equal(got, bufs[0][bufs[0] < dtype.type(tval)]))
                chk = "ok" if ok else "WRONG"
                del got
            record(name, p, ms, sel, sel * (isz if output == "values" else 8), chk)
        if peer is not None and "cub" in impls:
            ms = timer(lambda k: peer.select_if(dtype.name, bufs[k], out_v, count, t, temp), nbuf)
            peer.select_if(dtype.name, bufs[0], out_v, count, t, temp)
            record(
                "cub_select_if_values",
                p,
                ms,
                sel,
                sel * isz,
                "ok" if int(count.get()[0]) == sel else "WRONG",
            )
            ms = timer(
                lambda k: peer.flagged_idx(dtype.name, bufs[k], flags, out_i, count, t, temp), nbuf
            )
            peer.flagged_idx(dtype.name, bufs[0], flags, out_i, count, t, temp)
            record(
                "cub_flags_then_flagged_indices",
                p,
                ms,
                sel,
                sel * 8,
                "ok" if int(count.get()[0]) == sel else "WRONG",
            )
        if "cupy" in impls:
            tt = dtype.type(tval)
            ms = timer(lambda k: bufs[k][bufs[k] < tt], nbuf)
            record("cupy_bool_mask_values", p, ms, sel, sel * isz)
            ms = timer(lambda k: cupy.flatnonzero(bufs[k] < tt), nbuf)
            record("cupy_flatnonzero_indices", p, ms, sel, sel * 8)
        if tbufs is not None and "torch" in impls:
            tt = float(tval) if dtype.kind == "f" else int(tval)
            ms = timer(lambda k: torch.masked_select(tbufs[k], tbufs[k] < tt), nbuf)
            record("torch_masked_select_values", p, ms, sel, sel * isz)
            ms = timer(lambda k: torch.nonzero(tbufs[k] < tt).view(-1), nbuf)
            record("torch_nonzero_indices", p, ms, sel, sel * 8)
    del bufs, tbufs, out_v, out_i, flags, temp
    cupy.get_default_memory_pool().free_all_blocks()
    if torch is not None:
        torch.cuda.empty_cache()


def summarize(rows, out: Path, log2n: int = 28, dtype: str = "float32") -> str:
    sel = [r for r in rows if r["log2n"] == log2n and r["dtype"] == dtype]
    if not sel:
        return ""
    copy = next((r["ms"] for r in sel if r["impl"] == "memcpy_d2d"), None)
    lines = [
        f"### {dtype}, n = 2^{log2n}: time (ms), effective GB/s, speed-up (peer time / ours)",
        "",
    ]
    lines.append("| impl | p | ms | GB/s | x CUB | x CuPy | x torch | % copy GB/s |")
    lines.append("|---|---|---|---|---|---|---|---|")
    copy_gbps = next((r["GBps"] for r in sel if r["impl"] == "memcpy_d2d"), None)
    for r in sel:
        if r["impl"] == "memcpy_d2d":
            lines.append(f"| memcpy_d2d | - | {r['ms']:.4f} | {r['GBps']:.0f} | | | | 100 |")
            continue
        is_idx = "indices" in r["impl"]
        def peer(name: str, p=r["p"]) -> float | None:
            return next((q["ms"] for q in sel if q["impl"] == name and q["p"] == p), None)

        cub = peer("cub_flags_then_flagged_indices" if is_idx else "cub_select_if_values")
        cp = peer("cupy_flatnonzero_indices" if is_idx else "cupy_bool_mask_values")
        th = peer("torch_nonzero_indices" if is_idx else "torch_masked_select_values")
        def f(v: float | None, ms: float = r["ms"]) -> str:
            return f"{v / ms:.2f}" if v else ""

        pc = f"{100 * r['GBps'] / copy_gbps:.0f}" if copy_gbps else ""
        lines.append(
            f"| {r['impl']} | {r['p']} | {r['ms']:.4f} | {r['GBps']:.0f} "
            f"| {f(cub)} | {f(cp)} | {f(th)} | {pc} |"
        )
    if copy:
        lines.append(f"\n(copy of the input: {copy:.4f} ms)")
    return "\n".join(lines) + "\n"


def plots(rows, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print("no plots:", e)
        return
    for dtype in sorted({r["dtype"] for r in rows}):
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.5), sharey=True)
        for ax, p in zip(axes, (0.05, 0.5, 0.95)):
            impls = sorted({r["impl"] for r in rows if r["dtype"] == dtype and r["p"] == p})
            for impl in impls:
                pts = sorted(
                    (r["log2n"], r["GBps"])
                    for r in rows
                    if r["dtype"] == dtype and r["impl"] == impl and r["p"] == p
                )
                if len(pts) > 1:
                    ax.plot(
                        [a for a, _ in pts],
                        [b for _, b in pts],
                        marker="o",
                        label=impl,
                        linestyle="-" if impl.startswith("ours") else "--",
                    )
            cp = sorted(
                (r["log2n"], r["GBps"])
                for r in rows
                if r["dtype"] == dtype and r["impl"] == "memcpy_d2d"
            )
            if cp:
                ax.plot([a for a, _ in cp], [b for _, b in cp], color="k", label="memcpy_d2d")
            ax.set_title(f"{dtype}, p = {p}")
            ax.set_xlabel("log2 n")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("effective GB/s (read + written)")
        axes[-1].legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / f"gpu_kernels_{dtype}.png", dpi=110)
        plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20,22,24,26,28,30")
    ap.add_argument("--dtypes", default="float32,int32,float64,int8")
    ap.add_argument("--ps", default="0.05,0.5,0.95")
    ap.add_argument("--impls", default="copy,ours_values,ours_indices,ours_exact,cub,cupy,torch")
    ap.add_argument("--peer-lib", default=None)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument(
        "--reps", type=int, default=0, help="batches of 4 calls; 0: 25 below 2^26, 10 above"
    )
    ap.add_argument("--tuning", default="",
                    help='JSON {"4": [256, 32], ...}: tile shapes for every algorithm')
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tuning:
        for k, (b, i) in json.loads(args.tuning).items():
            cupy_tuning.override_tuning(int(k), cupy_tuning.Tuning(b, i))
    impls = set(args.impls.split(","))
    peer = CubPeer(args.peer_lib) if args.peer_lib else None
    timer_reps = (lambda n: args.reps) if args.reps else (lambda n: 25 if n < 2**26 else 10)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    dev = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except Exception:
        sha = ""
    meta = dict(
        device=dev,
        date=datetime.date.today().isoformat(),
        git=sha or "uncommitted",
        cupy=cupy.__version__,
        torch=getattr(torch, "__version__", None),
        tuning={f"{alg}:{s}": [t.block, t.items]
                for alg in ("single-pass", "hybrid") for s in (1, 2, 4, 8, 16)
                for t in [cupy_tuning.tuning_for(alg, s)]},
        tag=args.tag,
    )
    print(json.dumps(meta), flush=True)
    rows: list[dict] = []
    t0 = time.time()
    for dt in args.dtypes.split(","):
        for s in map(int, args.sizes.split(",")):
            bench_config(
                np.dtype(dt),
                s,
                [float(p) for p in args.ps.split(",")],
                peer,
                timer_reps,
                impls,
                rows,
            )
    print(f"benchmark took {time.time() - t0:.0f} s", flush=True)
    import csv

    tag = f"_{args.tag}" if args.tag else ""
    with open(out / f"gpu_kernels{tag}.csv", "w", newline="") as f:
        f.write("# " + json.dumps(meta) + "\n")
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    md = [
        f"# GPU kernel benchmark{(' (' + args.tag + ')') if args.tag else ''}",
        "",
        "```",
        json.dumps(meta, indent=1),
        "```",
        "",
    ]
    for dt in args.dtypes.split(","):
        for s in (28, 30, 24):
            md.append(summarize(rows, out, s, dt))
    (out / f"summary{tag}.md").write_text("\n".join(md))
    print(summarize(rows, out, 28, "float32"))
    plots(rows, out)


if __name__ == "__main__":
    sys.exit(main())
