"""Predicates: traced callables and parsed strings become expression trees (see expr.py)."""

from .core import Predicate, PredicateLike, TypedPredicate, as_predicate, check_mask
from .expr import ConstantOverflowError, ParamOverflow

__all__ = [
    "Predicate",
    "PredicateLike",
    "TypedPredicate",
    "ParamOverflow",
    "ConstantOverflowError",
    "as_predicate",
    "check_mask",
]
