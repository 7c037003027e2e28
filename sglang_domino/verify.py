"""Tree-free chain verification (torch reference).

The target scores ``[bonus, y_1 .. y_n]`` in one pass, giving its distributions ``p_0 .. p_n``
(``p_i`` predicts the token after position i). A step commits ``accept_len`` drafts plus one token
from the target (the *bonus*), so ``accept_len + 1`` tokens.

Greedy: keep the longest prefix with ``y_{i+1} == argmax p_i``; the bonus is ``argmax p_accept_len``.

Sampling (Leviathan et al. / Chen et al.): accept ``y_{i+1}`` when ``u_i < p_i(y) / q_i(y)``; at the first
rejection draw the bonus from ``normalise(max(p_i - q_i, 0))``; when all n are accepted, from ``p_n``.
Each committed token is then distributed exactly as under plain sampling from p. Greedy rows are the
special case of one-hot p and q, so a batch may mix both.
"""

from __future__ import annotations

import torch

from .sampling import sample_from


def verify_greedy(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft: [b, n]; target_logits: [b, n+1, V]. Returns (accept_len [b], bonus [b]) as int64."""
    target = target_logits.argmax(-1)
    accept_len = (draft == target[:, :-1]).long().cumprod(-1).sum(-1)
    return accept_len, target.gather(1, accept_len[:, None]).squeeze(1)


def verify_sampled(
    draft: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    uniform: torch.Tensor,
    exponential: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless speculative sampling over a chain.

    draft: [b, n] proposals; q: [b, n, V] the distributions they were drawn from; p: [b, n+1, V] the
    target's (after temperature/top-k/top-p); uniform: [b, n] U[0,1); exponential: [b, V] Exp(1) noise
    for the bonus draw. Returns (accept_len [b], bonus [b]) as int64.
    """
    b, n = draft.shape
    p_y = p[:, :n].gather(-1, draft[..., None]).squeeze(-1)
    q_y = q.gather(-1, draft[..., None]).squeeze(-1)
    accept = uniform * q_y < p_y  # u < p/q without dividing by q
    accept_len = accept.long().cumprod(-1).sum(-1)

    rows = torch.arange(b, device=draft.device)
    p_stop = p[rows, accept_len]  # [b, V]
    q_stop = torch.cat([q, q.new_zeros(b, 1, q.shape[-1])], 1)[rows, accept_len]  # zeros where all accepted
    residual = (p_stop - q_stop).clamp_min(0)
    # A rejection has residual mass > 0 in exact arithmetic; fall back to p if rounding erased it.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_stop)
    return accept_len, sample_from(residual, exponential)
