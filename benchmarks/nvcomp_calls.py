"""Where an nvCOMP zstd decode call's time goes (the batch job's GPU decode,
``dask_compact/batch/nvcomp_capi.py``), and whether calls on several streams overlap.

For zstd frames of 64 KiB, 256 KiB and 1 MiB (float32 values: uniform, ~0.89 compressed, or
quantized to 1/256, ~0.38), batches of 1, 16 and 128 frames: the host time of
``nvcompBatchedZstdDecompressGetTempSize`` and of the asynchronous launch, the GPU time of the
call by CUDA events (median of 5 after one warm-up), and ``nvcomp_capi.decode_into``'s wall
time; backend 0 (nvCOMP chooses) and 2 for 16 frames. Then 64 calls of 8 frames of 256 KiB
from 1, 4 and 16 threads, each thread on its own stream. The first frame's output is checked
against ``zstandard``'s. Needs the ``gpu`` extra and ``zstandard``.

    python benchmarks/nvcomp_calls.py OUT.jsonl [--md OUT.md]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
import time
from typing import Any

import numpy as np


def _frames(kind: str, nbytes: int, n: int, rng: np.random.Generator) -> list[bytes]:
    import zstandard

    comp = zstandard.ZstdCompressor(level=3, write_content_size=True)
    out = []
    for _ in range(n):
        v = rng.random(nbytes // 4, dtype=np.float32)
        if kind == "quantized":
            v = np.floor(v * 256) / 256
        out.append(comp.compress(v.tobytes()))
    return out


def _upload(frames: list[bytes], nbytes: int) -> tuple[Any, ...]:
    """The frames in one device buffer (256-byte aligned each) and an output buffer."""
    import cupy

    aligned = [(len(f) + 255) // 256 * 256 for f in frames]
    host = np.zeros(sum(aligned), np.uint8)
    offsets, at = [], 0
    for f, a in zip(frames, aligned):
        host[at:at + len(f)] = np.frombuffer(f, np.uint8)
        offsets.append(at)
        at += a
    dev = cupy.asarray(host)
    out = cupy.empty(nbytes * len(frames), np.uint8)
    return (dev, [dev.data.ptr + o for o in offsets], [len(f) for f in frames], out,
            [out.data.ptr + nbytes * k for k in range(len(frames))], [nbytes] * len(frames))


def _steps(nc: Any, ins: list, insz: list, outs: list, outsz: list, stream: Any,
           backend: int) -> dict[str, float]:
    """One call taken apart: host time of each step, GPU time by events."""
    import cupy

    lib, n = nc._lib(), len(ins)
    opts, temp_bytes = nc._Opts(backend), ctypes.c_size_t(0)
    t0 = time.perf_counter()
    nc._check(lib.nvcompBatchedZstdDecompressGetTempSize(
        n, max(outsz), opts, ctypes.byref(temp_bytes), sum(outsz), stream.ptr), "temp size")
    t1 = time.perf_counter()
    _, (a, b, c, d) = nc._table(stream, ins, insz, outsz, outs)
    with stream:
        actual = cupy.zeros(n, np.uint64)
        status = cupy.full(n, -1, np.int32)
        temp = cupy.empty(max(1, temp_bytes.value), np.uint8)
    stream.synchronize()
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    e0.record(stream)
    t2 = time.perf_counter()
    nc._check(lib.nvcompBatchedZstdDecompressAsync(
        a, b, c, actual.data.ptr, n, temp.data.ptr, temp_bytes.value, d, opts,
        status.data.ptr, stream.ptr), "decode")
    t3 = time.perf_counter()
    e1.record(stream)
    stream.synchronize()
    ok = int((status.get() == 0).sum())
    if ok != n:
        raise RuntimeError(f"{n - ok} of {n} frames not decoded")
    return {"temp_bytes": temp_bytes.value, "gettemp_ms": (t1 - t0) * 1e3,
            "launch_ms": (t3 - t2) * 1e3, "gpu_ms": cupy.cuda.get_elapsed_time(e0, e1)}


def main() -> None:
    import cupy
    import zstandard

    from dask_compact.batch import nvcomp_capi as nc

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON lines, one per measurement")
    ap.add_argument("--md", help="a markdown table of the same")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows: list[dict] = []

    def keep(rec: dict) -> None:
        rows.append(rec)
        print(json.dumps(rec), flush=True)

    for kind in ("uniform", "quantized"):
        for kib in (64, 256, 1024):
            nbytes = kib * 1024
            frames = _frames(kind, nbytes, 128, rng)
            ratio = sum(map(len, frames)) / (nbytes * len(frames))
            _dev, ins, insz, outb, outs, outsz = _upload(frames, nbytes)
            for n in (1, 16, 128):
                for backend in ((0, 2) if n == 16 else (0,)):
                    runs = [_steps(nc, ins[:n], insz[:n], outs[:n], outsz[:n], stream, backend)
                            for _ in range(6)][1:]
                    walls = []
                    for _ in range(5):
                        t = time.perf_counter()
                        nc.decode_into(ins[:n], insz[:n], outs[:n], outsz[:n], stream)
                        walls.append(time.perf_counter() - t)
                    keep({"probe": "steps", "kind": kind, "kib": kib, "n": n,
                          "backend": backend, "ratio": round(ratio, 3),
                          "decode_into_ms": float(np.median(walls)) * 1e3,
                          **{k: float(np.median([r[k] for r in runs])) for k in runs[0]}})
            want = np.frombuffer(zstandard.ZstdDecompressor().decompress(frames[0]), np.uint8)
            if not (cupy.asnumpy(outb[:nbytes]) == want).all():
                raise RuntimeError("nvCOMP's output differs from zstandard's")
            if kib != 256:
                continue
            for threads in (1, 4, 16):
                streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(threads)]
                calls = 64 // threads

                def work(s: Any, j: int) -> None:
                    with cupy.cuda.Device(0):
                        for _ in range(calls):
                            sl = slice((j * 8) % 120, (j * 8) % 120 + 8)
                            nc.decode_into(ins[sl], insz[sl], outs[sl], outsz[sl], s)

                for _ in range(2):
                    pool = [threading.Thread(target=work, args=(streams[j], j))
                            for j in range(threads)]
                    t = time.perf_counter()
                    for th in pool:
                        th.start()
                    for th in pool:
                        th.join()
                    keep({"probe": "threads", "kind": kind, "kib": kib, "threads": threads,
                          "calls": 64, "frames_a_call": 8, "wall_s": time.perf_counter() - t})
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    if args.md:
        with open(args.md, "w") as f:
            f.write(markdown(rows) + "\n")


def markdown(rows: list[dict]) -> str:
    """The measurements as two tables: calls taken apart, and calls from threads."""
    lines = ["| kind | frame KiB | compressed | frames a call | backend | GPU ms a call "
             "| host ms: temp size / launch | decode_into ms |", "|---" * 8 + "|"]
    for r in rows:
        if r["probe"] == "steps":
            lines.append(f"| {r['kind']} | {r['kib']} | {r['ratio']} | {r['n']} | "
                         f"{r['backend']} | {r['gpu_ms']:.2f} | {r['gettemp_ms']:.3f} / "
                         f"{r.get('launch_ms', r.get('async_host_ms', 0.0)):.3f} | "
                         f"{r['decode_into_ms']:.2f} |")
    lines += ["", "| kind | threads (a stream each) | calls of 8 frames of 256 KiB | wall s |",
              "|---" * 4 + "|"]
    walls: dict[tuple, list[float]] = {}
    for r in rows:
        if r["probe"] == "threads":
            walls.setdefault((r["kind"], r["threads"]), []).append(r["wall_s"])
    lines += [f"| {k} | {t} | 64 | {' / '.join(f'{w:.3f}' for w in v)} |"
              for (k, t), v in walls.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
