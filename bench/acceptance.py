"""Acceptance and speed of the Transformers backend: plain vs Domino vs backbone-only vs a DFlash drafter.

For each prompt (MT-Bench first turns, then a held-out ShareGPT slice) and each temperature, the
decoders run back to back on the same prompt, so the ratios compare like with like on a noisy machine.
Methods: ``plain`` (the target alone), ``domino`` (the drafter, backbone + head), ``backbone`` (the same
drafter with the head switched off) and, with ``--baseline-drafter``, ``dflash`` (a drafter trained with
lambda = 1, backbone only: the same-budget baseline) and, with ``--previous-drafter``, ``previous`` (another
Domino drafter, head on: an earlier training stage, to compare stages in one run). Writes
``bench/results/<name>.json`` (with each prompt's committed tokens and steps, and a 95% paired-bootstrap interval
over prompts for the Domino / DFlash and Domino / previous tau ratios) and a Markdown table beside it.

    python bench/acceptance.py --drafter drafters/smollm2-domino-b16 --mtbench 20 --sharegpt 10
    python bench/acceptance.py --drafter D --baseline-drafter B --methods plain domino dflash --temperatures 0
    python bench/acceptance.py --drafter D --previous-drafter P --methods plain domino previous
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import write_result  # noqa: E402

from sglang_domino.drafter import load_drafter  # noqa: E402
from sglang_domino.hf.generate import plain_generate, speculative_generate  # noqa: E402
from sglang_domino.hf.target import chat_input_ids, load_target, stop_token_ids  # noqa: E402
from sglang_domino.models import DEFAULT_MODEL_DIR, init_drafter  # noqa: E402
from sglang_domino.policy import POLICIES, DraftPolicy  # noqa: E402
from sglang_domino.prompts import mtbench_first_turns, sharegpt_heldout  # noqa: E402
from sglang_domino.sampling import SamplingParams  # noqa: E402

METHODS = ("plain", "domino", "backbone", "dflash", "previous")
DRAFTER_OF = {"domino": "main", "backbone": "main", "dflash": "baseline", "previous": "previous"}


def run_method(method, target, drafters, ids, max_new, params, stops, seed, block, policy):
    if method == "plain":
        return plain_generate(target, ids, max_new, params, stops, seed=seed)
    return speculative_generate(target, drafters[DRAFTER_OF[method]], ids, max_new, params, stops, seed=seed,
                                use_head=method in ("domino", "previous"), block_size=block, policy=policy)


def summarise(runs: list) -> dict:
    """Aggregate GenerateStats of one (dataset, temperature, method) cell."""
    steps = sum(s.steps for s in runs)
    tokens = sum(s.new_tokens for s in runs)
    total = sum(s.time_total for s in runs)
    out = {"prompts": len(runs), "new_tokens": tokens, "time_s": round(total, 3),
           "tokens_per_s": round(tokens / total, 3) if total else 0.0}
    if steps:
        committed = sum(a + 1 for s in runs for a in s.accept_lens)
        widths = [w for s in runs for w in s.widths]
        out.update(
            steps=steps, tau=round(committed / steps, 3),
            per_prompt=[[sum(a + 1 for a in s.accept_lens), s.steps] for s in runs],  # committed, steps
            widths={w: widths.count(w) for w in sorted(set(widths))},
            ms_per_step_backbone=round(1e3 * sum(s.time_backbone for s in runs) / steps, 3),
            ms_per_step_head=round(1e3 * sum(s.time_head for s in runs) / steps, 3),
            ms_per_step_verify=round(1e3 * sum(s.time_verify for s in runs) / steps, 3),
        )
    return out


def tau_ratio_interval(num: list, den: list, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% paired-bootstrap interval of tau(num) / tau(den), resampling prompts. num, den: per prompt (in the same
    order) (committed tokens, decode steps); tau = sum of committed / sum of steps over the resampled prompts."""
    rng, n, ratios = random.Random(seed), len(num), []
    for _ in range(draws):
        pick = [rng.randrange(n) for _ in range(n)]
        (c1, s1), (c2, s2) = ([sum(runs[i][j] for i in pick) for j in (0, 1)] for runs in (num, den))
        ratios.append(c1 * s2 / (s1 * c2))
    ratios.sort()
    return round(ratios[int(0.025 * draws)], 3), round(ratios[int(0.975 * draws) - 1], 3)


def table(rows: list[dict]) -> str:
    head = "| dataset | T | method | tau | tok/s | speedup | backbone ms/step | head ms/step | verify ms/step |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['temperature']} | {r['method']} | {r.get('tau', 1.0):.2f} | "
            f"{r['tokens_per_s']:.2f} | {r['speedup']:.2f}x | {r.get('ms_per_step_backbone', 0):.1f} | "
            f"{r.get('ms_per_step_head', 0):.1f} | {r.get('ms_per_step_verify', 0):.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--drafter", help="drafter checkpoint; default: a random (untrained) drafter")
    ap.add_argument("--baseline-drafter", help="a DFlash-trained drafter (lambda = 1) for the dflash method")
    ap.add_argument("--previous-drafter", help="another Domino drafter (an earlier stage) for the previous method")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--mtbench", type=int, default=20, help="MT-Bench first turns to use (of 80)")
    ap.add_argument("--sharegpt", type=int, default=10, help="held-out ShareGPT prompts")
    ap.add_argument("--exclude-data", nargs="*", default=None,
                    help="training data folders whose ShareGPT records to skip (default: every folder under data/)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    ap.add_argument("--block-size", type=int, help="widest verify step (default: the drafter's block)")
    ap.add_argument("--policy", default="always", choices=POLICIES,
                    help="always: every step verifies --block-size (tau of the drafter at that block); adaptive: "
                         "the draft policy picks the width per step, one policy per method across all prompts")
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS,
                    help="default: plain domino backbone, and dflash / previous when their drafter is given")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="acceptance", help="result file name under bench/results/")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(args.model, dtype)
    if args.drafter:
        drafter, drafter_name = load_drafter(args.drafter, target.config, dtype=dtype), args.drafter
    else:
        drafter, drafter_name = init_drafter(target.config).to(dtype), "random (untrained)"
    drafters = {"main": drafter}
    for key, path in (("baseline", args.baseline_drafter), ("previous", args.previous_drafter)):
        if path:
            drafters[key] = load_drafter(path, target.config, dtype=dtype)
    methods = args.methods or [m for m in METHODS if DRAFTER_OF.get(m, "main") in drafters]
    for m in methods:
        if DRAFTER_OF.get(m, "main") not in drafters:
            ap.error(f"the {m} method needs --{DRAFTER_OF[m]}-drafter")
    stops = stop_token_ids(target, tokenizer)
    datasets = {"mtbench": mtbench_first_turns(args.mtbench),
                "sharegpt": sharegpt_heldout(args.sharegpt, args.exclude_data) if args.sharegpt else []}

    block = args.block_size or drafter.config.block_size
    policies = {m: DraftPolicy.from_env(block, mode=args.policy) for m in methods if m != "plain"}
    cells = defaultdict(list)
    jobs = [(d, t, i, p) for t in args.temperatures for d, ps in datasets.items() for i, p in enumerate(ps)]
    for dataset, temp, i, prompt in tqdm(jobs, desc="prompts", unit="prompt"):
        ids = chat_input_ids(tokenizer, prompt)
        params = SamplingParams(temperature=temp, top_p=0.95 if temp else 1.0)
        for method in methods:
            out = run_method(method, target, drafters, ids, args.max_new_tokens, params, stops, i, block,
                             policies.get(method))
            cells[(dataset, temp, method)].append(out.stats)

    rows = []
    for (dataset, temp, method), runs in cells.items():
        row = {"dataset": dataset, "temperature": temp, "method": method, **summarise(runs)}
        plain = cells.get((dataset, temp, "plain"))
        row["speedup"] = round(row["tokens_per_s"] / summarise(plain)["tokens_per_s"], 3) if plain else 1.0
        rows.append(row)
    domino = [r for r in rows if r["method"] == "domino" and "steps" in r]
    head_share = {f"{r['dataset']}@T={r['temperature']}": round(r["ms_per_step_head"] / r["ms_per_step_backbone"], 3)
                  for r in domino if r["ms_per_step_backbone"]}
    md = table(rows)
    by_cell = {(r["dataset"], r["temperature"], r["method"]): r for r in rows}

    def over(other: str) -> tuple[dict, dict]:
        """Domino tau / ``other``'s tau per cell, and its 95% bootstrap interval over the prompts."""
        point, interval = {}, {}
        for (d, t, m), r in by_cell.items():
            o = by_cell.get((d, t, other))
            if m == "domino" and "steps" in r and o:
                point[f"{d}@T={t}"] = round(r["tau"] / o["tau"], 3)
                interval[f"{d}@T={t}"] = tau_ratio_interval(r["per_prompt"], o["per_prompt"])
        return point, interval

    (tau_over_dflash, dflash_ci), (tau_over_previous, previous_ci) = over("dflash"), over("previous")
    payload = {"target": args.model, "drafter": drafter_name, "baseline_drafter": args.baseline_drafter,
               "previous_drafter": args.previous_drafter, "domino_tau_over_previous_tau": tau_over_previous,
               "dtype": args.dtype, "block_size": block, "policy": args.policy,
               "max_new_tokens": args.max_new_tokens, "head_cost_over_backbone": head_share,
               "domino_tau_over_dflash_tau": tau_over_dflash,
               "domino_tau_over_dflash_tau_95ci": dflash_ci, "domino_tau_over_previous_tau_95ci": previous_ci,
               "results": rows, "table": md}
    path = write_result(args.name, payload)
    path.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(f"head cost / backbone cost per draft step: {head_share}")
    if tau_over_dflash:
        print(f"Domino tau / DFlash tau: {tau_over_dflash} (95% bootstrap over prompts: {dflash_ci})")
    if tau_over_previous:
        print(f"Domino tau / previous drafter's tau: {tau_over_previous} (95%: {previous_ci})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
