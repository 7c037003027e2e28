"""Anchors and blocks.

A block anchored at position ``a`` of a sequence ``x`` is ``[x_a, MASK x (B-1)]`` at positions
``a .. a+B-1``; it sees the target features of positions ``< a`` only (``ctx_mask`` per row), never its
own future and never another block (every block is its own row). With ``shift_label`` the backbone
output ``z_i`` predicts ``x_{a+i+1}`` (i = 0 .. B-2) and the teacher-forced GRU state for that
prediction has read ``x_a .. x_{a+i}``.

A relabelled sequence (``relabel.py``) carries ``targets``: the target's greedy next token after each
position. Its labels are then ``targets[a] .. targets[a+B-2]``, kept while the sequence follows that chain
(``x_{a+j} == targets[a+j-1]`` for every earlier block position) and IGNORE after it first leaves it, so
every kept label is a token of the target's greedy continuation of ``x_0 .. x_a``.

Anchors are response positions ``prompt_len <= a <= len-2`` (at inference the first anchor is the
target's first response token, whose context is the prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


def sample_anchors(prompt_len: int, seq_len: int, num_anchors: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``num_anchors`` distinct anchors in ``[prompt_len, seq_len - 2]``, sorted."""
    lo, hi = prompt_len, seq_len - 2
    count = hi - lo + 1
    if count <= 0:
        return torch.empty(0, dtype=torch.long)
    if count <= num_anchors:
        return torch.arange(lo, hi + 1)
    picks = torch.randperm(count, generator=generator)[:num_anchors]
    return (picks + lo).sort().values


@dataclass
class BlockBatch:
    """Blocks as rows. R rows, block size B, context length T (the longest needed)."""

    row_seq: torch.Tensor  # [R] which sequence (index into the batch's feature list)
    anchors: torch.Tensor  # [R]
    block_ids: torch.Tensor  # [R, B] [x_a, MASK ...]
    positions: torch.Tensor  # [R, B] a .. a+B-1
    gru_ids: torch.Tensor  # [R, B-1] x_a .. x_{a+B-2} (teacher forcing; clipped at the sequence end)
    labels: torch.Tensor  # [R, B-1] x_{a+1} .. x_{a+B-1} or the target's chain; IGNORE past the end or the chain
    ctx_mask: torch.Tensor  # [R, T] position < anchor
    ctx_len: int

    def to(self, device) -> "BlockBatch":
        kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return BlockBatch(**kw)


def build_blocks(seqs: list[torch.Tensor], anchors: list[torch.Tensor], block_size: int, mask_token_id: int,
                 pad_token_id: int | None = None, targets: list[torch.Tensor | None] | None = None) -> BlockBatch:
    """seqs: 1-D token tensors; anchors: per sequence anchor positions; targets: per sequence the target's
    greedy next tokens (same length as the sequence), or None where the sequence is itself the target's output."""
    B = block_size
    pad = mask_token_id if pad_token_id is None else pad_token_id
    rows = [(j, int(a)) for j, anc in enumerate(anchors) for a in anc.tolist()]
    R = len(rows)
    row_seq = torch.tensor([j for j, _ in rows], dtype=torch.long)
    anc = torch.tensor([a for _, a in rows], dtype=torch.long)
    block_ids = torch.full((R, B), mask_token_id, dtype=torch.long)
    gru_ids = torch.full((R, B - 1), pad, dtype=torch.long)
    labels = torch.full((R, B - 1), IGNORE, dtype=torch.long)
    for r, (j, a) in enumerate(rows):
        x = seqs[j].long()
        n = x.numel()
        block_ids[r, 0] = x[a]
        k = min(B - 1, n - a - 1)  # labels available
        gru_ids[r, :k] = x[a:a + k]
        g = None if targets is None else targets[j]
        if g is None:
            labels[r, :k] = x[a + 1:a + 1 + k]
        else:
            g = g.long()
            follows = (x[a + 1:a + k] == g[a:a + k - 1]).long().cumprod(0)  # x_{a+1..a+j} on the chain
            k = 1 + int(follows.sum())
            labels[r, :k] = g[a:a + k]
    positions = anc[:, None] + torch.arange(B)[None]
    ctx_len = int(anc.max()) if R else 0
    ctx_mask = torch.arange(ctx_len)[None] < anc[:, None]
    return BlockBatch(row_seq, anc, block_ids, positions, gru_ids, labels, ctx_mask, ctx_len)
