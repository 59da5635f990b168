"""What a page-locked host registration costs in a process that holds contexts on every
device, by how the memory was made; and what the process's end costs (the staging rings of
dask_compact/batch/staging.py; result: results/2026-11-28_4xh200_pin_probe.txt).

    python benchmarks/pin_probe.py    # on a GPU host; prints one JSON line per variant

Variants, each a 128 MiB slab (one staging ring of 16 x 8 MiB), registered 4 times in turn
(the 4 devices' rings):
  fresh     np.empty, untouched (the rings today)
  touched   np.empty, written first (time of the write reported apart)
  thp       anonymous mmap, 2 MiB aligned, madvise(MADV_HUGEPAGE), written first
  hostalloc cudaHostAlloc(portable) (CuPy's alloc_pinned_memory)
"""
import json
import mmap
import os
import subprocess
import sys
import time

import numpy as np

MiB = 2**20
SIZE = 128 * MiB
TWO = 2 * MiB


def thp_array(nbytes):
    m = mmap.mmap(-1, nbytes + TWO, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(m, dtype=np.uint8)
    skip = -raw.ctypes.data % TWO
    m.madvise(mmap.MADV_HUGEPAGE)
    a = raw[skip: skip + nbytes]
    return m, a


def run(variant, ndev_ctx):
    import cupy
    rt = cupy.cuda.runtime
    t = time.perf_counter()
    for d in range(ndev_ctx):
        with cupy.cuda.Device(d):
            rt.free(0)
    ctx_s = time.perf_counter() - t
    res = {"variant": variant, "contexts": ndev_ctx, "ctx_s": round(ctx_s, 3), "make": [],
           "reg": [], "unreg": []}
    keep = []
    for _ in range(4):
        t = time.perf_counter()
        if variant == "hostalloc":
            mem = cupy.cuda.alloc_pinned_memory(SIZE)
            res["make"].append(0.0)
            res["reg"].append(round(time.perf_counter() - t, 4))
            keep.append(mem)
            continue
        if variant == "thp":
            m, a = thp_array(SIZE)
            a[:] = 1
            keep.append(m)
        else:
            a = np.empty(SIZE, dtype=np.uint8)
            if variant == "touched":
                a[:] = 1
        t1 = time.perf_counter()
        rt.hostRegister(a.ctypes.data, SIZE, 0)
        t2 = time.perf_counter()
        res["make"].append(round(t1 - t, 4))
        res["reg"].append(round(t2 - t1, 4))
        keep.append(a)
    # a DMA through the last slab, to check it works and its speed
    if variant != "hostalloc":
        dev = cupy.empty(SIZE, dtype=cupy.uint8)
        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            t = time.perf_counter()
            for _ in range(8):
                dev.set(a, stream=s)
            s.synchronize()
            res["h2d_GBps"] = round(8 * SIZE / (time.perf_counter() - t) / 1e9, 1)
    for a in keep:
        if isinstance(a, np.ndarray) and variant != "hostalloc":
            t = time.perf_counter()
            rt.hostUnregister(a.ctypes.data)
            res["unreg"].append(round(time.perf_counter() - t, 4))
    return res


def exit_child(variant, total_mib):
    """Contexts on every device, `total_mib` registered, then os._exit: the parent times
    the end."""
    import cupy
    rt = cupy.cuda.runtime
    for d in range(rt.getDeviceCount()):
        with cupy.cuda.Device(d):
            rt.free(0)
            cupy.empty(2**28, dtype=cupy.uint8)  # some pool memory, as a job leaves
    keep = []
    for _ in range(total_mib // 128):
        if variant == "thp":
            m, a = thp_array(SIZE)
            a[:] = 1
            keep.append(m)
        elif variant == "none":
            break
        else:
            a = np.empty(SIZE, dtype=np.uint8)
        rt.hostRegister(a.ctypes.data, SIZE, 0)
        keep.append(a)
    sys.stdout.write("exiting\n")
    sys.stdout.flush()
    os._exit(0)


def main():
    if sys.argv[1:2] == ["child"]:
        print(json.dumps(run(sys.argv[2], int(sys.argv[3]))))
        return
    if sys.argv[1:2] == ["exit"]:
        exit_child(sys.argv[2], int(sys.argv[3]))
        return
    for p in ["/sys/kernel/mm/transparent_hugepage/enabled",
              "/sys/kernel/mm/transparent_hugepage/defrag"]:
        try:
            print(p, open(p).read().strip())
        except OSError as e:
            print(p, e)
    import cupy
    ndev = cupy.cuda.runtime.getDeviceCount()
    print("devices", ndev, "cores", os.cpu_count())
    for rnd in range(2):
        for variant in ["fresh", "touched", "thp", "hostalloc"]:
            for nctx in sorted({1, ndev}):
                r = subprocess.run([sys.executable, __file__, "child", variant, str(nctx)],
                                   capture_output=True, text=True)
                print(rnd, r.stdout.strip() or r.stderr[-800:])
    for rnd in range(2):
        for variant, mib in [("none", 0), ("fresh", 512), ("thp", 512)]:
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, __file__, "exit", variant, str(mib)],
                                 stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            t1 = time.perf_counter()
            p.wait()
            t2 = time.perf_counter()
            print(rnd, f"exit {variant} {mib} MiB: to 'exiting' {t1 - t0:.3f} s, "
                  f"exit to end {t2 - t1:.3f} s ({line.strip()})")


if __name__ == "__main__":
    main()
