"""A result's pieces, remade after their worker was lost, must have the lengths it recorded.

An eager result knows its chunk sizes: phase 1's counts, read once it ran. A piece lost with
its worker is remade from its run spec, which reads the input again; where the input changed
since (a Zarr store rewritten in place, read again by ``da.from_zarr``'s tasks), the remade
piece selected other data, of another length, and the result silently changed length and
mixed old and new data (2026-11-30, a probe: ``len(y)`` 499808, ``y.compute()`` 500604
long). Once the counts are known, each piece's run spec on the scheduler is wrapped so that a
remade piece of another length raises :class:`InputChangedError` instead (:func:`expect`);
the wrapping rides on a message that goes anyway (the direct path's sizes, the scheduler
question that reads the counts), so it costs no round trip. A piece lost before its run
spec is wrapped (a window of milliseconds) is remade unchecked.
"""

from __future__ import annotations

from typing import Any


class InputChangedError(RuntimeError):
    """A piece of a compacted result, remade after its worker was lost, has another length
    than the result recorded: the input changed since the result was made."""


def checked(expected: Any, key: Any, out: Any) -> Any:
    """``out``, a remade piece (an array, or a group task's tuple of runs' outputs, each an
    array or a ``(values, indices)`` pair), if its length is ``expected`` (an int, or one per
    run); else :class:`InputChangedError`."""
    if isinstance(expected, int):
        got: Any = len(out)
    else:
        got = [len(p[0] if isinstance(p, tuple) else p) for p in out]
        expected = list(expected)
    if got != expected:
        raise InputChangedError(
            f"dask_compact: a piece of a compacted result ({key!r}) was remade after its worker "
            f"was lost and selected {got} elements where the result recorded {expected}: the "
            "input changed since the result was made (e.g. a Zarr store written in place), so "
            "the result's known chunk sizes no longer hold. Make the result again (the call "
            "that made it: map_compact, partition, compact_records ...) on the input as it is "
            "now, or persist (or copy) the input before the call.")
    return out


def expect(lengths: dict, dask_scheduler: Any) -> None:
    """On the scheduler: wrap the run spec of each key of ``lengths`` (key -> its expected
    length, :func:`checked`) so that remaking it checks its length. Keys gone, of no run spec
    (scattered) or wrapped already are left as they are."""
    from dask._task_spec import Alias, Task, TaskRef

    for key, n in lengths.items():
        ts = dask_scheduler.tasks.get(key)
        spec = ts.run_spec if ts is not None else None
        if isinstance(spec, Task) and spec.func is checked:
            continue
        if isinstance(spec, Alias):  # dask's persist left our key an alias of a fused task
            inner: Any = TaskRef(spec.target)
        elif isinstance(spec, Task):
            inner = spec  # a nested task runs inline, with the same dependencies
        else:
            continue
        ts.run_spec = Task(key, checked, n, key, inner)


def checked_sort(call: str, edges: tuple, cuts: list, key: Any, pieces: list, out: Any) -> Any:
    """``out``, a remade merge of a sort's bucket (:func:`.sort_graph.build_sort`), if every
    one of its ``pieces`` (the sorted chunks, or their slices, that it merged) is still cut
    where the histogram cut it; else :class:`InputChangedError`. ``cuts[k]``: ``(base, lo,
    hi)``, the global index of piece k's first element and where the bucket lies in it;
    ``edges``: the splitters bounding the bucket (values, global indices) and, for each, the
    position in ``(lo, hi)`` it cut at (none for the first bucket's lower edge or the last's
    upper one: those are the piece's ends)."""
    from .dispatch import sort_bounds

    values, index, at = edges
    for piece, cut in zip(pieces, cuts):
        want = [cut[1 + a] for a in at]
        got = [int(b) for b in sort_bounds(piece, values, index, cut[0])]
        if got != want:
            raise InputChangedError(
                f"dask_compact: a piece of the result of {call} ({key!r}) was remade after its "
                f"worker was lost, and its input's sorted chunk is cut at {got} by the "
                f"splitters where the histogram recorded {want}: the input changed since the "
                "result was made (e.g. a Zarr store written in place), so the merged buckets "
                f"would no longer be in order. Make the result again ({call}) on the input as "
                "it is now, or persist (or copy) the input before the call.")
    return out


def expect_sorted(checks: dict, call: str, dask_scheduler: Any) -> None:
    """On the scheduler: wrap the run spec of each merge task of ``checks`` (key -> its
    pieces' keys, ``edges`` and ``cuts``: :func:`checked_sort`) so that remaking it checks
    where its pieces are cut. Keys gone, not plain tasks, or wrapped already are left as
    they are."""
    from dask._task_spec import List, Task, TaskRef

    for key, (deps, edges, cuts) in checks.items():
        ts = dask_scheduler.tasks.get(key)
        spec = ts.run_spec if ts is not None else None
        if not isinstance(spec, Task) or spec.func is checked_sort:
            continue
        # the pieces are the merge's own dependencies: the dependencies stay the same
        ts.run_spec = Task(key, checked_sort, call, edges, cuts, key,
                           List(*[TaskRef(k) for k in deps]), spec)


def expect_sorted_from(result: Any, checks: dict, call: str) -> None:
    """From the client: :func:`expect_sorted` for the persisted merges of a sort, sent without
    waiting (as :func:`expect_from`) once the first merge has run: sent at once, it could reach
    the scheduler before the graph (another connection) and find no merge to wrap. Nothing
    where the merges are not futures. Until 2026-12-01 (thirteenth session) a sort's merges
    were remade unchecked: after a Zarr store rewritten in place and every worker killed,
    each remade sorted chunk was cut at the old bounds, and ``sort`` came back neither the
    old data's sort nor the new data's, unsorted, with no error (the twelfth session's
    worker-loss probe)."""
    keys = _keys(result)
    first: Any = result.dask[keys[0]] if keys else None
    client = getattr(first, "client", None)
    if client is None or not hasattr(client, "_run_on_scheduler") or not checks:
        return
    def send(_: Any) -> None:
        # called in distributed's callback thread once the merge has finished, erred or been
        # cancelled (keys gone: nothing to wrap)
        try:
            client.loop.add_callback(_send, client, expect_sorted, checks, call)
        except RuntimeError:  # the client's loop closed meanwhile: nothing left to remake
            pass

    first.add_done_callback(send)


def expect_from(arrays: list, lengths: list) -> None:
    """From the client: :func:`expect` for the blocks of persisted 1-D ``arrays`` (each
    block a future), block ``i`` of each of length ``lengths[i]`` of that array's own list.
    Sent without waiting (no round trip on the call's path: the check is installed a moment
    later, the same window as the other paths'); nothing where the blocks are not futures
    (an in-process scheduler loses no worker). Until 2026-12-01 ``partition``'s and
    ``compact_records``' pieces were remade unchecked (the records' but for the field whose
    sizes were read), so a result over a rewritten Zarr store came back of another length
    than its chunks said (the twelfth session's worker-loss probe)."""
    wanted: dict = {}
    client = None
    for arr, ns in zip(arrays, lengths):
        for key, n in zip(_keys(arr), ns):
            block = arr.dask[key]
            client = getattr(block, "client", None)
            if client is None or not hasattr(client, "_run_on_scheduler"):
                return
            wanted[key] = int(n)
    if client is not None and wanted:
        client.loop.add_callback(_send, client, expect, wanted)


def _keys(arr: Any) -> list:
    from dask.core import flatten

    return list(flatten(arr.__dask_keys__()))


async def _send(client: Any, install: Any, *args: Any) -> None:
    try:
        await client._run_on_scheduler(install, *args)
    except Exception:  # noqa: BLE001 -- a scheduler gone: nothing of it to remake
        pass
