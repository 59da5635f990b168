"""Per-device caches of the CuPy layer: compiled kernels (per device, module spec, output and
group; a module per kernel), typed predicate functors (one per tree and dtype), the resident
grid of each kernel, each device's compute capability. All bounded (``dask_compact.cache``)
except the last."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..cache import BoundedCache
from ..codegen.cuda_functor import generate_functor
from ..predicate.core import Predicate
from .cupy_source import NVRTC_OPTIONS, ModuleSpec, RecordSpec, group_of

__all__ = [
    "compiled", "build_modules", "OutputKernels", "typed_functor", "resident_blocks",
    "device_cc", "modules",
]  # fmt: skip


def build_modules(code: str, names: dict[str, str],
                  shared: tuple[str, frozenset[str]] | None = None) -> dict[str, Any]:
    """role -> a compiled RawModule of ``code`` holding that role's kernel (``names``: role ->
    name expression), one module per distinct name, compiled at once from a thread each on the
    current device. ``shared``: (a source without the predicate, the roles whose kernels do
    not take it): those roles' modules are built from that source and kept per device for
    every predicate (:data:`shared_modules`), so a new predicate compiles only the kernels
    that take it.

    Why one module per kernel: NVRTC's time is mostly the kernels it instantiates, and one
    program is one thread's work, while NVRTC releases the GIL. Measured on the H100 host
    (``benchmarks/compile_probe.py``, float32 ``x < 0.5``, values' five compaction kernels,
    each from a cold cache, six runs): one module 0.63-0.97 s, a module per kernel one after
    another 0.75-1.34 s, a module per kernel from a thread each 0.44-0.68 s; a batch job's
    first run compiles beside the early read's decoding threads, where one compile thread took
    1.5-2.0 s. Each module's text ends with a line naming its kernel: CuPy's disk cache is
    keyed by the text, not by the names it instantiates."""
    import cupy

    device = cupy.cuda.Device().id
    free_code, free_roles = shared if shared is not None else ("", frozenset())
    by_name: dict[tuple[str, bool], Any] = {}
    # (name expression, shared) -> the line that ends its module's text, for those not held
    todo: dict[tuple[str, bool], str] = {}
    for role, name in names.items():
        job = (name, role in free_roles)
        if job in by_name or job in todo:
            continue
        held = shared_modules.get((device, free_code, name)) if job[1] else None
        if held is not None:
            by_name[job] = held
        else:  # a shared module's line names its kernel: its text serves every role
            todo[job] = f"// kernel: {name if job[1] else role}\n"
    if len(todo) > 1:
        _prime_cache_key(cupy, device)

    def build(job: tuple[str, bool]) -> Any:
        name, is_shared = job

        def compile_one() -> Any:
            with cupy.cuda.Device(device):  # the current device is per thread
                m = cupy.RawModule(code=(free_code if is_shared else code) + todo[job],
                                   options=NVRTC_OPTIONS, name_expressions=[name])
                # Compiled here, inside the cache's one build per key: a RawModule compiles
                # at its first get_function otherwise, unguarded, and a job's threads
                # reaching a new module together each ran NVRTC on it (9 concurrent
                # compiles, 5 s, seen in a cold cache on the H100).
                m.compile()
                return m

        if is_shared:
            return shared_modules.get_or_build((device, free_code, name), compile_one)
        return compile_one()

    if len(todo) == 1:  # no thread for one module (a new predicate's usual case)
        job = next(iter(todo))
        by_name[job] = build(job)
    elif todo:
        with ThreadPoolExecutor(len(todo), thread_name_prefix="dask-compact-nvrtc") as pool:
            by_name.update(zip(todo, pool.map(build, list(todo))))
    return {role: by_name[(name, role in free_roles)] for role, name in names.items()}


# (device, source without a predicate, name expression) -> the module of a kernel that takes
# no predicate (a tile scan, a copy, the records' scatter and gather): one for every predicate
# that uses it, where each predicate's module set had compiled its own copy. Bounded.
shared_modules: BoundedCache[tuple, Any] = BoundedCache("predicate-free cupy modules")


_primed: set[int] = set()  # devices on which a module was built with NVRTC_OPTIONS


def _prime_cache_key(cupy: Any, device: int) -> None:
    """CuPy keys its kernel cache by NVRTC's output for an empty program under the options and
    architecture, made at the first build of a process and kept: threads that each met it
    first each made it, one after another (a module per kernel, five threads, from CuPy's
    disk cache: 0.14 s, where one module had taken 0.03 s). A module with no kernel, built
    once per device before the threads start, makes it."""
    if device in _primed:
        return
    cupy.RawModule(code="// dask_compact: no kernel (makes CuPy's cache key once)\n",
                   options=NVRTC_OPTIONS).compile()
    _primed.add(device)


# The roles whose kernels stage a tile in dynamic shared memory (ModuleSpec.smem_bytes).
_TILE_ROLES = ("main", "chain", "prefix", "partition", "partition_lb")


class _Compiled:
    """The kernels of a :class:`ModuleSpec`'s output and group (``cupy_source.GROUPS``), or of
    a :class:`RecordSpec` (``output`` None), compiled on one device (:func:`build_modules`)."""

    def __init__(self, spec: ModuleSpec | RecordSpec, output: str | None = None,
                 group: str = "compact") -> None:
        self.spec, self.output = spec, output
        if isinstance(spec, ModuleSpec) and output is None:
            raise TypeError("a ModuleSpec's module is built per output and group")
        if output is None:
            assert isinstance(spec, RecordSpec)
            self._names, code = spec.names(), spec.source()
        else:
            assert isinstance(spec, ModuleSpec)
            self._names = spec.group_names(output, group)
            code = spec.group_source(output, group)
        self.modules = build_modules(code, self._names, spec.shared_part(self._names))
        self._kernels: dict[str, Any] = {}

    def kernel(self, role: str) -> Any:
        """The RawKernel of ``role`` (shared-memory limit raised where needed), made once: a
        plan asks for it per call, and the launch grid is cached per kernel object."""
        k = self._kernels.get(role)
        if k is None:
            k = self.modules[role].get_function(self._names[role])
            if isinstance(self.spec, ModuleSpec) and role in _TILE_ROLES:
                assert self.output is not None
                smem = self.spec.smem_bytes(self.output)
                if smem > 0:  # static shared memory counts against the same 48 KB default
                    k.max_dynamic_shared_size_bytes = smem
            self._kernels[role] = k
        return k


# (device, spec, output, group) -> its module; bounded (dask_compact.cache): each holds
# compiled kernels.
modules: BoundedCache[tuple, _Compiled] = BoundedCache("cupy modules")


def compiled(spec: ModuleSpec | RecordSpec, output: str | None = None,
             group: str = "compact") -> _Compiled:
    import cupy

    # dask's threaded scheduler may ask for the same module from many threads: built once
    key = (cupy.cuda.Device().id, spec, output, group)
    return modules.get_or_build(key, lambda: _Compiled(spec, output, group))


class OutputKernels:
    """role -> RawKernel of one spec and output on the current device; each group's module
    is built at the first use of one of its roles."""

    def __init__(self, spec: ModuleSpec, output: str) -> None:
        self.spec, self.output = spec, output
        self._kernels: dict[str, Any] = {}

    def __getitem__(self, role: str) -> Any:
        k = self._kernels.get(role)
        if k is None:
            k = self._kernels[role] = compiled(self.spec, self.output,
                                              group_of(role)).kernel(role)
        return k


_functors: BoundedCache[tuple, tuple] = BoundedCache("cuda functors")


def typed_functor(
    dtype: Any, pred: Predicate, generate: Callable[[Any], Any] = generate_functor
) -> tuple:
    """Typing and code generation once per (typed tree, dtype, generator): both cost more
    than a launch. ``dtype``: one dtype, or a record's FieldDtypes with
    generate_record_functor.

    Keyed by the tree ``pred`` is typed to, not ``pred.expr``: a comparison with a Python int
    outside an integer's dtype is folded into a boolean parameter (expr.fold_outside), by
    the constant's value, so one ``pred.expr`` has two trees (``id != -1`` and ``id != 7`` on
    uint8), and a tree's folds are ``pred``'s own (the typed tree of another predicate with
    the same tree may fold ``==`` where this one folds ``!=``)."""
    tp = pred.typed(dtype)  # kept on pred (Predicate.memo): a dict look-up after the first
    functor = _functors.get_or_build((tp.expr, dtype, generate), lambda: generate(tp))
    return tp, functor


# Keyed by the kernel object's id: a module evicted and a new kernel at the same address may
# get an old entry, which is harmless (any grid is correct, see below); bounded all the same.
_grid_cache: BoundedCache[tuple, int] = BoundedCache("grid sizes")


def resident_blocks(kernel: Any, block: int, smem: int) -> int:
    """Blocks of the persistent tile kernels to launch: as many as fit on the device at once.

    More would only wait (tiles are taken from a counter, so any grid is correct); fewer would
    leave SMs idle.
    """
    import cupy

    dev = cupy.cuda.Device()
    key = (dev.id, id(kernel), block, smem)
    g = _grid_cache.get(key)
    if g is None:
        try:
            attrs = dev.attributes
            regs = max(32, int(getattr(kernel, "num_regs", 64)))
            per_sm = min(
                attrs["MaxThreadsPerMultiProcessor"] // block,
                attrs["MaxRegistersPerMultiprocessor"] // (block * ((regs + 7) // 8 * 8)),
                attrs["MaxSharedMemoryPerMultiprocessor"] // (smem + 1024 + 64),
                32,
            )
            g = max(1, per_sm) * attrs["MultiProcessorCount"]
        except Exception:  # unknown attributes: one block per tile (correct, less overlap)
            g = 1 << 30
        _grid_cache.put(key, g)
    return g


_cc: dict[int, str] = {}


def device_cc() -> str:
    """The current device's compute capability ("90" for an H100): the tuning table's key."""
    import cupy

    dev = cupy.cuda.Device()
    cc = _cc.get(dev.id)
    if cc is None:
        cc = _cc[dev.id] = str(dev.compute_capability)
    return cc
