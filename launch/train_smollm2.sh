#!/usr/bin/env bash
# How drafters/smollm2-domino-b16 and its same-budget DFlash baseline were made, on a 2-core CPU:
#   1. finish the regenerated ShareGPT data (resumes; skipped when complete),
#   2. compute the target features once into a shared cache (one fp32 target forward per conversation),
#   3. stage 1: train the Domino curriculum and the lambda = 1 baseline side by side, one thread each, same
#      steps, same data order, same seed: the only difference is the loss (1000 prompts, seed-0 data);
#   4. stage 2: continue each from its stage-1 export on the seed-0 and seed-1 data together (2400 prompts;
#      the held-out conversations stay those of stage 1), Domino at lambda = 0 (where its curriculum ended),
#      the baseline at lambda = 1; again same steps, order and seed;
#   5. stage 3: continue from the stage-2 exports with two more sources: the first 768 prompts of a seed-2
#      gen-data set (48 of its 100 shards) and 1152 relabelled ShareGPT answers (relabel-data, which also
#      fills the feature cache);
#   6. stage 4: continue from the stage-3 exports with 2560 more relabelled answers (seed 1, questions
#      already in the other folders excluded);
#   7. stage 5 (STAGE5=1): on a CPU with AMX, bf16 makes the target forward ~4x and a training step 2-5x
#      cheaper, so: the last 1897 relabelled first answers (seed 2) and 2400 relabelled later turns of
#      conversations (--later-turns), features in bf16, then 3500 steps at 2 threads from each stage-4 export,
#      Domino (lambda = 0) first, then the DFlash baseline (lambda = 1).
# Then compare them on MT-Bench with bench/acceptance.py --baseline-drafter (see README, Benchmarks).
#   bash launch/train_smollm2.sh   (the committed run; STEPS1/2/3/4/5 change the stage lengths)
# Rerunning resumes every run from runs/*/checkpoint.pt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
STEPS1=${STEPS1:-2600}
STEPS2=${STEPS2:-2400}
STEPS3=${STEPS3:-1600}
STEPS4=${STEPS4:-1500}
FEATURES=runs/features-smollm2
DATA1=data/sharegpt-smollm2
DATA2=data/sharegpt-smollm2-s1
DATA3=data/sharegpt-smollm2-s2
DATA4=data/sharegpt-smollm2-relabelled
DATA5=data/sharegpt-smollm2-relabelled-s1
COMMON=(--threads 1 --loss-vocab data --feature-dtype float32 --features-dir "$FEATURES"
        --eval-every 100 --ckpt-every 50 --no-progress)

if [ -n "${GEN_DATA:-}" ]; then
  $PY -m sglang_domino.train gen-data --threads 2 --out $DATA1 --num-prompts 1000 --seed 0 --dtype bfloat16
  $PY -m sglang_domino.train gen-data --threads 2 --out $DATA2 --num-prompts 1600 --seed 1 --dtype float32
  $PY -m sglang_domino.train gen-data --threads 2 --out $DATA3 --num-prompts 1600 --seed 2 --dtype float32 --max-shards 48
fi
mkdir -p runs
# Features first (2 threads), so the runs below do not both compute them; relabel-data fills them as it goes.
$PY -m sglang_domino.train relabel-data --threads 2 --out $DATA4 --num-conversations 1152 \
    --features-dir "$FEATURES" --target-layer-ids 1 10 18 27 --no-progress
$PY -m sglang_domino.train relabel-data --threads 2 --out $DATA5 --num-conversations 2560 --seed 1 \
    --exclude $DATA1 $DATA2 $DATA3 $DATA4 --features-dir "$FEATURES" --target-layer-ids 1 10 18 27 --no-progress
$PY -m sglang_domino.train train --threads 2 --feature-dtype float32 --features-dir "$FEATURES" \
    --data $DATA1 $DATA2 $DATA3 --run-dir runs/features-only --out runs/features-only/export --stop-after-steps 0

stage1() {  # name, extra args
  $PY -m sglang_domino.train train "${COMMON[@]}" --data $DATA1 --max-steps "$STEPS1" --init-layers target \
      --run-dir "runs/smollm2-$1-b16-stage1" --out "runs/smollm2-$1-b16-stage1/export" "${@:2}" \
      > "runs/smollm2-$1-b16-stage1.log" 2>&1
}
stage2() {  # name, extra args
  $PY -m sglang_domino.train train "${COMMON[@]}" --data $DATA1 $DATA2 --max-steps "$STEPS2" --lr 6e-4 \
      --init-from "runs/smollm2-$1-b16-stage1/export" \
      --run-dir "runs/smollm2-$1-b16-stage2" --out "runs/smollm2-$1-b16-stage2/export" "${@:2}" \
      > "runs/smollm2-$1-b16-stage2.log" 2>&1
}
stage3() {  # name, extra args
  $PY -m sglang_domino.train train "${COMMON[@]}" --data $DATA1 $DATA2 $DATA3 $DATA4 --max-steps "$STEPS3" --lr 4e-4 \
      --init-from "runs/smollm2-$1-b16-stage2/export" \
      --run-dir "runs/smollm2-$1-b16-stage3" --out "runs/smollm2-$1-b16-stage3/export" "${@:2}" \
      > "runs/smollm2-$1-b16-stage3.log" 2>&1
}
stage4() {  # name, extra args
  $PY -m sglang_domino.train train "${COMMON[@]}" --data $DATA1 $DATA2 $DATA3 $DATA4 $DATA5 --max-steps "$STEPS4" \
      --lr 3e-4 --init-from "runs/smollm2-$1-b16-stage3/export" \
      --run-dir "runs/smollm2-$1-b16" --out "drafters/smollm2-$1-b16" "${@:2}" > "runs/smollm2-$1-b16.log" 2>&1
}
if [ -n "${STAGE5:-}" ]; then
  DATA6=data/sharegpt-smollm2-relabelled-s2
  DATA7=data/sharegpt-smollm2-later-turns
  BF16=(--threads 2 --dtype bfloat16 --features-dir runs/features-bf16 --target-layer-ids 1 10 18 27 --no-progress)
  $PY -m sglang_domino.train relabel-data "${BF16[@]}" --out $DATA6 --num-conversations 12000 --seed 2 \
      --exclude $DATA1 $DATA2 $DATA3 $DATA4 $DATA5
  $PY -m sglang_domino.train relabel-data "${BF16[@]}" --out $DATA7 --num-conversations 2400 --seed 3 \
      --later-turns --max-prompt-tokens 768
  stage5() {  # name, lambda: continue from the stage-4 export (kept as runs/smollm2-NAME-b16-stage4)
    [ -d "runs/smollm2-$1-b16-stage4" ] || cp -r "drafters/smollm2-$1-b16" "runs/smollm2-$1-b16-stage4"
    $PY -m sglang_domino.train train --threads 2 --loss-vocab data --dtype bfloat16 --feature-dtype bfloat16 \
        --features-dir runs/features-bf16 --eval-every 500 --ckpt-every 200 --no-progress \
        --data $DATA1 $DATA2 $DATA3 $DATA4 $DATA5 $DATA6 $DATA7 --max-steps "${STEPS5:-3500}" --lr 3e-4 \
        --init-from "runs/smollm2-$1-b16-stage4" --run-dir "runs/smollm2-$1-b16-stage5" \
        --out "drafters/smollm2-$1-b16" --lambda-const "$2" > "runs/smollm2-$1-b16-stage5.log" 2>&1
  }
  stage5 domino 0
  stage5 dflash 1
  exit
fi
(stage1 domino && stage2 domino --lambda-const 0 && stage3 domino --lambda-const 0 && stage4 domino --lambda-const 0) &
(stage1 dflash --lambda-const 1 && stage2 dflash --lambda-const 1 && stage3 dflash --lambda-const 1 &&
   stage4 dflash --lambda-const 1) &
wait
