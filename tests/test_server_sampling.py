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


def _penalized_reqs():
    from types import SimpleNamespace as NS

    tok = NS(additional_stop_token_ids={7}, eos_token_id=2)

    def req(freq=0.0, pres=0.0, rep=1.0, min_new=0, stop=None):
        params = NS(frequency_penalty=freq, presence_penalty=pres, repetition_penalty=rep, min_new_tokens=min_new,
                    stop_token_ids=stop)
        return NS(sampling_params=params, eos_token_ids={3}, tokenizer=tok, output_ids=[])

    return [req(freq=0.7), req(pres=1.3), req(rep=1.4), req(min_new=5, stop={11}),
            req(freq=0.3, pres=0.2, rep=1.2, min_new=6), req()]


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_penalties_are_sglang_penalizers_advanced_token_by_token(seed):
    """Position i of a verify chain gets exactly what SGLang's own penalizers (penaltylib) give once they have
    counted the outputs so far and the drafts y_1 .. y_i (the summed state that plain decoding applies)."""
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    from sglang_domino.serving.sampling import apply_chain_penalties, has_penalties

    class Batch:  # what the orchestrator reads of SGLang's ScheduleBatch
        device = "cpu"

        def __init__(self, reqs):
            self.reqs = reqs

    g = torch.Generator().manual_seed(seed)
    vocab, n_out, n = 40, 3, 4
    reqs = _penalized_reqs()
    b = len(reqs)
    outputs = torch.randint(0, 12, (b, n_out), generator=g)  # small ids: repeats and stop tokens
    drafts = torch.randint(0, 12, (b, n), generator=g)
    logits = torch.randn(b, n + 1, vocab, generator=g) * 3
    batch = Batch(reqs)
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(vocab, batch, {
        penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedMinNewTokensPenalizer,
        penaltylib.BatchedPresencePenalizer, penaltylib.BatchedRepetitionPenalizer})
    want = logits.clone()
    for t in range(n_out + n):
        if t >= n_out:  # chain position t - n_out: the state after the outputs and the drafts before it
            pos = want[:, t - n_out]
            additive = torch.zeros(b, vocab)
            orchestrator.accumulate_additive_penalties(additive)
            pos.add_(additive)
            apply_scaling_penalties(pos, orchestrator.accumulate_scaling_penalties())
        orchestrator.cumulate_output_tokens(outputs[:, t] if t < n_out else drafts[:, t - n_out])
    pos = want[:, n]
    additive = torch.zeros(b, vocab)
    orchestrator.accumulate_additive_penalties(additive)
    pos.add_(additive)
    apply_scaling_penalties(pos, orchestrator.accumulate_scaling_penalties())

    for r, ids in zip(reqs, outputs.tolist()):
        r.output_ids = ids
    got = logits.clone()
    assert has_penalties(reqs) and not has_penalties(reqs[-1:])
    apply_chain_penalties(got, reqs, drafts)
    assert torch.equal(got, want)
    assert not torch.equal(got, logits)
    # min_new_tokens = 5 holds the stop tokens (3 = EOS, 2, 7, 11) back for two chain positions, then lets go
    assert torch.isinf(got[3, :2, [2, 3, 7, 11]]).all() and torch.isfinite(got[3, 2:]).all()
