#!/usr/bin/env bash
# How drafters/smollm2-domino-b16 and its same-budget DFlash baseline were made, on a 2-core CPU:
#   1. finish the regenerated ShareGPT data (resumes; skipped when complete),
#   2. compute the target features once into a shared cache (one fp32 target forward per conversation),
#   3. train the Domino curriculum and the lambda = 1 baseline side by side, one thread each, same steps,
#      same data order, same seed: the only difference is the loss.
# Then compare them on MT-Bench with bench/acceptance.py --baseline-drafter (see README, Benchmarks).
#   STEPS=2600 bash launch/train_smollm2.sh   (the committed run)
# Rerunning resumes both runs from runs/*/checkpoint.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
STEPS=${STEPS:-2600}
STOP=${STOP:-$STEPS}
FEATURES=runs/features-smollm2
COMMON=(--threads 1 --max-steps "$STEPS" --stop-after-steps "$STOP" --loss-vocab data --init-layers target --feature-dtype float32 --features-dir "$FEATURES"
        --eval-every 100 --ckpt-every 50 --no-progress)

if [ -n "${GEN_DATA:-}" ]; then
  $PY -m sglang_domino.train gen-data --threads 2
fi
mkdir -p runs
# Features first (2 threads), so the two runs below do not both compute them.
$PY -m sglang_domino.train train --threads 2 --feature-dtype float32 --features-dir "$FEATURES" \
    --run-dir runs/features-only --out runs/features-only/export --stop-after-steps 0

$PY -m sglang_domino.train train "${COMMON[@]}" --run-dir runs/smollm2-domino-b16 \
    --out drafters/smollm2-domino-b16 > runs/smollm2-domino-b16.log 2>&1 &
$PY -m sglang_domino.train train "${COMMON[@]}" --lambda-const 1.0 --run-dir runs/smollm2-dflash-b16 \
    --out drafters/smollm2-dflash-b16 > runs/smollm2-dflash-b16.log 2>&1 &
wait
