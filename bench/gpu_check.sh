#!/usr/bin/env bash
# One prepared GPU check of the Triton kernels: tests/test_kernels.py compiled on CUDA (not interpreted),
# then bench/kernels.py --tune --profile (all batches, SmolLM2-135M and Qwen3-8B shapes, tile sizes, time per
# kernel). Everything lands in $OUT:
#   env.txt (GPU, versions, commit), tests.txt, bench.txt, kernels-cuda.json, status.txt
# Installs nothing: it uses the project's .venv when that has a CUDA torch, else the machine's python3
# (torch + triton + pytest), with a throwaway package tree so `sglang_domino.kernels` imports uninstalled.
# SGLANG_DOMINO_COMMIT names the commit for env.txt and the JSON (the device machine's copy of the tree may
# carry a stale .git).
#   OUT=/tmp/out bash bench/gpu_check.sh
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/gpu_check}
mkdir -p "$OUT"
cd "$ROOT"
unset TRITON_INTERPRET SGLANG_DOMINO_KERNELS

PY=python3
if [ -x .venv/bin/python ] && .venv/bin/python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  PY=.venv/bin/python
fi
if ! $PY -c "import sglang_domino.kernels.rollout" 2>/dev/null; then
  SITE=$(mktemp -d)
  cp -r sglang_domino "$SITE/" && cp -r kernels "$SITE/sglang_domino/kernels"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONSAFEPATH=1  # keep ./sglang_domino (no kernels/ inside) off sys.path, in pytest's workers too
fi

{
  echo "commit: ${SGLANG_DOMINO_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "date: $(date -u +%FT%TZ)  python: $PY"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  $PY -c "import torch, triton, sglang_domino.kernels.rollout as k; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), k.__file__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

export PYTHONUNBUFFERED=1
XDIST=()  # compile the kernel variants in parallel where pytest-xdist is installed
$PY -c "import xdist" 2>/dev/null && XDIST=(-n 8)
timeout 200 $PY -m pytest tests/test_kernels.py -q -rs -p no:cacheprovider \
  --durations=10 ${XDIST[@]+"${XDIST[@]}"} 2>&1 | tee "$OUT/tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout 240 $PY bench/kernels.py --tune --profile --out "$OUT/kernels-cuda.json" 2>&1 \
  | tee "$OUT/bench.txt"
bench_rc=${PIPESTATUS[0]}
echo "tests_rc=$tests_rc bench_rc=$bench_rc" | tee "$OUT/status.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
