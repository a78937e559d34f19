#!/usr/bin/env bash
# Fashion-MNIST under the literature's protocol on a lent GPU (docs/evaluation.md): the
# like-for-like LeNet-5 ensemble of uncertainty-baselines and the project's recipe, each over
# three seeds and with other member choices, all at once as separate command-line runs sharing the GPU; the fast
# test tier beside them. Each run has its own Prefect home and data directory.
#
#   OUT=/tmp/lit scripts/gpu_literature.sh [RUN_S TEST_S]
#
# Needs: the project's packages importable (scripts/gpu_check.sh installs them from .whl/ into
# /tmp/site on the same machine; set SITE to use another folder), and the Fashion-MNIST IDX
# files in $FM_DIR (default .fmdata/, carried beside the working tree). EXTRA holds --set
# options added to every run (a rehearsal at toy size: EXTRA="--set train.epochs=1 ...").
# Writes under $OUT: lit.tar.gz (each run's protocol summary, report.md and log), lit.json
# (the summaries together), tests.log, tests.xml.
set -uo pipefail
OUT=${OUT:-/tmp/lit}
RUN_S=${1:-420}
TEST_S=${2:-150}
SITE=${SITE:-/tmp/site}
FM_DIR=$(realpath "${FM_DIR:-.fmdata}")
PY=${PY:-python3}
mkdir -p "$OUT/lit"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
[ -d "$SITE" ] && export PYTHONPATH=$SITE:$PWD
$PY -c "import prefect, tensorflow_datasets" || { echo "the project's packages are not installed (run scripts/gpu_check.sh first)"; exit 3; }
[ -f "$FM_DIR/train-images-idx3-ubyte.gz" ] || { echo "no Fashion-MNIST IDX files in $FM_DIR"; exit 3; }
WORK=$(mktemp -d)
LIKE="--config configs/fashion_mnist_lenet5.yaml --set train.member_choice=final --set eval.temperature_scaling=true"
LIKE="$LIKE --set eval.evaluators={\"test\":{}}"
BEST="--config configs/fashion_mnist_best.yaml"
# name|options: the like-for-like protocol (final weights, three seeds, and seed 0 by best
# validation NLL), then the project's recipe (the full protocol: corruptions and OOD sets) over
# three seeds, and at its best epoch by validation NLL and by accuracy
RUNS=(
  "lenet5-final-s0|$LIKE --set seed=0"
  "lenet5-final-s1|$LIKE --set seed=1"
  "lenet5-final-s2|$LIKE --set seed=2"
  "lenet5-bestnll-s0|$LIKE --set seed=0 --set train.member_choice=best_validation_nll"
  "recipe-s0|$BEST --set seed=0"
  "recipe-s1|$BEST --set seed=1"
  "recipe-s2|$BEST --set seed=2"
  "recipe-bestnll-s0|$BEST --set seed=0 --set train.member_choice=best_validation_nll"
  "recipe-bestacc-s0|$BEST --set seed=0 --set train.member_choice=best_validation_accuracy"
)
t0=$SECONDS
pids=()
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}
  opts=${spec#*|}
  # shellcheck disable=SC2086  # the options are words
  PREFECT_HOME=$WORK/prefect-$name timeout -k 10 "$RUN_S" $PY -m flows.train_ensemble $opts ${EXTRA:-} \
    --set "data.manual_dir=$FM_DIR" --set "data.data_dir=$WORK/tfds-$name" \
    --run-name "$name" --output-dir "$WORK/runs" >"$OUT/lit/$name.log" 2>&1 &
  pids+=($!)
done
JAX_PLATFORMS=${TEST_PLATFORMS:-cuda} timeout -k 10 "$TEST_S" $PY -m pytest -q -n 6 -p no:cacheprovider \
  -m "not slow and not soak" --junitxml="$OUT/tests.xml" tests >"$OUT/tests.log" 2>&1
echo "== tests: rc=$? in $((SECONDS - t0)) s"
tail -n 5 "$OUT/tests.log"
i=0
for spec in "${RUNS[@]}"; do
  name=${spec%%|*}
  wait "${pids[$i]}"
  rc=$?
  i=$((i + 1))
  echo "== $name: rc=$rc at $((SECONDS - t0)) s"
  if [ -f "$WORK/runs/$name/report.json" ]; then
    $PY -m benchmarks.literature_protocol --run-dir "$WORK/runs/$name" --out "$OUT/lit/$name.json" \
      --note "lent GPU, ${#RUNS[@]} runs sharing it" >/dev/null
    cp "$WORK/runs/$name/report.md" "$OUT/lit/$name.md"
  else
    tail -n 8 "$OUT/lit/$name.log"
  fi
done
$PY - "$OUT/lit" "$OUT/lit.json" <<'EOF'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1) + "\n")
for name, r in runs.items():
    e, m, t = r["test"]["ensemble"], r["test"]["member_mean"], r["test"].get("ensemble_temperature_scaled") or {}
    print(f"{name:22s} ens acc {e['accuracy']:.4f} nll {e['nll']:.4f} ece {e['ece']:.4f} | member acc "
          f"{m['accuracy']:.4f} nll {m['nll']:.4f} | T-scaled nll {t.get('nll', float('nan')):.4f} "
          f"ece {t.get('ece', float('nan')):.4f} | train {r['timing']['train_seconds']:.0f} s")
EOF
tar -czf "$OUT/lit.tar.gz" -C "$OUT" lit && rm -rf "$OUT/lit" "$WORK"
