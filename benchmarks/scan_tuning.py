"""One sweep of the look-back scan's tunings (issue 13): candidate ``ScanTuning``s of
``dcx_scan_lookback`` (threads, rows, blocks per SM asked of ptxas, cache hints, the
look-back's polling), each built from the installed package's own kernel sources through
``override_scan_tuning`` (no CUDA source here), timed beside a device copy, ``cupy.cumsum``,
``torch.cumsum`` (where torch imports) and CUB (``--peer-lib``, optional) in one process on
the same data.

    python benchmarks/scan_tuning.py --out DIR [--log2n 28,26,24] [--reps 21]
        [--cases float32:float32,int32:int32,int32:int64] [--only LABEL,...]
        [--peer-lib /tmp/cub_peer.so] [--budget-s 70]
    python benchmarks/scan_tuning.py --list             # the candidates and kernel names, no GPU
    python benchmarks/scan_tuning.py --ptxas [--arch sm_90]   # nvcc + ptxas -v of every
        candidate (exclusive and inclusive), registers, spills, blocks per SM: no GPU

Timing: CUDA events around batches of 4 calls, median of ``--reps`` batches (>= 20) after 3
warm-up calls, every implementation of a (case, size) measured round-robin (batch r of each
before batch r + 1 of any), so clock and thermal drift fall on all of them alike. "ours" is
the look-back launch alone (the status words' memset and the kernel, ``cupy_scan._lookback``,
what a tuning changes; the output allocated once), "public" the default's public call
(``scan_array``, what ``scan_bench.py`` reports). Sizes run largest first; a size that would
start past ``--budget-s`` (from the process start) is skipped, and so is a case (said in
the output).

Checks, per candidate and case, through the public call: integers bit for bit against
``cupy.cumsum``; float32 (1) on small integers (every prefix exact in any order: bit for bit
against the float64 cumsum, so a wrong order or a lost tile shows), (2) on normal random
data, the error against the float64 cumsum no worse than 4 times the default kernel's on the
same data (the look-back's own order varies from run to run, docs/design.md, so bits are not
compared), (3) a size with a partial last tile (2^20 + 12345). A failed check prints WRONG
and the row is not a candidate.

Writes ``scan-tuning-DATE-DEVICE-SHA.md`` and ``.csv`` under --out (also after each case, so
a run stopped early leaves what it measured).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dask_compact.backends.cupy_scan_source import (
    ScanSpec,
    ScanTuning,
    override_scan_tuning,
    scan_tuning,
)

CASES = (("float32", "float32"), ("int32", "int32"), ("int32", "int64"))
_T0 = time.perf_counter()  # --budget-s counts from here (the imports of cupy and torch too)


@dataclass(frozen=True)
class Candidate:
    label: str
    tuning: ScanTuning
    why: str


def _c(label: str, why: str, block: int, rows: int, minb: int, cache: int, poll: int = 20,
       wait: int = 0, sched: int = 0) -> Candidate:
    return Candidate(label, ScanTuning(block, rows, minb, cache, poll, wait, sched), why)


# Candidates per case; the first is the table's default (cupy_scan_source.TABLE). Every one
# was compiled with nvcc for sm_90, exclusive and inclusive (--ptxas, 2026-12-01): none spills
# and each fits the blocks per SM it asks. Dropped there: every .cs-store variant of the
# 4-byte tiles under 3 blocks/SM (__stcs, and st.global.cs by PTX alike: float32 inclusive
# spills 16 bytes, int32 exclusive 8; cache 2, 3, 10, 11, also with spin), 192 x 32 x 2 for
# int32 (inclusive spills 16 bytes), int32 -> int64 asking 3 blocks/SM (spills 8 bytes), SCHED 1
# for int32 (inclusive spills 20 bytes).
# CUB's sm_90 look-back tuning (cub/device/dispatch/tuning/tuning_scan.cuh): 4-byte sums
# 128 threads x 24 items (float: 1140 ns before the first look-back read, 688 ns per poll),
# 8-byte 224 x 24 (1290 / 632 ns).
# Since d08d3a1 the 4-byte default sleeps as CUB's sm_90 float tuning does (688 ns per poll,
# 1140 ns before the first read); the cache and shape variants below keep those sleeps, so
# each differs from the default in one thing.
_P, _W = 688, 1140
_FOUR = (
    _c("default", "the table: 128 x 32, 3 blocks/SM, CUB's sleeps", 128, 32, 3, 0, _P, _W),
    _c("ld.cs", ".cs loads (no .cs stores: those spill here)", 128, 32, 3, 1, _P, _W),
    _c("ld.cs.256B", ".cs loads with the L2::256B prefetch", 128, 32, 3, 9, _P, _W),
    _c("ld.na", "ld.global.nc.L1::no_allocate", 128, 32, 3, 4, _P, _W),
    _c("ld.256B", "ld.global.nc.L2::256B prefetch", 128, 32, 3, 8, _P, _W),
    _c("ld.na.256B", "nc, L1::no_allocate, L2::256B", 128, 32, 3, 12, _P, _W),
    _c("no-delay", "the default before d08d3a1: 20 ns polls, no first wait", 128, 32, 3, 0),
    _c("spin", "look-back polls with no sleep", 128, 32, 3, 0, 0),
    _c("backoff", "whole-warp back-off 32 ns doubling to 1024", 128, 32, 3, 0, -32),
    _c("wait500", "500 ns before the first look-back read, 688 ns polls", 128, 32, 3, 0, _P,
       500),
    _c("wait2000", "2000 ns before the first look-back read, 688 ns polls", 128, 32, 3, 0, _P,
       2000),
    _c("poll300", "300 ns polls, 1140 ns first", 128, 32, 3, 0, 300, _W),
    _c("ld.na.256B+spin", "nc, L1::no_allocate, L2::256B, no sleep", 128, 32, 3, 12, 0),
)
CANDIDATES: dict[str, tuple[Candidate, ...]] = {
    "float32:float32": _FOUR + (
        _c("192x32x2", "192 x 32 (24576 a tile), 2 blocks/SM: 384 threads as 128 x 3", 192, 32,
           2, 0, _P, _W),
        _c("early", "warp 0 looks back while warps 1-3 scan (SCHED 1)", 128, 32, 3, 0, _P, _W,
           1),
        _c("early+ld.na.256B", "SCHED 1 with nc, L1::no_allocate, L2::256B", 128, 32, 3, 12, _P,
           _W, 1),
    ),
    "int32:int32": _FOUR,
    "int32:int64": (
        _c("default", "the table: 128 x 32, no bound, .cs loads and stores", 128, 32, 0, 3),
        _c("st.cs", "nc loads, .cs stores", 128, 32, 0, 2),
        _c("ld.cs", ".cs loads, plain stores", 128, 32, 0, 1),
        _c("plain", "nc loads, plain stores", 128, 32, 0, 0),
        _c("ld.cs.256B+st.cs", ".cs L2::256B loads, .cs stores", 128, 32, 0, 11),
        _c("ld.na.256B+st.cs", "nc L1::no_allocate L2::256B loads, .cs stores", 128, 32, 0, 14),
        _c("spin", "look-back polls with no sleep", 128, 32, 0, 3, 0),
        _c("backoff", "whole-warp back-off 32 ns doubling to 1024", 128, 32, 0, 3, -32),
        _c("wait500", "500 ns before the first look-back read", 128, 32, 0, 3, 20, 500),
        _c("cub-delay", "CUB sm_90 8-byte: 1290 ns first, 632 ns per poll", 128, 32, 0, 3, 632,
           1290),
        _c("128x24x4", "128 x 24, 4 blocks/SM", 128, 24, 4, 3),
        _c("192x32x2", "192 x 32, 2 blocks/SM", 192, 32, 2, 3),
        _c("early", "warp 0 looks back while warps 1-3 scan (SCHED 1)", 128, 32, 0, 3, 20, 0, 1),
        _c("early+ld.cs.256B", "SCHED 1 with .cs L2::256B loads, .cs stores", 128, 32, 0, 11, 20,
           0, 1),
    ),
}
# SCHED 1 (named barriers) had not run on a GPU when this list was made: its candidates are
# first checked in a child process with a timeout (a deadlocked kernel dies with its process)
# and left out of the sweep unless that passes (--no-precheck: trust them).


def candidates_for(idt: np.dtype, odt: np.dtype, only: set[str]) -> list[Candidate]:
    cands = list(CANDIDATES[f"{idt}:{odt}"])
    assert cands[0].tuning == scan_tuning(odt, idt), (cands[0], scan_tuning(odt, idt))
    return [c for c in cands if not only or c.label in only or c.label == "default"]


def spec_of(idt: np.dtype, odt: np.dtype, t: ScanTuning, exclusive: bool = True) -> ScanSpec:
    """The spec the public call builds under the override (so its module is the one timed)."""
    override_scan_tuning(odt.itemsize, t)
    try:
        return ScanSpec.make(idt, odt, "lookback", exclusive)
    finally:
        override_scan_tuning(odt.itemsize, None)


def parse_cases(text: str) -> list[tuple[np.dtype, np.dtype]]:
    pairs = [tuple(c.split(":")) for c in text.split(",") if c] or CASES
    return [(np.dtype(i), np.dtype(o)) for i, o in pairs]


# ---- no GPU: the list, and ptxas ---------------------------------------------------------


def list_candidates(cases: list[tuple[np.dtype, np.dtype]], only: set[str]) -> None:
    for idt, odt in cases:
        print(f"{idt} -> {odt}:")
        for c in candidates_for(idt, odt, only):
            print(f"  {c.label:18s} {spec_of(idt, odt, c.tuning).names()['vector']}  # {c.why}")


def ptxas_report(cases: list[tuple[np.dtype, np.dtype]], only: set[str], arch: str) -> int:
    """nvcc every candidate's vector kernel (exclusive and inclusive) for ``arch``; print
    registers, spills and the blocks per SM its registers allow. Returns the count of bad
    candidates (spills, or fewer blocks than asked)."""
    from dask_compact.backends.cupy_source import NVRTC_OPTIONS

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        sys.exit("nvcc is not on PATH")
    jobs: list[tuple[str, str, str]] = []  # (case label, candidate label, name)
    for idt, odt in cases:
        for c in candidates_for(idt, odt, only):
            for ex in (True, False):
                jobs.append((f"{idt}->{odt}", c.label, spec_of(idt, odt, c.tuning, ex)
                             .names()["vector"]))
    source = spec_of(*cases[0], ScanTuning(128, 32)).source()
    tmpdir = tempfile.TemporaryDirectory(prefix="scan_tuning_")
    tmp = Path(tmpdir.name)

    def compile_part(k_part: tuple[int, list[str]]) -> str:
        k, names = k_part
        cu = tmp / f"part{k}.cu"
        cu.write_text(source + "\nvoid* dcx_instantiate[] = {" + ",".join(
            f"(void*)&{n}" for n in names) + "};\n")
        r = subprocess.run([nvcc, f"-arch={arch}", "-std=c++17", *NVRTC_OPTIONS, "-Xptxas", "-v",
                            "-c", str(cu), "-o", str(cu.with_suffix(".o"))],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"nvcc failed:\n{r.stderr[:4000]}")
        return r.stderr

    names = list(dict.fromkeys(n for _, _, n in jobs))
    ncpu = max(1, os.cpu_count() or 1)
    parts = [(k, names[k::ncpu]) for k in range(min(ncpu, len(names)))]
    with tmpdir, ThreadPoolExecutor(len(parts)) as pool:
        log = "\n".join(pool.map(compile_part, parts))
    # mangled entry -> (registers, spill stores, spill loads)
    stats: dict[str, tuple[int, int, int]] = {}
    fn, spill = None, (0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            fn = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spill = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and fn:
            stats[fn] = (int(m.group(1)), *spill)
            fn = None
    bad = 0
    print(f"{'case':16s} {'candidate':18s} excl regs spill  incl regs spill  blocks/SM "
          "(registers)  asked")
    for case, label, name in jobs[::2]:
        row = []
        for ex in (True, False):
            targs = _template_args(name if ex else name.replace(", true, ", ", false, ", 1))
            hits = [v for k, v in stats.items() if _mangled_args(k) == targs]
            row.append(hits[0] if hits else (-1, -1, -1))
        block, minb = _block_minb(name)
        regs = max(r[0] for r in row)
        per_warp = -(-max(regs, 1) // 8) * 8 * 32
        fits = min(65536 // (per_warp * (block // 32)), 2048 // block, 32)
        ok = all(r[0] > 0 and r[1] == 0 and r[2] == 0 for r in row) and fits >= minb
        bad += not ok
        print(f"{case:16s} {label:18s} {row[0][0]:9d} {row[0][1]:5d}  {row[1][0]:9d} "
              f"{row[1][1]:5d}  {fits:9d}               {minb or '-'}  {'' if ok else 'DROP'}")
    return bad


def _template_args(name: str) -> list[str]:
    """A name expression's template arguments, POLL, WAIT and SCHED's defaults filled in
    (the mangled name spells them)."""
    inner = name[name.index("<") + 1: name.rindex(">")]
    args = [a.strip() for a in inner.split(",")]
    return args + ["20", "0", "0"][len(args) - 8:]


_MANGLE_TYPES = {"f": "float", "d": "double", "i": "int", "j": "unsigned int", "x": "long long",
                 "y": "unsigned long long", "h": "unsigned char", "a": "signed char",
                 "s": "short", "t": "unsigned short", "l": "long", "m": "unsigned long"}


def _mangled_args(mangled: str) -> list[str]:
    """Template arguments of a dcx_scan_lookback entry's Itanium name, as the source spells
    the ones the candidates use (enough to match the report to the candidate)."""
    m = re.match(r"_Z\d+dcx_scan_lookbackI(.*?)EvP", mangled)
    if not m:
        return []
    out, s = [], m.group(1)
    while s:
        if s.startswith("Li"):
            mm = re.match(r"Lin?(\d+)E", s)
            assert mm
            neg = s.startswith("Lin")
            out.append(("-" if neg else "") + mm.group(1))
            s = s[mm.end():]
        elif s.startswith("Lb"):
            out.append("true" if s[2] == "1" else "false")
            s = s[4:]
        elif s.startswith("N3dcx2b8E"):
            out.append("dcx::b8")
            s = s[len("N3dcx2b8E"):]
        else:
            out.append(_MANGLE_TYPES.get(s[0], s[0]))
            s = s[1:]
    return out


def _block_minb(name: str) -> tuple[int, int]:
    a = _template_args(name)
    return int(a[2]), int(a[5])



# ---- GPU ------------------------------------------------------------------------------------


def _input(n: int, dtype: np.dtype, seed: int, small: bool = False) -> Any:
    import cupy

    rs = cupy.random.RandomState(seed)
    if small:  # float32 small integers: every prefix exact in any order of addition
        return rs.randint(-2, 3, size=n).astype(dtype)
    if dtype.kind == "f":
        return rs.standard_normal(n, dtype=dtype)
    return rs.randint(-1000, 1000, size=n, dtype=dtype)


def _exclusive(ref: Any) -> Any:
    import cupy

    return cupy.concatenate([cupy.zeros(1, ref.dtype), ref[:-1]])


class Checker:
    """Checks of one case (module docstring): the reference data made once per case."""

    def __init__(self, idt: np.dtype, odt: np.dtype, n: int) -> None:
        import cupy

        self.idt, self.odt, self.n = idt, odt, n
        self.sizes = (n, (1 << 20) + 12345)
        self.data = [_input(m, idt, 101 + m % 7) for m in self.sizes]
        if odt.kind == "f":
            self.small = [_input(m, idt, 7 + m % 5, small=True) for m in self.sizes]
            self.ref64 = [_exclusive(cupy.cumsum(d.astype(np.float64))) for d in self.data]
            self.scale = [cupy.cumsum(cupy.abs(r)) + 1 for r in self.ref64]
            self.small_want = [_exclusive(cupy.cumsum(d.astype(np.float64))).astype(odt)
                               for d in self.small]
            self.default_err: list[float] | None = None
        else:
            self.want = [_exclusive(cupy.cumsum(d, dtype=odt)) for d in self.data]

    def __call__(self, t: ScanTuning) -> str:
        import cupy

        from dask_compact import scan_array

        override_scan_tuning(self.odt.itemsize, t)
        try:
            bad: list[str] = []
            errs: list[float] = []
            for k, m in enumerate(self.sizes):
                got = scan_array(self.data[k], exclusive=True, dtype=self.odt)
                if self.odt.kind != "f":
                    if not bool(cupy.all(got == self.want[k])):
                        bad.append(f"ints@{m}")
                    continue
                err = float(cupy.max(cupy.abs(got.astype(np.float64) - self.ref64[k])
                                     / self.scale[k]))
                errs.append(err)
                sm = scan_array(self.small[k], exclusive=True, dtype=self.odt)
                if not bool(cupy.all(sm.view(np.int32) == self.small_want[k].view(np.int32))):
                    bad.append(f"exact@{m}")
                del got, sm
            if errs:
                if self.default_err is None:
                    self.default_err = errs
                for e, d in zip(errs, self.default_err):
                    if not e <= 4 * d + 1e-9:
                        bad.append(f"err {e:.2e} vs default {d:.2e}")
            return "ok" if not bad else "WRONG " + "; ".join(bad)
        finally:
            override_scan_tuning(self.odt.itemsize, None)


def _build_all(specs: list[ScanSpec]) -> list[str]:
    """Every candidate's look-back module, the 16-byte-vector kernel alone (the one these
    aligned buffers run; the public call's module also holds the element-wise one for
    misaligned views), compiled by the package's own ``build_modules`` (NVRTC, CuPy's disk
    cache) from a thread per candidate and put in ``cupy_scan``'s module cache under the spec
    the public call asks for. Returns the errors (a candidate that fails to build is a row)."""
    import cupy

    from dask_compact.backends import cupy_scan
    from dask_compact.backends.cupy_modules import build_modules

    device = cupy.cuda.Device().id
    errors: list[str] = []

    def one(spec: ScanSpec) -> None:
        try:
            with cupy.cuda.Device(device):
                names = {"vector": spec.names()["vector"]}
                mod = object.__new__(cupy_scan._Module)
                mod.spec, mod._names, mod._kernels = spec, names, {}
                mod.modules = build_modules(spec.source(), names)
                mod.kernel("vector")  # loaded now, not inside the timing
                cupy_scan._modules.put((device, spec), mod)
        except Exception as e:  # noqa: BLE001 -- a candidate that does not build is a row
            errors.append(f"{spec.tuning}: {type(e).__name__}: {str(e)[:500]}")

    with ThreadPoolExecutor(min(16, max(1, len(specs)))) as pool:
        list(pool.map(one, specs))
    return errors


def precheck(args: argparse.Namespace, cases: list[tuple[np.dtype, np.dtype]],
             only: set[str]) -> int:
    """The child of ``_risky_ok``: builds and checks the SCHED 1 candidates (and the default,
    the float error's bar) at 2^check_log2n; prints one line per candidate."""
    bad = 0
    for idt, odt in cases:
        cands = [c for c in candidates_for(idt, odt, only)
                 if c.label == "default" or c.tuning.sched]
        if len(cands) < 2:
            continue
        specs = [spec_of(idt, odt, c.tuning) for c in cands]
        errors = _build_all(specs)
        checker = Checker(idt, odt, 1 << args.check_log2n)
        for c in cands:
            res = "BUILD FAILED" if any(e.startswith(str(c.tuning)) for e in errors) else \
                checker(c.tuning)
            bad += res != "ok"
            print(f"precheck {idt}->{odt} {c.label}: {res}", flush=True)
    return bad


def _risky_ok(args: argparse.Namespace, cases: list[tuple[np.dtype, np.dtype]]) -> bool:
    """Whether the SCHED 1 candidates may run here: their precheck in a child process, killed
    after --precheck-timeout seconds (a hung kernel leaves with it)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--precheck", "--check-log2n", "20",
           "--cases", ",".join(f"{i}:{o}" for i, o in cases)]
    if args.only:
        cmd += ["--only", args.only]
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.precheck_timeout)
    except subprocess.TimeoutExpired:
        print(f"precheck of the SCHED 1 candidates timed out after {args.precheck_timeout} s: "
              "left out", flush=True)
        return False
    print(r.stdout.strip(), flush=True)
    if r.returncode:
        print(f"precheck failed (rc {r.returncode}): SCHED 1 candidates left out\n"
              + r.stderr[-2000:], flush=True)
        return False
    print(f"precheck passed in {time.perf_counter() - t:.1f} s", flush=True)
    return True


def _round_robin(fns: dict[str, Any], nbuf: int, reps: int, batch: int = 4,
                 warmup: int = 3) -> dict[str, float]:
    """Median ms per call of each fn(k) (k: the input buffer), batches taken in turn."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    for f in fns.values():
        for k in range(warmup):
            f(k % nbuf)
    stream.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times: dict[str, list[float]] = {name: [] for name in fns}
    k = 0
    for _ in range(reps):
        for name, f in fns.items():
            start.record()
            for _ in range(batch):
                f(k % nbuf)
                k += 1
            end.record()
            end.synchronize()
            times[name].append(cupy.cuda.get_elapsed_time(start, end) / batch)
    return {name: float(np.median(v)) for name, v in times.items()}


def gpu_sweep(args: argparse.Namespace, cases: list[tuple[np.dtype, np.dtype]],
              only: set[str]) -> None:
    import cupy

    import dask_compact
    from dask_compact import scan_array
    from dask_compact.backends import cupy_scan
    from dask_compact.backends.cupy_source import inline

    t0 = _T0
    src = inline("scan.cuh", set())
    if "int SCHED = 0" not in src:
        sys.exit(f"{dask_compact.__file__}: the installed kernels predate the tuning "
                 "parameters (POLL, WAIT, SCHED, CACHE bits 2-3): install this branch's wheel")
    print(f"dask_compact from {dask_compact.__file__}", flush=True)
    try:
        import torch
    except Exception:  # noqa: BLE001 -- torch is optional
        torch = None
    peer = None
    if args.peer_lib:
        sys.path.insert(0, str(Path(__file__).parent))  # the sibling modules, also under python -P
        from scan_bench import CubScan

        peer = CubScan(args.peer_lib)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    device = name.decode() if isinstance(name, bytes) else name
    sha = args.sha or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "nosha"
    sizes = sorted((int(s) for s in args.log2n.split(",")), reverse=True)
    stem = f"scan-tuning-{dt.date.today()}-{device.replace(' ', '_')}-{sha}"
    head = [f"# Look-back scan tuning sweep, {dt.date.today()}, {device}, git {sha}", "",
            f"ms per call: CUDA events, batches of 4 after 3 warm-up calls, median of "
            f"{args.reps} batches, all rows of a (case, n) round-robin. ours = status memset + "
            "kernel (`cupy_scan._lookback`, output allocated once); public = the default's "
            "`scan_array` call. copy% = the scan's bytes (input read, output written) per "
            "second over the copy's (read and write of the input); x default = the default's "
            "ms / the row's; x torch, x cupy, x CUB = the peer's ms / the row's. check: see "
            "benchmarks/scan_tuning.py.", ""]
    lines: list[str] = []
    rows: list[dict] = []
    risky = any(c.tuning.sched for i, o in cases for c in candidates_for(i, o, only))
    if risky and not args.no_precheck and not _risky_ok(args, cases):
        lines += ["SCHED 1 candidates left out: their precheck failed (see the output)", ""]
        only_safe = True
    else:
        only_safe = False

    def save() -> None:
        if not args.out:
            return
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{stem}.md").write_text("\n".join(head + lines) + "\n")
        if rows:
            with open(args.out / f"{stem}.csv", "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
                w.writeheader()
                w.writerows(rows)

    for idt, odt in cases:
        if time.perf_counter() - t0 > args.budget_s:
            msg = f"{idt}->{odt}: skipped, past --budget-s {args.budget_s}"
            print(msg, flush=True)
            lines += [msg, ""]
            continue
        cands = [c for c in candidates_for(idt, odt, only)
                 if not (only_safe and c.tuning.sched)]
        specs = [spec_of(idt, odt, c.tuning) for c in cands]
        tb = time.perf_counter()
        errors = _build_all(specs)
        print(f"{idt}->{odt}: {len(specs)} modules built in {time.perf_counter() - tb:.1f} s",
              flush=True)
        for e in errors:
            print("  build failed:", e, flush=True)
        failed = {e.split(": ", 1)[0] for e in errors}
        checker = Checker(idt, odt, 1 << args.check_log2n)
        checks = {}
        for c in cands:  # the default first: its float error is the bar
            if str(c.tuning) in failed:
                checks[c.label] = "BUILD FAILED"
                continue
            try:
                checks[c.label] = checker(c.tuning)
            except Exception as e:  # noqa: BLE001
                checks[c.label] = f"FAILED {type(e).__name__}: {str(e)[:200]}"
            if checks[c.label] != "ok":
                print(f"  {c.label}: {checks[c.label]}", flush=True)
        del checker
        cupy.get_default_memory_pool().free_all_blocks()
        for log2n in sizes:
            if time.perf_counter() - t0 > args.budget_s:
                msg = f"{idt}->{odt} 2^{log2n}: skipped, past --budget-s {args.budget_s}"
                print(msg, flush=True)
                lines += [msg, ""]
                continue
            n = 1 << log2n
            nbuf = max(1, min(4, -(-(256 * 2**20) // (n * idt.itemsize))))
            bufs = [_input(n, idt, 17 * k + 5) for k in range(nbuf)]
            out = cupy.empty(n, dtype=odt)
            fns: dict[str, Any] = {}
            stream = cupy.cuda.get_current_stream()
            fns["copy"] = lambda k: cupy.cuda.runtime.memcpyAsync(
                out.data.ptr, bufs[k].data.ptr, n * idt.itemsize,
                cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
            fns["cupy.cumsum"] = lambda k: cupy.cumsum(bufs[k], dtype=odt)
            if torch is not None:
                tbufs = [torch.as_tensor(b, device="cuda") for b in bufs]
                tdt = getattr(torch, odt.name)
                fns["torch.cumsum"] = lambda k: torch.cumsum(tbufs[k], 0, dtype=tdt)
            if peer is not None and peer.available(idt, odt):
                temp = cupy.empty(peer.temp_bytes(idt, odt, n), dtype=np.uint8)
                fns["cub"] = lambda k: peer(bufs[k], out, temp)
            fns["public default"] = lambda k: scan_array(bufs[k], exclusive=True, dtype=odt)
            base = odt.type(-0.0 if odt.kind == "f" else 0)
            for c, spec in zip(cands, specs):
                if checks[c.label] != "ok":
                    continue  # wrong results are not timed
                mod = cupy_scan.module_for(spec)
                fns[c.label] = (lambda k, mod=mod, spec=spec: cupy_scan._lookback(
                    mod, spec, bufs[k], out, n, base, None))
            try:
                ms = _round_robin(fns, nbuf, args.reps)
            except Exception as e:  # noqa: BLE001 -- keep what the other cases measured
                print(f"{idt}->{odt} 2^{log2n}: {type(e).__name__}: {e}", flush=True)
                lines += [f"{idt}->{odt} 2^{log2n}: {type(e).__name__}: {e}", ""]
                continue
            finally:
                del fns
            copy_gbps = 2 * n * idt.itemsize / ms["copy"] / 1e6
            d = ms.get("default")
            peers = [p for p in ("torch.cumsum", "cupy.cumsum", "cub") if p in ms]
            lines += [f"## {idt} -> {odt}, n = 2^{log2n}", "",
                      "copy {:.4f} ms ({:.0f} GB/s); ".format(ms["copy"], copy_gbps)
                      + "; ".join(f"{p} {ms[p]:.4f} ms" for p in
                                  ("public default", *peers)), "",
                      "| candidate | threads | rows | blocks/SM | cache | poll | wait | sched "
                      "| ms | copy% | x default | "
                      + " | ".join(f"x {p.split('.')[0]}" for p in peers) + " | check |",
                      "|---" * (12 + len(peers)) + "|"]
            for c in cands:
                t = c.tuning
                m = ms.get(c.label)
                pct = (n * (idt.itemsize + odt.itemsize) / m / 1e6 / copy_gbps * 100
                       if m else float("nan"))
                xd = d / m if (m and d) else float("nan")
                xs = [ms[p] / m if m else float("nan") for p in peers]
                row = {"case": f"{idt}->{odt}", "log2n": log2n, "candidate": c.label,
                       "block": t.block, "rows": t.rows, "min_blocks": t.min_blocks,
                       "cache": t.cache, "poll": t.poll, "wait": t.wait, "sched": t.sched,
                       "ms": m, "copy_pct": pct, "x_default": xd, "check": checks[c.label],
                       "copy_ms": ms["copy"], **{f"{p}_ms": ms[p] for p in
                                                 ("public default", *peers)}}
                rows.append(row)
                lines.append(f"| {c.label} | {t.block} | {t.rows} | {t.min_blocks} | {t.cache} "
                             f"| {t.poll} | {t.wait} | {t.sched} | "
                             + (f"{m:.4f} | {pct:.1f} | {xd:.3f} | " if m else "- | - | - | ")
                             + " | ".join(f"{x:.2f}" for x in xs) + f" | {checks[c.label]} |")
                print(f"{idt}->{odt} 2^{log2n} {c.label:18s} "
                      + (f"{m:8.4f} ms {pct:5.1f}% copy x{xd:.3f} default " if m else "- ")
                      + " ".join(f"x{x:.2f} {p}" for x, p in zip(xs, peers))
                      + f" {checks[c.label]}", flush=True)
            lines.append("")
            del bufs, out
            if torch is not None:
                del tbufs
            cupy.get_default_memory_pool().free_all_blocks()
            save()
    lines.append(f"(wall {time.perf_counter() - t0:.1f} s)")
    save()
    print("\n".join(head + lines))
    if args.out:
        print(f"wrote {args.out / stem}.md/.csv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--log2n", default="28,26,24")
    ap.add_argument("--cases", default="", help='comma-separated "in:out" (default: '
                    + ", ".join(f"{i}:{o}" for i, o in CASES) + ")")
    ap.add_argument("--only", default="", help="candidate labels (the default always runs)")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--check-log2n", type=int, default=24, help="the checks' random size")
    ap.add_argument("--budget-s", type=float, default=70.0,
                    help="start no case or size past this many seconds from the start")
    ap.add_argument("--peer-lib", default=None, help="cub_peer.so (benchmarks/peers/cub_peer.cu)")
    ap.add_argument("--sha", default=None)
    ap.add_argument("--list", action="store_true", help="print the candidates; no GPU")
    ap.add_argument("--ptxas", action="store_true", help="nvcc + ptxas -v of every candidate")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--precheck", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--precheck-timeout", type=float, default=45.0)
    ap.add_argument("--no-precheck", action="store_true",
                    help="run the SCHED 1 candidates without checking them in a child first")
    args = ap.parse_args()
    cases = parse_cases(args.cases)
    only = {s for s in args.only.split(",") if s}
    if args.list:
        list_candidates(cases, only)
    elif args.ptxas:
        sys.exit(1 if ptxas_report(cases, only, args.arch) else 0)
    elif args.precheck:
        sys.exit(1 if precheck(args, cases, only) else 0)
    else:
        if args.reps < 20:
            sys.exit("--reps: at least 20")
        gpu_sweep(args, cases, only)


if __name__ == "__main__":
    main()
