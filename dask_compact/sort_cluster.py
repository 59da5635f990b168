"""How many buckets a sort of NumPy chunks on a distributed cluster takes when ``buckets`` is
not given (:func:`dask_compact.sort`; the graph is :mod:`.sort_graph`'s).

The sample sort sorts every element twice (the local sorts, then each bucket's merge) and
pays three round trips to the client and a task per piece of the exchange; one bucket sorts
each element once, where one worker holds the whole array. Measured through the public call
(``benchmarks/sort_buckets.py``, float32 in chunks of 2^21, result persisted; 2026-12-07,
``sort-buckets-2026-12-07-*``):

* 2 workers x 1 thread (the 2-core CI machine): one bucket the fastest at 2^20 .. 2^25,
  0.33 s against 0.59 s by default (8 buckets) at 2^24, 0.62 against 1.42 s (16) at 2^25; no
  count of buckets beat it. Two threads cannot sort twice the work in less than one sort.
* 4 workers x 4 threads (the H100 host's 16 cores): 2^22 one bucket 0.06 s; 2^24 8 buckets
  0.17 s, 4 buckets 0.20 s, one 0.21 s; 2^26 4 buckets 0.75 s, one 0.90 s, 32 (the default
  then: a bucket per chunk) 1.37 s; 2^27 4 buckets 1.19 s, 64 (the default) 3.53 s.
* 16 workers x 1 thread: 2^24 8 buckets 0.18 s, one 0.23 s; 2^26 one 0.71 s, 32 0.88 s,
  16 0.93 s.

Hence: one bucket where the cluster has at most two threads in all or the array is small
(the setting ``dask-compact.sort.one-bucket-bytes``, 16 MiB; 0 turns both off), if a quarter
of the smallest worker's memory limit holds it (an array larger than any worker is still
cut); otherwise no more buckets than workers (a bucket per chunk made the exchange's
pieces, chunks x buckets, cost more than the sorts). CuPy chunks keep
:func:`.sort_graph.default_buckets`: a GPU worker is one thread, and its chunks are sorted on
its device (the multi-GPU measurements of docs/design.md).
"""

from __future__ import annotations

from typing import NamedTuple

import dask.array as da

from . import settings
from .placement import _held_where


class Shape(NamedTuple):
    """What the default needs of a cluster: its workers, their threads in all, and the
    smallest memory limit among them in bytes (0: none set)."""

    workers: int
    threads: int
    smallest_limit: int


def cluster_shape(x: da.Array) -> Shape | None:
    """The shape of the distributed cluster that ``x`` runs on (one round trip to its
    scheduler), or None where ``x`` runs under another scheduler, or its chunks are not
    declared NumPy (CuPy chunks keep the GPU default)."""
    if type(x._meta).__module__.split(".")[0] != "numpy":
        return None
    from dask.base import get_scheduler

    client = getattr(get_scheduler(collections=[x]), "__self__", None)
    if client is None or type(client).__name__ != "Client" or getattr(client, "asynchronous",
                                                                       False):
        return None
    # the placement's question with no keys: every worker's threads and memory limit
    _, nthreads, _, limits = client.run_on_scheduler(_held_where, [])
    if not nthreads:
        return None
    return Shape(len(nthreads), sum(nthreads.values()), min(limits.values(), default=0))


def one_bucket(n: int, itemsize: int, indices: bool, shape: Shape) -> bool:
    """Whether ``n`` elements of ``itemsize`` bytes are sorted as one bucket on ``shape``:
    a cluster of at most two threads or an array of at most ``sort.one-bucket-bytes`` (2^22
    float32: 0.06 s as one bucket on 4 workers x 4 threads, 0.10-0.12 s in 4-16 buckets),
    where a quarter of the smallest worker's memory limit holds it (and, for an argsort,
    its indices and the sort's own keys: 16 bytes an element more)."""
    small = settings.get("sort.one-bucket-bytes")
    held = n * (itemsize + (16 if indices else 0))
    if not small or (shape.smallest_limit and 4 * held > shape.smallest_limit):
        return False
    return shape.threads <= 2 or n * itemsize <= small


def cluster_buckets(default: int, n: int, itemsize: int, indices: bool, shape: Shape) -> int:
    """The buckets of a sort of ``n`` elements whose default (:func:`.sort_graph.
    default_buckets`) is ``default``, on ``shape``: one where :func:`one_bucket` says so,
    else no more than the workers (two at least, where the default asks as many)."""
    if one_bucket(n, itemsize, indices, shape):
        return 1
    return min(default, max(2, shape.workers))
