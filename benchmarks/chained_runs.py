"""Runs of chunks (``compact_many``: one output for several chunks, what map_compact's grouped
tasks run) on one GPU: the path before the chained runs (``CHAINED_RUNS = False``: read once
into scratch and copy, or count first) against the chained run (speculative outputs, each
chunk's kernel starting where the previous one's count ended), beside one ``compact_array``
call on the same elements as one chunk. 4 x 2^26 float32 by default, p = .05/.5/.95, values
and indices; median/min microseconds with a device synchronisation. The chained values are
checked against NumPy.

    python benchmarks/chained_runs.py
"""

import time

import cupy
import numpy as np

from dask_compact import compact_array
from dask_compact.backends import cupy_backend as cb
from dask_compact.backends import cupy_tuning as ct
from dask_compact.predicate import as_predicate

N, CH, REPS = 1 << 26, 4, 7
rng = cupy.random.default_rng(1)
blocks = [rng.random(N, dtype=cupy.float32) for _ in range(CH)]
whole = cupy.concatenate(blocks)
bases = [i * N for i in range(CH)]
host = [cupy.asnumpy(b) for b in blocks]


def timed(fn):
    fn()  # compile, learn the fraction
    fn()
    ts = []
    for _ in range(REPS):
        cupy.cuda.get_current_stream().synchronize()
        t = time.perf_counter()
        out = fn()
        cupy.cuda.get_current_stream().synchronize()
        ts.append(time.perf_counter() - t)
        del out
    return 1e6 * float(np.median(ts)), 1e6 * min(ts)


print(f"{'p':>5} {'output':>8} {'old us (med/min)':>18} {'chained us':>16} {'speedup':>8} "
      f"{'1-chunk 2^28 us':>16}")
refs = {p: np.concatenate([h[h < p] for h in host]) for p in (0.05, 0.5, 0.95)}
for output in ("values", "indices"):
    for p in (0.05, 0.5, 0.95):
        row = {}
        for mode in ("old", "new"):
            ct.CHAINED_RUNS = mode == "new"
            pred = as_predicate(f"x < {p}")  # a new predicate per arm: its own memo
            got = cb.compact_many(blocks, pred, output, True, "auto", bases)
            got = cb.compact_many(blocks, pred, output, True, "auto", bases)  # chained if new
            assert got.size == refs[p].size, (mode, got.size, refs[p].size)
            if output == "values" and mode == "new":
                np.testing.assert_array_equal(cupy.asnumpy(got), refs[p])
            del got
            row[mode] = timed(lambda: cb.compact_many(blocks, pred, output, True, "auto", bases))
        ct.CHAINED_RUNS = True
        pred1 = as_predicate(f"x < {p}")
        one = timed(lambda: compact_array(whole, pred1, output=output))
        print(f"{p:>5} {output:>8} {row['old'][0]:>9.0f}/{row['old'][1]:<8.0f} "
              f"{row['new'][0]:>7.0f}/{row['new'][1]:<8.0f} {row['old'][0] / row['new'][0]:>7.2f}x "
              f"{one[0]:>9.0f}/{one[1]:<6.0f}")
print(cupy.cuda.runtime.getDeviceProperties(0)["name"].decode())
