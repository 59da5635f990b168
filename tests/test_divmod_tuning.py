"""Which predicates call NumPy's float divmod on the device, and the tile shape they get.

A predicate whose functor calls ``kernels/npy_ops.cuh``'s float divmod (out of line: float
``%`` and ``//``) runs 8-byte types at ``cupy_tuning.DIVMOD_TABLE``'s shape, the others
(``**`` too, whose ``dpow`` is also out of line) at ``TABLE``'s. These checks need neither
nvcc nor a GPU; the compile and register check is in test_kernels_compile.py, the GPU run in
tests/gpu/test_out_of_line_math.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dask_compact.backends import cupy_tuning
from dask_compact.codegen.cuda_functor import calls_float_divmod, generate_functor
from dask_compact.predicate import as_predicate

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


@pytest.mark.parametrize(("dtype", "text"), [
    ("float64", "x % 5 == 1"), ("float64", "x // 7 == 2"), ("float64", "(x < 0) | (x // 3 > 2)"),
    ("float32", "x % 0.75 < 0.25"), ("float16", "x // 2 > 1"), ("int64", "x % 0.75 < 0.25"),
    ("int32", "x % 2.5 > 1"), ("float64", "(x ** 2 < 9) & (x % 4 == 1)"),
    ("uint64", "x // 2.5 == 1"), ("float64", "mod(x, 3) > 1"),
])  # fmt: skip
def test_float_remainder_and_floor_divide_call_divmod(dtype: str, text: str) -> None:
    tp = as_predicate(text).typed(np.dtype(dtype))
    assert calls_float_divmod(tp)
    assert generate_functor(tp).float_divmod


@pytest.mark.parametrize(("dtype", "text"), [
    ("float64", "x < 0.5"), ("int64", "x % 5 == 1"), ("int64", "x // 7 == 2"),
    ("uint64", "x ** 2 > 9"), ("float64", "abs(x) * 2 > exp(x)"), ("float64", "x / 7 < 1"),
    ("float32", "sqrt(x) > 2"), ("int8", "x % 3 == 0"), ("float64", "x ** 1.5 < 3"),
    ("int32", "x ** 0.5 > 3"), ("float64", "(x < 0) | (x ** x > 2)"),
])  # fmt: skip
def test_integer_division_powers_and_inline_calls_do_not(dtype: str, text: str) -> None:
    tp = as_predicate(text).typed(np.dtype(dtype))
    assert not calls_float_divmod(tp)
    assert not generate_functor(tp).float_divmod


def test_the_kernels_out_of_line_functions_are_divmod_and_pow() -> None:
    """npy_ops.cuh's __noinline__ functions are float divmod's (fdivmod_pair, dmod, smod: what
    remainder and floor_divide reach, cuda_functor.DIVMOD_CALLS), pow's (dpow, measured
    and kept at TABLE's shape) and 64-bit integer division past 32 bits (ifloordiv_wide,
    iremainder_wide, behind an inline 32-bit path, measured at TABLE's shape). A function
    moved out of line must be measured at both shapes and named here."""
    src = (KERNELS / "npy_ops.cuh").read_text()
    noinline = set(re.findall(r"__noinline__\s+[\w<>:, ]+?\s(\w+)\s*\(", src))
    assert noinline == {"dmod", "smod", "fdivmod_pair", "dpow", "ifloordiv_wide",
                        "iremainder_wide"}


def test_tuning_for_float_divmod_predicates() -> None:
    """8-byte single-pass takes DIVMOD_TABLE's measured shape; other sizes and
    algorithms keep TABLE's; a sweep's override wins over both; every entry says why."""
    on = cupy_tuning.MEASURED_ON
    for key, entry in cupy_tuning.DIVMOD_TABLE.items():
        assert entry.why and entry.variant in cupy_tuning.SINGLE_PASS_VARIANTS
        assert entry.tuning.items <= 32 and key[1] in cupy_tuning.ALGORITHMS
        assert entry.variant == cupy_tuning.variant_for(key[2], key[0])
    heavy = cupy_tuning.tuning_for("single-pass", 8, on, float_divmod=True)
    assert heavy == cupy_tuning.DIVMOD_TABLE[(on, "single-pass", 8)].tuning
    assert heavy != cupy_tuning.tuning_for("single-pass", 8, on)
    assert cupy_tuning.tuning_for("single-pass", 8, "80", float_divmod=True) == heavy
    for size in (1, 2, 4, 16):
        assert (cupy_tuning.tuning_for("single-pass", size, on, float_divmod=True)
                == cupy_tuning.tuning_for("single-pass", size, on))
    for alg in ("hybrid", "three-pass"):
        assert (cupy_tuning.tuning_for(alg, 8, on, float_divmod=True)
                == cupy_tuning.tuning_for(alg, 8, on))
    cupy_tuning.override_tuning(8, cupy_tuning.Tuning(128, 8), ("single-pass",))
    try:
        assert (cupy_tuning.tuning_for("single-pass", 8, on, float_divmod=True)
                == cupy_tuning.Tuning(128, 8))
    finally:
        cupy_tuning.override_tuning(8, None, ("single-pass",))
