"""The demo cluster's TLS (docker/make-certs.sh, the DASK_DISTRIBUTED__COMM__TLS__* settings of
docker/compose.yaml), checked on a local `dask scheduler` + `dask worker`: a client with the
cluster certificate works, the batch CLI works through the dask config from the environment,
and clients without the certificate (or with one from another CA, or plain TCP) are refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
from distributed import Client
from distributed.security import Security

ROOT = Path(__file__).resolve().parents[1]
MAKE_CERTS = ROOT / "docker" / "make-certs.sh"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def make_certs(directory: Path) -> Path:
    subprocess.run(["bash", str(MAKE_CERTS), str(directory)], check=True, capture_output=True)
    return directory


def tls_env(certs: Path) -> dict[str, str]:
    """What compose.yaml gives every container (paths adapted)."""
    env = {
        "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
        "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(certs / "ca.pem"),
    }
    for role in ("SCHEDULER", "WORKER", "CLIENT"):
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__CERT"] = str(certs / "cluster.pem")
        env[f"DASK_DISTRIBUTED__COMM__TLS__{role}__KEY"] = str(certs / "cluster-key.pem")
    return env


def dask_bin() -> str:
    return str(BIN / "dask") if (BIN / "dask").exists() else shutil.which("dask") or "dask"


def _address_in(sched_file, timeout: float) -> str:
    """The address in the scheduler file, once it is whole. The scheduler opens the file,
    then writes its JSON (``json.dump`` into the open file, distributed 2026.7.1): the file
    exists, empty or partial, before it is written. A fixed 0.2 s after it appeared was
    waited until 2026-12-01, a guess a loaded machine need not keep (not seen to fail)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(sched_file.read_text())["address"]
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            assert time.monotonic() < deadline, "the scheduler wrote no scheduler file"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    certs = make_certs(tmp / "certs")
    env = {**os.environ, **tls_env(certs)}
    sched_file = tmp / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                dask_bin(),
                "scheduler",
                "--protocol",
                "tls",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(sched_file),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        address = _address_in(sched_file, timeout=30)
        assert address.startswith("tls://")
        procs.append(
            subprocess.Popen(
                [
                    dask_bin(),
                    "worker",
                    address,
                    "--nthreads",
                    "2",
                    "--no-dashboard",
                    "--no-nanny",
                    "--memory-limit",
                    "1GiB",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        yield address, certs, tmp
    finally:
        # Nothing to keep: no graceful shutdown (a worker closing politely can take 10 s).
        for p in reversed(procs):
            p.kill()
            p.wait(timeout=10)


def test_client_with_certificate_works(cluster):
    address, certs, _ = cluster
    sec = Security(
        tls_ca_file=str(certs / "ca.pem"),
        tls_client_cert=str(certs / "cluster.pem"),
        tls_client_key=str(certs / "cluster-key.pem"),
        require_encryption=True,
    )
    with Client(address, security=sec, timeout=10) as client:
        client.wait_for_workers(1, timeout=20)
        assert client.submit(sum, [1, 2, 3]).result(timeout=10) == 6


def first_byte(address: str, ctx: ssl.SSLContext) -> bytes:
    """Open a TLS connection and read the first byte the scheduler sends (b"" if refused).

    An accepted peer gets the scheduler's comm handshake at once. A refused one gets the
    "certificate required" alert (TLS 1.3 sends it after the client's side of the handshake,
    so it surfaces on the first read) or a closed connection.
    """
    host, port = address[len("tls://") :].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw) as conn:
                return conn.recv(1)
        except ssl.SSLError:
            return b""


def test_client_without_certificate_is_refused(cluster):
    """A TLS client that trusts the CA but shows no certificate (distributed cannot even build
    such a client, so this is plain ssl), next to the same client with the certificate."""
    address, certs, _ = cluster
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    ctx.check_hostname = False
    assert first_byte(address, ctx) == b""
    ctx.load_cert_chain(str(certs / "cluster.pem"), str(certs / "cluster-key.pem"))
    assert len(first_byte(address, ctx)) == 1


@pytest.mark.parametrize("how", ["other-ca", "plain-tcp"])
def test_client_with_wrong_or_no_tls_is_refused(cluster, tmp_path, how):
    address, certs, _ = cluster
    if how == "other-ca":  # a certificate that the cluster's CA did not sign
        other = make_certs(tmp_path / "other")
        target, sec = (
            address,
            Security(
                tls_ca_file=str(certs / "ca.pem"),
                tls_client_cert=str(other / "cluster.pem"),
                tls_client_key=str(other / "cluster-key.pem"),
                require_encryption=True,
            ),
        )
    else:
        target, sec = address.replace("tls://", "tcp://"), Security()
    with pytest.raises((OSError, TimeoutError)):
        Client(target, security=sec, timeout=3)


def test_cli_uses_tls_config_from_environment(cluster):
    address, certs, tmp = cluster
    a = np.random.default_rng(1).random(5000)
    np.save(tmp / "a.npy", a)
    argv = [
        sys.executable,
        "-m",
        "dask_compact",
        str(tmp / "a.npy"),
        str(tmp / "o.zarr"),
        "--where",
        "x > 0.8",
        "--scheduler",
        address,
        "--json",
        "--timeout",
        "20",
    ]
    proc = subprocess.run(
        argv,
        env={**os.environ, **tls_env(certs)},
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["selected"] == int((a > 0.8).sum())
    assert summary["scheduler"].startswith("distributed scheduler tls://")
    zarr = pytest.importorskip("zarr")
    np.testing.assert_array_equal(zarr.open_group(str(tmp / "o.zarr"))["values"][:], a[a > 0.8])

    # Without the certificate settings the same command fails cleanly.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM")}
    proc = subprocess.run(
        [*argv[:4], str(tmp / "o2.zarr"), *argv[5:-2], "--timeout", "3"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "cannot connect to the scheduler" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp / "o2.zarr").exists()


def test_the_scheduler_file_is_read_once_it_is_whole(tmp_path):
    """The file appears empty and is written later (here 0.5 s, as a loaded machine may
    delay the scheduler between the two): the address is the one written, not a
    JSONDecodeError (as the fixed 0.2 s after the file appeared gave)."""
    import threading

    sched_file = tmp_path / "scheduler.json"
    sched_file.write_text("")
    late = threading.Timer(0.5, sched_file.write_text, args=('{"address": "tls://a:1"}',))
    late.start()
    try:
        assert _address_in(sched_file, timeout=10) == "tls://a:1"
    finally:
        late.join()
