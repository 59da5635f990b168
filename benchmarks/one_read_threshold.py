"""Where an exact-size ``compact_array`` call should read its input once whatever it selects:
the public call timed at each size, fraction, dtype and output with the backend's
``ONE_READ_ALWAYS_BYTES`` bound set to several values (0: count first unless the previous
call selected little), beside CUB's ``DeviceSelect::If`` into a preallocated buffer. The
measurement behind the bound's value (see its comment in dask_compact/backends/cupy_backend.py).

    python benchmarks/one_read_threshold.py --peer-lib cub_peer.so [--out DIR] [--sha SHA]

Microseconds per call with a device synchronisation (median), the same timing as
public_calls.py; each call's predicate is a new lambda, as a user writes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gpu_kernels import CubPeer  # noqa: E402
from public_calls import timed_us  # noqa: E402

from dask_compact import compact_array  # noqa: E402
from dask_compact.backends import cupy_tuning as ct  # noqa: E402

BOUNDS = {"0": 0, "2^27": 1 << 27, "2^28": 1 << 28, "2^29": 1 << 29}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peer-lib", required=True)
    ap.add_argument("--sizes", default="22,23,24,25,26,27")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sha", default="")
    args = ap.parse_args()
    peer = CubPeer(args.peer_lib)
    dev = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    lines = [f"# one-read bound sweep, {dev}, sha {args.sha}: compact_array us per call "
             "(median, synchronised) for each ONE_READ_ALWAYS_BYTES; CUB If preallocated",
             "dtype output log2n p | " + " ".join(BOUNDS) + " | CUB"]
    print(lines[-1], flush=True)
    default = ct.ONE_READ_ALWAYS_BYTES
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        for log2n in map(int, args.sizes.split(",")):
            n = 1 << log2n
            rng = cupy.random.default_rng(log2n)
            nbuf = 4
            bufs = [rng.random(n, dtype=np.float64).astype(dtype) for _ in range(nbuf)]
            out_v = cupy.empty(n, dtype=dtype)
            count = cupy.zeros(1, dtype=np.uint64)
            temp = cupy.empty(peer.temp_bytes(dtype.name, n), dtype=np.uint8)
            for output in ("values", "indices"):
                for p in (0.05, 0.5, 0.95):
                    want = int((cupy.asnumpy(bufs[0]) < p).sum())
                    times = []
                    for bound in BOUNDS.values():
                        ct.ONE_READ_ALWAYS_BYTES = bound
                        for k in range(2):  # the predicate's memo learns this fraction
                            got = compact_array(bufs[k], lambda v: v < p, output=output)
                        assert got.size == int((cupy.asnumpy(bufs[1]) < p).sum())
                        assert compact_array(bufs[0], lambda v: v < p, output=output).size == want
                        times.append(timed_us(
                            lambda k: compact_array(bufs[k], lambda v: v < p, output=output),
                            nbuf, 30))
                    ct.ONE_READ_ALWAYS_BYTES = default
                    cub = timed_us(lambda k: peer.select_if(dtype.name, bufs[k], out_v, count, p,
                                                            temp), nbuf, 30)
                    lines.append(f"{dtype.name} {output} {log2n} {p} | "
                                 + " ".join(f"{t:7.1f}" for t in times) + f" | {cub:7.1f}")
                    print(lines[-1], flush=True)
            del bufs, out_v, temp
            cupy.get_default_memory_pool().free_all_blocks()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "one_read_threshold.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
