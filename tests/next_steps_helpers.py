"""What a user does next with a result, against NumPy: the operations that Dask (2026.7.1)
got wrong on arrays with empty chunks (a new-user probe, 2026-11-30; probe scripts
bug_empty_chunks.py, bug1_reverse*.py): reverse slicing gave ``[]``, ``std``/``var`` nan,
fancy indexing and ``argmax`` raised, and ``dd.concat`` of two results' DataFrames dropped a
row. Results come without empty chunks now (``graph.without_empty_chunks``)."""

from __future__ import annotations

import importlib.util

import dask
import numpy as np

DATAFRAMES = importlib.util.find_spec("pyarrow") is not None  # dask.dataframe needs it


def no_empty_chunk(y) -> None:
    """No empty chunk along axis 0 unless ``y`` is empty, then one chunk of length 0."""
    rows = y.chunks[0]
    assert all(rows) or rows == (0,), f"chunks {y.chunks}"


def check_next_steps(y, want: np.ndarray, scheduler=None, exact: bool = True) -> None:
    """``y`` (a result of known chunks) is ``want`` (``exact``: bit for bit, else to float
    rounding), and so are the next steps a user takes (computed together: one round trip)."""
    no_empty_chunk(y)
    n = len(want)
    steps = [("y", y, want)]
    # (a negative start before the first element, y[-2::-1] of one element, is Dask's own
    # bug whatever the chunks: [y[0]] where NumPy gives [])
    for s in (slice(None, None, -1), slice(None, None, -2), slice(max(n - 2, 0), None, -1),
              slice(-1, 0, -1), slice(1, None), slice(None, None, 3)):  # fmt: skip
        steps.append((f"y[{s}]", y[s], want[s]))
    picks = [0, n - 1, n // 2, 0] if n else []
    steps.append((f"y[{picks}]", y[picks], want[picks]))
    if want.ndim == 1:
        steps += [("y + 1", y + 1, want + 1), ("y.sum()", y.sum(), want.sum())]
    if n and want.ndim == 1:
        steps += [("y.std()", y.std(), want.std()), ("y.var()", y.var(), want.var()),
                  ("y.argmax()", y.argmax(), want.argmax()),
                  ("y.argmin()", y.argmin(), want.argmin())]  # fmt: skip
    kw = {} if scheduler is None else {"scheduler": scheduler}
    got = dask.compute(*[lazy for _, lazy, _ in steps], **kw)
    for (what, _, w), g in zip(steps, got):
        if what in ("y.std()", "y.var()", "y.sum()"):  # summed in another order than NumPy's
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-12, err_msg=what)
        elif exact:
            np.testing.assert_array_equal(g, w, err_msg=what)
        else:
            np.testing.assert_allclose(g, w, err_msg=what)


def check_columns(pairs: dict, scheduler=None) -> None:
    """The results in ``pairs`` (name -> (1-D result, want)), of one call and one length,
    concatenated as DataFrame columns: no row lost (where pyarrow, which dask.dataframe
    needs, is importable; this part alone is left out otherwise)."""
    if not DATAFRAMES:
        return
    import dask.dataframe as dd

    frames = [y.to_dask_dataframe(columns=name) for name, (y, _) in pairs.items()]
    kw = {} if scheduler is None else {"scheduler": scheduler}
    got = dd.concat(frames, axis=1).compute(**kw)
    for name, (_, want) in pairs.items():
        np.testing.assert_array_equal(got[name].to_numpy(), want, err_msg=name)
