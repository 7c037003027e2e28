#!/usr/bin/env python
"""Why a verify step is dear on a small CPU: the target's matmuls at M tokens, 1 vs 2 threads, idle vs busy.

A plain decode step multiplies each weight by M = batch rows; a width-w verify step by M = batch x w rows.
This times ``F.linear`` at SmolLM2-135M's shapes (per layer: qkv 576->960, gate_up 576->3072, o 576->576,
down 1536->576; and the 576->49152 LM head) for M in --rows, with 1 and 2 torch threads, once with the
other cores idle and once with a busy-looping process on every core but one (what the tokenizer,
detokenizer and HTTP client of a server on the same machine do to it).

    python bench/cpu_matmul.py --name cpu-matmul
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import RESULTS, run_info  # noqa: E402

LAYER = {"qkv": (576, 960), "gate_up": (576, 3072), "o": (576, 576), "down": (1536, 576)}
LM_HEAD = (576, 49152)


def _spin() -> None:
    while True:
        pass


def time_linear(k: int, n: int, m: int, reps: int) -> float:
    """Median ms of F.linear([m, k] x [n, k]^T) over 5 rounds of ``reps`` calls."""
    w, x = torch.randn(n, k), torch.randn(m, k)
    for _ in range(3):
        F.linear(x, w)
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            F.linear(x, w)
        rounds.append((time.perf_counter() - t) / reps * 1e3)
    return statistics.median(rounds)


def measure(rows: list[int], threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    out = []
    for m in rows:
        layer = sum(time_linear(k, n, m, 30) for k, n in LAYER.values())
        head = time_linear(*LM_HEAD, m, 5)
        out.append({"rows": m, "layer_linears_ms": round(layer, 3), "lm_head_ms": round(head, 3)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--name", default="cpu-matmul")
    args = p.parse_args(argv)
    results = []
    for load in ("idle", "busy"):
        spinners = []
        if load == "busy":
            spinners = [mp.Process(target=_spin, daemon=True) for _ in range(max(1, (os.cpu_count() or 2) - 1))]
            for s in spinners:
                s.start()
        try:
            for threads in (1, 2):
                for row in measure(args.rows, threads):
                    results.append({"load": load, "threads": threads, **row})
                    print(json.dumps(results[-1]), flush=True)
        finally:
            for s in spinners:
                s.terminate()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps({**run_info(), "shapes": {"layer": LAYER, "lm_head": LM_HEAD}, "rows": results},
                               indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
