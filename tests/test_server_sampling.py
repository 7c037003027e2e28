"""The SGLang-convention target distribution used for lossless sampling in the server glue must be
exactly what SGLang's own plain sampler draws from (no server needed)."""

from __future__ import annotations

import pytest
import torch

from sglang_domino.sampling import sampling_probs
from sglang_domino.serving.sampling import draft_batch_sampling, sglang_probs

sampler = pytest.importorskip("sglang.srt.layers.sampler")


def _sglang_filtered(logits, temps, top_ks, top_ps, min_ps):
    probs = torch.softmax(logits / temps.view(-1, 1), -1)
    need_min_p = bool((min_ps > 0).any())
    _, probs_sort, probs_idx, _ = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        probs.clone(), top_ks.clone(), top_ps, min_ps, need_min_p, None, None, return_filtered_probs=True)
    dense = torch.zeros_like(probs).scatter_(-1, probs_idx.long(), probs_sort)
    return dense / dense.sum(-1, keepdim=True)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglang_probs_matches_sglang_sampler(seed):
    g = torch.Generator().manual_seed(seed)
    b, vocab = 6, 300
    logits = torch.randn(b, vocab, generator=g) * 3
    temps = torch.tensor([1.0, 0.7, 1.3, 1.0, 0.5, 2.0])
    top_ks = torch.tensor([1, 1 << 30, 20, 5, 1 << 30, 40], dtype=torch.int32)
    top_ps = torch.tensor([1.0, 0.9, 1.0, 0.5, 0.3, 0.95])
    min_ps = torch.tensor([0.0, 0.0, 0.1, 0.0, 0.0, 0.05])
    ours = sglang_probs(logits[:, None], temps, top_ks, top_ps, min_ps)[:, 0]
    ref = _sglang_filtered(logits, temps, top_ks, top_ps, min_ps)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(ours[0] > 0, torch.nn.functional.one_hot(logits[0].argmax(), vocab).bool())


def test_conventions_differ_from_hf_when_top_k_and_top_p_combine():
    """Documented difference: SGLang applies top-p to the unrenormalised sorted probabilities."""
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    sg = sglang_probs(logits[:, None], torch.tensor([1.0]), torch.tensor([2]), torch.tensor([0.5]))[0, 0]
    from sglang_domino.sampling import BatchSampling

    hf = sampling_probs(logits, BatchSampling(torch.tensor([1.0]), torch.tensor([2]), torch.tensor([0.5])))[0]
    assert (sg > 0).sum() == 2  # mass above token 2 is 0.4 <= 0.5: kept
    assert (hf > 0).sum() == 1  # HF renormalises top-2 (0.57, 0.43): token 2 dropped


def test_draft_sampling_maps_greedy_and_whole_vocab():
    class Info:
        temperatures = torch.tensor([[1.0], [0.7]])
        top_ks = torch.tensor([1, 1 << 30], dtype=torch.int32)
        top_ps = torch.tensor([1.0, 0.9])

    s = draft_batch_sampling(Info())
    assert s.temperature.tolist() == [0.0, pytest.approx(0.7)]
    assert s.top_k.tolist() == [0, 0]
