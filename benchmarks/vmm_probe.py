"""What CUDA's virtual memory management (VMM) calls cost on this device: the measurements
behind the design question of an exact-size compaction output that is written in one pass
(docs/design.md, "Exact size in one read"): write into a mapped range, then release the
physical memory past the selected length.

    python benchmarks/vmm_probe.py [--out DIR]

Times, through the driver API (ctypes, the primary context CuPy made current): the allocation
granularity; cuMemCreate of 2 MiB .. 1 GiB; mapping and unmapping a reserved range piece by
piece (2 MiB and 32 MiB pieces) and access set-up; a device memset through the mapping against
CuPy's pool memory. Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import cupy

MiB = 2**20


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


cu = ctypes.CDLL("libcuda.so.1")
u64 = ctypes.c_uint64


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def prop_for(dev: int) -> Prop:
    p = Prop()
    p.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = dev
    return p


def create(size: int, p: Prop) -> int:
    h = u64()
    check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(p), u64(0)),
          "cuMemCreate")
    return h.value


def timed(fn, reps: int = 1) -> float:
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    cupy.cuda.runtime.free(0)
    dev = cupy.cuda.runtime.getDevice()
    say(f"device {cupy.cuda.runtime.getDeviceProperties(dev)['name'].decode()}")
    p = prop_for(dev)
    g = ctypes.c_size_t()
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 0), "granularity")
    gmin = g.value
    check(cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(p), 1), "granularity")
    say(f"granularity min {gmin // 1024} KiB, recommended {g.value // 1024} KiB")

    for size in (2 * MiB, 32 * MiB, 256 * MiB, 1024 * MiB):
        hs: list[int] = []
        t = timed(lambda size=size: hs.append(create(size, p)), 3)
        t2 = timed(lambda: check(cu.cuMemRelease(u64(hs.pop())), "release"), 3)
        say(f"cuMemCreate {size // MiB:5d} MiB: {t * 1e6:9.1f} us; cuMemRelease {t2 * 1e6:8.1f} us")

    total = 1024 * MiB
    va = u64()
    t = time.perf_counter()
    check(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(total), ctypes.c_size_t(0),
                                 u64(0), u64(0)), "reserve")
    say(f"cuMemAddressReserve 1 GiB: {(time.perf_counter() - t) * 1e6:.1f} us")
    acc = AccessDesc()
    acc.location.type, acc.location.id, acc.flags = 1, dev, 3  # READWRITE
    for piece in (2 * MiB, 32 * MiB):
        n = total // piece
        handles = [create(piece, p) for _ in range(n)]
        t = time.perf_counter()
        for i, h in enumerate(handles):
            check(cu.cuMemMap(u64(va.value + i * piece), ctypes.c_size_t(piece),
                              ctypes.c_size_t(0), u64(h), u64(0)), "map")
        t_map = time.perf_counter() - t
        t = time.perf_counter()
        check(cu.cuMemSetAccess(u64(va.value), ctypes.c_size_t(total), ctypes.byref(acc),
                                ctypes.c_size_t(1)), "access")
        t_acc = time.perf_counter() - t
        mem = cupy.cuda.UnownedMemory(va.value, total, None)
        mapped = cupy.ndarray((total // 4,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        pool = cupy.empty(total // 4, cupy.float32)
        t_vmm = timed(lambda: mapped.fill(1.0), 5)
        t_pool = timed(lambda: pool.fill(1.0), 5)
        del pool
        # the tail half released in one call (a range spanning several mappings)
        half = total // 2
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        rc = cu.cuMemUnmap(u64(va.value + half), ctypes.c_size_t(half))
        t_unmap_one = time.perf_counter() - t
        if rc != 0:
            t = time.perf_counter()
            for i in range(n // 2, n):
                check(cu.cuMemUnmap(u64(va.value + i * piece), ctypes.c_size_t(piece)), "unmap")
            t_unmap_one = time.perf_counter() - t
            how = f"piece by piece (one call over {n // 2} mappings: CUresult {rc})"
        else:
            how = "in one call"
        ok = bool((mapped[: half // 4] == 1.0).all())
        check(cu.cuMemUnmap(u64(va.value), ctypes.c_size_t(half)), "unmap head")
        for h in handles:
            check(cu.cuMemRelease(u64(h)), "release")
        say(f"pieces of {piece // MiB} MiB x {n}: map {t_map * 1e6:.0f} us "
            f"({t_map / n * 1e6:.2f} us each), set access {t_acc * 1e6:.0f} us, unmap the "
            f"tail half {t_unmap_one * 1e6:.0f} us {how}; fill 1 GiB through the mapping "
            f"{t_vmm * 1e6:.0f} us vs pool memory {t_pool * 1e6:.0f} us; head intact {ok}")
    check(cu.cuMemAddressFree(u64(va.value), ctypes.c_size_t(total)), "free va")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vmm_probe.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
