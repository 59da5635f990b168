"""Run one profile of docker/compose.yaml as plain processes, for hosts without a container engine.

    sudo python docker/compose_as_processes.py --profile gpu --env-file docker/gpu.env \
        --copy docker/demo_job.py:/opt/dask-compact/demo_job.py [--certs DIR]

The GPU hosts this project is tested on have GPUs but no container engine, so the ``gpu``
profile cannot be brought up there as containers. This runs the same service definitions
instead: each service's ``command`` with its ``environment`` (the TLS settings included), the
profile's services only, its bind mounts made as symlinks at the container paths, named
volumes as directories, service names resolving to this host (an ``/etc/hosts`` line), and a
device reservation's ``device_ids`` as ``CUDA_VISIBLE_DEVICES``. ``--copy`` puts files where the
image would have them (Dockerfile ``COPY``). The packages come from this host's Python. The
exit status is the ``job`` service's; a service that exits before the job ends (a worker that
cannot start) is reported with the end of its log, everything is stopped, and its status (1
if 0) is returned; 124 if the job runs past ``--timeout``. Each service's output is in
``--logs`` (``/tmp/compose-logs/SERVICE.log``). It writes to ``/``: run it as root, on a
throwaway host.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def substitute(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` interpolation."""
    return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def read_env_file(path: Path | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines() if path else []:
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def argv_of(command: list[str]) -> list[str]:
    """The image's console scripts, as this Python's modules (no scripts on PATH needed)."""
    head, *rest = command
    if head == "dask":
        return [sys.executable, "-m", "dask", *rest]
    if head in ("python", "python3"):
        return [sys.executable, *rest]
    return command


def mount(spec: str, compose_dir: Path, env: dict[str, str], volumes_root: Path) -> None:
    src, dst = substitute(spec, env).split(":")[:2]
    target = Path(dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    if "/" not in src:  # a named volume: a directory shared by the services that mount it
        (volumes_root / src).mkdir(parents=True, exist_ok=True)
        src_path = volumes_root / src
    else:
        src_path = (compose_dir / src).resolve()
    if target.is_symlink():
        target.unlink()
    elif target.exists():  # never remove a real file or directory of the host
        raise SystemExit(f"{target} exists on this host; refusing to mount over it")
    target.symlink_to(src_path)


def gpus_of(service: dict) -> str | None:
    devices = (
        service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    )
    ids = [str(i) for d in devices for i in d.get("device_ids", [])]
    return ",".join(ids) if ids else None


def say(msg: str) -> None:
    print(f"[compose-as-processes] {msg}", flush=True)


def tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a service's log, indented."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"    ({e})"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def supervise(
    procs: dict[str, subprocess.Popen], logs: Path, timeout: float, poll_s: float = 0.5
) -> int:
    """Wait for the ``job`` service and return its exit status; but a service that exits
    before the job ends is reported at once, with the end of its log, and its status (1 if
    0) returned: the job would otherwise wait for workers that will never come (GPU workers
    without dask-cuda: "No such command 'cuda'"), and all one saw after minutes was "job
    exited 1". 124 if the job runs past ``timeout`` seconds. The caller stops the rest."""
    deadline = time.monotonic() + timeout
    while True:
        if (rc := procs["job"].poll()) is not None:
            say(f"job exited {rc}")
            if rc != 0:
                say(f"the end of {logs / 'job.log'}:\n{tail(logs / 'job.log')}")
            return rc
        for name, proc in procs.items():
            if name != "job" and (rc := proc.poll()) is not None:
                log = logs / f"{name}.log"
                say(f"{name} exited {rc} before the job ended; the end of {log}:\n{tail(log)}")
                say("stopping the other services")
                return rc or 1
        if time.monotonic() > deadline:
            say(f"the job is still running after {timeout:g} s (--timeout); stopping it")
            return 124
        time.sleep(poll_s)


def stop_all(procs: dict[str, subprocess.Popen], grace_s: float = 15) -> None:
    """SIGTERM to every service still running, SIGKILL to those still running after
    ``grace_s`` seconds."""
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compose", type=Path, default=HERE / "compose.yaml")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--env-file", type=Path)
    ap.add_argument("--copy", action="append", default=[], metavar="SRC:DST")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/compose-logs"))
    args = ap.parse_args()

    env = {**read_env_file(args.env_file), **os.environ}
    spec = yaml.safe_load(args.compose.read_text())  # merge keys (<<) resolved by PyYAML
    services = {
        n: s
        for n, s in spec["services"].items()
        if not s.get("profiles") or args.profile in s["profiles"]
    }
    names = " ".join(services)
    with open("/etc/hosts", "a") as hosts:  # service names resolve, as on a compose network
        hosts.write(f"\n127.0.0.1 {names}\n")
    for pair in args.copy:
        src, dst = pair.split(":")
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    args.logs.mkdir(parents=True, exist_ok=True)
    volumes_root = Path("/tmp/compose-volumes")

    procs: dict[str, subprocess.Popen] = {}
    # The scheduler first (the others depend on it), the job last.
    order = sorted(services, key=lambda n: (n != "scheduler", n == "job"))
    try:
        for name in order:
            svc = services[name]
            for v in svc.get("volumes", []):
                mount(v, args.compose.parent, env, volumes_root)
            penv = dict(os.environ)
            penv.update(
                {k: substitute(str(v), env) for k, v in (svc.get("environment") or {}).items()}
            )
            if (gpus := gpus_of(svc)) is not None:
                penv["CUDA_VISIBLE_DEVICES"] = gpus
            cmd = argv_of([substitute(str(c), env) for c in svc["command"]])
            say(f"{name}: {' '.join(cmd)}" + (f" (GPUs {gpus})" if gpus else ""))
            log = open(args.logs / f"{name}.log", "w")  # noqa: SIM115 -- kept open while it runs
            procs[name] = subprocess.Popen(
                cmd,
                env=penv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=svc.get("working_dir", "/tmp"),
            )
            time.sleep(3 if name == "scheduler" else 0.5)
        return supervise(procs, args.logs, args.timeout)
    finally:
        stop_all(procs)


if __name__ == "__main__":
    sys.exit(main())
