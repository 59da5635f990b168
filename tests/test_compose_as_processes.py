"""docker/compose_as_processes.py reads the demo's compose file as compose would (the run itself
writes to / and needs GPUs: it runs on the GPU host, see docker/README.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def _module():
    spec = importlib.util.spec_from_file_location(
        "compose_as_processes", DOCKER / "compose_as_processes.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_interpolation_and_env_file(tmp_path):
    m = _module()
    env = {"A": "1", "EMPTY": ""}
    assert m.substitute("${A}-${B:-two}-${EMPTY:-three}", env) == "1-two-three"
    f = tmp_path / "x.env"
    f.write_text("# comment\nBASE_IMAGE=nvidia/cuda:13\n\nEXTRAS=gpu,zarr\n")
    assert m.read_env_file(f) == {"BASE_IMAGE": "nvidia/cuda:13", "EXTRAS": "gpu,zarr"}


def test_gpu_profile_services_commands_and_devices():
    m = _module()
    spec = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    gpu = {
        n: s for n, s in spec["services"].items() if not s.get("profiles") or "gpu" in s["profiles"]
    }
    assert set(gpu) == {"scheduler", "worker-gpu-0", "worker-gpu-1", "job"}
    assert [m.gpus_of(gpu[w]) for w in ("worker-gpu-0", "worker-gpu-1")] == ["0", "1"]
    assert m.gpus_of(gpu["scheduler"]) is None
    argv = m.argv_of([str(c) for c in gpu["worker-gpu-0"]["command"]])
    assert argv[:4] == [sys.executable, "-m", "dask", "cuda"]
    # the merge keys (<<) give every process the TLS settings
    for s in gpu.values():
        assert s["environment"]["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "true"


def _service(logs, name: str, code: str) -> subprocess.Popen:
    log = open(logs / f"{name}.log", "w")  # noqa: SIM115 -- the child writes it
    return subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)


def test_a_service_that_exits_early_is_reported_and_the_rest_stopped(tmp_path, capsys):
    """A worker that dies at once (dask-cuda missing) is reported with its log's end within
    a poll, not after the job's 120 s wait for workers as "job exited 1" (a new-user probe,
    2026-11-30); then every service is stopped."""
    m = _module()
    worker_dies = "import sys; print(\"Error: No such command 'cuda'.\"); sys.exit(2)"
    procs = {
        "scheduler": _service(tmp_path, "scheduler", "import time; time.sleep(60)"),
        "worker-gpu-0": _service(tmp_path, "worker-gpu-0", worker_dies),
        "job": _service(tmp_path, "job", "import time; time.sleep(60)"),
    }
    t0 = time.monotonic()
    try:
        rc = m.supervise(procs, tmp_path, timeout=50, poll_s=0.05)
    finally:
        m.stop_all(procs, grace_s=5)
    assert rc == 2
    assert time.monotonic() - t0 < 20
    out = capsys.readouterr().out
    assert "worker-gpu-0 exited 2 before the job ended" in out, out
    assert "    Error: No such command 'cuda'." in out, out
    assert "job exited" not in out
    assert all(p.poll() is not None for p in procs.values())


def test_the_job_status_and_the_end_of_its_log_when_it_fails(tmp_path, capsys):
    m = _module()
    procs = {
        "scheduler": _service(tmp_path, "scheduler", "import time; time.sleep(60)"),
        "job": _service(tmp_path, "job", "import sys; print('[demo job] FAILED'); sys.exit(1)"),
    }
    try:
        rc = m.supervise(procs, tmp_path, timeout=50, poll_s=0.05)
    finally:
        m.stop_all(procs, grace_s=5)
    assert rc == 1
    out = capsys.readouterr().out
    assert "job exited 1" in out and "    [demo job] FAILED" in out, out


def test_a_job_past_the_timeout_is_stopped_with_124(tmp_path, capsys):
    m = _module()
    procs = {"job": _service(tmp_path, "job", "import time; time.sleep(60)")}
    try:
        assert m.supervise(procs, tmp_path, timeout=0.3, poll_s=0.05) == 124
    finally:
        m.stop_all(procs, grace_s=5)
    assert "still running after 0.3 s" in capsys.readouterr().out
