"""Argument checks shared by the array-level and the Dask-level API, with errors that say what to do."""

from __future__ import annotations

from typing import Any

import numpy as np

OUTPUTS = ("values", "indices", "both")
ALGORITHMS = ("auto", "single-pass", "three-pass", "hybrid")
# What the GPU kernels and the CPU loop are built for (no longdouble, no datetime/object/str).
DTYPES = tuple(
    np.dtype(t)
    for t in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)


def check_output(output: Any) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")


def check_algorithm(algorithm: Any, stable: bool) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    if algorithm == "hybrid" and stable:
        raise ValueError(
            'algorithm="hybrid" does not keep the input order within a chunk; '
            "pass stable=False to accept that"
        )


def check_dtype(dtype: Any) -> None:
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise TypeError(
            f"dask_compact compacts arrays of {', '.join(d.name for d in DTYPES)}; not {dtype}"
        )
