"""Domino rollout: turn one backbone pass into a causal draft chain (torch reference).

Given the backbone outputs ``z_0 .. z_{n-1}`` (n = B - 1 proposals; with ``shift_label`` proposal
``y_{i+1}`` uses ``z_i``) and their base logits ``lm_head(z_i)``:

    s = GRUCell(E[bonus], 0)
    for i in 0 .. n-1:
        logits_i = base_i                                   if i < pure_draft_prefix_len
                 = base_i + embed_proj([z_i ; s])           otherwise
        y_{i+1} = argmax(logits_i)    or    y_{i+1} ~ q_i = draft_probs(logits_i)
        s = GRUCell(E[y_{i+1}], s)

so the state that corrects proposal i has read ``[bonus, y_1 .. y_i]``. ``kernels/rollout.py`` fuses the
same loop; this file is the readable reference it is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .drafter import HeadWeights
from .sampling import BatchSampling, draft_probs, sample_from


def gru_cell(x: torch.Tensor, h: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """Bias-free GRU cell in PyTorch's gate order (r, z, n). x: [b, H], h: [b, G] -> [b, G]."""
    gi, gh = x @ w_ih.t(), h @ w_hh.t()
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - u) * n + u * h


def correction_hidden(z: torch.Tensor, s: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """SiLU(embed_proj.0([z ; s])): z [b, H], s [b, G] -> [b, E]."""
    return F.silu(torch.cat([z, s.to(z.dtype)], -1) @ w1.t())


def correction(z: torch.Tensor, s: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """embed_proj([z ; s]): z [b, H], s [b, G] -> [b, V]."""
    return correction_hidden(z, s, w1) @ w2.t()


_ROW_NORMS: dict = {}


def row_norms(w: torch.Tensor) -> torch.Tensor:
    """Row norms [V] of w [V, E], float32, cached while w is unchanged (one entry)."""
    key = (w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device)
    if key not in _ROW_NORMS:
        _ROW_NORMS.clear()
        _ROW_NORMS[key] = w.detach().float().norm(dim=-1)
    return _ROW_NORMS[key]


def pooled_argmax(base: torch.Tensor, h: torch.Tensor, w2: torch.Tensor, w2_norm: torch.Tensor,
                  pool_size: int) -> torch.Tensor:
    """argmax(base + h @ w2.T) over the full vocabulary, computing the correction for a pool only.

    base: [b, V] float32; h: [b, E]; w2: [V, E]; w2_norm: [V] row norms of w2. By Cauchy-Schwarz
    ``base_j + ||w2_j|| ||h||`` bounds every token's score; the pool is the ``pool_size`` tokens with the
    largest bound, and when the best exact score in the pool beats the largest bound outside it, it is the
    full-vocabulary argmax. Rows where it does not are computed in full, so the result is always exact.
    Returns tokens [b] int64 (the smallest index on ties, like torch.argmax).
    """
    vocab = base.shape[-1]
    if pool_size <= 0 or pool_size >= vocab:
        return (base + (h @ w2.t()).float()).argmax(-1)
    bound = base + w2_norm.float() * h.float().norm(dim=-1, keepdim=True)
    top = bound.topk(pool_size + 1, dim=-1)
    pool, outside = top.indices[:, :pool_size], top.values[:, pool_size]
    scores = base.gather(-1, pool) + torch.einsum("bke,be->bk", w2[pool], h).float()
    best = scores.max(-1, keepdim=True).values
    tokens = torch.where(scores == best, pool, vocab).min(-1).values
    inexact = (best.squeeze(-1) <= outside + 1e-3 * (1 + outside.abs())).nonzero().squeeze(-1)
    if inexact.numel():
        tokens[inexact] = (base[inexact] + (h[inexact] @ w2.t()).float()).argmax(-1)
    return tokens


def rollout(
    z: torch.Tensor,
    base_logits: torch.Tensor,
    bonus: torch.Tensor,
    embed: torch.Tensor,
    head: HeadWeights | None,
    pure_prefix_len: int = 1,
    sampling: BatchSampling | None = None,
    exponential: torch.Tensor | None = None,
    pool_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw the draft chain.

    z: [b, n, H] backbone states z_0..z_{n-1}; base_logits: [b, n, V]; bonus: [b] anchor tokens;
    embed: [V, H] target embedding table; head: the Domino head, or None for backbone-only (DFlash).
    sampling: None for greedy proposals; else per-row parameters, and exponential: [b, n, V] Exp(1)
    noise for the draws. pool_size > 0: greedy proposals compute the correction over an exact candidate
    pool (``pooled_argmax``), which reads far less of ``w2`` per step and picks the same tokens.
    Returns (draft tokens [b, n] int64, draft probabilities q [b, n, V] float32 or None when greedy).
    """
    b, n, _ = z.shape
    tokens = torch.empty(b, n, dtype=torch.long, device=z.device)
    q = None if sampling is None else torch.empty(b, n, base_logits.shape[-1], dtype=torch.float32, device=z.device)
    s = None
    if head is not None:
        w_ih, w_hh = head.w_ih.float(), head.w_hh.float()
        w2_norm = row_norms(head.w2) if pool_size and sampling is None else None
        s = gru_cell(embed[bonus].float(), z.new_zeros(b, w_hh.shape[1], dtype=torch.float32), w_ih, w_hh)
    for i in range(n):
        logits = base_logits[:, i].float()
        corrected = head is not None and i >= pure_prefix_len
        if corrected and w2_norm is not None:
            y = pooled_argmax(logits, correction_hidden(z[:, i], s, head.w1), head.w2, w2_norm, pool_size)
        else:
            if corrected:
                logits = logits + correction(z[:, i], s, head.w1, head.w2).float()
            if sampling is None:
                y = logits.argmax(-1)
            else:
                q[:, i] = draft_probs(logits, sampling)
                y = sample_from(q[:, i], exponential[:, i])
        tokens[:, i] = y
        if head is not None and i + 1 < n:
            s = gru_cell(embed[y].float(), s, w_ih, w_hh)
    return tokens, q
