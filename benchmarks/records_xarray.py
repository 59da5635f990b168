"""CPU benchmark: ``ds.compact.where(cond, dim)`` against what xarray users write today.

A dask-backed Dataset of n events (four float32 variables ``energy, eta, phi, pt``, chunks
of n/8 rows, persisted first, so both sides read from memory), the condition
``(energy > X) & (abs(eta) < 2.5)`` with X set so that a fraction p of the rows is selected.
Both sides are timed until the caller holds a Dataset whose ``event`` length is known and
whose data is computed, on the threaded scheduler, in the same process on the same data:

* ours: ``ds.compact.where(cond, dim="event")``, as returned (it persists; chunks known);
* ours with ds.where's condition: ``ds.compact.where((ds.energy > X) & (abs(ds.eta) <
  2.5))``, the lazy boolean DataArray evaluated in the compacting pass;
* ``ds.where(cond, drop=True)``: the condition computed first (xarray refuses a dask
  condition with ``drop=True``: it would give an unknown length), then ``.where(...,
  drop=True)`` and ``.persist()`` of the result;
* ``ds.isel``: the condition computed, ``ds.isel(event=np.flatnonzero(cond))`` persisted (no
  NaN fill pass: the cheapest thing an xarray user can write).

Best of ``--reps`` after one warm-up round, a new threshold per repetition (new keys).

    python benchmarks/records_xarray.py [--log2n 24] [--reps 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import xarray as xr

import dask_compact

PS = (0.05, 0.5, 0.95)
ETA_CUT = 2.5


def dataset(n: int, chunk: int, gpu: bool = False) -> xr.Dataset:
    """Events: energy uniform in [0, 10), eta standard normal (|eta| < 2.5 for 98.8% of the
    rows, so that p = 0.95 can be reached), phi and pt as payload; CuPy chunks with ``gpu``."""
    rng = da.random.default_rng(0)
    data = {
        "energy": rng.random(n, chunks=chunk, dtype=np.float32) * 10,
        "eta": rng.standard_normal(n, chunks=chunk, dtype=np.float32),
        "phi": (rng.random(n, chunks=chunk, dtype=np.float32) - 0.5) * 2 * np.pi,
        "pt": rng.random(n, chunks=chunk, dtype=np.float32) * 100,
    }
    if gpu:
        import cupy

        data = {k: v.map_blocks(cupy.asarray) for k, v in data.items()}
    return xr.Dataset({k: ("event", v) for k, v in data.items()}).persist()


def host(v: xr.DataArray) -> np.ndarray:
    """A variable's values in host memory (NumPy or CuPy chunks)."""
    a = v.data.compute() if hasattr(v.data, "compute") else v.data
    return a.get() if hasattr(a, "get") else np.asarray(a)


def sync() -> None:
    """Wait for the GPU (its work is queued asynchronously), when there is one."""
    import sys

    if "cupy" in sys.modules:
        sys.modules["cupy"].cuda.Device().synchronize()


def threshold(p: float) -> float:
    """X with P(energy > X and |eta| < 2.5) = p, energy ~ U[0, 10), eta ~ N(0, 1)."""
    from math import erf, sqrt

    p_eta = erf(ETA_CUT / sqrt(2))
    return 10 * (1 - p / p_eta)


def best(times: list[float]) -> float:
    return min(times)


def run(n: int, chunk: int, reps: int, gpu: bool = False) -> list[dict]:
    ds = dataset(n, chunk, gpu)
    rows = []
    for p in PS:
        x0 = threshold(p)
        times: dict[str, list[float]] = {"ours": [], "mask": [], "where": [], "isel": []}
        selected = 0
        failed = ""
        for r in range(reps + 1):
            x = float(np.float32(x0 + r * 1e-5))  # a new threshold per repetition: new keys
            sync()
            t0 = time.perf_counter()
            ours = ds.compact.where(f"(energy > {x!r}) & (abs(eta) < {ETA_CUT})", dim="event")
            sync()
            t1m = time.perf_counter()
            masked = ds.compact.where((ds.energy > x) & (abs(ds.eta) < ETA_CUT))
            sync()
            t1 = time.perf_counter()
            try:
                cond = ((ds.energy > x) & (abs(ds.eta) < ETA_CUT)).compute()
                theirs = ds.where(cond, drop=True).persist()
                sync()
            except Exception as e:  # noqa: BLE001 -- e.g. CuPy chunks: reported, not timed
                theirs, failed = None, f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            t2 = time.perf_counter()
            cond = ((ds.energy > x) & (abs(ds.eta) < ETA_CUT)).compute()
            taken = ds.isel(event=np.flatnonzero(host(cond))).persist()
            sync()
            t3 = time.perf_counter()
            if r:  # the first round warms up: compilation, page faults, thread pools
                times["ours"].append(t1m - t0)
                times["mask"].append(t1 - t1m)
                times["where"].append(t2 - t1)
                times["isel"].append(t3 - t2)
            else:  # checked once, outside the timings
                assert ours.sizes["event"] == taken.sizes["event"]
                assert not any(np.isnan(c) for c in ours.energy.chunks[0])
                for k in ds.data_vars:
                    np.testing.assert_array_equal(host(ours[k]), host(taken[k]))
                    np.testing.assert_array_equal(host(masked[k]), host(taken[k]))
                    if theirs is not None:
                        np.testing.assert_array_equal(host(ours[k]), host(theirs[k]))
                selected = ours.sizes["event"]
            del ours, masked, theirs, taken
        b = {k: best(v) for k, v in times.items()}
        if failed:
            b["where"] = float("nan")
        rows.append(dict(n=n, chunk=chunk, p=p, selected=selected / n, ours_s=b["ours"],
                         mask_s=b["mask"],
                         where_s=b["where"], isel_s=b["isel"], ratio_where=b["where"] / b["ours"],
                         ratio_isel=b["isel"] / b["ours"], failed=failed))
        print(f"n=2^{int(np.log2(n))} p={p}: ours {b['ours']:.3f} s (mask DataArray "
              f"{b['mask']:.3f} s), ds.where(drop=True) "
              f"{b['where']:.3f} s ({rows[-1]['ratio_where']:.2f}x), ds.isel "
              f"{b['isel']:.3f} s ({rows[-1]['ratio_isel']:.2f}x)", flush=True)
    return rows


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - not a git checkout
        return "unknown"


def table(rows: list[dict], reps: int, device: str, sha: str) -> list[str]:
    r0 = rows[0]
    lines = [
        f"# ds.compact.where vs xarray, {dt.date.today().isoformat()}, device {device}, git "
        f"{sha}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"numpy {np.__version__}, xarray {xr.__version__}, dask {dask.__version__}, "
        f"dask_compact {dask_compact.__version__}",
        "",
        f"n = 2^{int(np.log2(r0['n']))} events, 4 float32 variables, chunks of "
        f"2^{int(np.log2(r0['chunk']))}, persisted; cond `(energy > X) & (abs(eta) < 2.5)`; "
        f"threaded scheduler; best of {reps} after a warm-up round; each time ends with a "
        "persisted Dataset of known length.",
        "",
        "| p | selected | ds.compact.where(string) s | ds.compact.where(mask DataArray) s | "
        "cond.compute + ds.where(cond, drop=True).persist s | ratio | cond.compute + "
        "ds.isel(flatnonzero).persist s | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['p']} | {r['selected']:.4f} | {r['ours_s']:.3f} | {r['mask_s']:.3f} "
                     f"| {r['where_s']:.3f} "
                     f"| **{r['ratio_where']:.2f}x** | {r['isel_s']:.3f} | "
                     f"**{r['ratio_isel']:.2f}x** |")
    failures = {r["failed"] for r in rows if r.get("failed")}
    if failures:
        lines += ["", "ds.where(cond, drop=True) failed here: " + "; ".join(sorted(failures))]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=24, help="events: 2^log2n (default 24)")
    ap.add_argument("--nchunks", type=int, default=8, help="chunks along event (default 8)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the table to DIR")
    ap.add_argument("--gpu", action="store_true", help="CuPy chunks (on the GPU host)")
    ap.add_argument("--sha", default=None, help="the commit measured (default: git HEAD)")
    args = ap.parse_args()
    n = 2**args.log2n
    device = "cpu"
    if args.gpu:
        import cupy

        device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode().replace(" ", "_")
    sha = args.sha or git_sha()  # --sha: the GPU host's copy may carry a stale HEAD
    with dask.config.set(scheduler="threads"):
        rows = run(n, n // args.nchunks, args.reps, args.gpu)
    lines = table(rows, args.reps, device, sha)
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"records-xarray-{dt.date.today().isoformat()}-{device}-{sha}.md"
        path.write_text("\n".join(lines) + "\n")
        print(f"written: {path}")


if __name__ == "__main__":
    main()
