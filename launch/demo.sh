#!/usr/bin/env bash
# Main job: set up (idempotent), serve SmolLM2-135M-Instruct with --speculative-algorithm DOMINO and the
# committed drafter on 127.0.0.1, answer one chat request over the OpenAI-compatible API, print the
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

url = f"http://127.0.0.1:{os.environ['PORT']}/v1/chat/completions"
body = {"model": "default", "messages": [{"role": "user", "content": os.environ["PROMPT"]}],
        "max_tokens": 128, "temperature": 0}
req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
t = time.perf_counter()
with urllib.request.urlopen(req, timeout=600) as r:
    out = json.load(r)
dt = time.perf_counter() - t
print(out["choices"][0]["message"]["content"])
usage = out.get("usage") or {}
n = usage.get("completion_tokens", 0)
meta = {k: v for k, v in (out.get("meta_info") or {}).items() if "spec" in k or "accept" in k}
print(json.dumps({"completion_tokens": n, "seconds": round(dt, 2), "tokens_per_s": round(n / dt, 2), **meta}))
PYEOF
