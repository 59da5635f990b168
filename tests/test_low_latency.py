"""dask_compact.low_latency on a real LocalCluster of worker processes: every batched stream of
the cluster set, workers and clients that join later included, distributed's intervals back
on request, and results unchanged."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster

import dask_compact

DEFAULT = {"client": 0.010, "to_worker": 0.005, "to_client": 0.002, "worker": 0.002}


def _scheduler_intervals(dask_scheduler=None) -> tuple[list, list]:
    return ([b.interval for b in dask_scheduler.stream_comms.values()],
            [b.interval for b in dask_scheduler.client_comms.values()])


def _worker_interval(dask_worker=None) -> float:
    return dask_worker.batched_stream.interval


def _intervals(client) -> dict:
    to_worker, to_client = client.run_on_scheduler(_scheduler_intervals)
    return {"client": {client.scheduler_comm.interval}, "to_worker": set(to_worker),
            "to_client": set(to_client), "worker": set(client.run(_worker_interval).values())}


def _local_cluster():
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                        dashboard_address=":0", worker_dashboard_address=None)


@pytest.fixture
def cluster():
    """A cluster of the test's own: the tests that set intervals or scale it."""
    with _local_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def unchanged_cluster():
    """One cluster for the tests that leave it as they found it (a refusal changes nothing;
    the asynchronous client's test restores the intervals it sets): a cluster per test was
    3-4 s of start and stop each (2026-12-01 (thirteenth session), CI time). Each checks
    distributed's intervals first, so one left changed by another fails there."""
    with _local_cluster() as c:
        yield c


def _assert_default_intervals(cluster) -> None:
    with Client(cluster) as client:
        got = _intervals(client)
    assert got == {k: {v} for k, v in DEFAULT.items()}


def test_sets_every_stream_now_and_later_and_restores(cluster):
    with Client(cluster) as client:
        assert _intervals(client) == {k: {v} for k, v in DEFAULT.items()}
        dask_compact.low_latency(client)
        assert _intervals(client) == {k: {0} for k in DEFAULT}
        # a worker and a client that connect afterwards get it from the plugins
        cluster.scale(3)
        client.wait_for_workers(3)
        with Client(cluster.scheduler_address) as other:
            got = _intervals(client)
            assert len(got) == 4 and got["to_client"] == {0} and got["worker"] == {0}
            assert len(client.run(_worker_interval)) == 3
            # the other client's own stream is its process's to set
            assert other.scheduler_comm.interval == DEFAULT["client"]
        # again with another value: replaced, no "overwriting" warning from distributed
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dask_compact.low_latency(client, interval="1ms")
        assert _intervals(client) == {k: {0.001} for k in DEFAULT}
        dask_compact.low_latency(client, interval=None)
        assert _intervals(client) == {k: {v} for k, v in DEFAULT.items()}
        cluster.scale(4)  # a worker that joins now keeps distributed's interval
        client.wait_for_workers(4)
        assert set(client.run(_worker_interval).values()) == {DEFAULT["worker"]}


def test_results_unchanged_and_default_client(cluster):
    a = np.random.default_rng(3).random(30_011).astype(np.float32)
    x = da.from_array(a, chunks=2_003)
    with Client(cluster) as client:
        dask_compact.low_latency()  # the default client
        assert client.scheduler_comm.interval == 0
        for p in (0.0, 0.37, 1.1):
            y = x.map_compact(lambda v, p=p: v < p)
            np.testing.assert_array_equal(y.compute(), a[a < p])
            # every chunk's count, less the empty ones (graph.without_empty_chunks)
            counts = [int((a[i:i + 2_003] < p).sum()) for i in range(0, a.size, 2_003)]
            assert y.chunks[0] == (tuple(c for c in counts if c) or (0,))
        i = x.map_compact("x > 0.5", output="indices")
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(a > 0.5))


@pytest.mark.parametrize("bad", [-1, "-2ms", "soon", float("nan")])
def test_refuses_a_negative_interval(unchanged_cluster, bad):
    _assert_default_intervals(unchanged_cluster)
    with Client(unchanged_cluster) as client, pytest.raises(ValueError, match="interval"):
        dask_compact.low_latency(client, interval=bad)
    _assert_default_intervals(unchanged_cluster)  # nothing set by a refused call


def test_an_asynchronous_client_on_its_loop_is_refused_and_a_thread_works(unchanged_cluster):
    """In a coroutine the calls of an asynchronous client return coroutines: low_latency set
    only the client's own stream and never installed the plugins, with no error (a probe);
    refused now, changing nothing; through asyncio.to_thread it works."""
    import asyncio

    cluster = unchanged_cluster
    _assert_default_intervals(cluster)

    async def main():
        async with Client(cluster.scheduler_address, asynchronous=True) as client:
            for interval in (0, None):
                with pytest.raises(RuntimeError, match="asyncio.to_thread"):
                    dask_compact.low_latency(client, interval=interval)
            assert client.scheduler_comm.interval == DEFAULT["client"]
            assert await client.run_on_scheduler(_scheduler_intervals) != ([0, 0], [0])
            await asyncio.to_thread(dask_compact.low_latency, client)
            to_worker, _ = await client.run_on_scheduler(_scheduler_intervals)
            assert set(to_worker) == {0}
            await asyncio.to_thread(dask_compact.low_latency, client, None)
            to_worker, _ = await client.run_on_scheduler(_scheduler_intervals)
            assert set(to_worker) == {DEFAULT["to_worker"]}

    asyncio.run(main())
    _assert_default_intervals(cluster)  # restored: the module's cluster as it was


def test_no_client_or_a_cluster_or_an_address_is_refused_saying_what_to_pass(unchanged_cluster):
    """low_latency() with no client said distributed's "No global client found and no address
    provided", and a LocalCluster or a scheduler address given for the client raised
    "AttributeError: ... has no attribute 'run_on_scheduler'" (a new-user probe, 2026-12-01,
    fourteenth session): each now says to pass a distributed Client, and how to make one."""
    from distributed import default_client

    try:
        default_client()
        pytest.skip("a default client exists in this process")
    except ValueError:
        pass
    with pytest.raises(ValueError, match=r"no client given and none is the default: pass one, "
                                         r"low_latency\(client\)"):
        dask_compact.low_latency()
    cluster = unchanged_cluster
    with pytest.raises(TypeError, match=r"takes a distributed Client, not LocalCluster: pass "
                                        r"Client\(cluster\)"):
        dask_compact.low_latency(cluster)
    with pytest.raises(TypeError, match=r"takes a distributed Client, not str: pass "
                                        r"Client\(address\)"):
        dask_compact.low_latency(cluster.scheduler_address, interval=None)
    _assert_default_intervals(cluster)  # nothing set by a refused call
