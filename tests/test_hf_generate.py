"""Transformers backend: speculative generation is lossless on tiny random targets.

Greedy: token-for-token equal to ``target.generate``. Sampling: a chi-square test on the first tokens'
distribution against the exact one computed from the target. The real-model checks are in
``test_smollm2.py``.
"""


import pytest
import torch
from scipy.stats import chisquare

from sglang_domino.hf import generate as gen
from sglang_domino.drafter import drafting_head
from sglang_domino.hf.generate import plain_generate, speculative_generate
from sglang_domino.kernels import dispatch
from sglang_domino.models import init_drafter, tiny_target
from sglang_domino.policy import DraftPolicy
from sglang_domino import sampling
from sglang_domino.sampling import BatchSampling, SamplingParams, sampling_probs

torch.set_num_threads(2)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def pair(request):
    target = tiny_target(request.param, vocab_size=64, hidden_size=64, num_layers=6)
    drafter = init_drafter(target.config, num_layers=1, num_context_layers=2, block_size=6,
                           gru_hidden_dim=32, emb_dim=16, init_std=0.2)
    return target, drafter


def _prompts(n, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab - 1, (1, int(torch.randint(3, 12, (1,), generator=g))), generator=g)
            for _ in range(n)]


def _hf_greedy(target, ids, max_new, eos=None):
    out = target.generate(ids, max_new_tokens=max_new, do_sample=False, eos_token_id=eos, pad_token_id=0,
                          attention_mask=torch.ones_like(ids))
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("use_head, block, policy", [(True, None, "always"), (False, None, "always"),
                                                    (True, 3, "always"), (True, None, "adaptive")])
def test_greedy_equals_hf_generate(pair, use_head, block, policy):
    target, drafter = pair
    shared = DraftPolicy("adaptive", widths=(1, 2, 4, 6))  # carried across prompts: all widths get measured
    widths = []
    for ids in _prompts(6):
        expected = _hf_greedy(target, ids, 24)
        out = speculative_generate(target, drafter, ids, 24, use_head=use_head, block_size=block,
                                   policy=shared if policy == "adaptive" else policy)
        assert out.tokens == expected
        assert out.tokens == plain_generate(target, ids, 24).tokens
        assert out.stats.new_tokens == 24 and out.stats.steps >= 24 // drafter.config.block_size
        assert len(out.stats.widths) == out.stats.steps
        widths += out.stats.widths
    if policy == "always":
        assert max(widths) == (block or drafter.config.block_size)  # narrower only where max_new_tokens cut it
    else:  # plain steps (width 1) and drafting steps mixed in one output
        assert 1 in widths and max(widths) > 1, widths


def test_gate_table_drafts_the_same(pair, monkeypatch):
    """SGLANG_DOMINO_GATE_TABLE=1: the head reads its GRU input gates from the table; the same drafts at
    every step as without it (fp32 drafts; only the summation order differs), so the same output."""
    target, drafter = pair
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_DTYPE", "model")
    built, real_rollout, drafts = [], dispatch.rollout, []
    monkeypatch.setattr(gen, "drafting_head", lambda *a: built.append(drafting_head(*a)) or built[-1])

    def recording_rollout(z, base, *args):
        tokens, q = real_rollout(z, base, *args)
        drafts.append((tokens.clone(), base.float().argmax(-1)))
        return tokens, q

    monkeypatch.setattr(dispatch, "rollout", recording_rollout)
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SGLANG_DOMINO_GATE_TABLE", flag)
        runs[flag] = [speculative_generate(target, drafter, ids, 24, policy="always") for ids in _prompts(4)]
    assert [h.gate_table is not None for h in built] == [False] * 4 + [True] * 4
    assert [r.tokens for r in runs["1"]] == [r.tokens for r in runs["0"]]
    off, on = drafts[:len(drafts) // 2], drafts[len(drafts) // 2:]
    assert len(on) == len(off) > 0 and all(torch.equal(a[0], b[0]) for a, b in zip(on, off))
    assert any(not torch.equal(tokens, base) for tokens, base in on)  # the head's correction moved drafts


def test_accepted_blocks_rollback_and_stop_tokens(pair, monkeypatch):
    """Draft the target's own greedy continuation, corrupted every third step: exercises every accept
    length, the KV rollback and the drafter context update (a controlled draft, not a stubbed target)."""
    target, drafter = pair
    real_verify, state = dispatch.verify_greedy, {}

    def oracle_rollout(z, base, bonus, embed, head, pure, sampling, noise):
        n, done = z.shape[1], state["done"]
        draft = (state["cont"][done:done + n] + [0] * n)[:n]
        state["calls"] += 1
        if state["calls"] % 3 == 0 and n > 1:
            k = state["calls"] % n
            draft[k] = (draft[k] + 1) % 64
        return torch.tensor([draft]), None

    def counting_verify(draft, logits):
        a, b = real_verify(draft, logits)
        state["done"] += int(a) + 1
        return a, b

    monkeypatch.setattr(gen.dispatch, "rollout", oracle_rollout)
    monkeypatch.setattr(gen.dispatch, "verify_greedy", counting_verify)
    last = drafter.config.block_size - 1
    for ids in _prompts(4, seed=1):
        cont = _hf_greedy(target, ids, 40)
        state.update(cont=cont, done=1, calls=0)
        out = speculative_generate(target, drafter, ids, 40, policy="always")
        assert out.tokens == cont
        assert max(out.stats.accept_lens) == last and min(out.stats.accept_lens) < last
        # A stop token inside an accepted block ends the output exactly where plain decoding does.
        stop = cont[17]
        state.update(done=1, calls=0)
        out = speculative_generate(target, drafter, ids, 40, stop_token_ids=[stop], policy="always")
        assert out.tokens == _hf_greedy(target, ids, 40, eos=stop)
        assert out.tokens[-1] == stop and stop not in out.tokens[:-1]


def _exact_prefix_distribution(target, ids, params, length):
    """P(first `length` new tokens) under plain sampling, by enumeration: dict tuple -> prob."""
    vocab = target.config.vocab_size
    batch = BatchSampling.of([params])
    dist = {(): 1.0}
    for _ in range(length):
        prefixes = list(dist)
        seqs = torch.cat([ids.expand(len(prefixes), -1), torch.tensor([list(p) for p in prefixes])
                          .reshape(len(prefixes), -1).long()], 1)
        with torch.no_grad():
            logits = target(seqs).logits[:, -1]
        probs = sampling_probs(logits, BatchSampling(batch.temperature.expand(len(prefixes)),
                                                     batch.top_k.expand(len(prefixes)),
                                                     batch.top_p.expand(len(prefixes))))
        dist = {p + (t,): dist[p] * float(probs[i, t]) for i, p in enumerate(prefixes)
                for t in range(vocab) if probs[i, t] > 0}
    return dist


@pytest.mark.parametrize("params,candidates,policy", [(SamplingParams(0.9, 0, 1.0), None, "always"),
                                                      (SamplingParams(1.0, 6, 0.8), None, "always"),
                                                      (SamplingParams(1.0, 6, 0.8), 3, "always"),
                                                      (SamplingParams(1.0, 6, 0.8), None, "adaptive")])
def test_sampling_is_lossless(params, candidates, policy, monkeypatch):
    """Chi-square on the joint distribution of the first 3 tokens (2 of which come from speculation).
    candidates=3: the draft q keeps only 3 tokens (``draft_probs``), narrower than the target's top-k 6 /
    top-p 0.8, so rejections must resample the rest from max(p - q, 0). adaptive: one draft policy across
    all samples, so plain (width-1) and drafting steps mix within and across outputs."""
    if candidates is not None:
        monkeypatch.setattr(sampling, "DRAFT_CANDIDATES", candidates)
    target = tiny_target("llama", vocab_size=16, hidden_size=32, num_layers=4, seed=3)
    with torch.no_grad():  # a peaky target, so that drafts are often accepted
        target.lm_head.weight.mul_(4)
    drafter = init_drafter(target.config, num_layers=1, num_context_layers=2, block_size=4,
                           gru_hidden_dim=16, emb_dim=8, init_std=0.3, seed=1)
    ids = torch.tensor([[3, 7, 1, 9]])
    exact = _exact_prefix_distribution(target, ids, params, 3)
    samples, accepted, widths = 2000, 0, []
    counts = dict.fromkeys(exact, 0)
    # widths 1 and 2 (3 new tokens leave room for one draft); exploring every 3rd step (odd: calls take 2 steps)
    shared = DraftPolicy("adaptive", widths=(1, 2), explore_every=3, max_explore_every=3)
    for seed in range(samples):
        out = speculative_generate(target, drafter, ids, 3, sampling=params, seed=seed,
                                   policy=shared if policy == "adaptive" else policy)
        counts[tuple(out.tokens)] += 1  # KeyError = a sequence plain sampling can never produce
        accepted += sum(out.stats.accept_lens)
        widths += out.stats.widths
    # speculation did its part (a 3-token q is often rejected, yet drafts must still be accepted)
    assert accepted > (samples // 10 if candidates is None and policy == "always" else samples // 40)
    if policy == "adaptive":
        assert widths.count(1) > samples // 10 and len(widths) - widths.count(1) > samples // 10
    # Pool rare outcomes so every expected count is >= 5.
    keys = sorted(exact, key=exact.get, reverse=True)
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for k in keys:
        if exact[k] * samples >= 5:
            obs.append(counts[k]), exp.append(exact[k] * samples)
        else:
            rest_o, rest_e = rest_o + counts[k], rest_e + exact[k] * samples
    obs.append(rest_o), exp.append(rest_e)
    exp = [e * samples / sum(exp) for e in exp]
    assert chisquare(obs, exp).pvalue > 1e-3


def test_plain_sampling_matches_exact_distribution():
    """The reference decoder itself samples the target's distribution (guards the test above)."""
    target = tiny_target("llama", vocab_size=16, hidden_size=32, num_layers=4, seed=3)
    ids, params = torch.tensor([[3, 7, 1, 9]]), SamplingParams(1.0, 6, 0.8)
    exact = _exact_prefix_distribution(target, ids, params, 1)
    counts = dict.fromkeys(exact, 0)
    for seed in range(2000):
        counts[tuple(plain_generate(target, ids, 1, params, seed=seed).tokens)] += 1
    keys = list(exact)
    total = sum(exact.values())
    assert chisquare([counts[k] for k in keys], [exact[k] / total * 2000 for k in keys]).pvalue > 1e-3
