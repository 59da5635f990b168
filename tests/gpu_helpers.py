"""Helpers of the GPU tests that must run at collection on any machine."""

from __future__ import annotations

from typing import Any


def expect(a: Any, m: Any, output: str) -> Any:
    """NumPy's selection of ``a`` (NumPy) by the mask ``m`` for ``output``."""
    import numpy as np

    v, i = a.ravel()[m.ravel()], np.flatnonzero(m)
    return {"values": v, "indices": i, "both": (v, i)}[output]


def check(got: Any, want: Any, output: str, stable: bool) -> None:
    """A GPU result (CuPy arrays) equals NumPy's ``want``: in order where ``stable``, else
    the same multiset (the unordered kernel)."""
    import cupy
    import numpy as np

    pairs = zip(got, want) if output == "both" else [(got, want)]
    for g, w in pairs:
        g = cupy.asnumpy(g)
        assert g.size == w.size
        if stable:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_array_equal(np.sort(g), np.sort(w))


def device_count() -> int:
    """CUDA devices present; 0 where CuPy is installed but no driver or device is (a skip
    condition evaluated at collection raised there, and the GPU modules errored instead of
    being skipped)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 -- no driver, an old driver, no device: none usable
        return 0


# A kernel that holds its stream for a given time (the GPU's global timer, ns): the work
# queued after it waits that long (the GPU tests of interrupted calls).
_HOLD = r"""
extern "C" __global__ void dcx_test_hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


def hold_kernel() -> Any:
    """The CuPy kernel of _HOLD: ``hold((1,), (1,), (np.uint64(ns),))`` holds the current
    stream ``ns`` nanoseconds."""
    import cupy

    return cupy.RawKernel(_HOLD, "dcx_test_hold")


class ArmedStream:
    """A stream as a call sees it (``ptr``, ``synchronize``) whose next synchronisation,
    while ``error`` holds an exception class, raises it before it waits (a KeyboardInterrupt
    landing between the work a call queued and its wait); then ``error`` is None again."""

    def __init__(self, stream: Any, error: type[BaseException] | None = None) -> None:
        self.stream, self.ptr, self.error = stream, stream.ptr, error

    def synchronize(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error()
        self.stream.synchronize()

    @property
    def done(self) -> bool:
        return bool(self.stream.done)


def served_by_shape(monkeypatch: Any, module: Any, name: str, functions_only: bool = False):
    """Spy on ``module.name``, a shaped lookup (``(a, pred_like, key)`` -> a call or None):
    yields the list of the predicates it served (a call returned), with the kept calls
    forgotten before and after; ``functions_only``: strings not listed. A generator for a
    fixture (``yield from``)."""
    from dask_compact.backends import cupy_backend as cb

    hits: list = []
    real = getattr(module, name)

    def spy(a: Any, pred_like: Any, key: Any) -> Any:
        found = real(a, pred_like, key)
        if found is not None and not (functions_only and isinstance(pred_like, str)):
            hits.append(pred_like)
        return found

    monkeypatch.setattr(module, name, spy)
    cb.forget_ready_calls()
    yield hits
    cb.forget_ready_calls()


def held_bytes(g: Any) -> int:
    """The bytes of the allocation a CuPy result's memory lies in, checked to start where the
    result does: an exact-size result is the head of an allocation (``cupy_device.head_rows``:
    a new array over the allocation's memory, not a view with a ``base``)."""
    assert g.data.ptr == g.data.mem.ptr
    return int(g.data.mem.size)


def pool_bytes(items: int, itemsize: int) -> int:
    """What CuPy's pool allocates for ``items`` elements: the request rounded up to its 512-byte
    unit."""
    return -(-items * itemsize // 512) * 512
