#!/usr/bin/env bash
# Main job: set up (idempotent), serve SmolLM2-135M-Instruct with --speculative-algorithm DOMINO and the
# committed drafter on 127.0.0.1, answer one chat prompt over HTTP (SGLang's /generate), print the
# answer with the server's accept length and speed, then stop the server.
#   PORT=30010 PROMPT="..." bash launch/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
PORT=${PORT:-30010}
PROMPT=${PROMPT:-Write a Python function that returns the n-th Fibonacci number.}
DRAFTER=${DRAFTER:-drafters/smollm2-domino-b16}
PY=.venv/bin/python
trap '$PY launch/serve.py stop --port "$PORT" >/dev/null 2>&1 || true' EXIT
echo "[demo] starting the DOMINO server (first start ~1-2 min on a CPU)"
$PY launch/serve.py start domino --port "$PORT" --draft "$DRAFTER"
PORT="$PORT" PROMPT="$PROMPT" $PY - <<'PYEOF'
import json, os, time, urllib.request

from transformers import AutoTokenizer

base = f"http://127.0.0.1:{os.environ['PORT']}"
tok = AutoTokenizer.from_pretrained("models/SmolLM2-135M-Instruct")
text = tok.apply_chat_template([{"role": "user", "content": os.environ["PROMPT"]}], tokenize=False,
                               add_generation_prompt=True)
# SGLang's native endpoint: its meta_info carries the speculative accept length.
body = {"text": text, "sampling_params": {"max_new_tokens": 128, "temperature": 0}}
req = urllib.request.Request(base + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"})
t = time.perf_counter()
with urllib.request.urlopen(req, timeout=600) as r:
    out = json.load(r)
dt = time.perf_counter() - t
meta = out["meta_info"]
print(out["text"])
n = meta["completion_tokens"]
print(json.dumps({"completion_tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt, 2),
                  "spec_accept_length": meta.get("spec_accept_length"), "spec_verify_ct": meta.get("spec_verify_ct")}))
PYEOF
