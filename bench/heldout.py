"""Held-out acceptance of drafters, teacher-forced: a quick paired comparison of training stages.

Every drafter is scored on the same blocks: every answer position of the held-out conversations of the training
data (``--data``, as ``sglang_domino.train`` splits them) that the target answered greedily. On such text the
leading hits of a block are what greedy verification would commit there, so two scores follow without decoding:

- ``accept``: tokens a greedy step commits (bonus included), averaged over every answer position as the anchor;
  also the top-1 accuracy of each draft position and P(at least j drafts right);
- ``accept_decoding``: the same, over the anchors greedy decoding reaches: from the answer's first token, each
  step commits its leading hits plus the bonus and the next step starts after them. This is the tau of a greedy
  decoding that writes these answers (the target's own, in the data's dtype; ``bench/acceptance.py`` measures tau
  by decoding MT-Bench); it is lower than ``accept`` because a step starts right after a draft went wrong, where
  drafting is harder than at a random position.

For each drafter after the first, both scores minus the first's with a 95% paired bootstrap over conversations.
About a minute per drafter, against ~20 min for MT-Bench decoding. Writes ``bench/results/<name>.json``.

    python bench/heldout.py --drafters drafters/smollm2-domino-b16 drafters/smollm2-dflash-b16
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_info import write_result  # noqa: E402

from sglang_domino.hf.target import load_target  # noqa: E402
from sglang_domino.train.curriculum import lead_lengths  # noqa: E402
from sglang_domino.train.trainer import Trainer, TrainConfig, resolve_device  # noqa: E402

DEFAULT_DATA = ["data/sharegpt-smollm2", "data/sharegpt-smollm2-s1", "data/sharegpt-smollm2-s2",
                "data/sharegpt-smollm2-relabelled", "data/sharegpt-smollm2-relabelled-s1",
                "data/sharegpt-smollm2-relabelled-s2", "data/sharegpt-smollm2-later-turns"]
EVERY_POSITION = 10 ** 9  # anchors per conversation: more than any answer has


def summary(correct: torch.Tensor, valid: torch.Tensor, depth: int = 5) -> dict:
    lead = lead_lengths(correct).float()
    return {"accept": round(1 + float(lead.mean()), 4),
            "acc_by_position": [round(float(c), 4) for c in correct.sum(0) / valid.sum(0).clamp_min(1)],
            "p_at_least": [round(float((lead >= j).float().mean()), 4) for j in range(1, depth + 1)],
            "blocks": int(correct.shape[0])}


def decoding_path(lead: torch.Tensor, offset: torch.Tensor) -> list[int]:
    """Greedy decoding of one answer from its leading hits at every anchor: lead [R] and offset [R] (the anchor's
    position in the answer). From offset 0, a step commits lead + 1 tokens and the next starts after them, until
    no block is left. Returns the drafts each step accepts (steps = its length, tokens = its sum + its length)."""
    at = dict(zip(offset.tolist(), lead.tolist()))
    path, pos = [], 0
    while pos in at:
        path.append(at[pos])
        pos += at[pos] + 1
    return path


def per_conversation(lead: torch.Tensor, conv: torch.Tensor, offset: torch.Tensor, ids: list[int]) -> dict:
    """For each conversation in ids: summed leading hits and blocks over every anchor, and the decoding path's
    steps and tokens, as [C] tensors (the numerators and denominators of ``accept`` and ``accept_decoding``)."""
    rows = [conv == c for c in ids]
    path = [decoding_path(lead[r], offset[r]) for r in rows]
    return {"lead": torch.tensor([float(lead[r].sum()) for r in rows]),
            "blocks": torch.tensor([float(r.sum()) for r in rows]),
            "steps": torch.tensor([float(len(p)) for p in path]),
            "tokens": torch.tensor([float(sum(p) + len(p)) for p in path])}


def paired_interval(num_a: torch.Tensor, den_a: torch.Tensor, num_b: torch.Tensor, den_b: torch.Tensor,
                    draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of sum(num_b)/sum(den_b) - sum(num_a)/sum(den_a), [C] per-conversation sums,
    resampling whole conversations (the same draw for both drafters)."""
    pick = torch.randint(0, num_a.numel(), (draws, num_a.numel()), generator=torch.Generator().manual_seed(seed))
    diffs = (num_b[pick].sum(1) / den_b[pick].sum(1) - num_a[pick].sum(1) / den_a[pick].sum(1)).sort().values
    return float(diffs[int(0.025 * draws)]), float(diffs[int(0.975 * draws) - 1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafters", nargs="+", required=True, help="exported drafters; the first is the reference")
    p.add_argument("--data", nargs="+", default=DEFAULT_DATA, help="the training data folders (the split's source)")
    p.add_argument("--target", default=TrainConfig.target)
    p.add_argument("--features-dir", default="runs/features-bf16", help="target feature cache (filled if missing)")
    p.add_argument("--dtype", default="bfloat16", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default=None, help="result file name under bench/results/ (default: print only)")
    p.add_argument("--note", default="", help="what the drafters are (stored in the result)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    results, sums = {}, {}
    target = load_target(args.target, torch.float32, resolve_device("auto"))[0]  # once, for every drafter
    with tempfile.TemporaryDirectory() as tmp:
        for d in args.drafters:
            cfg = TrainConfig(target=args.target, data=args.data, init_from=d, run_dir=tmp, out=tmp, resume=False,
                              dtype=args.dtype, feature_dtype=args.dtype, features_dir=args.features_dir,
                              batch_seqs=1, progress=False)  # one conversation at a time: every position is a block
            trainer = Trainer(cfg, target=target)
            correct, valid, conv, offset = trainer.heldout_hits(EVERY_POSITION)
            # only the target's own answers: no decoding follows a relabelled (human-written) one
            ids = [c for c in conv.unique().tolist() if "labels" not in trainer.val[c]]
            if not ids:
                raise SystemExit(f"no held-out conversation of {args.data[0]} is a greedy answer of the target")
            keep = torch.isin(conv, torch.tensor(ids, dtype=conv.dtype))
            correct, valid, conv, offset = correct[keep], valid[keep], conv[keep], offset[keep]
            sums[d] = per_conversation(lead_lengths(correct), conv, offset, ids)
            results[d] = summary(correct, valid)
            results[d]["accept_decoding"] = round(float(sums[d]["tokens"].sum() / sums[d]["steps"].sum()), 4)
            results[d]["decoding_steps"] = int(sums[d]["steps"].sum())
            print(d, results[d], flush=True)
    ref = sums[args.drafters[0]]
    for d in args.drafters[1:]:
        r, s = results[d], sums[d]
        for score, num, den in (("accept", "lead", "blocks"), ("accept_decoding", "tokens", "steps")):
            r[score + "_minus_first"] = round(r[score] - results[args.drafters[0]][score], 4)
            r[score + "_minus_first_95"] = [round(x, 4) for x in paired_interval(ref[num], ref[den], s[num], s[den])]
            print(f"{d}: {score} - first's = {r[score + '_minus_first']:+.4f}, 95% {r[score + '_minus_first_95']}")
    if args.name:
        path = write_result(args.name, {"note": args.note, "data": args.data, "anchors": "every answer position",
                                        "greedy_held_out_conversations": int(ref["steps"].numel()),
                                        "drafters": results})
        print("wrote", path)


if __name__ == "__main__":
    main()
