"""Sampling distributions with SGLang's conventions (for lossless speculative sampling in SGLang).

SGLang's plain sampler (``sglang/srt/layers/sampler.py``, pytorch backend,
``top_k_top_p_min_p_sampling_from_probs_torch``) draws from a distribution that differs from the
Hugging Face logits warpers that ``sglang_domino.sampling.sampling_probs`` follows:

* probabilities are ``softmax(logits / T)`` first; top-k and top-p then act on the *same* sorted
  probabilities: a token is dropped when its rank is >= top_k, or when the probability mass of the
  tokens ranked above it is > top_p (HF applies top-p to the renormalised top-k distribution and
  drops at mass >= top_p);
* min-p drops tokens below ``min_p x`` the top probability;
* greedy requests arrive as top_k = 1 (temperature 1), top_k = -1 as 1 << 30 ("whole vocabulary").

To stay lossless, speculative verification must accept against exactly that distribution, so the
target side uses ``sglang_probs`` below. The draft side may use any distribution it actually sampled
from (``sglang_domino.rollout`` uses HF semantics via ``draft_batch_sampling``). The logit rules that change
with every token (penalties, grammars) are in ``serving.rules``.
"""

from __future__ import annotations

import torch

from ..sampling import BatchSampling


def sglang_probs(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor,
                 top_ps: torch.Tensor, min_ps: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [b, n, V]; per-row (length b) parameters as in SGLang's SamplingBatchInfo.
    Returns float32 probabilities [b, n, V] of SGLang's plain sampler."""
    b, n, vocab = logits.shape
    scaled = logits.float() / temperatures.float().view(b, 1, 1)
    probs = scaled.softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass ranked strictly above each token
    rank = torch.arange(vocab, device=logits.device)
    keep = (rank.view(1, 1, -1) < top_ks.long().clamp(1, vocab).view(b, 1, 1)).expand(b, n, vocab)
    keep = keep & ~(before > top_ps.float().view(b, 1, 1))
    if min_ps is not None and bool((min_ps > 0).any()):
        keep = keep & (sorted_p >= sorted_p[..., :1] * min_ps.float().view(b, 1, 1))
    keep[..., 0] = True  # the top token always survives (as in SGLang)
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, kept)


def draft_batch_sampling(sampling_info) -> BatchSampling:
    """Per-request draft parameters for the core rollout (HF semantics): greedy (top_k = 1) rows
    become temperature 0; SGLang's "whole vocabulary" top_k becomes 0 (off)."""
    top_ks = sampling_info.top_ks.long().view(-1)
    temps = sampling_info.temperatures.float().view(-1)
    greedy = top_ks <= 1
    vocab_all = top_ks >= (1 << 30)
    return BatchSampling(
        temperature=torch.where(greedy, torch.zeros_like(temps), temps),
        top_k=torch.where(greedy | vocab_all, torch.zeros_like(top_ks), top_ks),
        top_p=sampling_info.top_ps.float().view(-1).clamp(1e-6, 1.0),
    )
