"""docker/compose_as_processes.py reads the demo's compose file as compose would (the run itself
writes to / and needs GPUs: it runs on the GPU host, see docker/README.md)."""

from __future__ import annotations

import importlib.util
import sys
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
