"""bench/heldout.py: the held-out blocks are the same for every run, its statistics by hand, and its decoding path
against real decoding."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from sglang_domino.hf.generate import plain_generate, speculative_generate
from sglang_domino.models import tiny_target
from sglang_domino.train.trainer import Trainer
from test_train import make_examples, small_cfg

_spec = importlib.util.spec_from_file_location("heldout", Path(__file__).parents[1] / "bench" / "heldout.py")
heldout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(heldout)


def test_statistics_by_hand():
    correct = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 1], [1, 1, 1]], dtype=torch.bool)
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert heldout.lead_lengths(correct).tolist() == [2, 0, 1, 3]
    s = heldout.summary(correct, valid, depth=3)
    assert s["accept"] == 2.5 and s["blocks"] == 4
    assert s["acc_by_position"] == [0.75, 0.75, 1.0]  # the third column has 2 valid labels, both hit
    assert s["p_at_least"] == [0.75, 0.5, 0.25]


def test_decoding_path_follows_the_leading_hits():
    # anchors 0..7 of one answer; from 0: 2 hits -> 3 tokens, at 3: 0 -> 1, at 4: 1 -> 2, at 6: 0, at 7: 0 -> end
    lead = torch.tensor([2, 5, 5, 0, 1, 5, 0, 0])
    assert heldout.decoding_path(lead, torch.arange(8)) == [2, 0, 1, 0, 0]
    order = torch.tensor([4, 0, 6, 3, 7, 2, 5, 1])
    assert heldout.decoding_path(lead[order], order) == [2, 0, 1, 0, 0]  # rows in any order
    assert heldout.decoding_path(torch.zeros(4, dtype=torch.long), torch.arange(4)) == [0] * 4  # every step: bonus
    s = heldout.per_conversation(torch.cat([lead, torch.zeros(4, dtype=torch.long)]),
                                 torch.tensor([3] * 8 + [5] * 4), torch.cat([torch.arange(8), torch.arange(4)]), [3, 5])
    assert s["lead"].tolist() == [18, 0] and s["blocks"].tolist() == [8, 4]
    assert s["steps"].tolist() == [5, 4] and s["tokens"].tolist() == [8, 4]


def test_paired_interval_holds_a_shift_and_is_zero_for_equal_drafters():
    g = torch.Generator().manual_seed(0)
    num, den = torch.randint(0, 30, (20,), generator=g).float(), torch.full((20,), 10.0)
    assert heldout.paired_interval(num, den, num, den, draws=200) == (0.0, 0.0)
    lo, hi = heldout.paired_interval(num, den, num + 10, den, draws=200)  # one more hit per block everywhere
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
    lo, hi = heldout.paired_interval(num, den, num + torch.arange(20.0), den, draws=200)  # a spread-out gain
    assert 0 < lo < 0.95 < hi


def test_heldout_blocks_do_not_depend_on_the_training_seed(tmp_path):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_layers=6, seed=0)
    exs = [dict(e, sampled=i % 2 == 1) for i, e in enumerate(make_examples(80))]  # every other answer sampled
    a = Trainer(small_cfg(tmp_path / "a", seed=0, val_examples=8), target=target, examples=exs)
    a.export()
    b, c = (Trainer(small_cfg(tmp_path / n, seed=seed, val_examples=8, init_from=str(tmp_path / "a" / "out")),
                    target=target, examples=exs) for n, seed in (("b", 3), ("c", 5)))
    _, va, conv_a, off_a = a.heldout_hits(5)
    cb, vb, conv_b, off_b = b.heldout_hits(5)
    cc, _, _, _ = c.heldout_hits(5)
    assert torch.equal(va, vb) and torch.equal(conv_a, conv_b) and torch.equal(off_a, off_b)  # same blocks, labels
    answer_len = torch.tensor([len(e["input_ids"]) - e["prompt_len"] for e in a.val])
    assert bool((off_a >= 0).all() and (off_a < answer_len[conv_a]).all())  # anchors lie in the answer
    greedy = [j for j, e in enumerate(a.val) if not e.get("sampled")]
    assert 0 < len(greedy) < len(a.val) and conv_a.unique().tolist() == greedy  # sampled answers left out
    assert torch.equal(cb, cc)  # the same weights score the same, whatever the seed


def test_decoding_path_is_the_steps_of_real_decoding(tmp_path, monkeypatch):
    """On the target's own greedy answers the decoding path takes the speculative decoder's steps, answer by
    answer (fp32 drafts; only the last step may count differently, where the answer's end cuts it)."""
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_DTYPE", "model")
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_layers=6, seed=0)
    exs = []
    for e in make_examples(80):  # 8 held out
        prompt = e["input_ids"][:8].long()
        answer = plain_generate(target, prompt[None], 24).tokens
        exs.append({"id": e["id"], "input_ids": torch.cat([prompt, torch.tensor(answer)]).int(), "prompt_len": 8})
    trainer = Trainer(small_cfg(tmp_path, val_examples=8, max_steps=40, dtype="float32"), target=target, examples=exs)
    trainer.run()
    correct, _, conv, offset = trainer.heldout_hits(heldout.EVERY_POSITION)
    lead = heldout.lead_lengths(correct)
    trainer.drafter.eval()
    for c in conv.unique().tolist():
        x, p = trainer.val[c]["input_ids"].long(), trainer.val[c]["prompt_len"]
        out = speculative_generate(target, trainer.drafter, x[None, :p], len(x) - p, policy="always")
        assert out.tokens == x[p:].tolist()  # lossless: the stored answer again
        path = heldout.decoding_path(lead[conv == c], offset[conv == c])
        assert len(out.stats.accept_lens) == len(path) and out.stats.accept_lens[:-1] == path[:-1]
    assert int(lead.max()) >= 2  # drafts right in a row: the path skips anchors
