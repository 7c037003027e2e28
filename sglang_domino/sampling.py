"""Per-request sampling parameters and the distribution they define over the vocabulary.

``sampling_probs`` applies temperature, then top-k, then top-p (nucleus) exactly as Hugging Face's
logits warpers do in ``generate(do_sample=True)``; temperature 0 means greedy (a one-hot at the argmax,
first index on ties, like ``torch.argmax``). The target's distribution p comes from here; the draft's q
(``draft_probs``) applies the same rule to a candidate set, which speculative sampling allows.

Randomness enters only through tensors the caller passes (``uniform`` and ``exponential`` noise), so a
torch reference and a Triton kernel given the same numbers draw the same tokens.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclasses.dataclass
class BatchSampling:
    """Sampling parameters of a batch as tensors of shape [b]."""

    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64
    top_p: torch.Tensor  # float32

    @classmethod
    def of(cls, params: list[SamplingParams], device="cpu") -> "BatchSampling":
        return cls(
            torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )


def _per_row(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape [b] to broadcast against [b, ..., V]."""
    return x.view(-1, *([1] * (like.dim() - 1)))


def sampling_probs(logits: torch.Tensor, params: BatchSampling) -> torch.Tensor:
    """logits: [b, ..., V] -> float32 probabilities [b, ..., V] (one-hot rows where temperature is 0)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    temp = _per_row(params.temperature, logits)
    greedy = temp == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temp), temp)

    # top-k: drop everything below the k-th largest value (ties at the k-th value are kept).
    k = _per_row(params.top_k, logits)
    if bool((params.top_k > 0).any()):
        sorted_desc = scaled.sort(dim=-1, descending=True).values
        kth = sorted_desc.gather(-1, (k.clamp(1, vocab) - 1).expand(*scaled.shape[:-1], 1))
        scaled = scaled.masked_fill((k > 0) & (scaled < kth), float("-inf"))

    # top-p: drop the low tail whose cumulative probability is <= 1 - top_p; keep at least one token.
    p = _per_row(params.top_p, logits)
    if bool((params.top_p < 1).any()):
        sorted_asc, idx = scaled.sort(dim=-1)
        cum = sorted_asc.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1 - p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        scaled = scaled.masked_fill((p < 1) & drop, float("-inf"))

    probs = scaled.softmax(-1)
    onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy, onehot, probs)


DRAFT_CANDIDATES = 128


def draft_probs(logits: torch.Tensor, params: BatchSampling, candidates: int | None = None) -> torch.Tensor:
    """The draft distribution q: the target's rule (``sampling_probs``) applied to the ``candidates``
    (default ``DRAFT_CANDIDATES``) largest logits only, for rows with top-k or top-p. logits [b, ..., V] -> float32 [b, ..., V].

    Speculative sampling is exact for any q (a draft y is kept with probability min(1, p(y)/q(y)), a
    rejection resamples from max(p - q, 0)), so q need not be the target's warped distribution: this one
    sorts ``candidates`` values instead of the whole vocabulary at every draft step and is close to it
    whenever the nucleus fits in the candidates. Greedy rows and rows with neither top-k nor top-p get
    exactly ``sampling_probs`` (no sort either way).
    """
    vocab = logits.shape[-1]
    candidates = DRAFT_CANDIDATES if candidates is None else candidates
    truncating = (params.temperature > 0) & ((params.top_k > 0) | (params.top_p < 1))
    if candidates >= vocab or not bool(truncating.any()):
        return sampling_probs(logits, params)
    plain = BatchSampling(params.temperature, torch.zeros_like(params.top_k), torch.ones_like(params.top_p))
    full = sampling_probs(logits, plain)
    values, index = logits.float().topk(candidates, dim=-1)
    restricted = torch.zeros_like(full).scatter_(-1, index, sampling_probs(values, params))
    return torch.where(_per_row(truncating, full), restricted, full)


def sample_from(probs: torch.Tensor, exponential: torch.Tensor) -> torch.Tensor:
    """Draw one token per row by the exponential race: argmax(probs / E), E ~ Exp(1).

    probs, exponential: [..., V] -> tokens [...] (int64). Exact for any distribution, one-hot included.
    """
    return (probs / exponential.clamp_min(1e-20)).argmax(-1)


def exponential_like(shape, generator: torch.Generator | None = None, device="cpu") -> torch.Tensor:
    return torch.empty(shape, device=device).exponential_(generator=generator)
