"""The predicate a caller passed, as the key of a call kept for its repeats.

A public call that ran once keeps what it ran (a GPU ready call, a CPU compiled loop with its
bound constants) under the predicate the caller passed, so that an equal call skips the
checks and the dispatch that the first one passed. The key: a string itself; a function its
trace key (:mod:`.predicate.memo`: its code and the current values of what it reads, so a
rebound constant is a new key, as for the trace memo); a Predicate its identity (the entry
must hold it, so the id is not reused while it lives). Anything else is not kept.
"""

from __future__ import annotations

from typing import Any

from .predicate.core import Predicate
from .predicate.memo import TRACED_UNDER, trace_key

__all__ = ["caller_key", "kept_key"]


def caller_key(pred_like: Any) -> Any:
    """The predicate a caller passed, as a kept call's key (see above), or None where it is
    not kept. A Predicate's key is its identity: the entry must hold it."""
    if isinstance(pred_like, str):
        return pred_like
    if isinstance(pred_like, Predicate):
        return ("predicate", id(pred_like))
    return trace_key(pred_like)


def kept_key(pred_like: Any, pred: Predicate) -> Any:
    """:func:`caller_key` for keeping a call that ran ``pred``, made from ``pred_like``: None
    where ``pred_like`` is a function whose key now is not the one ``pred`` was traced under.
    A thread rebinding a constant the function reads while the call ran would otherwise keep
    a call that compacted with one value under the other's key, and every later call with the
    other value would run it (a new-user probe found that race in the trace memo, 2026-11-30:
    predicate/memo.py trace_under_key). A mask-path predicate runs the function itself."""
    pk = caller_key(pred_like)
    if pk is None or isinstance(pred_like, (str, Predicate)) or pred.expr is None:
        return pk
    return pk if pred.memo.get(TRACED_UNDER) == pk else None
