"""The demo cluster's job: make a Zarr dataset, compact it with the batch CLI on the TLS
cluster, and check the output against NumPy; then the same for a particle-like Zarr group
(fields x, y, z, vx, vy, vz, mass, id, pos), compacted as one record. Exit status 0 only if
everything matched.

Settings come from the environment (see compose.yaml): DEMO_SIZE, DEMO_CHUNK, DEMO_LOW,
DEMO_HIGH (select LOW < x < HIGH), DEMO_PARTICLES (rows of the group), DEMO_WORKERS (workers
to wait for), DEMO_DATA (/data).

In the container this is PID 1, which the kernel spares every signal it has no handler for:
SIGTERM (`docker stop`) and SIGINT stop it here (exit 143 / 130), and while `dask compact`
runs they are passed on to it, so that its own clean stop runs (its temporary output
removed) before this process exits with its status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import ssl
import subprocess
import sys
import time

import numpy as np
import zarr


def log(msg: str) -> None:
    print(f"[demo job] {msg}", flush=True)


# Every chunk stored, those equal to the fill value included (zarr skips those by default):
# `dask compact` refuses an input with chunks missing from the store, as it may be incomplete
# (the particles' "id" = arange(n) in chunks of one row made a first chunk [0], not stored).
ALL_CHUNKS_STORED = {"write_empty_chunks": True}


def make_dataset(path: str, size: int, chunk: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).random(size, dtype=np.float32)
    z = zarr.create_array(
        store=path,
        shape=a.shape,
        dtype=a.dtype,
        chunks=(chunk,),
        overwrite=True,
        config=ALL_CHUNKS_STORED,
    )
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
        a = group.create_array(
            name,
            shape=v.shape,
            dtype=v.dtype,
            chunks=(rows, *v.shape[1:]),
            config=ALL_CHUNKS_STORED,
        )
        a[:] = v
    return data


def cli_command(src: str, out: str, scheduler: str | None, *options: str) -> list[str]:
    """`dask compact SRC OUT OPTIONS` on the scheduler (None: the command's own threads)."""
    where = ["--scheduler", scheduler] if scheduler else []
    return [sys.executable, "-m", "dask_compact", src, out, *options, *where,
            "--overwrite", "--timeout", "60"]  # fmt: skip


def run_cli(cmd: list[str]) -> int:
    """Run the batch CLI as a child process and return its exit status.

    SIGTERM and SIGINT that reach this process meanwhile are passed on to it, and it is
    waited for: its own clean stop removes its temporary output and exits 143 / 130, and this
    process then exits with that status (SystemExit). `subprocess.run` SIGKILLed the child
    0.25 s after a Ctrl-C, and as PID 1 this process ignored SIGTERM (`podman stop` waited its
    10 s, then SIGKILLed everything). The child runs in a session of its own, so that a
    terminal's Ctrl-C reaches it once, through here, not twice.
    """
    received: list[int] = []
    child: subprocess.Popen | None = None

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        if child is not None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        child = subprocess.Popen(cmd, start_new_session=True)
        if received:  # came while it was being started
            child.send_signal(received[0])
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        name = signal.Signals(received[0]).name
        log(f"{name} passed on to the batch job, which exited {rc}")
        # a status of its own, else the signal's that killed it, else (it had just finished)
        # the one received
        raise SystemExit(rc if rc > 0 else 128 - rc if rc < 0 else 128 + received[0])
    return rc


def stop_on_signal(signum: int, frame: object) -> None:
    """SIGTERM / SIGINT outside `dask compact`: stop with the shell's status (143 / 130)."""
    log(f"stopped by {signal.Signals(signum).name}")
    raise SystemExit(128 + signum)


def compact_dataset(
    scheduler: str | None, data_dir: str, a: np.ndarray, low: float, high: float
) -> tuple[bool, int] | None:
    """The first step: `dask compact` on the array ``a`` (written by :func:`make_dataset`),
    its output checked against NumPy: whether all matched and how many were selected; None
    if the command failed."""
    src, out = f"{data_dir}/input.zarr", f"{data_dir}/selected.zarr"
    where = f"(x > {low!r}) & (x < {high!r})"
    cmd = cli_command(src, out, scheduler, "--where", where, "--output", "both", "--progress")
    log("running: " + " ".join(cmd))
    if run_cli(cmd) != 0:
        log("FAILED: the batch job exited with an error")
        return None
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
    return all(checks.values()), int(m.sum())


def compact_particles(scheduler: str | None, data_dir: str, n: int, chunk: int) -> bool:
    """The second step: `dask compact` on the group, the output checked against NumPy."""
    src, out = f"{data_dir}/particles.zarr", f"{data_dir}/selected-particles.zarr"
    data = make_particles(src, n, chunk, seed=20240902)
    log(f"wrote {src}: {n:,} particles, fields {', '.join(data)}")
    fields = ",".join(PARTICLE_FIELDS)
    cmd = cli_command(src, out, scheduler, "--where", PARTICLE_WHERE, "--fields", fields,
                      "--output", "both")  # fmt: skip
    log("running: " + " ".join(cmd))
    if run_cli(cmd) != 0:
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

    t0 = time.perf_counter()
    a = make_dataset(f"{data}/input.zarr", size, chunk, seed=20240901)
    log(f"wrote {data}/input.zarr: {size:,} float32 in chunks of {chunk:,} "
        f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    wait_for_workers(args.scheduler, int(env.get("DEMO_WORKERS", 1)), timeout=120)

    ok = refused_without_certificate(args.scheduler, env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"])
    ok &= refused_plain_tcp(args.scheduler)

    result = compact_dataset(args.scheduler, data, a, low, high)
    if result is None:
        return 1
    matched, selected = result
    ok &= matched
    ok &= compact_particles(args.scheduler, data, int(env.get("DEMO_PARTICLES", 2**20)), chunk // 8)
    log(
        f"{'OK' if ok else 'FAILED'}: {selected:,} of {size:,} selected, "
        f"{time.perf_counter() - t0:.1f} s in all"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    # PID 1 in the container: without handlers, SIGTERM and SIGINT would not stop it at all
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_on_signal)
    sys.exit(main())
