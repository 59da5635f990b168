"""Tile-shape sweep of the look-back scan (``scan_array(algorithm="lookback")``, the default):
every (threads per block, rows per warp) of a grid, or the listed shapes (``--shapes``, which
also set the blocks per SM asked of ptxas and the cache hints), per case, beside CUB
``DeviceScan::ExclusiveSum``, ``torch.cumsum`` (where torch imports) and a device copy of the
input, in one process on the same data.

The shape is read per accumulator size from ``cupy_scan_source.TABLE``; this script sets each
candidate with ``override_scan_tuning`` (a new module per shape: NVRTC compiles it once) and
times the public call (a new output per call) with CUDA events, as ``scan_bench.py`` does.
Each shape's result is checked against the reference once.

    python benchmarks/scan_sweep.py --peer-lib /tmp/cub_peer.so [--log2n 20,24,28]
        [--blocks 128,256,512] [--rows 1,2,4,8,16] [--cases int32:int64] [--out DIR]
        [--shapes 128x32x3x0,128x32x3x2]   (threads x rows x min blocks per SM x cache hints)

Prints a table per case (ms, share of the copy's bandwidth for the bytes a scan moves, CUB's
time over ours) and writes it as ``scan-sweep-DATE-DEVICE-SHA.md`` under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
from bench_common import EventTimer
from scan_bench import CubScan, _gpu_check, _gpu_input

from dask_compact import scan_array
from dask_compact.backends.cupy_scan_source import ScanTuning, override_scan_tuning, scan_tuning

CASES = (("float32", "float32"), ("int32", "int32"), ("int32", "int64"))
BLOCKS = (128, 256, 512)
ROWS = (1, 2, 4, 8, 16)


def main() -> None:
    import cupy

    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-lib", default=None)
    ap.add_argument("--log2n", default="28", help="comma-separated sizes, as powers of two")
    ap.add_argument("--blocks", default=",".join(map(str, BLOCKS)))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--cases", default="", help='comma-separated "in:out" (default: '
                    + ", ".join(f"{i}:{o}" for i, o in CASES) + ")")
    ap.add_argument("--shapes", default="", help="comma-separated THREADSxROWSxMINBxCACHE "
                    "(ScanTuning's fields); replaces --blocks and --rows")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sha", default=None)
    args = ap.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    rows_all = [int(r) for r in args.rows.split(",")]
    shapes = ([ScanTuning(*map(int, sh.split("x"))) for sh in args.shapes.split(",")]
              if args.shapes else
              [ScanTuning(b, r) for b in blocks for r in rows_all])
    peer = CubScan(args.peer_lib) if args.peer_lib else None
    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    sha = args.sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "nosha"
    lines = [f"# Look-back scan tile sweep, {dt.date.today()}, {device}, git {sha}", "",
             f"ms per public call (CUDA events, median of {args.reps} "
             "batches of 4); copy% = our bandwidth for the bytes a scan moves (input read, "
             "output written) as a share of the device copy's; x CUB = CUB's time / ours, "
             "x torch = torch.cumsum's time / ours. "
             "The default shape is marked *.", ""]
    cases = [tuple(c.split(":")) for c in args.cases.split(",") if c] or CASES
    for (i, o), log2n in [(c, int(k)) for k in args.log2n.split(",") for c in cases]:
        n = 1 << log2n
        idt, odt = np.dtype(i), np.dtype(o)
        nbuf = max(1, min(8, -(-(256 * 2**20) // (n * idt.itemsize))))
        bufs = [_gpu_input(n, idt, 17 * k + 5) for k in range(nbuf)]
        ref = cupy.cumsum(bufs[0].astype(np.float64 if odt.kind == "f" else odt))
        out = cupy.empty(n, dtype=odt)
        timer = EventTimer(args.reps)
        copy_ms = timer(lambda k: cupy.cuda.runtime.memcpyAsync(
            out.data.ptr, bufs[k].data.ptr, n * idt.itemsize,
            cupy.cuda.runtime.memcpyDeviceToDevice, cupy.cuda.get_current_stream().ptr), nbuf)
        copy_gbps = 2 * n * idt.itemsize / copy_ms / 1e6
        cub_ms = None
        if peer is not None and peer.available(idt, odt):
            temp = cupy.empty(peer.temp_bytes(idt, odt, n), dtype=np.uint8)
            cub_ms = timer(lambda k: peer(bufs[k], out, temp), nbuf)
            del temp
        torch_ms = None
        if torch is not None:
            tb = [torch.as_tensor(b, device="cuda") for b in bufs]
            tdt = getattr(torch, odt.name)
            torch_ms = timer(lambda k: torch.cumsum(tb[k], 0, dtype=tdt), nbuf)
            del tb
        default = scan_tuning(odt, idt)
        lines += [f"## {i} -> {o}, n = 2^{log2n}", "",
                  f"copy {copy_ms:.4f} ms ({copy_gbps:.0f} GB/s); CUB "
                  + (f"{cub_ms:.4f} ms" if cub_ms else "not available") + "; torch.cumsum "
                  + (f"{torch_ms:.4f} ms" if torch_ms else "not available"), "",
                  "| threads | rows | min blocks/SM | cache | ms | copy% | x CUB | x torch "
                  "| check |", "|---|---|---|---|---|---|---|---|---|"]
        for t in shapes:
            block, rows = t.block, t.rows
            override_scan_tuning(odt.itemsize, t)
            try:
                got = scan_array(bufs[0], exclusive=True, dtype=odt)
                chk = _gpu_check(got, ref, True)
                del got
                ms = timer(lambda k: scan_array(bufs[k], exclusive=True, dtype=odt), nbuf)
            except Exception as e:  # noqa: BLE001 -- a shape that does not build is a row
                print(f"{i}->{o} {t}: {type(e).__name__}: {e}", flush=True)
                lines.append(f"| {block} | {rows} | {t.min_blocks} | {t.cache} | - | - | - "
                             f"| - | {type(e).__name__} |")
                continue
            finally:
                override_scan_tuning(odt.itemsize, None)
            pct = n * (idt.itemsize + odt.itemsize) / ms / 1e6 / copy_gbps * 100
            x = f"{cub_ms / ms:.2f}" if cub_ms else "-"
            xt = f"{torch_ms / ms:.2f}" if torch_ms else "-"
            mark = "*" if t == default else ""
            print(f"{i}->{o} 2^{log2n} {block:5d} x {rows:2d} mb {t.min_blocks} "
                  f"c {t.cache}{mark:1s} {ms:8.4f} ms {pct:5.1f}% copy  {x} x CUB "
                  f"{xt} x torch {chk}", flush=True)
            lines.append(f"| {block}{mark} | {rows} | {t.min_blocks} | {t.cache} | {ms:.4f} "
                         f"| {pct:.0f} | {x} | {xt} | {chk} |")
        lines.append("")
        del bufs, ref, out
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"scan-sweep-{dt.date.today()}-{device.replace(' ', '_')}-{sha}.md"
        (args.out / name).write_text(text + "\n")


if __name__ == "__main__":
    main()
