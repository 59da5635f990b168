"""Property tests: for any array, chunking, predicate and mode, map_compact equals NumPy."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dask_compact  # noqa: F401

DTYPES = st.sampled_from(["int8", "int32", "uint16", "float32", "float64"])

# Predicate templates: (string form, callable form) with one or two thresholds.
TEMPLATES = [
    ("x > {a}", lambda a, b: lambda v: v > a),
    ("(x >= {a}) & (x < {b})", lambda a, b: lambda v: (v >= a) & (v < b)),
    ("~(x == {a}) | (x > {b})", lambda a, b: lambda v: ~(v == a) | (v > b)),
    ("abs(x) <= {a}", lambda a, b: lambda v: abs(v) <= a),
]


@st.composite
def chunked(draw):
    dtype = draw(DTYPES)
    n = draw(st.integers(0, 300))
    elems = (
        st.floats(-100, 100, width=np.dtype(dtype).itemsize * 8)
        if dtype.startswith("float")
        else st.integers(*(lambda i: (max(i.min, -100), min(i.max, 100)))(np.iinfo(dtype)))
    )
    a = draw(hnp.arrays(dtype, n, elements=elems))
    sizes = []
    left = n
    while left > 0:
        s = draw(st.integers(1, max(1, left)))
        sizes.append(s)
        left -= s
    return a, tuple(sizes) or (0,)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=chunked(),
    template=st.sampled_from(TEMPLATES),
    a=st.integers(-50, 50),
    b=st.integers(-50, 50),
    output=st.sampled_from(["values", "indices", "both"]),
    lazy=st.booleans(),
    as_string=st.booleans(),
)
def test_map_compact_equals_numpy(data, template, a, b, output, lazy, as_string):
    arr, sizes = data
    text, make = template
    fn = make(a, b)
    pred = text.format(a=a, b=b) if as_string else fn
    x = da.from_array(arr, chunks=(sizes,))
    m = np.asarray(fn(arr))
    with dask.config.set(scheduler="sync"):
        got = x.map_compact(pred, output=output, lazy=lazy)
        got = got if output == "both" else (got,)
        want = {
            "values": (arr[m],),
            "indices": (np.flatnonzero(m),),
            "both": (arr[m], np.flatnonzero(m)),
        }
        for g, w in zip(got, want[output]):
            np.testing.assert_array_equal(g.compute(), w)
            if not lazy:
                assert g.shape == w.shape
