"""The demo cluster's job: make a Zarr dataset, compact it with the batch CLI on the TLS
cluster, and check the output against NumPy; then the same for a particle-like Zarr group
(fields x, y, z, vx, vy, vz, mass, id, pos), compacted as one record. Exit status 0 only if
everything matched.

Settings come from the environment (see compose.yaml): DEMO_SIZE, DEMO_CHUNK, DEMO_LOW,
DEMO_HIGH (select LOW < x < HIGH), DEMO_PARTICLES (rows of the group), DEMO_WORKERS (workers
to wait for), DEMO_DATA (/data).
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
import subprocess
import sys
import time

import numpy as np
import zarr


def log(msg: str) -> None:
    print(f"[demo job] {msg}", flush=True)


def make_dataset(path: str, size: int, chunk: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).random(size, dtype=np.float32)
    z = zarr.create_array(store=path, shape=a.shape, dtype=a.dtype, chunks=(chunk,), overwrite=True)
    z[:] = a
    return a


PARTICLE_WHERE = "(mass > 5) & (x < 0.3)"
PARTICLE_FIELDS = ["x", "y", "z", "id", "pos"]  # written; mass is read, not written


def make_particles(path: str, n: int, chunk: int, seed: int) -> dict[str, np.ndarray]:
    """A particle-like Zarr group: positions and velocities, mass, id, and pos (n, 3); the
    fields chunked differently (the job aligns them)."""
    rng = np.random.default_rng(seed)
    group = zarr.open_group(store=path, mode="w")
    data: dict[str, np.ndarray] = {}
    for k, name in enumerate(["x", "y", "z", "vx", "vy", "vz"]):
        data[name] = rng.random(n, dtype=np.float32 if k < 3 else np.float64)
    data["mass"] = (rng.random(n) * 10).astype(np.float32)
    data["id"] = np.arange(n, dtype=np.int64)
    data["pos"] = np.stack([data["x"], data["y"], data["z"]], axis=1)
    for k, (name, v) in enumerate(data.items()):
        rows = max(1, chunk // (1 + k % 3))
        a = group.create_array(name, shape=v.shape, dtype=v.dtype, chunks=(rows, *v.shape[1:]))
        a[:] = v
    return data


def compact_particles(scheduler: str, data_dir: str, n: int, chunk: int) -> bool:
    """The second step: `dask compact` on the group, the output checked against NumPy."""
    src, out = f"{data_dir}/particles.zarr", f"{data_dir}/selected-particles.zarr"
    data = make_particles(src, n, chunk, seed=20240902)
    log(f"wrote {src}: {n:,} particles, fields {', '.join(data)}")
    cmd = [
        sys.executable,
        "-m",
        "dask_compact",
        src,
        out,
        "--where",
        PARTICLE_WHERE,
        "--fields",
        ",".join(PARTICLE_FIELDS),
        "--output",
        "both",
        "--scheduler",
        scheduler,
        "--overwrite",
        "--timeout",
        "60",
    ]
    log("running: " + " ".join(cmd))
    if subprocess.run(cmd, check=False).returncode != 0:
        log("FAILED: the batch job on the group exited with an error")
        return False
    group = zarr.open_group(store=out, mode="r")
    m = (data["mass"] > 5) & (data["x"] < np.float32(0.3))
    checks = {
        "group marked complete": group.attrs["dask_compact"]["complete"] is True,
        "group holds the fields and indices": sorted(k for k, _ in group.arrays())
        == sorted([*PARTICLE_FIELDS, "indices"]),
        "indices == flatnonzero(mask)": np.array_equal(group["indices"][:], np.flatnonzero(m)),
    }
    for name in PARTICLE_FIELDS:
        checks[f"{name} == {name}[mask]"] = np.array_equal(group[name][:], data[name][m])
    for name, good in checks.items():
        log(f"check {name}: {'ok' if good else 'FAILED'}")
    log(f"particles: {int(m.sum()):,} of {n:,} selected")
    return all(checks.values())


def wait_for_workers(address: str, n: int, timeout: float) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:  # TLS settings from the environment
        client.wait_for_workers(n, timeout=timeout)
        log(f"{len(client.scheduler_info()['workers'])} workers connected to {address}")


def refused_without_certificate(address: str, ca_file: str) -> bool:
    """A TLS client that trusts the CA but has no certificate of its own must be refused:
    an accepted peer would get the scheduler's comm handshake as its first bytes."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.check_hostname = False
    reason = "connection closed"
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw) as conn:
                got = conn.recv(1)  # TLS 1.3: the "certificate required" alert arrives here
        except ssl.SSLError as e:
            got, reason = b"", str(e.reason or e)
    if got:
        log("a client without a certificate was NOT refused")
        return False
    log(f"client without a certificate refused: {reason}")
    return True


def refused_plain_tcp(address: str) -> bool:
    """A client that speaks plain TCP (no TLS at all) must not get through either."""
    import dask
    from distributed import Client
    from distributed.security import Security

    # Lift this process's own require-encryption, so the refusal seen is the scheduler's.
    try:
        with dask.config.set({"distributed.comm.require-encryption": False}):
            Client(address.replace("tls://", "tcp://"), security=Security(), timeout=5).close()
    except (OSError, TimeoutError) as e:
        log(f"plain tcp:// client refused: {type(e).__name__}")
        return True
    log("a plain tcp:// client was NOT refused")
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheduler", required=True)
    args = ap.parse_args()
    env = os.environ
    size, chunk = int(env.get("DEMO_SIZE", 2**24)), int(env.get("DEMO_CHUNK", 2**21))
    low, high = float(env.get("DEMO_LOW", 0.25)), float(env.get("DEMO_HIGH", 0.3))
    data = env.get("DEMO_DATA", "/data")
    src, out = f"{data}/input.zarr", f"{data}/selected.zarr"

    t0 = time.perf_counter()
    a = make_dataset(src, size, chunk, seed=20240901)
    log(f"wrote {src}: {size:,} float32 in chunks of {chunk:,} ({time.perf_counter() - t0:.1f} s)")
    wait_for_workers(args.scheduler, int(env.get("DEMO_WORKERS", 1)), timeout=120)

    ok = refused_without_certificate(args.scheduler, env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"])
    ok &= refused_plain_tcp(args.scheduler)

    where = f"(x > {low!r}) & (x < {high!r})"
    cmd = [
        sys.executable,
        "-m",
        "dask_compact",
        src,
        out,
        "--where",
        where,
        "--output",
        "both",
        "--scheduler",
        args.scheduler,
        "--overwrite",
        "--timeout",
        "60",
        "--progress",
    ]
    log("running: " + " ".join(cmd))
    if subprocess.run(cmd, check=False).returncode != 0:
        log("FAILED: the batch job exited with an error")
        return 1

    group = zarr.open_group(store=out, mode="r")
    m = (a > np.float32(low)) & (a < np.float32(high))
    checks = {
        "marked complete": group.attrs["dask_compact"]["complete"] is True,
        "values == a[mask]": np.array_equal(group["values"][:], a[m]),
        "indices == flatnonzero(mask)": np.array_equal(group["indices"][:], np.flatnonzero(m)),
        "indices are int64": group["indices"].dtype == np.int64,
    }
    for name, good in checks.items():
        log(f"check {name}: {'ok' if good else 'FAILED'}")
    ok &= all(checks.values())
    ok &= compact_particles(args.scheduler, data, int(env.get("DEMO_PARTICLES", 2**20)), chunk // 8)
    log(
        f"{'OK' if ok else 'FAILED'}: {int(m.sum()):,} of {size:,} selected, "
        f"{time.perf_counter() - t0:.1f} s in all"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
