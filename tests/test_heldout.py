"""bench/heldout.py: the held-out blocks are the same for every run, and its statistics by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

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


def test_paired_interval_holds_a_shift_and_is_zero_for_equal_drafters():
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 3, (400,), generator=g)
    conv = torch.arange(400) // 20
    assert heldout.paired_interval(a, a, conv, draws=200) == (0.0, 0.0)
    lo, hi = heldout.paired_interval(a, a + 1, conv, draws=200)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)


def test_heldout_blocks_do_not_depend_on_the_training_seed(tmp_path):
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_layers=6, seed=0)
    exs = [dict(e, sampled=i % 2 == 1) for i, e in enumerate(make_examples(80))]  # every other answer sampled
    a = Trainer(small_cfg(tmp_path / "a", seed=0, val_examples=8), target=target, examples=exs)
    a.export()
    b, c = (Trainer(small_cfg(tmp_path / n, seed=seed, val_examples=8, init_from=str(tmp_path / "a" / "out")),
                    target=target, examples=exs) for n, seed in (("b", 3), ("c", 5)))
    _, va, conv_a = a.heldout_hits(5)
    cb, vb, conv_b = b.heldout_hits(5)
    cc, _, _ = c.heldout_hits(5)
    assert torch.equal(va, vb) and torch.equal(conv_a, conv_b)  # the same blocks and labels
    greedy = [j for j, e in enumerate(a.val) if not e.get("sampled")]
    assert 0 < len(greedy) < len(a.val) and conv_a.unique().tolist() == greedy  # sampled answers left out
    assert torch.equal(cb, cc)  # the same weights score the same, whatever the seed
