#!/usr/bin/env bash
# The batch job on the GPU host in one command: install the carried wheels and this checkout,
# run the batch tests (GPU and CPU) and benchmarks/batch_io.py. Run from the repository root
# with the wheels in .whl/ (wheels.sh of the GPU-host notes, plus nvidia-libnvcomp-cu13).
# Installed as pip installs for a user, with bytecode compiled: the host's image sets no .pyc
# for the carried packages otherwise, and every command would compile them again (over a
# second of each CLI run's start was compile() before this).
#   SHA=$(git rev-parse --short HEAD) bash benchmarks/batch_session.sh [LOG2N] [CHUNK_LOG2] \
#       [batch_io.py options, e.g. --rounds 3 --skip "cli processes (cpu)"]
# (SHA names the commit measured: the copy of the tree on the host may carry another HEAD;
# TESTS=0 skips the tests; BENCH_ARGS adds options split on spaces. Every GPU-host run of
# batch_io.py goes through this script: without its bytecode step each command also compiles
# the host image's NumPy and CuPy modules, 0.46 s of a profiled command's start on the H100.)
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/batch_out}
mkdir -p "$OUT"
LOG2N=${1:-31}
CHUNK=${2:-25}
shift $(( $# < 2 ? $# : 2 ))  # what follows goes to batch_io.py as it is
log() { echo "== $(date +%T) $*" | tee -a "$OUT/session.log"; }
log "install wheels"
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >> "$OUT/session.log" 2>&1 || log "pip install FAILED"
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
  --target /tmp/site . >> "$OUT/session.log" 2>&1 || log "pip install . FAILED"
export PYTHONPATH=/tmp/site
env | grep '^PYTHON' >> "$OUT/session.log"
# The host's image sets PYTHONDONTWRITEBYTECODE=1 and ships its own packages (NumPy, CuPy,
# Jinja2, ...) without bytecode, so every command compiled ~130 modules again (0.4 s of each
# start measured). A pip install writes bytecode; so does this, once, for what is imported.
SITE=$(python3 -P -c "import numpy, os; print(os.path.dirname(os.path.dirname(numpy.__file__)))")
t0=$(date +%s.%N)
python3 -P -c "import numpy, cupy, jinja2" 2>/dev/null
t1=$(date +%s.%N)
python3 -m compileall -q -j 16 -x 'site-packages/(torch|triton|nvidia|sympy|networkx|functorch)/' \
  "$SITE" /tmp/site > /dev/null 2>&1
python3 -P -c "import numpy, cupy, jinja2" 2>/dev/null
t2=$(date +%s.%N)
python3 -P -c "import numpy, cupy, jinja2" 2>/dev/null
t3=$(date +%s.%N)
log "bytecode: import numpy, cupy, jinja2 took $(awk "BEGIN{print $t1-$t0}") s before, \
$(awk "BEGIN{print $t3-$t2}") s after compileall of $SITE"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; nproc; free -g | head -2;
  python3 -P -c "import cupy, zarr, dask, dask_compact; from nvidia import libnvcomp; \
print('cupy', cupy.__version__, 'zarr', zarr.__version__, 'dask', dask.__version__, \
'nvcomp', libnvcomp.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "${TESTS:-1}" != 0 ]; then
log "batch tests"
timeout 300 python3 -P -m pytest tests/gpu/test_batch_gpu.py tests/test_batch_stream.py \
  tests/test_batch_reader.py tests/test_batch_faults.py tests/test_cli.py \
  tests/test_batch_head_start.py tests/test_zstd_frames.py -q -p no:cacheprovider \
  -o addopts="" -x -k "not four_times" > "$OUT/pytest.txt" 2>&1
tail -5 "$OUT/pytest.txt"
fi
log "benchmark 2^$LOG2N"
timeout ${BENCH_S:-420} python3 -P benchmarks/batch_io.py --log2n "$LOG2N" --chunk-log2 "$CHUNK" \
  --work /tmp/batch_work --out "$OUT" ${SHA:+--sha "$SHA"} ${BENCH_ARGS:-} "$@" 2>&1 \
  | tee "$OUT/bench.txt" | tail -30
log "done"
