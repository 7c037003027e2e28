#!/usr/bin/env python
"""What a few-row matmul costs on a small CPU: SmolLM2-135M's linears at M rows, two ways, 1 vs 2 threads.

A plain decode step multiplies each weight by M = batch rows; a width-w verify step by M = batch x w rows.
This times one forward's worth of SmolLM2-135M's linears (30 layers of qkv 576->960, gate_up 576->3072,
o 576->576, down 1536->576, all resident in memory at once as in a real forward, so every weight comes
from DRAM; and the 576->49152 LM head) for M in --rows, in two forms: ``stock`` (``F.linear``, what SGLang
calls) and ``transposed`` (``(W @ x.T).T``, one row repeated to two; what ``sglang_domino.linear`` runs
at the 1-64-row counts where it measures faster on the machine at hand); with 1 and 2
torch threads, once with the other cores idle and once with a busy-looping process on every core but one
(what the tokenizer, detokenizer and HTTP client of a server on the same machine do to it).

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

from sglang_domino.linear import transposed_linear  # noqa: E402

LAYER = {"qkv": (576, 960), "gate_up": (576, 3072), "o": (576, 576), "down": (1536, 576)}
NUM_LAYERS = 30
LM_HEAD = (576, 49152)
FORMS = {"stock": F.linear, "transposed": transposed_linear}


def _spin() -> None:
    while True:
        pass


def time_forms(weights: list[torch.Tensor], m: int, reps: int) -> dict[str, float]:
    """Median ms, per form, of multiplying [m, k] rows by every weight [n, k] in turn (5 rounds of ``reps``)."""
    xs = {w.shape[1]: torch.randn(m, w.shape[1]) for w in weights}
    out = {}
    for form, fn in FORMS.items():
        for w in weights[:4]:
            fn(xs[w.shape[1]], w)
        rounds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                for w in weights:
                    fn(xs[w.shape[1]], w)
            rounds.append((time.perf_counter() - t) / reps * 1e3)
        out[form] = round(statistics.median(rounds), 3)
    return out


def measure(rows: list[int], threads: int) -> list[dict]:
    torch.set_num_threads(threads)
    layers = [torch.randn(n, k) * 0.02 for _ in range(NUM_LAYERS) for k, n in LAYER.values()]
    head = [torch.randn(LM_HEAD[1], LM_HEAD[0]) * 0.02]
    out = []
    for m in rows:
        lin, lm = time_forms(layers, m, 2), time_forms(head, m, 3)
        out += [{"rows": m, "form": f, "layer_linears_ms": lin[f], "lm_head_ms": lm[f]} for f in FORMS]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
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
    path.write_text(json.dumps({**run_info(), "shapes": {"layer": LAYER, "num_layers": NUM_LAYERS, "lm_head": LM_HEAD},
                               "rows": results},
                               indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
