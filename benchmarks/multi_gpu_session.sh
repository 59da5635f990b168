#!/usr/bin/env bash
# One device call on a multi-GPU host (nvidia-h200-x4): the whole GPU test suite, then the
# multi-GPU pieces of the scale-out work: the example, the batch CLI on a GPU cluster, a
# scheduler with two `dask cuda worker` processes of two GPUs each (two "nodes" on one host),
# and the 1/2/4-GPU scaling benchmark. Run from the repository root with the wheels in .whl/ (carried).
# USE=1 also times the result used right after each call (multi_gpu_scaling.py --use).
# Key results are copied to $OUT (at most 8 files come back); everything else is in bundle.tgz.
set -u -o pipefail
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (the device README: it can take the shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/dcx_out}
REPO=$PWD
W=/tmp/dcx_work
mkdir -p "$W"
log() { echo "== $(date +%T) $*" | tee -a "$W/session.log"; }

log "install wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >> "$W/session.log" 2>&1 || log "pip install FAILED"
export PYTHONPATH=/tmp/site
{ nvidia-smi -L; git rev-parse --short HEAD 2>/dev/null; python3 -P -c "import cupy, dask, dask_cuda, dask_compact; \
print('cupy', cupy.__version__, 'dask', dask.__version__, 'dask_cuda', dask_cuda.__version__, \
'gpus', cupy.cuda.runtime.getDeviceCount())"; } > "$W/env.txt" 2>&1
cat "$W/env.txt"

want() { [[ " ${PARTS:-tests example cli multinode gpudemo scaling} " == *" $1 "* ]]; }

if want tests; then
log "GPU test suite (all, slow ones included)"
# the whole suite takes 390 s at -n 14 on a 4x H200 host (2026-11-28); -v keeps a failure's
# name where the limit cuts the run
timeout 420 python3 -P -m pytest ${PYTEST_SELECT:-tests/gpu} -m gpu -n 14 -v -p no:cacheprovider -o addopts="" \
  --junitxml="$W/junit.xml" > "$W/pytest_gpu.log" 2>&1
echo "pytest rc=$?" >> "$W/pytest_gpu.log"
grep -E "FAILED|ERROR|passed|failed|rc=" "$W/pytest_gpu.log" | tail -15

fi
cd /tmp   # run the scripts away from the source tree: the installed wheel is what is tested
if want example; then
log "multi-GPU example (one worker per GPU, data born on the GPUs)"
timeout 120 python3 "$REPO/examples/multi_gpu.py" --size $((2**30)) --chunk $((2**26)) --check \
  > "$W/example_multi_gpu.log" 2>&1; echo "example rc=$?" | tee -a "$W/example_multi_gpu.log"
tail -12 "$W/example_multi_gpu.log"

fi
python3 -c "import numpy as np; np.save('/tmp/cli_in.npy', np.random.default_rng(3).random(2**24, dtype=np.float32))"
if want cli; then
log "batch CLI on the local GPU cluster (auto)"
timeout 120 python3 -m dask_compact /tmp/cli_in.npy /tmp/cli_out.zarr --where "(x > 0.2) & (x < 0.3)" \
  --output both --chunks $((2**22)) > "$W/cli_gpu.log" 2>&1; echo "cli rc=$?" >> "$W/cli_gpu.log"
python3 -c "
import numpy as np, zarr
a = np.load('/tmp/cli_in.npy'); g = zarr.open_group('/tmp/cli_out.zarr', mode='r'); m = (a > 0.2) & (a < 0.3)
print('cli check values', np.array_equal(g['values'][:], a[m]), 'indices', np.array_equal(g['indices'][:], np.flatnonzero(m)), 'complete', dict(g.attrs).get('dask_compact'))
" >> "$W/cli_gpu.log" 2>&1
tail -10 "$W/cli_gpu.log"

fi
if want multinode; then
log "two 'nodes': dask scheduler + two dask cuda worker processes of 2 GPUs each, on the host address"
IP=$(hostname -I 2>/dev/null | awk '{print $1}'); IP=${IP:-127.0.0.1}
python3 -m distributed.cli.dask_scheduler --host "$IP" --port 8786 --no-dashboard > "$W/scheduler.log" 2>&1 &
SCHED=$!
sleep 4
CUDA_VISIBLE_DEVICES=0,1 python3 -m dask cuda worker "tcp://$IP:8786" --no-dashboard > "$W/node_a.log" 2>&1 &
NODE_A=$!
CUDA_VISIBLE_DEVICES=2,3 python3 -m dask cuda worker "tcp://$IP:8786" --no-dashboard > "$W/node_b.log" 2>&1 &
NODE_B=$!
timeout 90 python3 -c "from distributed import Client; c = Client('tcp://$IP:8786'); c.wait_for_workers(4, timeout=80); print('workers', sorted(c.nthreads()))" \
  > "$W/multinode.log" 2>&1
timeout 120 python3 "$REPO/examples/multi_gpu.py" --scheduler "tcp://$IP:8786" --size $((2**30)) \
  --chunk $((2**26)) --check >> "$W/multinode.log" 2>&1; echo "example rc=$?" >> "$W/multinode.log"
timeout 120 python3 -m dask_compact /tmp/cli_in.npy /tmp/cli_out2.zarr --where "(x > 0.2) & (x < 0.3)" \
  --output both --chunks $((2**22)) --scheduler "tcp://$IP:8786" >> "$W/multinode.log" 2>&1
echo "cli rc=$?" >> "$W/multinode.log"
python3 -c "
import numpy as np, zarr
a = np.load('/tmp/cli_in.npy'); g = zarr.open_group('/tmp/cli_out2.zarr', mode='r'); m = (a > 0.2) & (a < 0.3)
print('cli check values', np.array_equal(g['values'][:], a[m]), 'indices', np.array_equal(g['indices'][:], np.flatnonzero(m)))
" >> "$W/multinode.log" 2>&1
kill $NODE_A $NODE_B $SCHED 2>/dev/null; sleep 3
cat "$W/multinode.log"

fi
if want gpudemo; then
log "the docker demo's gpu profile as processes (no container engine here), TLS, one GPU per worker"
# certificates made with docker/make-certs.sh beforehand and carried (docker/certs is ignored)
( cd "$REPO" && timeout 240 python3 docker/compose_as_processes.py --profile gpu \
    --env-file docker/gpu.env --copy docker/demo_job.py:/opt/dask-compact/demo_job.py \
    --logs "$W/gpu-demo" ) > "$W/gpu_demo.log" 2>&1; echo "gpu demo rc=$?" >> "$W/gpu_demo.log"
for f in "$W"/gpu-demo/*.log; do echo "--- $(basename "$f")"; tail -25 "$f"; done >> "$W/gpu_demo.log"
grep -E "compose-as-processes|demo job|ran on|rc=" "$W/gpu_demo.log"
fi
if want scaling; then
log "scaling benchmark 1/2/4 GPUs"
timeout ${SCALING_TIMEOUT:-420} python3 "$REPO/benchmarks/multi_gpu_scaling.py" \
  --strong-log2n ${STRONG:-33 34} --weak-log2n ${WEAK:-32} --chunk-log2 28 \
  --gpus 1 2 4 --reps 5 ${USE:+--use} --out "$W" > "$W/scaling.log" 2>&1; echo "scaling rc=$?" | tee -a "$W/scaling.log"
grep "^|" "$W/scaling.log"
fi

log "collect"
cd "$W" && tar czf "$OUT/bundle.tgz" . 2>/dev/null
cp "$W/pytest_gpu.log" "$W/multinode.log" "$W/scaling.log" "$W/gpu_demo.log" "$OUT/" 2>/dev/null
for f in "$W"/multi-gpu-*.md "$W"/multi-gpu-*.png "$W"/multi-gpu-*.csv; do [ -f "$f" ] && cp "$f" "$OUT/"; done
ls "$OUT"
