"""Base-anchored curriculum: the training forward and loss.

For a block anchored at ``a`` (see ``anchors.py``) and prediction index ``k = 0 .. B-2``:

    base_k  = lm_head(z_k)                                  (target's frozen lm_head)
    final_k = base_k                                        k <  pure_draft_prefix_len
            = base_k + embed_proj([z_k ; s_k])              otherwise, s_k = GRU(E[x_a] .. E[x_{a+k}])
    w_k     = exp(-k / gamma)
    CE_f    = sum_k w_k * ce(final_k, x_{a+k+1}) / sum_k w_k      (over valid labels of all rows)
    CE_b    = same with base_k
    loss    = (1 - lambda) * CE_f + lambda * CE_b

lambda decays linearly from 1 to 0 over ``decay_ratio`` of the total steps (``lambda_const`` fixes it;
``lambda_const = 1`` is plain DFlash training). The backbone first learns to draft on its own (base
anchored), then the head learns the causal correction on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..drafter import vocab_logits
from .anchors import IGNORE, BlockBatch

GAMMA_BY_BLOCK = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    """Published values for B = 16, 10, 8; otherwise about 0.45 B."""
    return GAMMA_BY_BLOCK.get(block_size, max(1.0, round(0.45 * block_size, 1)))


def position_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """[B-1] weights exp(-k / gamma), k = 0 .. B-2 (the first prediction has weight 1)."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32, device=device) / gamma)


def lambda_at(step: int, total_steps: int, decay_ratio: float, lambda_const: float | None = None) -> float:
    """Weight of the base-logit loss at optimizer step ``step`` (0-based)."""
    if lambda_const is not None:
        return float(lambda_const)
    decay_steps = decay_ratio * total_steps
    if decay_steps <= 0:
        return 0.0
    return max(0.0, 1.0 - step / decay_steps)


def lr_factor(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Linear warmup then cosine decay to ``min_ratio``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class Frozen:
    """The target's frozen tensors the drafter uses (not part of the drafter).

    ``vocab`` (optional, sorted token ids [V']) restricts the training loss to the tokens that occur in the
    training data: the softmax then runs over V' (plus ``negatives``) instead of V (SmolLM2 data: 12.3k of 49k
    tokens, about 2.5x cheaper steps on a CPU with 4096 negatives). Labels are mapped into it with
    ``to_loss_vocab``; evaluation uses the full vocabulary (``full()``). ``with_negatives`` appends a random sample of the other tokens for
    one step, so that their logits are pushed down too (without them nothing holds those logits down, and
    the full-vocabulary argmax drifts onto them).
    """

    embed: torch.Tensor  # [V, H]
    lm_head: torch.Tensor  # [V, H] (the rows of ``columns()`` when vocab is set)
    vocab: torch.Tensor | None = None  # [V'] int64, sorted
    full_lm_head: torch.Tensor | None = None  # [V, H] when vocab is set
    negatives: torch.Tensor | None = None  # [N] int64 token ids outside vocab, appended after it
    outside: torch.Tensor | None = None  # [V - V'] int64 token ids not in vocab (the pool negatives come from)

    @classmethod
    def from_target(cls, target, vocab: torch.Tensor | None = None) -> "Frozen":
        embed = target.get_input_embeddings().weight.detach()
        head = target.get_output_embeddings().weight.detach()
        if vocab is None:
            return cls(embed, head)
        vocab = vocab.to(head.device).long().sort().values
        mask = torch.ones(head.shape[0], dtype=torch.bool, device=head.device)
        mask[vocab] = False
        return cls(embed, head.index_select(0, vocab).contiguous(), vocab, head, outside=mask.nonzero()[:, 0])

    def full(self) -> "Frozen":
        return self if self.vocab is None else Frozen(self.embed, self.full_lm_head)

    def columns(self) -> torch.Tensor | None:
        """Token id of each logit column ([V' + N]), or None for the full vocabulary."""
        if self.vocab is None or self.negatives is None:
            return self.vocab
        return torch.cat([self.vocab, self.negatives])

    def with_negatives(self, n: int, generator: torch.Generator) -> "Frozen":
        """This loss vocabulary plus ``n`` tokens drawn uniformly from the rest (labels keep their positions)."""
        if self.vocab is None or n <= 0:
            return self
        draw = torch.randperm(len(self.outside), generator=generator)[:n].to(self.outside.device)
        picks = self.outside[draw].sort().values
        cols = torch.cat([self.vocab, picks])
        return Frozen(self.embed, self.full_lm_head.index_select(0, cols), self.vocab, self.full_lm_head, picks,
                      self.outside)

    def to_loss_vocab(self, labels: torch.Tensor) -> torch.Tensor:
        """Token ids [..] -> positions in ``vocab`` (IGNORE stays IGNORE). Every label must be in it."""
        if self.vocab is None:
            return labels
        valid = labels != IGNORE
        pos = torch.searchsorted(self.vocab, labels.clamp_min(0))
        if bool((self.vocab[pos.clamp_max(len(self.vocab) - 1)] != labels)[valid].any()):
            raise ValueError("a label is outside the loss vocabulary")
        return torch.where(valid, pos, labels)


def block_logits(drafter, frozen: Frozen, batch: BlockBatch, features: torch.Tensor, with_head: bool = True):
    """Teacher-forced forward.

    features: [S, T, K*H] context features of the S sequences (right-padded; T >= batch.ctx_len).
    Returns (base [R, B-1, V], final [R, B-1, V] or None when ``with_head`` is False); V is the loss
    vocabulary's size (``frozen.columns()``) when ``frozen.vocab`` is set.
    """
    cfg = drafter.config
    T = batch.ctx_len
    feats = features[:, :T].to(drafter.fc.weight.dtype)
    seq_pos = torch.arange(T, device=feats.device)[None].expand(features.shape[0], T)
    ctx = drafter.context_kv(feats, seq_pos)  # per layer ([S, kvh, T, d], ...)
    ctx = [(k.index_select(0, batch.row_seq), v.index_select(0, batch.row_seq)) for k, v in ctx]
    embeds = F.embedding(batch.block_ids, frozen.embed)
    z = drafter.backbone(embeds, batch.positions, ctx, batch.ctx_mask)  # [R, B, H]
    zp = z[:, :-1]  # z_k predicts x_{a+k+1}
    base = vocab_logits(zp, frozen.lm_head)
    if not with_head:
        return base, None
    s, _ = drafter.prefix_gru(F.embedding(batch.gru_ids, frozen.embed).to(zp.dtype))  # [R, B-1, G]
    hidden = drafter.embed_proj[1](drafter.embed_proj[0](torch.cat([zp, s.to(zp.dtype)], -1)))  # [R, B-1, E]
    w2 = drafter.embed_proj[2].weight
    cols = frozen.columns()
    corr = vocab_logits(hidden, w2 if cols is None else w2.index_select(0, cols))
    if cfg.pure_draft_prefix_len > 0:  # predictions k < pure_draft_prefix_len get no correction
        keep = torch.arange(zp.shape[1], device=zp.device) >= cfg.pure_draft_prefix_len
        corr = corr * keep[None, :, None].to(corr.dtype)  # a mask, not slices: no full-size zero tensors in backward
    return base, base + corr


def weighted_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                with_correct: bool = False):
    """sum(w_k * ce) / sum(w_k) over valid labels. logits [R, n, V]; labels [R, n]; weights [n].

    with_correct: also return the [R, n] bool top-1 hits (label logit is the maximum), computed on
    the float logits already made for the loss (cheaper than a separate argmax).
    """
    valid = labels != IGNORE
    lf = logits.float()
    target = labels.clamp_min(0)
    ce = F.cross_entropy(lf.flatten(0, 1), target.flatten(), reduction="none")
    w = weights[None, :].expand_as(labels) * valid
    loss = (ce.view_as(w) * w).sum() / w.sum().clamp_min(1e-12)
    if not with_correct:
        return loss
    with torch.no_grad():
        d = lf.detach()
        correct = (d.gather(-1, target[..., None])[..., 0] >= d.amax(-1)) & valid
    return loss, correct


def curriculum_loss(base: torch.Tensor, final: torch.Tensor | None, labels: torch.Tensor, weights: torch.Tensor,
                    lam: float) -> tuple[torch.Tensor, dict]:
    """(1 - lam) * CE(final) + lam * CE(base); terms with zero weight are not computed."""
    stats = {}
    loss = base.new_zeros((), dtype=torch.float32)
    if lam > 0 or final is None:
        ce_b, stats["correct_base"] = weighted_ce(base, labels, weights, with_correct=True)
        loss = loss + (lam if final is not None else 1.0) * ce_b
        stats["ce_base"] = float(ce_b.detach())
    if final is not None and lam < 1:
        ce_f, stats["correct_final"] = weighted_ce(final, labels, weights, with_correct=True)
        loss = loss + (1 - lam) * ce_f
        stats["ce_final"] = float(ce_f.detach())
    return loss, stats


def lead_lengths(correct: torch.Tensor) -> torch.Tensor:
    """[R, n] top-1 hits -> [R] number of leading hits (the drafts a greedy step accepts)."""
    return torch.cumprod(correct.long(), dim=1).sum(1)


@torch.no_grad()
def hit_metrics(correct: torch.Tensor, labels: torch.Tensor) -> dict:
    """``block_metrics`` from precomputed top-1 hits [R, n]."""
    valid = labels != IGNORE
    lead = lead_lengths(correct).float()
    return {"acc": float(correct.sum() / valid.sum().clamp_min(1)), "accept": float(1 + lead.mean()),
            "n_tok": int(valid.sum()), "n_rows": int(labels.shape[0])}


@torch.no_grad()
def block_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """Token accuracy and the teacher-forced acceptance length.

    ``accept`` = mean over rows of 1 + (number of leading correct predictions): for greedy data this is
    what greedy verification would commit per step (bonus token included), because along the accepted
    prefix the drafted tokens equal the true ones the GRU was fed.
    """
    return hit_metrics((logits.argmax(-1) == labels) & (labels != IGNORE), labels)
