"""Held-out acceptance of drafters, teacher-forced: a quick paired comparison of training stages.

Every drafter is scored on the same blocks: the held-out conversations of the training data (``--data``, as
``sglang_domino.train`` splits them) that the target answered greedily, at ``--anchors`` anchors each, drawn
independently of the training seed (on such text the leading hits are what greedy verification commits).
For each: tokens a greedy step would commit (``accept``, bonus included), the top-1 accuracy of each draft
position, and P(at least j drafts right); for each drafter after the first, its accept minus the first's with a
95% paired-bootstrap interval over conversations. Seconds per drafter, against ~20 min for MT-Bench decoding
(``bench/acceptance.py``, which measures what serving sees). Writes ``bench/results/<name>.json``.

    python bench/heldout.py --drafters drafters/smollm2-domino-b16 runs/smollm2-domino-b16-stage6/export
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import write_result  # noqa: E402

from sglang_domino.hf.target import load_target  # noqa: E402
from sglang_domino.train.trainer import Trainer, TrainConfig, resolve_device  # noqa: E402

DEFAULT_DATA = ["data/sharegpt-smollm2", "data/sharegpt-smollm2-s1", "data/sharegpt-smollm2-s2",
                "data/sharegpt-smollm2-relabelled", "data/sharegpt-smollm2-relabelled-s1",
                "data/sharegpt-smollm2-relabelled-s2", "data/sharegpt-smollm2-later-turns"]


def lead_lengths(correct: torch.Tensor) -> torch.Tensor:
    """[R, n] hits -> [R] number of leading hits (the drafts a greedy step accepts)."""
    return torch.cumprod(correct.long(), dim=1).sum(1)


def summary(correct: torch.Tensor, valid: torch.Tensor, depth: int = 5) -> dict:
    lead = lead_lengths(correct).float()
    return {"accept": round(1 + float(lead.mean()), 4),
            "acc_by_position": [round(float(c), 4) for c in correct.sum(0) / valid.sum(0).clamp_min(1)],
            "p_at_least": [round(float((lead >= j).float().mean()), 4) for j in range(1, depth + 1)],
            "blocks": int(correct.shape[0])}


def paired_interval(lead_a: torch.Tensor, lead_b: torch.Tensor, conv: torch.Tensor, draws: int = 2000,
                    seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of mean(lead_b) - mean(lead_a) over blocks, resampling whole conversations."""
    ids = conv.unique().tolist()
    rows = {c: (conv == c).nonzero()[:, 0] for c in ids}
    rng = random.Random(seed)
    diffs = []
    for _ in range(draws):
        pick = torch.cat([rows[rng.choice(ids)] for _ in ids])
        diffs.append(float(lead_b[pick].float().mean() - lead_a[pick].float().mean()))
    diffs.sort()
    return diffs[int(0.025 * draws)], diffs[int(0.975 * draws) - 1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafters", nargs="+", required=True, help="exported drafters; the first is the reference")
    p.add_argument("--data", nargs="+", default=DEFAULT_DATA, help="the training data folders (the split's source)")
    p.add_argument("--target", default=TrainConfig.target)
    p.add_argument("--features-dir", default="runs/features-bf16", help="target feature cache (filled if missing)")
    p.add_argument("--dtype", default="bfloat16", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--anchors", type=int, default=64, help="anchors per held-out conversation")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default=None, help="result file name under bench/results/ (default: print only)")
    p.add_argument("--note", default="", help="what the drafters are (stored in the result)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results, hits = {}, {}
    target = load_target(args.target, torch.float32, resolve_device("auto"))[0]  # once, for every drafter
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.drafters:
            cfg = TrainConfig(target=args.target, data=args.data, init_from=d, run_dir=tmp, out=tmp, resume=False,
                              dtype=args.dtype, feature_dtype=args.dtype, features_dir=args.features_dir,
                              progress=False)
            correct, valid, conv = Trainer(cfg, target=target).heldout_hits(args.anchors)
            hits[d] = (correct, conv)
            results[d] = summary(correct, valid)
            print(d, results[d], flush=True)
    ref = args.drafters[0]
    for d in args.drafters[1:]:
        a, b = lead_lengths(hits[ref][0]), lead_lengths(hits[d][0])
        results[d]["accept_minus_first"] = round(float(b.float().mean() - a.float().mean()), 4)
        results[d]["accept_minus_first_95"] = [round(x, 4) for x in paired_interval(a, b, hits[ref][1])]
        r = results[d]
        print(f"{d}: accept - {ref}'s = {r['accept_minus_first']:+.4f}, 95% {r['accept_minus_first_95']}")
    if args.name:
        path = write_result(args.name, {"note": args.note, "data": args.data, "anchors_per_conversation": args.anchors,
                                        "greedy_held_out_conversations": int(hits[ref][1].unique().numel()),
                                        "drafters": results})
        print("wrote", path)


if __name__ == "__main__":
    main()
