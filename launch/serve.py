#!/usr/bin/env python
"""Start / stop SGLang servers with the project's presets.

    python launch/serve.py start baseline --port 30000                     # plain decoding
    python launch/serve.py start domino --port 30001 --draft drafters/X    # --speculative-algorithm DOMINO
    python launch/serve.py start ngram --port 30002                        # SGLang's NGRAM (comparison)
    python launch/serve.py stop --port 30001                               # stop what `start` launched
    python launch/serve.py status --port 30001

`--device auto` picks cuda when a GPU is visible, else the CPU engine (SGLANG_USE_CPU_ENGINE=1,
float32, --sleep-on-idle, a 16k-token KV pool). `start` waits until /health answers and records the
process group in launch/run/<port>.json; `stop` ends the whole group (launcher, scheduler,
detokenizer). Extra SGLang flags go after `--`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT)) if str(ROOT) not in sys.path else None

from sglang_domino.policy import POLICIES, policy_env  # noqa: E402
from sglang_domino.serving.server import DEFAULT_MODEL, Server, preset_args  # noqa: E402

RUN_DIR = ROOT / "launch" / "run"


def detect_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


def _state(port: int) -> Path:
    return RUN_DIR / f"{port}.json"


def start(args, extra: list[str]) -> int:
    device = detect_device() if args.device == "auto" else args.device
    flags = preset_args(args.kind, device=device, draft=args.draft, num_draft_tokens=args.num_draft_tokens,
                        max_total_tokens=args.max_total_tokens, dtype=args.dtype) + extra
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log = args.log or str(RUN_DIR / f"{args.port}.log")
    env = policy_env(args.draft_policy, args.max_draft_batch, args.draft_widths)
    server = Server(str(args.model), args.port, flags, env=env, log_path=log, host=args.host)
    server.start()
    _state(args.port).write_text(json.dumps({"pid": server.proc.pid, "kind": args.kind, "command": server.command,
                                             "log": log, "device": device}))
    print(f"started {args.kind} on {server.url} (pid {server.proc.pid}, log {log})", flush=True)
    if args.no_wait:
        return 0
    try:
        server.wait_healthy(args.timeout)
    except Exception as e:
        print(f"FAILED: {e}", file=sys.stderr)
        server.stop()
        _state(args.port).unlink(missing_ok=True)
        return 1
    print(f"healthy: {server.url}", flush=True)
    return 0


def stop(args) -> int:
    state = _state(args.port)
    if not state.exists():
        print(f"nothing recorded for port {args.port}")
        return 0
    pid = json.loads(state.read_text())["pid"]
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.time() + wait
        while time.time() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
    state.unlink(missing_ok=True)
    print(f"stopped port {args.port} (process group {pid})")
    return 0


def status(args) -> int:
    state = _state(args.port)
    info = json.loads(state.read_text()) if state.exists() else None
    srv = Server(DEFAULT_MODEL, args.port, [], host=args.host)
    print(json.dumps({"recorded": info, "healthy": srv.healthy()}, indent=2))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("kind", choices=["baseline", "domino", "ngram"])
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    s.add_argument("--draft", help="Domino drafter checkpoint folder (domino)")
    s.add_argument("--num-draft-tokens", type=int, help="verify chain length incl. the bonus token")
    s.add_argument("--draft-policy", choices=POLICIES,
                   help="adaptive (default): per batch size, run the verify width (1 = plain step) measured fastest; "
                        "always: full width at every step")
    s.add_argument("--draft-widths", type=int, nargs="+",
                   help="candidate verify widths of the adaptive policy (default 1 2 4 8 and the full width)")
    s.add_argument("--max-draft-batch", type=int,
                   help="never draft above this decode batch size (0 = no cap; default 8 on a CPU, no cap on a GPU)")
    s.add_argument("--max-total-tokens", type=int)
    s.add_argument("--dtype")
    s.add_argument("--log")
    s.add_argument("--timeout", type=float, default=600)
    s.add_argument("--no-wait", action="store_true")
    for name in ("stop", "status"):
        q = sub.add_parser(name)
        q.add_argument("--port", type=int, default=30000)
        q.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    if args.cmd == "start":
        return start(args, extra)
    return stop(args) if args.cmd == "stop" else status(args)


if __name__ == "__main__":
    sys.exit(main())
