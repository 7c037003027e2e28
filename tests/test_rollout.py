"""The rollout against a naive re-implementation of the published math, and sampling semantics."""

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sglang_domino.config import DominoConfig
from sglang_domino.drafter import GATE_TABLE_ENV, DominoDrafter, drafting_head
from sglang_domino.rollout import rollout
from sglang_domino.sampling import (BatchSampling, SamplingParams, draft_probs, exponential_like, sample_from,
                                    sampling_probs)

torch.set_num_threads(2)


def _drafter(vocab=50, hidden=32, gru=24, emb=16, seed=0):
    cfg = DominoConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=8, intermediate_size=64, vocab_size=vocab, block_size=8, gru_hidden_dim=gru,
                       emb_dim=emb)
    torch.manual_seed(seed)
    model = DominoDrafter(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model


def naive_rollout(model, z, base, bonus, embed, pure_prefix_len, choose):
    """Published math, one request at a time; the GRU re-reads the whole prefix with nn.GRU each step."""
    out = []
    for r in range(z.shape[0]):
        prefix, tokens = [int(bonus[r])], []
        for i in range(z.shape[1]):
            logits = base[r, i].float()
            if i >= pure_prefix_len:
                _, s = model.prefix_gru(embed[torch.tensor(prefix)][None])  # zero initial state
                logits = logits + model.embed_proj(torch.cat([z[r, i], s[0, 0]]))
            y = choose(r, i, logits)
            tokens.append(y)
            prefix.append(y)
        out.append(tokens)
    return torch.tensor(out)


@pytest.mark.parametrize("gate_table", [False, True])
@pytest.mark.parametrize("batch, n, pure", [(1, 1, 1), (3, 7, 1), (4, 5, 2), (2, 15, 1)])
def test_greedy_rollout_matches_naive(batch, n, pure, gate_table):
    model = _drafter()
    torch.manual_seed(1)
    embed = torch.randn(50, 32)
    z, base, bonus = torch.randn(batch, n, 32), torch.randn(batch, n, 50) * 0.5, torch.randint(0, 50, (batch,))
    with torch.no_grad():
        head = model.head_weights()
        if gate_table:
            head = head.with_gate_table(embed, rows=7)  # built in ragged chunks
        tokens, q = rollout(z, base, bonus, embed, head, pure)
        expected = naive_rollout(model, z, base, bonus, embed, pure, lambda r, i, lg: int(lg.argmax()))
    assert q is None
    assert torch.equal(tokens, expected)
    # The head changes the chain (otherwise this test would not test it).
    assert not torch.equal(tokens, base.argmax(-1)) or n <= pure


def test_backbone_only_rollout_is_argmax_of_base():
    torch.manual_seed(2)
    base = torch.randn(3, 6, 50)
    tokens, _ = rollout(torch.randn(3, 6, 32), base, torch.zeros(3, dtype=torch.long), torch.randn(50, 32), None)
    assert torch.equal(tokens, base.argmax(-1))


def test_sampled_rollout_matches_naive_and_returns_q():
    model = _drafter()
    torch.manual_seed(3)
    b, n = 4, 6
    embed, z, base = torch.randn(50, 32), torch.randn(b, n, 32), torch.randn(b, n, 50)
    bonus = torch.randint(0, 50, (b,))
    params = [SamplingParams(0.7, 10, 0.9), SamplingParams(1.3), SamplingParams(0.0), SamplingParams(1.0, 0, 0.5)]
    sampling = BatchSampling.of(params)
    noise = exponential_like((b, n, 50), torch.Generator().manual_seed(0))
    qs = torch.zeros(b, n, 50)

    def choose(r, i, logits):
        qs[r, i] = draft_probs(logits[None], BatchSampling.of([params[r]]))[0]
        return int(sample_from(qs[r, i], noise[r, i]))

    with torch.no_grad():
        tokens, q = rollout(z, base, bonus, embed, model.head_weights(), 1, sampling, noise)
        expected = naive_rollout(model, z, base, bonus, embed, 1, choose)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(q, qs)
    assert torch.equal(tokens[2], q[2].argmax(-1))  # the greedy row is deterministic


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.2, 0, 0.8),
                                                        (0.5, 8, 0.6), (2.0, 1, 1.0), (1.0, 0, 0.01)])
def test_sampling_probs_equal_hf_warpers(temperature, top_k, top_p):
    torch.manual_seed(4)
    logits = torch.randn(5, 40) * 3
    logits[0, :4] = 2.5  # ties at the top-k boundary
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    ours = sampling_probs(logits, BatchSampling.of([SamplingParams(temperature, top_k, top_p)] * 5))
    torch.testing.assert_close(ours, scores.softmax(-1))


def test_exponential_race_samples_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    noise = exponential_like((200_000, 5), torch.Generator().manual_seed(5))
    freq = torch.bincount(sample_from(probs.expand(200_000, 5), noise), minlength=5) / 200_000
    torch.testing.assert_close(freq, probs, atol=4e-3, rtol=0)


def test_bad_sampling_params_rejected():
    for kwargs in ({"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


def test_draft_probs_restricts_truncating_rows_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 300, generator=g) * 3
    params = BatchSampling.of([SamplingParams(0.0), SamplingParams(0.8), SamplingParams(0.8, 50, 1.0),
                               SamplingParams(1.0, 0, 0.9)])
    q, p = draft_probs(logits, params, candidates=20), sampling_probs(logits, params)
    assert torch.equal(q[:2], p[:2])  # greedy and temperature-only rows: exactly the target's rule
    top = logits[2:].topk(20, dim=-1).indices
    assert torch.allclose(q[2:].sum(-1), torch.ones(2, 3))
    outside = torch.ones_like(q[2:], dtype=torch.bool).scatter_(-1, top, False)
    assert bool((q[2:][outside] == 0).all())  # support within the candidates
    # where the target's nucleus fits in the candidates, q is the target's distribution
    peaked = logits.clone()
    peaked[..., :5] += 30
    torch.testing.assert_close(draft_probs(peaked, params, candidates=20), sampling_probs(peaked, params))


def test_gate_table_and_its_switch(monkeypatch):
    """Every token's input gates E[v] @ w_ih^T, built in chunks; ``drafting_head`` adds the table only when
    SGLANG_DOMINO_GATE_TABLE=1, and refuses other values."""
    model = _drafter()
    embed = torch.randn(50, 32)
    head = model.head_weights().with_gate_table(embed, rows=16)
    assert head.gate_table.shape == (50, 72) and head.gate_table.dtype == torch.float32
    torch.testing.assert_close(head.gate_table, embed @ model.prefix_gru.weight_ih_l0.detach().t())
    monkeypatch.delenv(GATE_TABLE_ENV, raising=False)
    assert drafting_head(model, embed, torch.float32).gate_table is None
    monkeypatch.setenv(GATE_TABLE_ENV, "1")
    torch.testing.assert_close(drafting_head(model, embed, torch.bfloat16).gate_table, head.gate_table)
    monkeypatch.setenv(GATE_TABLE_ENV, "yes")
    with pytest.raises(ValueError, match=GATE_TABLE_ENV):
        drafting_head(model, embed, torch.float32)
