"""Helpers for the tests on a LocalCluster of worker processes."""

from __future__ import annotations

import os
import signal

import numpy as np


def kill_a_worker_then_check(client, a: np.ndarray, m: np.ndarray, v, i) -> str:
    """SIGKILL one worker process, then check that ``v`` and ``i`` (a map_compact result of
    ``a`` selecting ``m``, values and indices) and a rechunk of ``v`` compute exactly; wait for
    the nanny's replacement. Returns the address of the worker killed."""
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    try:
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
        np.testing.assert_array_equal(v.rechunk(997).compute(), a[m])
    finally:
        client.wait_for_workers(len(pids), timeout=60)
    assert pids[victim] not in client.run(os.getpid).values()  # it did die
    return victim
