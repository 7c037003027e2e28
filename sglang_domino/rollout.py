"""Domino rollout: turn one backbone pass into a causal draft chain (torch reference).

Given the backbone outputs ``z_0 .. z_{n-1}`` (n = B - 1 proposals; with ``shift_label`` proposal
``y_{i+1}`` uses ``z_i``) and their base logits ``lm_head(z_i)``:

    s = GRUCell(E[bonus], 0)
    for i in 0 .. n-1:
        logits_i = base_i                                   if i < pure_draft_prefix_len
                 = base_i + embed_proj([z_i ; s])           otherwise
        y_{i+1} = argmax(logits_i)    or    y_{i+1} ~ q_i = draft_probs(logits_i)
        s = GRUCell(E[y_{i+1}], s)

so the state that corrects proposal i has read ``[bonus, y_1 .. y_i]``. A GRU step's input gates
``E[y] @ w_ih^T`` may come from the head's gate table instead (``HeadWeights.with_gate_table``: the same
values, precomputed for every token). ``kernels/rollout.py`` fuses the same loop; this file is the
readable reference it is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .drafter import HeadWeights
from .linear import linear
from .sampling import BatchSampling, draft_probs, sample_from


def input_gates(head: HeadWeights, embed: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The GRU's input gates for tokens y [b]: E[y] @ w_ih^T in fp32 [b, 3G] (a row of the gate table
    when the head has one)."""
    if head.gate_table is not None:
        return head.gate_table[y]
    return linear(embed[y].float(), head.w_ih.float())


def gru_cell(gi: torch.Tensor, h: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """Bias-free GRU cell in PyTorch's gate order (r, z, n) from its input gates gi = x @ w_ih^T [b, 3G]:
    h [b, G] -> [b, G]."""
    gh = linear(h, w_hh)
    i_r, i_z, i_n = gi.chunk(3, -1)
    h_r, h_z, h_n = gh.chunk(3, -1)
    r, u = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - u) * n + u * h


def correction(z: torch.Tensor, s: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """embed_proj([z ; s]) = w2 @ SiLU(w1 @ [z ; s]): z [b, H], s [b, G] -> [b, V]."""
    return linear(F.silu(linear(torch.cat([z, s.to(z.dtype)], -1), w1)), w2)


def rollout(
    z: torch.Tensor,
    base_logits: torch.Tensor,
    bonus: torch.Tensor,
    embed: torch.Tensor,
    head: HeadWeights | None,
    pure_prefix_len: int = 1,
    sampling: BatchSampling | None = None,
    exponential: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw the draft chain.

    z: [b, n, H] backbone states z_0..z_{n-1}; base_logits: [b, n, V]; bonus: [b] anchor tokens;
    embed: [V, H] target embedding table; head: the Domino head (with or without its gate table), or
    None for backbone-only (DFlash).
    sampling: None for greedy proposals; else per-row parameters, and exponential: [b, n, V] Exp(1)
    noise for the draws.
    Returns (draft tokens [b, n] int64, draft probabilities q [b, n, V] float32 or None when greedy).
    """
    b, n, _ = z.shape
    tokens = torch.empty(b, n, dtype=torch.long, device=z.device)
    q = None if sampling is None else torch.empty(b, n, base_logits.shape[-1], dtype=torch.float32, device=z.device)
    s = None
    if head is not None:
        head = head._replace(w_ih=head.w_ih.float(), w_hh=head.w_hh.float())  # the GRU runs in fp32
        s = gru_cell(input_gates(head, embed, bonus), z.new_zeros(b, head.w_hh.shape[1], dtype=torch.float32),
                     head.w_hh)
    for i in range(n):
        logits = base_logits[:, i].float()
        if head is not None and i >= pure_prefix_len:
            logits = logits + correction(z[:, i], s, head.w1, head.w2).float()
        if sampling is None:
            y = logits.argmax(-1)
        else:
            q[:, i] = draft_probs(logits, sampling)
            y = sample_from(q[:, i], exponential[:, i])
        tokens[:, i] = y
        if head is not None and i + 1 < n:
            s = gru_cell(input_gates(head, embed, y), s, head.w_hh)
    return tokens, q
