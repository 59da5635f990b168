"""Quick start: filter a dask array with NumPy chunks on the local (threaded) scheduler.

    python examples/quickstart.py
"""

import time

import dask.array as da
import numpy as np

import dask_compact  # noqa: F401  (adds Array.map_compact)


def main() -> None:
    x = da.random.default_rng(42).random(2**24, chunks=2**21, dtype=np.float32)  # 8 chunks
    t = time.perf_counter()
    y = x.map_compact(lambda v: (v > 0.2) & (v < 0.3))  # values, order kept, known sizes
    i = x.map_compact("(x > 0.2) & (x < 0.3)", output="indices")  # global int64 indices
    took = time.perf_counter() - t

    print(f"input : {x.shape[0]:,} float32 in {x.numblocks[0]} chunks")
    print(f"result: shape {y.shape}, {y.numblocks[0]} chunks of known size {y.chunks[0][:3]}...")
    print(f"first : {y[:4].compute()} at indices {i[:4].compute()}")
    print(f"took  : {took:.2f} s for both (phase 1 ran on every chunk once, then persisted)")

    a = x.compute()
    assert np.array_equal(y.compute(), a[(a > 0.2) & (a < 0.3)])
    assert np.array_equal(i.compute(), np.flatnonzero((a > 0.2) & (a < 0.3)))
    print("check : equal to NumPy's a[(a > 0.2) & (a < 0.3)] and np.flatnonzero")


if __name__ == "__main__":
    main()
