#!/usr/bin/env bash
# One device call for the Dask side on one GPU: the Dask + CuPy tests, the one-GPU Dask
# benchmark, and a scheduler plus `dask cuda worker` started as separate processes (as on a
# multi-node cluster) with the batch CLI connecting to them. Wheels in .whl/ (carried).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dcx_out}; W=/tmp/dcx_work; REPO=$PWD; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$W/install.log" 2>&1 || echo "pip install FAILED"
export PYTHONPATH=/tmp/site
echo "== Dask + CuPy tests"
timeout 150 python3 -P -m pytest tests/gpu/test_dask_cupy.py -m gpu -q -p no:cacheprovider -o addopts="" \
  > "$W/pytest_dask_gpu.log" 2>&1; echo "pytest rc=$?"; grep -E "FAILED|passed|failed" "$W/pytest_dask_gpu.log" | tail -5
echo "== Dask benchmark (LocalCUDACluster, 2^30 float32 in 4 chunks)"
timeout 150 python3 -P benchmarks/dask_gpu.py --out "$W" > "$W/dask_gpu.log" 2>&1; echo "bench rc=$?"
grep -E "^\| (map_compact|dask_)" "$W/dask_gpu.log"
echo "== dask scheduler + dask cuda worker (separate processes), CLI with --scheduler"
cd /tmp
python3 -m distributed.cli.dask_scheduler --host 127.0.0.1 --port 8786 --no-dashboard > "$W/scheduler.log" 2>&1 &
sleep 4
python3 -m dask cuda worker tcp://127.0.0.1:8786 --no-dashboard > "$W/cuda_worker.log" 2>&1 &
sleep 12
python3 -c "import numpy as np; np.save('/tmp/in.npy', np.random.default_rng(5).random(2**25, dtype=np.float32))"
timeout 90 python3 -m dask_compact /tmp/in.npy /tmp/out.zarr --where "(x > 0.2) & (x < 0.3)" --output both \
  --scheduler tcp://127.0.0.1:8786 --chunks $((2**23)) > "$W/cli_remote.log" 2>&1; echo "cli rc=$?" >> "$W/cli_remote.log"
python3 -c "
import numpy as np, zarr
a = np.load('/tmp/in.npy'); g = zarr.open_group('/tmp/out.zarr', mode='r'); m = (a > 0.2) & (a < 0.3)
print('check values', np.array_equal(g['values'][:], a[m]), 'indices', np.array_equal(g['indices'][:], np.flatnonzero(m)))
" >> "$W/cli_remote.log" 2>&1
cat "$W/cli_remote.log"; grep -iE "error|exception" "$W/cuda_worker.log" | head -5
cd "$W" && tar czf "$OUT/bundle.tgz" . && cp dask_gpu.md pytest_dask_gpu.log cli_remote.log "$OUT/" 2>/dev/null; ls "$OUT"
