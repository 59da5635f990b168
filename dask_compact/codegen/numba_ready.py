"""numba, imported and its CPU target set up with Ctrl-C held; the kernels of the NumPy
backends import numba's names from here (the fused loops' builds are held themselves:
:func:`.numba_loop.numba_held`).

An interrupt inside numba's import leaves it half imported for the rest of the process, and
one inside the first compile's set-up of the CPU target (some 70 more numba modules, and the
typing and lowering registries, which are consumed as they are installed) loses definitions:
2026-11-30, a new-user probe, every later compiled call failed (`module 'numba' has no
attribute 'core'`, `No definition for lowering <built-in function lt>(int64, int64)`). So the
whole set-up runs here at once, held (about 1.4 s, spent at the first compile anyway); a
Ctrl-C meanwhile raises ``KeyboardInterrupt`` as it ends (the import of this module then
fails, and the next one does what is left: nothing half done). Here too, numba imported, the
fork hooks of :mod:`.numba_fork` are registered (once): a process forked while another
thread compiles can compile.
"""

from __future__ import annotations

import signal

from ..batch.signals import deferred

with deferred(signal.SIGINT):
    from numba import njit
    from numba.core.registry import cpu_target
    from numba.cpython.unsafe.numbers import trailing_zeros

    from . import numba_compress  # noqa: F401 - its intrinsics, installed by the refresh
    from .numba_fork import install as install_fork_hooks

    # a fork waits for another thread's compile: a child can compile (numba_fork)
    install_fork_hooks()

    cpu_target.typing_context.refresh()
    cpu_target.target_context.refresh()

__all__ = ["njit", "trailing_zeros"]
