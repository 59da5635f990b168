"""Small compactions for compute-sanitizer (memcheck, racecheck, initcheck, synccheck).

Run as ``compute-sanitizer --tool memcheck --error-exitcode 99 python sanitize_driver.py``
(tests/gpu/test_sanitizer.py does). CuPy's memory pool is switched off, so every array is its
own cudaMalloc and an access one element past an array's end is reported. Exits non-zero if a
result is wrong.
"""

from __future__ import annotations

import sys

import cupy
import numpy as np

from dask_compact import (
    compact_array,
    compact_into,
    compact_records,
    compact_records_into,
    partition_array,
)
from dask_compact.backends import cupy_backend as cb
from dask_compact.predicate.core import Predicate
from dask_compact.predicate.expr import Call, Param, Var


def main() -> int:
    cupy.cuda.set_allocator(None)  # exact-size cudaMalloc per array: memcheck sees every overrun
    rng = np.random.default_rng(0)
    bad = 0
    sizes = [1, 33, 1025, 8193, 3 * 8192 + 17] if "--quick" not in sys.argv else [1, 1025, 8193]
    for dtype in ("float32", "int8", "complex128", "float16"):
        for n in sizes:
            a_np = (rng.random(n) * 100).astype(dtype)
            a = cupy.asarray(a_np)
            pred = Predicate(Call("less", (Var(), Param(0, "float"))), (50.0,), None, "x < 50")
            want_i = np.flatnonzero(a_np < 50)
            for alg in ("single-pass", "three-pass", "hybrid"):
                for output in ("values", "indices", "both"):
                    got = cb.compact(a, pred, output, alg != "hybrid", alg, 0)
                    idx = got[1] if output == "both" else (got if output == "indices" else None)
                    if idx is not None:
                        i = np.sort(cupy.asnumpy(idx))
                        if not np.array_equal(i, want_i):
                            print("WRONG", dtype, n, alg, output, flush=True)
                            bad += 1
                # the public compact_into: caller buffers of exactly n, a caller count
                out_v, out_i = cupy.empty(n, a.dtype), cupy.empty(n, np.int64)
                count = cupy.empty(1, np.int64)
                compact_into(a, pred, (out_v, out_i), output="both", count=count,
                             stable=alg != "hybrid", algorithm=alg if alg != "hybrid" else "auto")
                k = int(count.get()[0])
                if not np.array_equal(np.sort(cupy.asnumpy(out_i[:k])), want_i):
                    print("WRONG compact_into", dtype, n, alg, flush=True)
                    bad += 1
                # the misaligned (element-wise) path and the mask path
                v = a[1:]
                got = cb.compact(v, pred, "indices", alg != "hybrid", alg, 0)
                if not np.array_equal(np.sort(cupy.asnumpy(got)), np.flatnonzero(a_np[1:] < 50)):
                    print("WRONG view", dtype, n, alg, flush=True)
                    bad += 1
                m = cupy.asarray(a_np < 50)
                got = cb.compact_masked(
                    a, m, "both", 0, algorithm=alg if alg != "hybrid" else "auto"
                )
                if not np.array_equal(cupy.asnumpy(got[1]), want_i):
                    print("WRONG mask", dtype, n, alg, flush=True)
                    bad += 1
    bad += repeated(rng, sizes)
    from dask_compact.backends import cupy_tuning

    for dense_from in (0.0, 2.0, cupy_tuning.REC_DENSE_FROM):  # each copy form, then both
        cupy_tuning.REC_DENSE_FROM = dense_from
        bad += records(rng, sizes)
    bad += splits(rng, sizes)
    bad += scans(rng, sizes)
    bad += sort_keys(rng, sizes)
    cupy.cuda.runtime.deviceSynchronize()
    print(f"sanitize_driver: {bad} wrong results", flush=True)
    return 1 if bad else 0


def repeated(rng: np.random.Generator, sizes: list[int]) -> int:
    """Ready calls (words zeroed once, kernels/lookback.cuh's epochs) repeated on new data."""
    bad = 0
    pred = Predicate(Call("less", (Var(), Param(0, "float"))), (50.0,), None, "x < 50")
    for dtype in ("float32", "float64"):
        for n in sizes + [40_009]:
            out = cupy.empty(n, dtype)
            count = cupy.empty(1, np.int64)
            for _ in range(3):
                a_np = (rng.random(n) * 100).astype(dtype)
                a = cupy.asarray(a_np)
                want = a_np[a_np < 50]
                got = cupy.asnumpy(compact_array(a, pred))
                compact_into(a, pred, out, count=count)
                k = int(count.get()[0])
                if not (np.array_equal(got, want) and np.array_equal(cupy.asnumpy(out[:k]), want)):
                    print("WRONG repeated", dtype, n, flush=True)
                    bad += 1
            # after those calls the outputs are sized from the fraction selected (about a
            # half, cupy_ready.OneReadCall._speculate): data selecting nearly all overflows
            # them (the kernel writes only what fits: each output its own cudaMalloc here),
            # then far less, every output
            for scale in (51.0, 1000.0, 51.0):
                a_np = (rng.random(n) * scale).astype(dtype)
                a = cupy.asarray(a_np)
                m = a_np < 50
                for output in ("values", "indices", "both"):
                    got = compact_array(a, pred, output=output)
                    v, i = (got if output == "both" else
                            (got, None) if output == "values" else (None, got))
                    if (v is not None and not np.array_equal(cupy.asnumpy(v), a_np[m])) or (
                            i is not None and not np.array_equal(cupy.asnumpy(i),
                                                                 np.flatnonzero(m))):
                        print("WRONG speculated", dtype, n, scale, output, flush=True)
                        bad += 1
    return bad


def records(rng: np.random.Generator, sizes: list[int]) -> int:
    """compact_records: fused and mask-path predicates, fields of 1, 2, 8, 12, 16, 24 and 64
    bytes a row, an unaligned view, indices; each call twice (the ready call, then the repeated
    call that skips the checks)."""
    bad = 0
    for n in sizes:
        f_np = {
            "e": (rng.random(n) * 10).astype(np.float32),
            "k": rng.integers(0, 5, n).astype(np.int8),
            "pos": rng.random((n, 3)).astype(np.float32),
            "r64": rng.random((n, 3)),  # rows of 8-byte units, staged as 6 words
            "wide": rng.random((n, 16)).astype(np.float32),  # 64 bytes: the widest staged
            "c": (rng.random(n) + 1j).astype(np.complex128),
            "h": rng.integers(0, 9, (n, 1)).astype(np.uint16),
            "v": rng.random(n + 1)[1:],
        }
        f = {k: cupy.asarray(v) for k, v in f_np.items()}
        f["v"] = cupy.asarray(rng.random(n + 1))[1:]
        f_np["v"] = cupy.asnumpy(f["v"])
        for pred, mask in [
            ("(e > 3) & (k != 2)", (f_np["e"] > 3) & (f_np["k"] != 2)),
            (lambda e: e.astype(np.float64) > 5, f_np["e"] > 5),  # the mask path
        ]:
            for _ in range(2):  # the second call runs the call the first one kept
                got = compact_records(f, pred, indices=True)
                for name, want in f_np.items():
                    if not np.array_equal(cupy.asnumpy(got[name]), want[mask]):
                        print("WRONG records", name, n, flush=True)
                        bad += 1
                if not np.array_equal(cupy.asnumpy(got["indices"]), np.flatnonzero(mask)):
                    print("WRONG records indices", n, flush=True)
                    bad += 1
            # into buffers of exactly n rows: memcheck sees any row written past them
            out = {k: cupy.empty_like(v) for k, v in f.items()}
            out["indices"] = cupy.empty(n, np.int64)
            count = cupy.empty(1, np.int64)
            for _ in range(2):  # the second call runs the call the first one kept
                k = int(compact_records_into(f, pred, out, count=count).get()[0])
                for name, want in f_np.items():
                    if not np.array_equal(cupy.asnumpy(out[name][:k]), want[mask]):
                        print("WRONG records_into", name, n, flush=True)
                        bad += 1
    return bad


def splits(rng: np.random.Generator, sizes: list[int]) -> int:
    """partition_array, both values routes (dcx_partition counted first; dcx_partition_lookback
    and dcx_reverse_tail in one pass): fused and mask-path predicates, values and indices."""
    from dask_compact.backends import cupy_tuning

    bad = 0
    for route in ("counted", "one-pass"):
        cupy_tuning.SPLIT_ROUTE = route
        for n in sizes:
            a_np = (rng.random(n) * 10).astype(np.float32)
            a = cupy.asarray(a_np)
            for pred, m in [("x > 3", a_np > 3), (lambda v: v.astype(np.float64) > 5, a_np > 5)]:
                v, i, k = partition_array(a, pred, output="both")
                order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)])
                if k != int(m.sum()) or not np.array_equal(cupy.asnumpy(i), order) or not (
                    np.array_equal(cupy.asnumpy(v), a_np[order])
                ):
                    print("WRONG partition", route, n, flush=True)
                    bad += 1
    cupy_tuning.SPLIT_ROUTE = "auto"
    return bad


def scans(rng: np.random.Generator, sizes: list[int]) -> int:
    """scan_array, every GPU algorithm, a 4-byte and an 8-byte accumulator, and the scan
    compaction (kernels/scan.cu, scan_compact.cu)."""
    from dask_compact import scan_array
    from dask_compact.backends.cupy_scan_source import GPU_ALGORITHMS

    bad = 0
    for n in sizes:
        a_np = rng.integers(-50, 50, n).astype(np.int32)
        a = cupy.asarray(a_np)
        for alg in GPU_ALGORITHMS:
            for dtype in (np.int32, np.int64):
                got = cupy.asnumpy(scan_array(a, exclusive=False, algorithm=alg, dtype=dtype))
                if not np.array_equal(got, np.cumsum(a_np, dtype=dtype)):
                    print("WRONG scan", alg, np.dtype(dtype), n, flush=True)
                    bad += 1
        got = cupy.asnumpy(compact_array(a, "x > 10", output="indices", algorithm="scan"))
        if not np.array_equal(got, np.flatnonzero(a_np > 10)):
            print("WRONG scan compaction", n, flush=True)
            bad += 1
    return bad


def sort_keys(rng: np.random.Generator, sizes: list[int]) -> int:
    """The argsort's float keys (kernels/sort_keys.cu: -0.0 as 0.0, every NaN one positive
    NaN), every float width, through the CuPy backend's local argsort; its order against
    NumPy's stable argsort (which takes -0.0 as 0.0 and puts NaNs last)."""
    from dask_compact.backends import cupy_sort

    bad = 0
    for dtype in (np.float16, np.float32, np.float64):
        for n in sizes:
            a_np = (rng.standard_normal(n) * 4).round().astype(dtype)
            a_np[rng.random(n) < 0.1] = np.nan
            a_np[rng.random(n) < 0.1] = -0.0
            _, order, _ = cupy_sort.sort_chunk(cupy.asarray(a_np), True, 0,
                                               np.zeros(0, np.int64), values=False)
            if not np.array_equal(cupy.asnumpy(order), np.argsort(a_np, kind="stable")):
                print("WRONG sort keys", np.dtype(dtype), n, flush=True)
                bad += 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
