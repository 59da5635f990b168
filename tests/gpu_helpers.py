"""Helpers of the GPU tests that must run at collection on any machine."""

from __future__ import annotations


def device_count() -> int:
    """CUDA devices present; 0 where CuPy is installed but no driver or device is (a skip
    condition evaluated at collection raised there, and the GPU modules errored instead of
    being skipped)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 -- no driver, an old driver, no device: none usable
        return 0
