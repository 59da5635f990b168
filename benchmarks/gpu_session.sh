#!/usr/bin/env bash
# One GPU-host session in one command (device time is scarce: build, test, sanitize and time
# together). Run from the repository root on the GPU host, with the wheels in .whl/ (carried):
#   bash benchmarks/gpu_session.sh first   # tests (not slow), sanitizers, SASS, quick timings + tuning
#   bash benchmarks/gpu_session.sh final   # slow tests (2^31 chunk), full benchmark, Dask benchmark
#   bash benchmarks/gpu_session.sh perf    # 2^28 variants side by side, kernel tests, int8/float64
#   TESTS="tests/gpu/test_sort_gpu.py ..." bash benchmarks/gpu_session.sh tests   # those GPU tests only
# Prepare here: bash shared/gpu-host/wheels.sh (dask stack) and pip wheel --no-deps -w .whl .
# Everything lands in $OUT (bundle.tgz with all logs, plus the key summaries as plain files).
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dcx_out}
W=${DCX_WORK:-$OUT/work}   # perf mode: keep it outside $OUT (at most 8 files come back)
mkdir -p "$W"
MODE=${1:-first}
BUDGET_END=$(( $(date +%s) + ${BUDGET_S:-480} ))   # stop starting new steps after this
log() { echo "== $(date +%T) $*" | tee -a "$W/session.log"; }
left() { echo $(( BUDGET_END - $(date +%s) )); }

log "install wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >> "$W/session.log" 2>&1 || log "pip install FAILED"
export PYTHONPATH=/tmp/site
PY="python3 -P"
{ nvidia-smi; nvcc --version | tail -2; $PY -c "import cupy, numpy, dask, distributed, dask_compact, sys; \
print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'dask', dask.__version__, 'python', sys.version); \
import importlib.resources as r; print('kernels', sorted(p.name for p in r.files('dask_compact.kernels').iterdir()))"; \
  $PY -c "import torch; print('torch', torch.__version__)"; $PY -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)"; \
  git rev-parse --short HEAD 2>/dev/null || echo uncommitted; } > "$W/env.txt" 2>&1
cat "$W/env.txt" | tail -8

log "build CUB peer (background)"
# a peer built on the CPU host and carried in .whl/ (static cudart) saves the device minute
[ "$MODE" = perf ] && [ -f .whl/cub_peer.so ] && cp .whl/cub_peer.so /tmp/cub_peer.so
[ -f /tmp/cub_peer.so ] || ( nvcc -O3 -arch=sm_90 -std=c++17 -shared -Xcompiler -fPIC -o /tmp/cub_peer.so benchmarks/peers/cub_peer.cu \
  > "$W/peer_build.log" 2>&1 || echo "peer build FAILED" >> "$W/peer_build.log" ) &
PEER_PID=$!

if [ "$MODE" = first ]; then
  log "SASS report (background)"
  ( timeout 240 $PY benchmarks/sass_report.py > "$W/sass.txt" 2>&1 ) &
  SASS_PID=$!

  log "GPU tests (not slow)"
  timeout 300 $PY -m pytest tests/gpu -m "gpu and not slow" -n 8 -q -p no:cacheprovider \
    --junitxml="$W/junit_first.xml" -o addopts="" > "$W/pytest_first.log" 2>&1
  tail -25 "$W/pytest_first.log"

  log "compute-sanitizer (quick driver)"
  for tool in ${SANITIZERS:-memcheck racecheck}; do
    [ "$(left)" -lt 150 ] && { log "skip $tool (time)"; continue; }
    extra=""; [ "$tool" = memcheck ] && extra="--leak-check no"
    timeout 150 compute-sanitizer --tool $tool $extra --error-exitcode 99 $PY tests/gpu/sanitize_driver.py --quick \
      > "$W/sanitizer_$tool.log" 2>&1; echo "$tool rc=$?" | tee -a "$W/session.log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong results" "$W/sanitizer_$tool.log" | tail -3
  done

  wait $PEER_PID; PEER=""; [ -f /tmp/cub_peer.so ] && PEER="--peer-lib /tmp/cub_peer.so"
  log "quick benchmark (float32; 2^24 and 2^28)"
  timeout $(( $(left) > 60 ? $(left) - 30 : 30 )) $PY benchmarks/gpu_kernels.py $PEER --out "$W" --dtypes float32 \
    --sizes 24,28 --impls copy,ours_values,ours_indices,ours_exact,cub,cupy,torch --tag quick > "$W/bench_quick.log" 2>&1
  tail -30 "$W/bench_quick.log"
  for t in '{"4": [256, 16]}' '{"4": [128, 32]}' '{"4": [512, 16]}' '{"4": [512, 32]}'; do
    [ "$(left)" -lt 40 ] && break
    tag=$(echo "$t" | tr -dc '0-9_')
    timeout 60 $PY benchmarks/gpu_kernels.py --out "$W" --dtypes float32 --sizes 28 \
      --impls ours_values,ours_indices --tuning "$t" --tag "tune$tag" > "$W/bench_tune$tag.log" 2>&1
    grep -E "ours_single-pass|ours_hybrid" "$W/bench_tune$tag.log" | sed "s/^/[$t] /"
  done
  wait $SASS_PID; grep -E "registers|spill|SASS" "$W/sass.txt" | cut -c1-200 | head -40
fi

if [ "$MODE" = final ]; then
  wait $PEER_PID; PEER=""; [ -f /tmp/cub_peer.so ] && PEER="--peer-lib /tmp/cub_peer.so"
  log "GPU tests (all but the sanitizer test, which runs below with a time limit)"
  # -v: each test's outcome is printed as it ends, so a run cut by the timeout still names
  # its failures (with -q they are only in the final summary; the suite took 345-361 s with
  # -n 14 on an H200 host on 2026-11-28, and one run cut at 330 s lost a failure's name)
  timeout ${SUITE_S:-420} $PY -m pytest tests/gpu -m gpu -k "not sanitizer" -n ${SUITE_N:-14} -v \
    -p no:cacheprovider --junitxml="$W/junit_final.xml" -o addopts="" > "$W/pytest_final.log" 2>&1
  echo "pytest rc=$?"
  tail -2 "$W/pytest_final.log"
  grep -E "^\[gw[0-9]+\].*(FAILED|ERROR)" "$W/pytest_final.log" | head -20

  log "compute-sanitizer (quick driver)"
  for tool in ${SANITIZERS:-memcheck racecheck}; do
    extra=""; [ "$tool" = memcheck ] && extra="--leak-check no"
    timeout 90 compute-sanitizer --tool $tool $extra --error-exitcode 99 $PY tests/gpu/sanitize_driver.py --quick \
      > "$W/sanitizer_$tool.log" 2>&1; echo "$tool rc=$?" | tee -a "$W/session.log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong results" "$W/sanitizer_$tool.log" | tail -3
  done

  log "kernel benchmark: float32 2^20..2^30"
  timeout $(( $(left) > 200 ? 150 : $(left) / 2 )) $PY benchmarks/gpu_kernels.py $PEER --out "$W" --dtypes float32 \
    --tag float32 > "$W/bench_float32.log" 2>&1
  grep -E "^\| ours_(single|hybrid|three)" "$W/bench_float32.log" | head -12

  log "Dask benchmark"
  timeout $(( $(left) > 100 ? 90 : 40 )) $PY benchmarks/dask_gpu.py --out "$W" > "$W/dask_gpu.log" 2>&1
  tail -12 "$W/dask_gpu.log"

  log "kernel benchmark: int32, float64, int8 at 2^24, 2^28, 2^30"
  [ "$(left)" -gt 40 ] && timeout $(( $(left) - 20 )) $PY benchmarks/gpu_kernels.py $PEER --out "$W" \
    --dtypes int32,float64,int8 --sizes 24,28,30 --tag other > "$W/bench_other.log" 2>&1
  tail -3 "$W/bench_other.log"
fi

if [ "$MODE" = tests ]; then
  # the GPU tests of the files named in TESTS (default: all of tests/gpu), -v so that a run
  # cut by the timeout still names its failures
  log "GPU tests: ${TESTS:-tests/gpu}"
  timeout ${SUITE_S:-420} $PY -m pytest ${TESTS:-tests/gpu} -m gpu -n ${SUITE_N:-15} -v -p no:cacheprovider \
    --junitxml="$W/junit_tests.xml" -o addopts="" > "$W/pytest_tests.log" 2>&1
  echo "pytest rc=$?" | tee -a "$W/session.log"
  tail -2 "$W/pytest_tests.log"
  grep -E "^\[gw[0-9]+\].*(FAILED|ERROR)" "$W/pytest_tests.log" | head -20
fi

if [ "$MODE" = verify ]; then
  # after a kernel fix: the kernel tests, the sanitizers, and float32 timings at 2^28
  log "GPU kernel tests (not slow, no Dask)"
  timeout 150 $PY -m pytest tests/gpu/test_cupy_kernels.py -m "gpu and not slow" -n 8 -q -p no:cacheprovider \
    --junitxml="$W/junit_verify.xml" -o addopts="" > "$W/pytest_verify.log" 2>&1
  grep -E "FAILED|passed|failed" "$W/pytest_verify.log" | tail -8
  log "compute-sanitizer (quick driver)"
  for tool in racecheck memcheck; do
    extra=""; [ "$tool" = memcheck ] && extra="--leak-check no"
    timeout 60 compute-sanitizer --tool $tool $extra --error-exitcode 99 $PY tests/gpu/sanitize_driver.py --quick \
      > "$W/sanitizer_$tool.log" 2>&1; echo "$tool rc=$?" | tee -a "$W/session.log"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|wrong results" "$W/sanitizer_$tool.log" | tail -3
  done
  wait $PEER_PID; PEER=""; [ -f /tmp/cub_peer.so ] && PEER="--peer-lib /tmp/cub_peer.so"
  log "float32 2^28 timings"
  timeout 60 $PY benchmarks/gpu_kernels.py $PEER --out "$W" --dtypes float32 --sizes 28 \
    --impls copy,ours_values,ours_indices,cub --tag verify > "$W/bench_verify.log" 2>&1
  grep -E "^\| (ours_(single|hybrid)|cub)" "$W/bench_verify.log" | head -12
  timeout 40 $PY benchmarks/gpu_kernels.py --out "$W" --dtypes float32 --sizes 28 --impls ours_values \
    --tuning '{"4": [512, 32]}' --tag verify_512x32 > "$W/bench_verify_512x32.log" 2>&1
  grep -E "^\| ours_(single|hybrid)" "$W/bench_verify_512x32.log" | sed 's/^/[512x32] /' | head -6
fi

if [ "$MODE" = perf ]; then
  # look-back schedules and exact-size paths side by side: float32 2^28 first (the numbers the
  # targets are about), then the kernel tests (every variant), then int8/float64 2^28 if time
  wait $PEER_PID 2>/dev/null; PEER=""; [ -f /tmp/cub_peer.so ] && PEER="--peer-lib /tmp/cub_peer.so"
  log "float32 2^28: CUB, single-pass early/classic, exact prefix/lookback, hybrid"
  timeout ${BENCH_S:-80} $PY benchmarks/gpu_kernels.py $PEER --out "$W" --dtypes float32 --sizes 28 \
    --impls copy,ours_values,ours_indices,ours_exact,cub --tag perf_float32 > "$W/bench_perf_float32.log" 2>&1
  echo "bench rc=$?"; grep -E "^\| (ours|cub|memcpy)" "$W/bench_perf_float32.log" | cut -d'|' -f2-6,7 | head -60
  log "GPU kernel tests (not slow)"
  timeout ${TEST_S:-150} $PY -m pytest tests/gpu/test_cupy_kernels.py -m "gpu and not slow" -n 8 -q -p no:cacheprovider \
    -o addopts="" --durations=8 > "$W/pytest_perf.log" 2>&1; echo "pytest rc=$?"
  grep -E "FAILED|ERROR|passed|failed|Timeout" "$W/pytest_perf.log" | tail -15
  if [ "$(left)" -gt 30 ]; then
    log "int8, float64 2^28"
    timeout $(( $(left) - 12 )) $PY benchmarks/gpu_kernels.py $PEER --out "$W" --dtypes int8,float64 --sizes 28 \
      --impls copy,ours_values,ours_exact_single-pass_values,ours_exact_single-pass-lookback-classic_values,cub \
      --tag perf_other > "$W/bench_perf_other.log" 2>&1
    grep -E "ms .*GB/s" "$W/bench_perf_other.log" | awk '{print $1, $2, $4, $5}' | head -40
  fi
fi

log "bundle"
tar czf "$OUT/bundle.tgz" -C "$W" . && ls -la "$OUT"
for f in summary_quick.md summary_float32.md summary_other.md dask_gpu.md summary_verify.md summary_perf_float32.md \
  summary_perf_other.md gpu_kernels_perf_float32.csv gpu_kernels_perf_other.csv pytest_perf.log; do [ -f "$W/$f" ] && cp "$W/$f" "$OUT/"; done
true
