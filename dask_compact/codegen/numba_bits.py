"""Bits of the generated CPU compaction loops (:mod:`.numba_loop`): LLVM's ``ctpop`` on a
uint64 (one ``popcnt`` instruction where the CPU has it), which numba does not expose (its
``cttz`` is ``numba.cpython.unsafe.numbers.trailing_zeros``), and when a loop visits set bits
rather than storing every row."""

from __future__ import annotations

from typing import Any

from numba.extending import intrinsic

__all__ = ["SPARSE_BELOW", "ctpop"]

# While the running mean of selected rows per block of 64 (over about its last 8 blocks) is
# below this, a block visits only its set bits (found by their trailing zeros: a branch per
# selected row, and one mispredicted at the end of the block); above it, a block stores every
# row (each kept or overwritten: 64 stores, no branch). Visiting costs less up to ~44 of 64
# selected rows on the 2-core CI machine. Decided by the running mean, not by each block's own
# count: at p near the crossover a block's count falls on either side by chance, and that
# branch mispredicted (0.90x around p = 0.6 with a per-block threshold of 40).
SPARSE_BELOW = 44


@intrinsic
def ctpop(typingctx: Any, x: Any) -> Any:
    """Set bits of the integer ``x``, of ``x``'s type."""
    sig = x(x)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.ctpop(args[0])

    return sig, codegen
