"""Every CUDA kernel, and the functors generated for a set of predicates, compile with nvcc.

Runs in CI without a GPU (skipped only where nvcc is missing). Sources are built by the same
functions the CuPy backend hands to NVRTC (``module_source``, ``ModuleSpec.names``); the name
expressions CuPy would instantiate are instantiated here by taking their addresses. Targets:
sm_90 (Hopper, what we tune for) and sm_80 (an older architecture the kernels must still support).
For sm_90 the ptxas resource report is checked for spills in the compaction kernels.

The larger units are compiled ahead, in the background, while the rest of the suite runs
(tests/compile_ahead.py; the builders are listed in :func:`compile_ahead_jobs`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from compile_ahead import AHEAD, Job

from dask_compact.backends import cupy_tuning
from dask_compact.backends.cupy_source import (
    FILES,
    NVRTC_OPTIONS,
    ModuleSpec,
    RecordSpec,
    inline,
    module_source,
)
from dask_compact.backends.cupy_tuning import ALGORITHMS, SINGLE_PASS_VARIANTS, tuning_for
from dask_compact.codegen.cuda_functor import (
    CodegenUnsupported,
    generate_functor,
    generate_record_functor,
)
from dask_compact.predicate.core import Predicate
from dask_compact.predicate.expr import UFUNCS, Call, Param, Var

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

ARCHS = ("sm_90", "sm_80")
DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
OUTPUTS = ("values", "indices", "both")


def _threshold(dtype: str) -> Predicate:
    """``x > p0`` (``x`` itself for bool): the simplest fused predicate of each dtype."""
    if dtype == "bool":
        return Predicate(Var(), (), None, "x")
    return Predicate(Call("greater", (Var(), Param(0, "float"))), (0.5,), None, "x > 0.5")


def _nvcc_all(jobs: list[Job], tmp: Path) -> list[str]:
    """``_nvcc`` of every job at once, one nvcc process per core: the largest translation
    units are cut in parts so that CI's two cores both compile (the single-pass module of
    every dtype took 51-80 s as one unit)."""
    with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda job: _nvcc(job, tmp), jobs))


def compile_command(job: Job, workdir: Path) -> list[str]:
    """nvcc's command line for ``job``, its source written into ``workdir``.

    The device code alone (``-cubin``), as NVRTC compiles it for CuPy: until 2026-12-01
    (fourteenth session) ``-c`` also compiled the host side (cudafe++'s stub per kernel and
    the instantiating array, with gcc), which NVRTC never does: 40 % of the CPU time of the
    functors' unit (685 kernels), a few per cent of the large units of few kernels. nvcc's
    whole report (its warnings and ptxas's per-function lines) is the same either way: the
    front end reads the host code, and instantiates the kernels it names, for the device
    pass too."""
    cu = workdir / f"{job.name}_{job.arch}.cu"
    cu.write_text(job.source)
    assert NVCC is not None
    opts = ["-std=c++17", *NVRTC_OPTIONS]
    if job.arch != SPILL_ARCH or job.unoptimised:
        opts += UNOPTIMISED
    return [NVCC, f"-arch={job.arch}", *opts, "-Xptxas", "-v", "-cubin", str(cu), "-o",
            str(cu.with_suffix(".cubin"))]  # fmt: skip


# The architecture whose ptxas report is checked for spills: compiled as NVRTC compiles (-O3).
SPILL_ARCH = "sm_90"
# The other architectures are compiled without optimisation (NVVM and ptxas at -O0): what
# they check, that every kernel instantiates, lowers and assembles for that target (the
# template errors of the front end, an intrinsic or an inline-PTX instruction the target
# lacks, static shared memory past 48 KiB, all of which ptxas reports at -O0 too), does not
# need the optimiser, which was ~85% of their time: the single-pass unit of half the dtypes
# for sm_80 26.5 s -> 4.5 s, a scan unit 16.7 -> 1.1 s, on the 2-core CI machine
# (2026-12-06). An sm_90-only instruction in inline PTX still fails for sm_80 at -O0
# ("Modifier '.async' requires .target sm_90 or higher", checked by hand that day).
UNOPTIMISED = ["-Xcicc", "-O0", "-Xptxas", "-O0"]


def _nvcc(job: Job, tmp: Path) -> str:
    """nvcc's report (stderr) of the job, which must compile: compiled ahead or here."""
    rc, err = AHEAD.compile(job, compile_command, tmp)
    assert rc == 0, f"nvcc failed for {job.name} ({job.arch}):\n{err[-6000:]}"
    return err


def _force(names: list[str]) -> str:
    """Instantiate the kernels CuPy would ask NVRTC for (host code takes their addresses)."""
    body = ",\n  ".join(f"(void*)&{n}" for n in names)
    return f"\nvoid* dcx_instantiate_for_test[] = {{\n  {body}\n}};\n"


def _per_function(ptxas_log: str, pattern: str) -> dict[str, re.Match]:
    """Function -> the last match of ``pattern`` in its part of ptxas's report."""
    out, fn = {}, None
    for line in ptxas_log.splitlines():
        m = re.search(r"(?:Function properties for|Compiling entry function) '?([^'\s]+)", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(pattern, line)
        if m and fn:
            out[fn] = m
    return out


def _spills(ptxas_log: str) -> dict[str, str]:
    """Entry function -> its 'spill' line, for functions that spill."""
    found = _per_function(ptxas_log, r"(\d+) bytes spill stores, (\d+) bytes spill loads")
    return {fn: m.string.strip() for fn, m in found.items() if int(m.group(1)) or int(m.group(2))}


def _registers(ptxas_log: str) -> dict[str, int]:
    """Entry function -> registers it uses, from ptxas's report."""
    found = _per_function(ptxas_log, r"Used (\d+) registers")
    return {fn: int(m.group(1)) for fn, m in found.items()}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_kernel_every_dtype_compiles(arch: str, algorithm: str, tmp_path: Path) -> None:
    """Every dtype x {fused, mask path} of one algorithm, in two translation units (half the
    dtypes each, compiled at once): all outputs on sm_90 (checked for spills; the unsigned
    dtypes in a third unit at -O0, see _every_kernel_jobs), values+indices ("both") and the
    mask path on sm_80."""
    jobs = _every_kernel_jobs(arch, algorithm)
    logs = _nvcc_all(jobs, tmp_path)
    if arch == "sm_90":
        spills = {fn: line for job, log in zip(jobs, logs) if not job.unoptimised
                  for fn, line in _spills(log).items()}  # fmt: skip
        assert not spills, f"register spills: {spills}"


def _every_kernel_jobs(arch: str, algorithm: str) -> list[Job]:
    if arch != SPILL_ARCH:
        return [Job(_kernels_unit(algorithm, arch, DTYPES[half::2]), arch,
                    f"{algorithm}_{half}") for half in (0, 1)]  # fmt: skip
    # The unsigned dtypes at -O0: their registers are their signed twins' (a comparison or
    # a load of the same width; the twins' spills are checked at -O3), and -O3 of all 14
    # dtypes was the suite's longest test (single-pass: 159 s on CI's machine, 2026-12-07)
    checked = [d for d in DTYPES if not d.startswith("uint")]
    unsigned = [d for d in DTYPES if d.startswith("uint")]
    return [*(Job(_kernels_unit(algorithm, arch, checked[half::2]), arch, f"{algorithm}_{half}")
              for half in (0, 1)),
            Job(_kernels_unit(algorithm, arch, unsigned), arch, f"{algorithm}_unsigned", True)]


def _kernels_unit(algorithm: str, arch: str, dtypes: list[str]) -> str:
    """One translation unit: the kernels of ``algorithm`` for ``dtypes``, every name CuPy
    would instantiate for them taken by address."""
    seen: set[str] = set()
    parts = [inline("npy_ops.cuh", seen), inline("compact_warp.cuh", seen)]
    names: list[str] = []
    outputs = OUTPUTS if arch == "sm_90" else ("both",)
    for dt in dtypes:
        functor = generate_functor(_threshold(dt).typed(dt))
        parts.append(functor.source)
        # single-pass: both look-back schedules (the count, tile-scan and prefix-scatter
        # kernels of the exact paths are in every spec's names)
        variants = SINGLE_PASS_VARIANTS if algorithm == "single-pass" else ("classic",)
        for f in (functor, None):
            for variant in variants:
                spec = ModuleSpec(
                    np.dtype(dt),
                    algorithm,
                    f,
                    tuning_for(algorithm, np.dtype(dt).itemsize),
                    variant,
                )
                for output in outputs:
                    names += [n for n in spec.names(output).values() if n not in names]
    for f in FILES[algorithm]:
        parts.append(inline(f, seen))
    return "\n".join(parts) + _force(names)


def _unary_or_binary(fn: str) -> int:
    return getattr(np, fn).nin


def _predicates() -> list[tuple[str, Predicate]]:
    """One predicate per whitelisted ufunc (plus where/real/imag and a compound one)."""
    out = []
    for fn in sorted(UFUNCS):
        nin = _unary_or_binary(fn)
        inner = Call(
            fn, (Var(),) if nin == 1 else (Var(), Param(0, "int" if "shift" in fn else "float"))
        )
        if fn.startswith(("bitwise", "invert", "left", "right")):
            inner = Call(fn, (Var(),) if nin == 1 else (Var(), Param(0, "int")))
        expr = Call("not_equal", (inner, Param(1, "int")))
        out.append(
            (fn, Predicate(expr, (0.5 if nin == 2 and "shift" not in fn else 3, 0), None, fn))
        )
    band = Call(
        "logical_and",
        (Call("greater", (Var(), Param(0, "float"))), Call("less", (Var(), Param(1, "float")))),
    )
    out.append(("band", Predicate(band, (0.2, 0.3), None, "band")))
    w = Call("where", (Call("isnan", (Var(),)), Param(0, "float"), Call("real", (Var(),))))
    out.append(
        ("where", Predicate(Call("less", (w, Param(1, "float"))), (0.0, 0.5), None, "where"))
    )
    # where's condition is any dtype's truth, as NumPy's (the functor casts it to bool)
    wt = Call("where", (Var(), Param(0, "int"), Param(1, "int")))
    wx = Call("not_equal", (wt, Param(2, "int")))
    out.append(("where truth", Predicate(wx, (1, 0, 0), None, "where(x, 1, 0) != 0")))
    im = Call("greater_equal", (Call("imag", (Var(),)), Param(0, "float")))
    out.append(("imag", Predicate(im, (0.0,), None, "imag")))
    # `v ** -1` and `v ** 0.5`: reciprocal/sqrt for floats, power for the rest (typing picks)
    for kind, c in (("int", -1), ("float", 0.5)):
        sp = Call("less", (Call("scalar_power", (Var(), Param(0, kind))), Param(1, "float")))
        out.append((f"scalar_power {c}", Predicate(sp, (c, 0.5), None, f"x ** {c}")))
    return out


# One thread, one element: the functor alone (the tile kernels around it are compiled above).
_EVAL_KERNEL = """
template <class T, class Pred, class... P>
__global__ void dcx_eval(const T* in, bool* out, long long n, P... p) {
  const Pred pred{p...};
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = pred(in[i]);
}
"""


@pytest.mark.parametrize("arch", ARCHS)
def test_generated_functors_compile(arch: str, tmp_path: Path) -> None:
    """Every whitelisted ufunc at every dtype NumPy types it for (plus where/real/imag and a
    compound predicate): the generated functor compiles."""
    job, generated, unsupported = _functors_unit(arch)
    _nvcc(job, tmp_path)
    assert generated > 300, (generated, unsupported)


def _functors_unit(arch: str) -> tuple[Job, int, int]:
    """The unit of every generated functor, how many there are and how many predicates the
    generator refused."""
    seen: set[str] = set()
    parts = [inline("npy_ops.cuh", seen), _EVAL_KERNEL]
    names: list[str] = []
    done: set[str] = set()
    unsupported = 0
    for _label, pred in _predicates():
        for dt in DTYPES:
            try:
                tp = pred.typed(dt)
            except TypeError:
                continue  # NumPy has no loop (e.g. bitwise_and of floats), nor do we
            try:
                f = generate_functor(tp)
            except CodegenUnsupported:
                unsupported += 1
                continue
            if f.name in done:
                continue
            done.add(f.name)
            parts.append(f.source)
            targs = "".join(", " + c for c in f.param_ctypes)
            names.append(f"dcx_eval<{f.input_ctype}, {f.name}{targs}>")
    return Job("\n".join(parts) + _force(names), arch, "functors"), len(done), unsupported


@pytest.mark.parametrize("arch", ARCHS)
def test_record_modules_compile(arch: str, tmp_path: Path) -> None:
    """The record kernels (kernels/records.cu) with a record functor over two fields of every
    dtype pair on the diagonal and a mixed pair, and the mask path: each module's source as
    the backend builds it, without spills on sm_90; field names never reach the source."""
    job, specs = _records_unit(arch)
    evil_functor = specs[-1].functor
    assert evil_functor is not None
    assert "error" not in evil_functor.source and "injected" not in evil_functor.source
    log = _nvcc(job, tmp_path)
    if arch == "sm_90":
        spills = _spills(log)
        assert not spills, f"register spills: {spills}"
    assert not re.search(r"^\s*#\s*include", specs[1].source(), re.M)


def _records_unit(arch: str) -> tuple[Job, list[RecordSpec]]:
    """One translation unit of the record modules (the shared parts once, then every functor
    and instantiation), and their specs: the mask path's first (the scatter staged, not
    staged, 8 and 32 rows a thread), one over a field named ``e\\n#error injected`` last."""
    from dask_compact.predicate.fields import record_predicate

    evil = "e\n#error injected"
    # the scatter of the other forms: per lane, and the benchmark's other tile shapes (8 rows
    # a thread stage rows of 2-8 bytes only, 32 rows, 8192-row tiles, rows of 1-4 bytes only);
    # their scatter alone (the other kernels would only lengthen CI's compile)
    shapes = [RecordSpec(None, stage=False), RecordSpec(None, items=8),
              RecordSpec(None, items=32)]  # fmt: skip
    specs = [RecordSpec(None), *shapes]
    for dt in DTYPES:
        text = "a & (e != 0)" if dt == "bool" else "(a > 1) & (e < 2)"
        p = record_predicate(text.replace("e", "ev"), ("a", "ev"))
        for other in sorted({dt, "float64"}):
            specs.append(RecordSpec(generate_record_functor(p.typed({"a": dt, "ev": other}))))
    p = record_predicate(lambda **kw: kw[evil] > 0, ("a", evil))
    specs.append(RecordSpec(generate_record_functor(p.typed({evil: "float32"}))))
    seen: set[str] = set()
    parts = [inline("npy_ops.cuh", seen), inline("compact_warp.cuh", seen)]
    parts += [s.functor.source for s in specs if s.functor is not None]
    parts += [inline("count.cu", seen), inline("records.cu", seen)]
    kernels: list[str] = []
    for spec in specs:
        names = [spec.names()["scatter"]] if spec in shapes else spec.all_names()
        kernels += [n for n in names if n not in kernels]
    return Job("\n".join(parts) + _force(kernels), arch, "records"), specs


def test_module_source_is_self_contained() -> None:
    """A module's source has no #include left: NVRTC needs no include path, and the source
    alone keys CuPy's on-disk kernel cache (a changed header changes the key)."""
    pred = _threshold("float32")
    f = generate_functor(pred.typed("float32"))
    for alg in ALGORITHMS:
        src = module_source(ModuleSpec(np.dtype("float32"), alg, f, tuning_for("hybrid", 4)))
        assert not re.search(r"^\s*#\s*include", src, re.M)
        assert f.name in src


def test_group_modules_split_each_output_and_compile(tmp_path: Path) -> None:
    """A module holds one output's kernels of one group: the groups of an output cover its
    roles exactly once, ``partition`` alone in "split"; each (output, group) has its own
    source text (CuPy's disk cache is keyed by the text, not by the names instantiated), and
    a group's source with its names compiles on sm_90."""
    from dask_compact.backends.cupy_source import GROUPS, group_of

    f = generate_functor(_threshold("float32").typed("float32"))
    texts = set()
    for alg in ALGORITHMS:
        spec = ModuleSpec(np.dtype("float32"), alg, f, tuning_for(alg, 4))
        for output in OUTPUTS:
            roles = spec.names(output)
            parts = [spec.group_names(output, g) for g in GROUPS]
            assert sorted(r for p in parts for r in p) == sorted(roles)
            assert all(group_of(r) == "split" for r in parts[1]) and (
                ("partition" in parts[1]) == ("partition" in roles))
            for g in GROUPS:
                texts.add(spec.group_source(output, g))
    assert len(texts) == len(ALGORITHMS) * len(OUTPUTS) * len(GROUPS)
    spec = ModuleSpec(np.dtype("float32"), "single-pass", f, tuning_for("single-pass", 4))
    names = list(spec.group_names("values", "compact").values())
    assert len(names) < len(spec.all_names())
    _nvcc(Job(spec.group_source("values", "compact") + _force(names), "sm_90", "group"), tmp_path)


def test_kernels_without_the_predicate_come_from_one_source_for_every_predicate() -> None:
    """The kernels that do not take the predicate (their name does not name it) are built from
    the source without it (``shared_part``), the same text for two predicates and the mask
    path's own source (whose kernels the units above compile): a new predicate compiles only
    the kernels that take it. Which ones: the records path's all but the flags kernel; a
    values compaction's tile scan and copy; the three-pass scan and scatter; the split's
    reversal."""
    from dask_compact.backends.cupy_source import RecordSpec
    from dask_compact.predicate.fields import record_predicate

    fs = [generate_functor(_threshold("float32").typed("float32")),
          generate_functor(Predicate(Call("less", (Var(), Param(0, "float"))), (0.25,), None,
                                     "x < 0.25").typed("float32"))]
    expect = {"single-pass": ["copy_out", "scan"], "hybrid": ["copy_out"],
              "three-pass": ["scan", "scatter"]}
    for alg, shared_roles in expect.items():
        tuning = tuning_for(alg, 4)
        mask = ModuleSpec(np.dtype("float32"), alg, None, tuning)
        assert mask.shared_part(mask.group_names("values", "compact")) is None
        texts = set()
        for f in fs:
            spec = ModuleSpec(np.dtype("float32"), alg, f, tuning)
            for output in OUTPUTS:
                names = spec.group_names(output, "compact")
                text, roles = spec.shared_part(names)
                assert sorted(roles) == shared_roles, (alg, output, roles)
                assert f.name not in text and f.name in spec.source()
                assert all(f.name not in names[r] for r in roles)
                assert all(f.name in n for r, n in names.items() if r not in roles)
                assert text == mask.source()
                texts.add(text)
        assert len(texts) == 1
        spec = ModuleSpec(np.dtype("float32"), alg, fs[0], tuning)
        split = spec.group_names("values", "split")
        # the split group: its two split kernels take the predicate, the one-pass route's
        # reversal of the others' run does not
        shared = spec.shared_part(split)
        assert (shared is None) if not split else (shared[1] == {"reverse"}), (alg, shared)
    p = record_predicate("(a > 1) & (ev < 2)", ("a", "ev"))
    specs = [RecordSpec(generate_record_functor(p.typed({"a": "float32", "ev": dt})))
             for dt in ("float32", "int64")]
    parts = [spec.shared_part(spec.names()) for spec in specs]
    assert all(sorted(roles) == ["gather", "scan", "scatter", "spans", "split"]
               for _, roles in parts)
    assert parts[0][0] == parts[1][0] == RecordSpec(None).source()
    assert specs[0].names()["scatter"] == specs[1].names()["scatter"]
    assert RecordSpec(None).shared_part(RecordSpec(None).names()) is None


def test_tuning_table_and_kernel_constants() -> None:
    """Every (algorithm, dtype size) has a measured entry with its reason and a valid
    schedule; the three-pass group size the launch layer computes grids with is the kernel's;
    an override for a sweep applies and is undone."""
    for alg in ("single-pass", "hybrid"):
        for size in (1, 2, 4, 8, 16):
            entry = cupy_tuning.TABLE[(cupy_tuning.MEASURED_ON, alg, size)]
            assert entry.why and entry.variant in SINGLE_PASS_VARIANTS
            assert entry.tuning.items <= 32 or size >= 4  # one flag word per thread
    src = inline("three_pass.cu", set())
    m = re.search(r"constexpr int TP_GROUP = (\d+);", src)
    assert m and int(m.group(1)) == cupy_tuning.TP_GROUP
    with pytest.raises(TypeError):
        cupy_tuning.TABLE[("90", "hybrid", 4)] = None  # type: ignore[index]
    before = tuning_for("single-pass", 4)
    cupy_tuning.override_tuning(4, cupy_tuning.Tuning(128, 16))
    try:
        assert tuning_for("single-pass", 4) == cupy_tuning.Tuning(128, 16)
        assert tuning_for("three-pass", 4) == cupy_tuning.Tuning(128, 16)
    finally:
        cupy_tuning.override_tuning(4, None)
    assert tuning_for("single-pass", 4) == before
    assert tuning_for("single-pass", 4, cc="80") == before  # unmeasured: sm_90's entry


def test_float_divmod_predicates_compile_at_their_shape(tmp_path: Path) -> None:
    """float64 ``%`` and ``//`` (functors that call the out-of-line float divmod) compile on
    sm_90 at DIVMOD_TABLE's shape without spills, their count, single-pass and scatter
    (exact_mode "prefix") kernels under the 128 registers they took at TABLE's 256 x 32 (two
    blocks per SM): the reason for the entry. The same kernels at TABLE's shape are compiled
    by the other tests."""
    from dask_compact.predicate import as_predicate

    jobs = []
    for k, text in enumerate(("x % 5 == 1", "x // 7 == 2")):
        f = generate_functor(as_predicate(text).typed("float64"))
        assert f.float_divmod
        spec = ModuleSpec(np.dtype("float64"), "single-pass", f,
                          tuning_for("single-pass", 8, float_divmod=True),
                          cupy_tuning.variant_for(8))
        names = [*spec.group_names("values", "compact").values(),
                 *spec.group_names("values", "prefix").values()]
        jobs.append(Job(spec.group_source("values", "compact") + _force(names), "sm_90",
                        f"float_divmod_{k}"))
    for log in _nvcc_all(jobs, tmp_path):
        assert not _spills(log), _spills(log)
        regs = {fn: r for fn, r in _registers(log).items()
                if re.search(r"dcx_(count|single_pass|scatter)", fn)}
        assert len(regs) >= 3 and max(regs.values()) < 128, regs


@pytest.mark.parametrize("arch", ARCHS)
def test_lookback_sleeps_compile(arch: str, tmp_path: Path) -> None:
    """The single-pass look-back's sleeps (cupy_tuning.Tuning's poll and wait, for
    benchmarks/lookback_sleeps_ab.py) compile in both schedules, before the first read and
    after a first miss, without spills on sm_90; every table entry keeps the kernel's
    defaults (20, 0); override_lookback_sleeps applies to the single-pass kernel only, is
    range-checked and is undone."""
    from dataclasses import replace

    f32 = np.dtype("float32")
    functor = generate_functor(_threshold("float32").typed("float32"))
    base = tuning_for("single-pass", 4)
    assert {(e.tuning.poll, e.tuning.wait) for e in cupy_tuning.TABLE.values()} == {(20, 0)}
    cupy_tuning.override_lookback_sleeps(688, 1140)
    try:
        on = tuning_for("single-pass", 4)
        assert (on.block, on.items, on.poll, on.wait) == (base.block, base.items, 688, 1140)
        assert tuning_for("single-pass", 8).wait == 1140
        assert (tuning_for("hybrid", 4).poll, tuning_for("hybrid", 4).wait) == (20, 0)
    finally:
        cupy_tuning.override_lookback_sleeps(None)
    assert tuning_for("single-pass", 4) == base
    for bad in ((2000, 0), (20, 5000), (-1, 0)):
        with pytest.raises(ValueError, match="look-back sleeps"):
            cupy_tuning.override_lookback_sleeps(*bad)
    assert tuning_for("single-pass", 4) == base
    pa = "".join(", " + c for c in functor.param_ctypes)
    names = []
    sleeps = ((688, 1140), (688, -1140), (0, 0)) if arch == "sm_90" else ((688, -1140),)
    outputs = ("values", "indices") if arch == "sm_90" else ("values",)
    for variant, code in SINGLE_PASS_VARIANTS.items():
        plain = ModuleSpec(f32, "single-pass", functor, base, variant).names("values")["main"]
        assert plain == (f"dcx_single_pass<float, {functor.name}, 1, 0, {base.block}, "
                         f"{base.items}, {code}, 20, 0{pa}>")
        for poll, wait in sleeps:
            spec = ModuleSpec(f32, "single-pass", functor, replace(base, poll=poll, wait=wait),
                              variant)
            for output in outputs:
                name = spec.names(output)["main"]
                assert name.endswith(f", {code}, {poll}, {wait}{pa}>")
                names.append(name)
    log = _nvcc(Job(module_source(spec) + _force(names), arch, "lookback_sleeps"), tmp_path)
    if arch == "sm_90":
        assert not _spills(log), f"register spills: {_spills(log)}"


def test_record_launch_constants_and_copy_unit() -> None:
    """The records' flags kernel zeroes the tile scan's status words by its SCAN_TILE
    template argument, by which the launch layer sizes the counts array and the scan's grid;
    copy_unit is the widest of 16/8/4/2/1 bytes dividing the row and every address, and the
    column table has one entry per field, its row in those units (none for a zero-width row);
    the copy's launches by the work lists' lengths."""
    from dask_compact.backends.cupy_records_common import (
        column_entries,
        copy_launches,
        copy_unit,
    )

    for spec in (RecordSpec(None), RecordSpec(None, scan_block=128, scan_items=4)):
        names = spec.names()
        assert names["flags"].split(", ")[3] == str(spec.scan_tile)
        assert spec.scan_tile == spec.scan_block * spec.scan_items
        assert names["scan"] == f"dcx_tile_scan_blocks<{spec.scan_block}, {spec.scan_items}>"
        for tiles in (0, 1, spec.scan_tile, spec.scan_tile + 1, 5 * spec.scan_tile - 1):
            assert (spec.scan_blocks(tiles) - 1) * spec.scan_tile < max(tiles, 1)
            assert spec.scan_blocks(tiles) * spec.scan_tile >= tiles
        for tiles in (1, spec.scan_tile, 3 * spec.scan_tile + 5):
            assert spec.counts_size(tiles) == tiles + 3 + spec.scan_blocks(tiles)
    spec = RecordSpec(None)
    before = cupy_tuning.REC_DENSE_FROM
    try:
        for share, rows in ((0.0, 0), (0.5, spec.span // 2), (2.0, spec.span + 1)):
            cupy_tuning.REC_DENSE_FROM = share  # read at each call
            assert spec.dense_from() == rows
    finally:
        cupy_tuning.REC_DENSE_FROM = before
    assert RecordSpec(None).scan_block == cupy_tuning.REC_SCAN_BLOCK
    assert RecordSpec(None).scan_items == cupy_tuning.REC_SCAN_ITEMS
    assert RecordSpec(None).stage is cupy_tuning.REC_STAGE
    # the copy's launches (nspans 10, tiles 20, 2 tiles a span, 5 columns): each form on its
    # list; sized with no sparse span, the scatter over every tile without a list; sync-free,
    # both over every span, the lengths read on the device
    assert copy_launches((3, 7), 10, 20, 2, 5) == [("gather", (7,), True, 7),
                                                   ("scatter", (6, 5), True, 3)]
    assert copy_launches((10, 0), 10, 20, 2, 5) == [("scatter", (20, 5), False, 10)]
    assert copy_launches((0, 4), 10, 20, 2, 5) == [("gather", (4,), True, 4)]
    assert copy_launches((0, 0), 10, 20, 2, 5) == []
    assert copy_launches(None, 10, 20, 2, 5) == [("gather", (10,), True, -1),
                                                 ("scatter", (20, 5), True, -1)]
    for stage in (True, False):  # the staged copy is the scatter's last template argument
        assert RecordSpec(None, stage=stage).names()["scatter"].endswith(f"{str(stage).lower()}>")
    rng = np.random.default_rng(0)
    for _ in range(3000):
        row = int(rng.choice([1, 2, 4, 8, 16, int(rng.integers(1, 200))]))
        addresses = [int(a) * int(rng.choice([1, 2, 4, 8, 16, 32]))
                     for a in rng.integers(0, 2**40, int(rng.integers(0, 4)))]  # fmt: skip
        want = max(u for u in (1, 2, 4, 8, 16)
                   if row % u == 0 and all(a % u == 0 for a in addresses))  # fmt: skip
        assert copy_unit(row, *addresses) == want, (row, addresses)
        if len(addresses) == 2:  # the column table: one (src, dst, unit, stride) per field
            expected = [addresses[0], addresses[1], want, row // want]
            assert column_entries([(row, *addresses), (0, 16, 16)]) == expected


def _scan_specs(algorithms: tuple[str, ...]) -> list:
    """Every scan module the launch layer can build for ``algorithms``: each input dtype the
    public calls take x each accumulator it may be scanned into (np.cumsum's choice and every
    explicit ``dtype=``, the narrow integers summed in uint32 and stored by the look-back in
    their own width), the current look-back tuning."""
    from dask_compact.backends.cupy_scan_source import ACC_DTYPES, ScanSpec
    from dask_compact.scan import scan_dtype, summing_dtype

    # The narrow outputs change only the look-back's stores (scan.cuh's narrowed; a signed
    # output is its unsigned kernel's bits): checked for the inputs that bound the registers
    # (the widest, int64; the byte loads of bool and int8), every input would be 72 kernels
    # more, 48 s of one of CI's cores at -O3
    narrow = [np.dtype(t) for t in ("uint8", "uint16")]
    specs = []
    for dt in DTYPES:
        for out in (None, *ACC_DTYPES, *narrow):
            try:
                acc = scan_dtype(dt, out)
            except TypeError:
                continue  # float16, complex; floats into integers
            s = summing_dtype(acc)
            for alg in algorithms:
                if s != acc and (alg != "lookback" or dt not in ("bool", "int8", "int64")):
                    continue  # the uint32 scan, cast: that spec is among the uint32 ones
                for exclusive in (True, False) if alg == "lookback" else (True,):
                    specs.append(ScanSpec.make(np.dtype(dt), s, alg, exclusive,
                                               acc if s != acc else None))
    return specs


@pytest.mark.parametrize("arch", ARCHS)
def test_scan_modules_compile(arch: str, tmp_path: Path) -> None:
    """kernels/scan.cu with every instantiation the scan launch layer names (cupy_scan.py): on
    sm_90 every algorithm x input dtype x accumulator, both look-back vector widths, and no
    spills (the look-back of unsigned inputs compiled at -O0: see _scan_jobs); on sm_80 the
    look-back kernels (acquire/release, nanosleep), one per accumulator and tile shape. On
    sm_90, the compaction module of algorithm="scan" (kernels/scan_compact.cu): the flags
    kernel of a functor of every dtype and the scatter of every dtype and position type (no
    code of its own per architecture; on sm_80 too it took ~100 s of the CI machine's two
    cores)."""
    from dask_compact.backends.cupy_scan_source import GPU_ALGORITHMS
    from dask_compact.scan import GPU_ALGORITHMS as PUBLIC_GPU

    assert set(PUBLIC_GPU) == {"auto", *GPU_ALGORITHMS}
    specs = _scan_specs((*GPU_ALGORITHMS, "total") if arch == "sm_90" else ("lookback",))
    names = _scan_names(specs)
    if arch == "sm_90":  # cupy_scan.total's kernels (float32 sums) among them
        assert "dcx_scan_total<float, double, 256>" in names
    # the look-back's VEC (element-wise and 16-byte tiles) and both exclusive and inclusive
    vecs = {m.group(1) for n in names
            if (m := re.search(r", (\d+), \d+, (?:true|false), \d+(?:, -?\d+){0,3}>$", n))}
    assert {"1", "4"} <= vecs
    # the narrow dtypes' look-back stores its own width (scan.cu's O)
    assert any(n.endswith(", 0, unsigned short>") for n in names)
    assert any(n.endswith(", 0, unsigned char>") for n in names)
    assert any("true" in n for n in names) and any("false" in n for n in names)
    assert not re.search(r"^\s*#\s*include", specs[0].source(), re.M)
    jobs, cnames, cone_source = _scan_jobs(arch)
    if arch != "sm_90":  # the look-back kernels only
        _nvcc_all(jobs, tmp_path)
        return
    assert any(n.startswith("dcx_scan_flags") for n in cnames)
    assert not re.search(r"^\s*#\s*include", cone_source, re.M)
    logs = _nvcc_all(jobs, tmp_path)
    spills = {**_spills(logs[0]), **_spills(logs[1])}
    assert not spills, f"register spills: {spills}"


@pytest.mark.parametrize("arch", ARCHS)
def test_sort_keys_compile(arch: str, tmp_path: Path) -> None:
    """kernels/sort_keys.cu (cupy_sort._keys, the float argsort's keys) for every float width,
    as cupy_sort names it, without spills on sm_90."""
    from dask_compact.backends.cupy_source import (
        SORT_KEY_TYPES,
        sort_keys_name,
        sort_keys_source,
    )

    names = [sort_keys_name(w) for w in sorted(SORT_KEY_TYPES)]
    assert names == ["dcx_sort_keys<unsigned short>", "dcx_sort_keys<unsigned int>",
                     "dcx_sort_keys<unsigned long long>"]
    source = sort_keys_source()
    assert not re.search(r"^\s*#\s*include", source, re.M)
    (log,) = _nvcc_all([Job(source + _force(names), arch, "sort_keys")], tmp_path)
    if arch == "sm_90":
        assert not _spills(log), _spills(log)
        assert set(_registers(log)) >= {"_Z13dcx_sort_keysItEvPKT_PS0_xS0_S0_"}


@pytest.mark.parametrize("arch", ARCHS)
def test_scan_sweep_knobs_compile(arch: str, tmp_path: Path) -> None:
    """The look-back's sweep-only knobs (benchmarks/scan_tuning.py: the polling POLL and WAIT,
    CACHE bits 2 and 3, SCHED 1's early look-back) compile, without spills on sm_90, and are
    named only when set: the table's instantiations keep their names (and their code)."""
    from dask_compact.backends.cupy_scan_source import ScanSpec, ScanTuning, override_scan_tuning

    f32, i32, i64 = np.dtype("float32"), np.dtype("int32"), np.dtype("int64")
    # the table's 8-byte entries keep the kernel's default polling: unnamed; the 4-byte ones
    # take CUB's sleeps (cupy_scan_source.TABLE), named
    assert ScanSpec.make(i64, i64, "lookback", True).names()["vector"].endswith(", true, 3>")
    assert ScanSpec.make(f32, f32, "lookback", True).names()["vector"].endswith(
        ", true, 0, 688, 1140>")
    names = []
    for dt, acc, tuning in ((f32, f32, ScanTuning(128, 32, 3, 12, -32, 500)),
                            (i32, i32, ScanTuning(128, 32, 3, 9, 0)),
                            (i32, i64, ScanTuning(128, 32, 0, 11, 100, 0)),
                            (f32, f32, ScanTuning(128, 32, 3, 0, 20, 0, 1))):
        override_scan_tuning(acc.itemsize, tuning)
        try:
            spec = ScanSpec.make(dt, acc, "lookback", tuning.cache != 9)
        finally:
            override_scan_tuning(acc.itemsize, None)
        names.append(spec.names()["vector"])
    assert names[0].endswith(", 12, -32, 500>") and names[1].endswith(", 9, 0, 0>")
    assert names[3].endswith(", 0, 20, 0, 1>")
    for bad in (ScanTuning(128, 32, 3, 5), ScanTuning(128, 32, 3, 16),
                ScanTuning(128, 32, 3, 0, 2000), ScanTuning(128, 32, 3, 0, 20, 0, 2)):
        with pytest.raises(ValueError):
            override_scan_tuning(4, bad)
    log = _nvcc(Job(spec.source() + _force(names), arch, "scan_knobs"), tmp_path)
    if arch == "sm_90":
        assert not _spills(log), f"register spills: {_spills(log)}"


def test_narrow_scan_outputs_are_named_unsigned_and_lookback_only() -> None:
    """A narrow dtype= is stored by the look-back's O, named after POLL, WAIT and SCHED, as the
    unsigned type of its width (an int16 output is the bits of a uint16 one: one kernel); the
    other algorithms scan in uint32 and cast, and refuse a narrow spec; no O where the output
    is the accumulator (the table's names unchanged)."""
    from dask_compact.backends.cupy_scan_source import ScanSpec

    u32 = np.dtype(np.uint32)
    for out, bits in (("int16", "unsigned short"), ("uint16", "unsigned short"),
                      ("int8", "unsigned char"), ("uint8", "unsigned char")):
        for dt in ("int16", "int64", "bool"):
            names = ScanSpec.make(np.dtype(dt), u32, "lookback", True, np.dtype(out)).names()
            assert names["vector"].endswith(f", true, 0, 688, 1140, 0, {bits}>"), names
            assert names["scalar"].endswith(f", 0, {bits}>") and ", 1, 3, true" in names["scalar"]
        with pytest.raises(ValueError, match="not stored as"):
            ScanSpec.make(np.dtype("int16"), u32, "shared", True, np.dtype(out))
        with pytest.raises(ValueError, match="not stored as"):
            ScanSpec.make(np.dtype("int16"), np.dtype(np.int64), "lookback", True, np.dtype(out))
    plain = ScanSpec.make(np.dtype("int16"), u32, "lookback", True)
    assert plain == ScanSpec.make(np.dtype("int16"), u32, "lookback", True, u32)
    assert plain.names()["vector"].endswith(", true, 0, 688, 1140>")


def _scan_names(specs: list) -> list[str]:
    names: list[str] = []
    for spec in specs:
        names += [n for n in spec.all_names() if n not in names]
    return names


def _scan_jobs(arch: str) -> tuple[list[Job], list[str], str]:
    """The scan units of ``arch`` (every instantiation in two halves, so that both of CI's
    cores compile: sm_80 took 162 s as one unit, 85 s as two; on sm_90 also one module alone,
    what NVRTC gets, and the compaction modules of algorithm="scan"), the compaction kernels'
    names and the source of one compaction module alone."""
    from dask_compact.backends.cupy_scan_source import GPU_ALGORITHMS, ScanCompactSpec

    specs = _scan_specs((*GPU_ALGORITHMS, "total") if arch == "sm_90" else ("lookback",))
    names = _scan_names(specs)
    if arch != "sm_90":
        # What differs by architecture is the look-back protocol, which depends on the
        # accumulator and the tile's parameters, not on the input type: one instantiation per
        # those (the 232 of every input type took 100 s of CI's two cores; sm_90 compiles all)
        first: dict[str, str] = {}
        for n in names:
            first.setdefault(n.split(",", 1)[1], n)  # the template arguments after the input
        names = list(first.values())
    unchecked: list[str] = []
    if arch == "sm_90":
        # The look-back's spills are checked for the signed and float inputs: an unsigned
        # input differs from its signed twin by the extension of each load into the
        # accumulator (zero for sign), not by a register; those kernels compile at -O0, to
        # instantiate and assemble (the look-back of every input was 264 kernels at -O3, 125
        # of 135 s of one core; 2026-12-07)
        unchecked = [n for n in names if n.startswith("dcx_scan_lookback<unsigned ")]
        names = [n for n in names if n not in unchecked]
    half = len(names) // 2
    jobs = [Job(specs[0].source() + _force(part), arch, f"scan_{k}")
            for k, part in enumerate((names[:half], names[half:]))]  # fmt: skip
    if arch != "sm_90":
        return jobs, [], ""
    jobs.append(Job(specs[0].source() + _force(unchecked), arch, "scan_unsigned", True))
    one = specs[-1]  # one module per spec compiles alone too (what NVRTC gets)
    jobs.append(Job(one.source() + _force(one.all_names()), arch, "scan_one"))
    seen: set[str] = set()
    parts = [inline("npy_ops.cuh", seen), inline("compact_warp.cuh", seen)]
    cnames: list[str] = []
    for dt in DTYPES:
        functor = generate_functor(_threshold(dt).typed(dt))
        parts.append(functor.source)
        for pos in ("int32", "int64"):
            for f in (functor, None):
                spec = ScanCompactSpec(np.dtype(dt), np.dtype(pos), f)
                cnames += [n for n in spec.all_names() if n not in cnames]
    parts.append(inline("scan_compact.cu", seen))
    jobs.append(Job("\n".join(parts) + _force(cnames), arch, "scan_compact"))
    cone = ScanCompactSpec(np.dtype("float32"), np.dtype("int64"),
                           generate_functor(_threshold("float32").typed("float32")))
    cone_source = cone.source()
    jobs.append(Job(cone_source + _force(cone.all_names()), arch, "scan_compact_one"))
    return jobs, cnames, cone_source


@pytest.mark.parametrize("arch", ARCHS)
def test_int64_against_uint64_comparisons_compile(arch: str, tmp_path: Path) -> None:
    """A uint64 array against an np.int64 constant and an int64 array against an np.uint64
    one, each comparison and both operand orders: NumPy's exact mixed loops, which the
    generated functor hands to npy_ops.cuh in their own types (a GPU review probe met an NVRTC
    error here, 2026-11-28)."""
    import operator

    from dask_compact.predicate import as_predicate

    seen: set[str] = set()
    parts = [inline("npy_ops.cuh", seen), _EVAL_KERNEL]
    names: list[str] = []
    for op in (operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne):
        for dt, c in ((np.uint64, np.int64(-3)), (np.int64, np.uint64(2**63))):
            for pred in (lambda v, op=op, c=c: op(v, c), lambda v, op=op, c=c: op(c, v)):
                tp = as_predicate(pred).typed(np.dtype(dt))
                assert {np.dtype(d).kind for d in tp.types[tp.expr].loop} == {"i", "u"}
                f = generate_functor(tp)
                parts.append(f.source)
                targs = "".join(", " + t for t in f.param_ctypes)
                names.append(f"dcx_eval<{f.input_ctype}, {f.name}{targs}>")
    _nvcc(Job("\n".join(parts) + _force(names), arch, "mixed"), tmp_path)


def compile_ahead_jobs(test_name: str, params: dict) -> Callable[[], list[Job]] | None:
    """What the selected compile test ``test_name`` with ``params`` will compile, as a builder
    for tests/compile_ahead.py (the units of a second or more; None for the others, and
    where nvcc is missing)."""
    if NVCC is None:
        return None
    arch = params.get("arch", "")
    builders: dict[str, Callable[[], list[Job]]] = {
        "test_every_kernel_every_dtype_compiles":
            lambda: _every_kernel_jobs(arch, params.get("algorithm", "")),
        "test_generated_functors_compile": lambda: [_functors_unit(arch)[0]],
        "test_record_modules_compile": lambda: [_records_unit(arch)[0]],
        "test_scan_modules_compile": lambda: _scan_jobs(arch)[0],
    }  # fmt: skip
    return builders.get(test_name)
