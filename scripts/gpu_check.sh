#!/usr/bin/env bash
# One check of the project on a lent GPU (docs/development.md#a-lent-gpu), as one command:
# the throughput benchmark, the default run, and the fast test tier with JAX on the GPU.
# Each part has its own time limit, so one that hangs still leaves the others' results.
#
#   OUT=/tmp/gpu-check scripts/gpu_check.sh [BENCH_S RUN_S TEST_S]   (TEST_S=0: no tests;
#   scripts/gpu_literature.sh runs them beside its runs)
#
# A machine without the project's packages gets them from wheels in .whl/ (Python 3.12,
# downloaded beforehand; JAX, NumPy and the other compiled packages are the machine's own).
# Writes under $OUT: env.txt, bench.json (+ .png), bench.log, run.log, run-report.json, run-warm.log,
# run-warm-report.json, tests.log, tests.xml.
# Measured on an H100 (benchmarks/results/gpu-h100*.json): about 60 s of wheel install and start,
# 230 s of benchmark, 70 s of run, 50 s of tests: one 10-minute call.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-check}
BENCH_S=${1:-260}
RUN_S=${2:-120}
TEST_S=${3:-180}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD
fi
# Several test processes share one GPU: no process takes three quarters of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  $PY -c "import sys, jax, flax, optax, orbax.checkpoint as oc, prefect, tensorflow_datasets as tfds
print('python', sys.version.split()[0], 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax', oc.__version__, 'prefect', prefect.__version__, 'tfds', tfds.__version__)
print('devices', jax.devices())"
} 2>&1 | tee "$OUT/env.txt"

part() {  # part NAME SECONDS COMMAND...: run with a limit, log to $OUT/NAME.log, print its status
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n 15 "$OUT/$name.log"
}

part bench "$BENCH_S" $PY -m benchmarks.bench --models cnn,resnet20 --sizes "${BENCH_SIZES:-1,8,32}" --steps 20 --skip-same-options --out "$OUT/bench.json"
part run "$RUN_S" $PY -m flows.train_ensemble --run-name gpu-check --output-dir "$OUT/runs"
cp "$OUT/runs/gpu-check/report.json" "$OUT/run-report.json" 2>/dev/null
# The same run again, its compilation and data caches warm, in an output directory of its own (no
# champion, so no drift check: the default pipeline as a first run finds it). Issue 61's GPU target
# compares this run's stages (report.json -> timing.stages) with its training time; RUN_WARM_S=0 skips it.
[ "${RUN_WARM_S:-90}" = 0 ] || part run-warm "${RUN_WARM_S:-90}" $PY -m flows.train_ensemble --run-name gpu-check-warm --output-dir "$OUT/runs-warm"
cp "$OUT/runs-warm/gpu-check-warm/report.json" "$OUT/run-warm-report.json" 2>/dev/null
[ "$TEST_S" = 0 ] || JAX_PLATFORMS=${TEST_PLATFORMS:-cuda} part tests "$TEST_S" $PY -m pytest -q -n 8 -p no:cacheprovider -m "not slow and not soak" \
  --junitxml="$OUT/tests.xml" tests
rm -rf "$OUT/runs" "$OUT/runs-warm"
