"""Latency of the fused Triton kernels against the eager torch paths.

Rollout (greedy, block 16 = 15 proposals, random weights at the real shapes):
    triton        sglang_domino.kernels.rollout.rollout (fused, full vocabulary)
    triton_table  the same with the head's gate table (E[v] @ w_ih^T for every token, fp32, built once:
                  a row gather per step in place of the w_ih read; ``SGLANG_DOMINO_GATE_TABLE=1``)
    reference     sglang_domino.rollout.rollout (the torch spec; fp32 GRU)
    eager_aten    an ATen gru_cell loop in the weights' dtype with full-vocabulary argmax, the way SGLang's
                  built-in domino_greedy_rollout runs with candidate_pool_size=0
each as plain eager calls (wall clock, launch overhead included) and replayed from a CUDA graph (GPU
time). Also: temperature sampling rollout, greedy and sampled verification (triton vs reference), and
with --tune the greedy rollout under other tile sizes (``tile_sweep``), with --profile the device time
per kernel of one rollout (``profile``).

On CUDA everything is timed at batch 1..64 for SmolLM2-135M and Qwen3-8B shapes. On CPU only the torch
paths run, on a small subset, and the JSON says ``"cpu_reference_only": true``: that exists to keep this
script tested, its numbers are not kernel measurements.

    python bench/kernels.py                      # all batches, both models (CUDA) / small subset (CPU)
    python bench/kernels.py --models smollm2-135m --batches 1,8 --out /tmp/k.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import RESULTS, run_info  # noqa: E402

from sglang_domino.drafter import HeadWeights  # noqa: E402
from sglang_domino.rollout import rollout as rollout_reference  # noqa: E402
from sglang_domino.sampling import BatchSampling, SamplingParams, sampling_probs  # noqa: E402
from sglang_domino.verify import verify_greedy, verify_sampled  # noqa: E402

MODELS = {
    "smollm2-135m": dict(hidden=576, vocab=49152, gru=256, emb=128),
    "qwen3-8b": dict(hidden=4096, vocab=151936, gru=1024, emb=256),
    "tiny": dict(hidden=64, vocab=1000, gru=32, emb=16),  # smoke test of this script
}


def eager_aten_rollout(z, base_logits, bonus, embed, head):
    """Greedy chain like SGLang's domino_greedy_rollout (pool 0): bf16 ATen GRU cell, full-vocab argmax."""
    b, n, _ = z.shape
    w_ih, w_hh, w1, w2 = head.w_ih, head.w_hh, head.w1, head.w2
    y = base_logits[:, 0].argmax(-1)
    out = [y]
    h = torch.ops.aten.gru_cell(embed[bonus], z.new_zeros(b, w_hh.shape[1]), w_ih, w_hh, None, None)
    h = torch.ops.aten.gru_cell(embed[y], h, w_ih, w_hh, None, None)
    for i in range(1, n):
        corr = F.linear(F.silu(F.linear(torch.cat([z[:, i], h], -1), w1)), w2)
        y = (base_logits[:, i] + corr).argmax(-1)
        out.append(y)
        if i + 1 < n:
            h = torch.ops.aten.gru_cell(embed[y], h, w_ih, w_hh, None, None)
    return torch.stack(out, 1)


def _randn(g, *shape, scale, dtype, device):
    return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


def make_weights(shape: dict, dtype, device, seed=0) -> dict:
    """Random head and embedding at the model's shapes, scaled so the correction moves the argmax."""
    g = torch.Generator(device=device).manual_seed(seed)
    hidden, vocab, gru, emb = shape["hidden"], shape["vocab"], shape["gru"], shape["emb"]
    r = lambda *s, scale=1.0: _randn(g, *s, scale=scale, dtype=dtype, device=device)  # noqa: E731
    head = HeadWeights(r(3 * gru, hidden, scale=hidden ** -0.5), r(3 * gru, gru, scale=gru ** -0.5),
                       r(emb, hidden + gru, scale=(hidden + gru) ** -0.5), r(vocab, emb, scale=3 * emb ** -0.5))
    return dict(embed=r(vocab, hidden), head=head)


def make_inputs(shape: dict, weights: dict, b: int, n: int, dtype, device, seed=1) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    return dict(z=_randn(g, b, n, shape["hidden"], scale=1.0, dtype=dtype, device=device),
                base_logits=_randn(g, b, n, shape["vocab"], scale=2.0, dtype=dtype, device=device),
                bonus=torch.randint(0, shape["vocab"], (b,), generator=g, device=device), **weights)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_eager(fn, device, warmup: int, iters: int) -> dict:
    """Wall-clock per call (launches included), after warm-up; microseconds."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e6)
    return {"median_us": statistics.median(times), "min_us": min(times), "iters": iters}


def time_graph(fn, warmup: int, iters: int) -> dict:
    """GPU time of one replay of a CUDA graph capturing fn; microseconds."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return {"median_us": statistics.median(times), "min_us": min(times), "iters": iters}


def bench_one(results, record, fn, device, args, graphs: bool):
    try:
        results.append({**record, "mode": "eager", **time_eager(fn, device, args.warmup, args.iters)})
    except Exception as exc:  # noqa: BLE001  (one failing method must not lose the others' numbers)
        results.append({**record, "mode": "eager", "error": repr(exc)[:500]})
    if graphs:
        try:
            results.append({**record, "mode": "graph", **time_graph(fn, args.warmup, args.iters)})
        except Exception as exc:  # noqa: BLE001
            results.append({**record, "mode": "graph", "error": repr(exc)[:500]})
    last = results[-1]
    print(f"{record['model']:>13} b={record['batch']:<3} {record['op']:<15} {record['method']:<11} "
          f"{last['mode']:<5} " + (f"{last['median_us']:10.1f} us" if "median_us" in last else last["error"]),
          flush=True)


def run(args) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    n = args.block - 1
    kr = kv = None
    if cuda:
        from sglang_domino.kernels import rollout as kr
        from sglang_domino.kernels import verify as kv
    results, checks, tables = [], [], {}
    for model in args.models:
        shape = MODELS[model]
        weights = make_weights(shape, dtype, device)
        table_head = weights["head"].with_gate_table(weights["embed"])
        tables[model] = table_head.gate_table.nbytes / 2**20
        for b in args.batches:
            inp = make_inputs(shape, weights, b, n, dtype, device)
            inp_table = {**inp, "head": table_head}
            rec = dict(model=model, batch=b, block=args.block, dtype=str(dtype).removeprefix("torch."))
            methods = {"reference": lambda: rollout_reference(**inp),
                       "eager_aten": lambda: eager_aten_rollout(**inp)}
            if cuda:
                methods = {"triton": lambda: kr.rollout(**inp), "triton_table": lambda: kr.rollout(**inp_table),
                           **methods}
                for op, args_ in (("rollout_greedy", inp), ("rollout_greedy_table", inp_table)):
                    tok_k, _ = kr.rollout(**args_)
                    tok_r, _ = rollout_reference(**args_)
                    checks.append({**rec, "op": op, "rows_equal": float((tok_k == tok_r).all(1).float().mean())})
            else:  # keeps the table path of this script tested
                methods["reference_table"] = lambda: rollout_reference(**inp_table)
            for method, fn in methods.items():
                bench_one(results, {**rec, "op": "rollout_greedy", "method": method}, fn, device, args, cuda)

            sampling = BatchSampling.of([SamplingParams(temperature=0.8)] * b, device=device)
            noise = torch.empty(b, n, shape["vocab"], device=device).exponential_()
            methods = {"reference": lambda: rollout_reference(**inp, sampling=sampling, exponential=noise)}
            if cuda:
                methods = {"triton": lambda: kr.rollout(**inp, sampling=sampling, exponential=noise), **methods}
            for method, fn in methods.items():
                bench_one(results, {**rec, "op": "rollout_sampled", "method": method}, fn, device, args, False)

            target = torch.randn(b, n + 1, shape["vocab"], device=device, dtype=dtype)
            draft = target[:, :n].argmax(-1)
            draft[:, n // 2:] = 0
            methods = {"reference": lambda: verify_greedy(draft, target)}
            if cuda:
                methods = {"triton": lambda: kv.verify_greedy(draft, target), **methods}
            for method, fn in methods.items():
                bench_one(results, {**rec, "op": "verify_greedy", "method": method}, fn, device, args, cuda)

            params = BatchSampling.of([SamplingParams(temperature=0.8)] * b, device=device)
            q = sampling_probs(torch.randn(b, n, shape["vocab"], device=device), params)
            p = sampling_probs(torch.randn(b, n + 1, shape["vocab"], device=device), params)
            u = torch.rand(b, n, device=device)
            e = torch.empty(b, shape["vocab"], device=device).exponential_()
            draft = torch.randint(0, shape["vocab"], (b, n), device=device)
            methods = {"reference": lambda: verify_sampled(draft, q, p, u, e)}
            if cuda:
                methods = {"triton": lambda: kv.verify_sampled(draft, q, p, u, e), **methods}
                got, want = kv.verify_sampled(draft, q, p, u, e), verify_sampled(draft, q, p, u, e)
                checks.append({**rec, "op": "verify_sampled",
                               "rows_equal": float(((got[0] == want[0]) & (got[1] == want[1])).float().mean())})
            for method, fn in methods.items():
                bench_one(results, {**rec, "op": "verify_sampled", "method": method}, fn, device, args, cuda)
        if cuda:
            torch.cuda.empty_cache()
    tune = sweep_tiles(args, device, dtype, n, kr) if cuda and args.tune else []
    prof = profile_kernels(args, device, dtype, n, kr) if cuda and args.profile else []
    return {"device": str(device), "cpu_reference_only": not cuda, "gate_table_mib": tables, "results": results,
            "checks": checks, "tile_sweep": tune, "profile": prof}


TILE_CONFIGS = [  # module globals of kernels/rollout.py to override; {} is its default
    {}, {"NATIVE_DOT": False}, {"BLOCK_K": 32}, {"K_CHUNK": 512}, {"K_CHUNK": 2048}, {"BLOCK_N": 128},
]


def sweep_tiles(args, device, dtype, n, kr) -> list[dict]:
    """Greedy rollout (CUDA graph) under other tile sizes at the largest model's shapes, batch 1 and 64;
    each config's tokens are checked against the default's."""
    model = args.models[-1]
    shape = MODELS[model]
    weights = make_weights(shape, dtype, device)
    out = []
    for b in (1, 64):
        inp = make_inputs(shape, weights, b, n, dtype, device)
        want, _ = kr.rollout(**inp)
        for config in TILE_CONFIGS:
            saved = {k: getattr(kr, k) for k in config}
            rec = dict(model=model, batch=b, config=config)
            try:
                for k, v in config.items():
                    setattr(kr, k, v)
                got, _ = kr.rollout(**inp)
                rec["same_tokens"] = bool(torch.equal(got, want))
                rec.update(time_graph(lambda: kr.rollout(**inp), args.warmup, args.iters))
            except Exception as exc:  # noqa: BLE001
                rec["error"] = repr(exc)[:500]
            finally:
                for k, v in saved.items():
                    setattr(kr, k, v)
            out.append(rec)
            print(f"tiles {model} b={b:<3} {str(config):<34} "
                  + (f"{rec['median_us']:8.1f} us same={rec['same_tokens']}" if "median_us" in rec else rec["error"]),
                  flush=True)
    return out


def profile_kernels(args, device, dtype, n, kr) -> list[dict]:
    """Device time per kernel (torch.profiler) of one greedy rollout, triton and eager_aten, at the largest
    model's shapes, batch 1 and 64: where the time goes."""
    from torch.profiler import ProfilerActivity, profile

    model = args.models[-1]
    shape = MODELS[model]
    weights = make_weights(shape, dtype, device)
    table_head = weights["head"].with_gate_table(weights["embed"])
    out = []
    for b in (1, 64):
        inp = make_inputs(shape, weights, b, n, dtype, device)
        for method, fn in (("triton", lambda: kr.rollout(**inp)),
                           ("triton_table", lambda: kr.rollout(**{**inp, "head": table_head})),
                           ("eager_aten", lambda: eager_aten_rollout(**inp))):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            reps = 5
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    fn()
                torch.cuda.synchronize()
            rows = []
            for e in prof.key_averages():
                us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
                if us > 0:
                    rows.append(dict(kernel=e.key[:80], calls=e.count // reps, us_per_rollout=us / reps))
            rows.sort(key=lambda r: -r["us_per_rollout"])
            total = sum(r["us_per_rollout"] for r in rows)
            out.append(dict(model=model, batch=b, method=method, total_us=total, kernels=rows[:12]))
            print(f"profile {model} b={b} {method}: {total:.0f} us of kernels per rollout")
            for r in rows[:8]:
                print(f"    {r['us_per_rollout']:8.1f} us  {r['calls']:4d}x  {r['kernel']}")
    return out


def print_summary(results: list[dict]) -> None:
    """Greedy rollout per model and batch: each method's median (eager / graph) and eager_aten over triton."""
    t = {(r["model"], r["batch"], r["method"], r["mode"]): r["median_us"]
         for r in results if r["op"] == "rollout_greedy" and "median_us" in r}
    print("\nrollout_greedy median us (eager / graph); speedup = eager_aten / triton (/ triton_table), same mode")
    for model, b in sorted({k[:2] for k in t}, key=lambda k: (k[0], k[1])):
        us = lambda m, mode: t.get((model, b, m, mode), float("nan"))  # noqa: E731
        cells = [f"{m} {us(m, 'eager'):.0f}/{us(m, 'graph'):.0f}"
                 for m in ("triton", "triton_table", "eager_aten", "reference")]
        ratio = [us("eager_aten", mode) / us(m, mode)
                 for m in ("triton", "triton_table") for mode in ("eager", "graph")]
        print(f"{model:>13} b={b:<3} " + "  ".join(cells)
              + " speedup {:.2f}x / {:.2f}x (table {:.2f}x / {:.2f}x)".format(*ratio))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default=None, help=f"comma list of {sorted(MODELS)}")
    ap.add_argument("--batches", default=None, help="comma list (default 1,2,4,8,16,32,64 on CUDA, 1,4 on CPU)")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--tune", action="store_true", help="CUDA: also time the rollout under other tile sizes")
    ap.add_argument("--profile", action="store_true", help="CUDA: device time per kernel of one rollout")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/kernels-<device>.json)")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.models = (args.models or ("smollm2-135m,qwen3-8b" if cuda else "smollm2-135m")).split(",")
    args.batches = [int(x) for x in (args.batches or ("1,2,4,8,16,32,64" if cuda else "1,4")).split(",")]
    args.warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    args.iters = args.iters if args.iters is not None else (30 if cuda else 3)
    if not cuda:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        print("CPU: timing the torch reference paths only (no Triton); not kernel measurements", flush=True)
    payload = run(args)
    print_summary(payload["results"])
    out = Path(args.out) if args.out else RESULTS / f"kernels-{'cuda' if cuda else 'cpu'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**run_info(), **payload}, indent=2) + "\n")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    main()
