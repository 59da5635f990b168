"""How fast threads decode a Zarr array's zstd chunks into buffers of each kind (the question
behind the batch CLI's early read, ``dask_compact/batch/early_read.py``: holding many decoded
chunks needs fresh memory, while the job's tasks decode into one reused buffer per thread).

    python benchmarks/decode_buffers_probe.py IN.zarr [--threads 15] [--make-log2n 31]

IN.zarr: a local Zarr v3 array of zarr's default codecs (``--make-log2n N`` writes one of 2^N
random float32 in chunks of 2^25 first, as benchmarks/batch_io.py does).
Prints the wall time and GB/s of decoding every chunk once per buffer kind, in turn, twice."""

from __future__ import annotations

import argparse
import mmap
import os
import threading
import time

import numpy as np

from dask_compact.batch.early_read import plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--make-log2n", type=int)
    args = ap.parse_args()
    if args.make_log2n:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
        from batch_io import make_input

        make_input(Path(args.input), 1 << args.make_log2n, 1 << 25, "zstd")
    reader, _ = plan(args.input, "values", 1 << 62)
    n_rows = reader.shape[0]
    nchunks = -(-n_rows // reader.chunk_rows)
    shape = (reader.chunk_rows, *reader.shape[1:])
    nbytes = int(np.prod(shape)) * reader.dtype.itemsize
    for name in ("/sys/kernel/mm/transparent_hugepage/enabled",
                 "/sys/kernel/mm/transparent_hugepage/defrag"):
        try:
            print(name, open(name).read().strip())
        except OSError as e:
            print(name, e)

    def fresh_mmap(advice: int | None, populate: bool) -> np.ndarray:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (mmap.MAP_POPULATE if populate else 0)
        m = mmap.mmap(-1, nbytes, flags=flags)
        if advice is not None:
            m.madvise(advice)
        return np.frombuffer(m, reader.dtype).reshape(shape)

    big: list[np.ndarray] = []
    kinds = {
        "reused per thread": None,
        "np.empty each": lambda i: np.empty(shape, reader.dtype),
        "mmap MAP_POPULATE each": lambda i: fresh_mmap(None, True),
        "mmap MADV_HUGEPAGE each": lambda i: fresh_mmap(getattr(mmap, "MADV_HUGEPAGE", 14),
                                                        False),
        "slices of one np.empty": lambda i: big[0][i],
    }
    for rnd in (1, 2):
        for kind, make in kinds.items():
            if kind == "slices of one np.empty":
                big[:] = [np.empty((nchunks, *shape), reader.dtype)]
            held: list[np.ndarray] = []
            nxt = [0]
            lock = threading.Lock()

            def work() -> None:
                own = np.empty(shape, reader.dtype) if make is None else None
                while True:
                    with lock:
                        i = nxt[0]
                        nxt[0] += 1
                    if i >= nchunks:
                        return
                    r0, r1 = i * reader.chunk_rows, min((i + 1) * reader.chunk_rows, n_rows)
                    if r1 - r0 != reader.chunk_rows:
                        reader.read(r0, r1)
                        continue
                    out = own if make is None else make(i)
                    reader.read(r0, r1, out=out)
                    if make is not None:
                        held.append(out)

            t0 = time.perf_counter()
            ts = [threading.Thread(target=work) for _ in range(args.threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.perf_counter() - t0
            print(f"round {rnd} {kind:26s} {dt:6.2f} s  {nchunks * nbytes / dt / 1e9:6.1f} GB/s "
                  f"({args.threads} threads, {nchunks} chunks of {nbytes >> 20} MiB)", flush=True)
            held.clear()
            big.clear()


if __name__ == "__main__":
    main()
