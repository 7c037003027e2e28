#!/usr/bin/env python
"""Serving throughput: plain decoding vs DOMINO (vs NGRAM) on real SGLang servers, one run.

For each server kind (started here, one at a time, and stopped afterwards; with --rounds R > 1 all at
once, each level then run R times per server with the servers taking turns; with --restart as well, the
servers are started afresh for every round, since one process's speed differs from the next one's) and
each concurrency level, a fixed set of prompts (MT-Bench first turns + held-out ShareGPT first turns, chat
template applied by the server) is sent through /generate with streaming, a fixed output length
(ignore_eos) and greedy decoding unless --temperature is given. Per level it records output tok/s,
TTFT, inter-token latency (ITL = (e2e - TTFT) / (tokens - 1) per request), e2e p50/p99 and the
accept length that SGLang reports in each response's meta_info, and each round's output tok/s; with a
baseline among the kinds, every other kind's tok/s over the baseline's, overall and round by round (a round of
each kind runs side by side, so the spread of these paired ratios shows how far one run's ratio can be trusted).
On a CPU the JSON also records, per server, the few-row linear's choices from its log (``linear_verdicts``).

    python bench/throughput.py --draft drafters/smollm2-domino --concurrency 1 2 4 8 16 32
    python bench/throughput.py --draft D --kinds baseline domino ngram --output-len 128 --requests 32
    python bench/throughput.py --draft D --kinds baseline domino domino-w1 domino-w2 --rounds 3
                                              # fixed widths beside adaptive, interleaved against machine drift
    python bench/throughput.py --draft D --rounds 4 --restart   # the README's reference runs: fresh servers each round
    python bench/throughput.py --draft D --sampling-params '{"frequency_penalty": 0.5}'   # any sampling parameters

Writes bench/results/<name>.json and .csv (with command, git commit, machine, date) and a PNG.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import json
import re
import signal
import statistics
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_info import RESULTS, run_info  # noqa: E402

from sglang_domino.linear import MAX_ROWS_ENV  # noqa: E402
from sglang_domino.policy import policy_env  # noqa: E402
from sglang_domino.serving.server import (  # noqa: E402
    DEFAULT_MODEL, Server, free_port, preset_args, sse_events, start_all)


def load_prompts(n_mtbench: int, n_sharegpt: int) -> list[dict]:
    from sglang_domino.prompts import mtbench_first_turns, sharegpt_heldout

    out = [{"source": "mtbench", "text": t} for t in mtbench_first_turns(n_mtbench)]
    if n_sharegpt:
        out += [{"source": "sharegpt", "text": t} for t in sharegpt_heldout(n_sharegpt)]
    return out


def chat_text(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def one_request(url: str, text: str, output_len: int, sampling: dict) -> dict:
    body = {"text": text, "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, **sampling}}
    t0 = time.perf_counter()
    ttft, meta = None, {}
    with requests.post(url + "/generate", json=body, stream=True, timeout=3600) as r:
        r.raise_for_status()
        for chunk in sse_events(r):
            if ttft is None:
                ttft = time.perf_counter() - t0
            meta = chunk.get("meta_info", meta)
    e2e = time.perf_counter() - t0
    n = int(meta.get("completion_tokens", output_len))
    return {"ttft": ttft or e2e, "e2e": e2e, "tokens": n, "itl": (e2e - (ttft or e2e)) / max(n - 1, 1),
            "accept_length": meta.get("spec_accept_length"), "verify_ct": meta.get("spec_verify_ct")}


def pct(values, q):
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run_requests(url, texts, concurrency, output_len, sampling, bar=None) -> tuple[list[dict], float]:
    """Send ``texts`` with at most ``concurrency`` in flight; per-request results and the wall time."""
    t0 = time.perf_counter()
    results = []
    with cf.ThreadPoolExecutor(concurrency) as ex:
        futs = [ex.submit(one_request, url, t, output_len, sampling) for t in texts]
        for f in cf.as_completed(futs):
            results.append(f.result())
            if bar is not None:
                bar.update(1)
    return results, time.perf_counter() - t0


def summarize(concurrency: int, results: list[dict], wall: float) -> dict:
    """One row: output tokens over the summed wall time of the level's rounds, latency percentiles."""
    acc = [r["accept_length"] for r in results if r["accept_length"] is not None]
    total = sum(r["tokens"] for r in results)
    return {
        "concurrency": concurrency, "requests": len(results), "output_tokens": total, "wall_s": wall,
        "output_tok_s": total / wall,
        "ttft_p50_s": pct([r["ttft"] for r in results], 0.5), "ttft_p99_s": pct([r["ttft"] for r in results], 0.99),
        "itl_p50_s": pct([r["itl"] for r in results], 0.5), "itl_p99_s": pct([r["itl"] for r in results], 0.99),
        "e2e_p50_s": pct([r["e2e"] for r in results], 0.5), "e2e_p99_s": pct([r["e2e"] for r in results], 0.99),
        "accept_length_mean": statistics.mean(acc) if acc else None,
    }


def add_ratios(rows: list[dict], reference: str = "baseline") -> None:
    """Give each row of another kind ``vs_<reference>``: its output tok/s over the reference kind's at the same
    concurrency, and ``vs_<reference>_rounds``: the same per round, paired by round (``output_tok_s_rounds``: one
    entry per round, None where the kind did not run)."""
    ref = {r["concurrency"]: r for r in rows if r["kind"] == reference}
    for row in rows:
        base = ref.get(row["concurrency"])
        if base is None or row is base:
            continue
        row[f"vs_{reference}"] = row["output_tok_s"] / base["output_tok_s"]
        row[f"vs_{reference}_rounds"] = [a / b if a and b else None  # None: a round one of them missed
                                         for a, b in zip(row["output_tok_s_rounds"], base["output_tok_s_rounds"])]


def csv_cell(value):
    """A CSV cell: a per-round list as space-separated values ("-" for a round that did not run)."""
    if isinstance(value, list):
        return " ".join("-" if x is None else f"{x:.4g}" for x in value)
    return value


def plot(rows: list[dict], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        rs = [r for r in rows if r["kind"] == kind]
        c = [r["concurrency"] for r in rs]
        axes[0].plot(c, [r["output_tok_s"] for r in rs], marker="o", label=kind)
        axes[1].plot(c, [r["itl_p50_s"] * 1000 for r in rs], marker="o", label=kind)
    for ax, title in zip(axes, ("output tokens/s", "ITL p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


KINDS = ("baseline", "baseline-sync", "baseline-stock", "domino", "domino-always", "ngram")


def linear_verdicts(log_path: str) -> list[str]:
    """The few-row linear's verdicts in a server log (``sglang_domino.linear``: one per kind of product and
    process start, each with both forms' median times and the form taken)."""
    return re.findall(r"few-row linear: (.+ -> (?:stock|transposed))", Path(log_path).read_text(errors="replace"))


def server_kind(value: str) -> str:
    """argparse type of --kinds: a preset name, baseline-sync (the baseline preset without overlap scheduling),
    baseline-stock (without the plugin's few-row CPU linear) or domino-wN (drafting width N at every step)."""
    if value in KINDS or re.fullmatch(r"domino-w[1-9][0-9]*", value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: expected one of {', '.join(KINDS)} or domino-wN")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / DEFAULT_MODEL))
    p.add_argument("--draft", help="Domino drafter checkpoint (required for the domino kind)")
    p.add_argument("--kinds", nargs="+", type=server_kind, default=["baseline", "domino"],
                   help="baseline | baseline-sync (without SGLang's overlap scheduling, which DOMINO turns off) | "
                        "baseline-stock (CPU: without the plugin's few-row linear) | "
                        "domino (the default adaptive draft policy) | domino-always (full width at every step) | "
                        "domino-wN (width N at every step, e.g. domino-w2) | ngram")
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--mtbench", type=int, default=16, help="MT-Bench first turns to use")
    p.add_argument("--sharegpt", type=int, default=16, help="held-out ShareGPT prompts to use")
    p.add_argument("--requests", type=int, default=0,
                   help="requests per level (default: max(#prompts at 1..., 2 x concurrency) capped by prompts)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--sampling-params", type=json.loads, default={},
                   help="more SGLang sampling parameters for every request, as JSON, "
                        "e.g. '{\"frequency_penalty\": 0.5}'")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--num-draft-tokens", type=int)
    p.add_argument("--max-draft-batch", type=int,
                   help="SGLANG_DOMINO_MAX_DRAFT_BATCH for the domino servers (0 = no cap; default: the server's, "
                        "8 on a CPU)")
    p.add_argument("--draft-widths", type=int, nargs="+",
                   help="candidate verify widths of the adaptive policy (default 1 2 4 8 and the full width)")
    p.add_argument("--rounds", type=int, default=1,
                   help="> 1: start all servers at once and run each level this many times per server, the servers "
                        "taking turns (so a slow spell of the machine hits every kind alike)")
    p.add_argument("--restart", action="store_true",
                   help="with --rounds: start fresh server processes for every round (on a small CPU a server "
                        "process's own speed varies by up to ~10%% from one start to the next)")
    p.add_argument("--name", default=None)
    p.add_argument("--server-args", default="", help="extra SGLang flags for every server (one string)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.restart and args.rounds < 2:
        p.error("--restart needs --rounds >= 2")
    # SIGTERM must still run the `finally` that stops the server we started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tqdm import tqdm
    from transformers import AutoTokenizer

    if any(k.startswith("domino") for k in args.kinds) and not args.draft:
        p.error("--draft is required for the domino kind")
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = load_prompts(args.mtbench, args.sharegpt)
    texts = [chat_text(tokenizer, q["text"]) for q in prompts]
    sampling = {"temperature": args.temperature, **args.sampling_params}
    name = args.name or time.strftime("throughput-%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)

    def texts_for(c):
        n = args.requests or min(len(texts), max(2 * c, 4))
        return [texts[i % len(texts)] for i in range(n)]

    def server_for(kind: str) -> Server:
        preset = "domino" if kind.startswith("domino") else "baseline" if kind.startswith("baseline") else kind
        flags = preset_args(preset, device=device, draft=args.draft, num_draft_tokens=args.num_draft_tokens)
        flags += ["--disable-overlap-schedule"] if kind == "baseline-sync" else []
        flags += args.server_args.split()
        env = {MAX_ROWS_ENV: "0"} if kind == "baseline-stock" else {}
        if preset == "domino":
            fixed = [int(kind[len("domino-w"):])] if kind.startswith("domino-w") else args.draft_widths
            env = policy_env("adaptive" if kind == "domino" else "always", args.max_draft_batch, fixed)
        return Server(args.model, free_port(), flags, env=env, log_path=str(RESULTS / f"{name}-{kind}.log"))

    # one server at a time; or (--rounds > 1) all of them up at once, the rounds of each level interleaved;
    # or (--restart) all up at once and started afresh for every round
    if args.rounds == 1:
        sessions = [([k], [0]) for k in args.kinds]
    elif args.restart:
        sessions = [(list(args.kinds), [r]) for r in range(args.rounds)]
    else:
        sessions = [(list(args.kinds), list(range(args.rounds)))]
    total_reqs = args.rounds * len(args.kinds) * sum(len(texts_for(c)) for c in args.concurrency)
    bar = tqdm(total=total_reqs, desc="requests", unit="req")
    results = {(k, c): [] for k in args.kinds for c in args.concurrency}
    wall = dict.fromkeys(results, 0.0)
    per_round = {key: {} for key in results}  # (kind, c) -> round -> output tok/s
    servers_info = {}
    for kinds, rounds in sessions:
        live = {}
        try:
            for kind in kinds:
                server = server_for(kind)
                bar.set_postfix_str(f"starting {kind}")
                try:
                    start_all([server], 900)
                    one_request(server.url, texts[0], 8, sampling)  # warm-up
                    live[kind] = server
                    servers_info[kind] = {"command": server.command, "env": server.env}
                except Exception as e:  # a kind that does not run (e.g. NGRAM on this CPU) is recorded, not fatal
                    tqdm.write(f"{kind}: FAILED: {e}")
                    servers_info[kind] = {"command": server.command, "error": str(e)[-2000:]}
                    server.stop()
            for c in args.concurrency:
                for r in rounds:
                    order = list(live)[r % len(live):] + list(live)[:r % len(live)] if live else []
                    for kind in order:
                        bar.set_postfix_str(f"{kind} c={c}" + (f" round {r + 1}" if args.rounds > 1 else ""))
                        res, w = run_requests(live[kind].url, texts_for(c), c, args.output_len, sampling, bar)
                        results[kind, c] += res
                        wall[kind, c] += w
                        per_round[kind, c][r] = sum(x["tokens"] for x in res) / w
        finally:
            for server in live.values():
                server.stop()
    bar.close()
    for kind, info in servers_info.items():
        if device == "cpu" and "error" not in info:
            info["few_row_linear"] = linear_verdicts(str(RESULTS / f"{name}-{kind}.log"))
    rows = []
    for c in args.concurrency:
        for kind in args.kinds:
            if results[kind, c]:
                by_round = per_round[kind, c]
                rows.append({"kind": kind, **summarize(c, results[kind, c], wall[kind, c]),
                             "output_tok_s_rounds": [by_round.get(r) for r in range(args.rounds)]})
    add_ratios(rows)
    for row in rows:
        ratio = ""
        if "vs_baseline" in row:
            spread = [x for x in row["vs_baseline_rounds"] if x is not None] or [float("nan")]
            ratio = f"  {row['vs_baseline']:.2f}x baseline (rounds {min(spread):.2f}-{max(spread):.2f}x)"
        print(f"{row['kind']:8s} c={row['concurrency']:3d}  {row['output_tok_s']:8.2f} tok/s{ratio}  ttft p50 "
              f"{row['ttft_p50_s']:.2f}s  itl p50 {row['itl_p50_s'] * 1000:.0f}ms  e2e p50/p99 {row['e2e_p50_s']:.1f}/"
              f"{row['e2e_p99_s']:.1f}s  accept {row['accept_length_mean']}")

    info = run_info()
    payload = {**info, "device": device, "model": args.model, "draft": args.draft, "output_len": args.output_len,
               "sampling": sampling, "prompts": {"mtbench": args.mtbench, "sharegpt": args.sharegpt},
               "rounds": args.rounds, "restart": args.restart,
               "servers": servers_info, "rows": rows}
    json_path = RESULTS / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=2) + "\n")
    csv_path = RESULTS / f"{name}.csv"
    with open(csv_path, "w", newline="") as f:
        f.write(f"# command: {info['command']}\n# commit: {info['commit']}\n# machine: {json.dumps(info['machine'])}\n"
                f"# date: {info['date']}\n")
        if rows:  # the baseline's rows have no ratio columns
            w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
            w.writeheader()
            w.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    png = plot(rows, RESULTS / f"{name}.png") if rows else None
    print(json.dumps({"json": str(json_path), "csv": str(csv_path), "png": str(png) if png else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
