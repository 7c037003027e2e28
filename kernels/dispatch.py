"""Pick the Triton kernel or the torch reference, with the reference's signatures.

``rollout``, ``verify_greedy`` and ``verify_sampled`` take the same arguments and return the same results
as ``sglang_domino.rollout.rollout`` and ``sglang_domino.verify.*``. ``verify_greedy_commit`` /
``verify_sampled_commit`` also return what to commit (see ``kernels/verify.py``).

The choice, by the environment variable ``SGLANG_DOMINO_KERNELS``:
    auto (default)   Triton when the tensors are on CUDA and triton imports, else the reference
    torch            always the reference
    triton           always Triton (CPU tensors need Triton's interpreter: TRITON_INTERPRET=1 set before
                     triton is first imported)
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import NamedTuple

import torch

from sglang_domino import rollout as _rollout_ref
from sglang_domino import verify as _verify_ref

ENV = "SGLANG_DOMINO_KERNELS"


class Verdict(NamedTuple):
    """accept_len, bonus, commit_len: [b] int64; tokens: [b, n+1] int64 (accepted drafts, bonus, -1 ...).

    commit_len = accept_len + 1 positions of the verified chain [bonus_prev, y_1 .. y_n] keep their KV;
    a serving engine frees the rest. ``tokens[:, :commit_len]`` are the tokens this step emits."""

    accept_len: torch.Tensor
    bonus: torch.Tensor
    commit_len: torch.Tensor
    tokens: torch.Tensor


def commit_reference(draft: torch.Tensor, accept_len: torch.Tensor, bonus: torch.Tensor) -> Verdict:
    """Torch reference of the commit outputs. draft: [b, n]; accept_len, bonus: [b] int64."""
    b, n = draft.shape
    pos = torch.arange(n + 1, device=draft.device)[None, :]
    a = accept_len[:, None]
    padded = torch.cat([draft.long(), draft.new_full((b, 1), -1, dtype=torch.long)], 1)
    tokens = torch.where(pos < a, padded, torch.where(pos == a, bonus[:, None], torch.full_like(padded, -1)))
    return Verdict(accept_len, bonus, accept_len + 1, tokens)


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001  (any import failure means: no Triton)
        return False
    return True


def use_triton(t: torch.Tensor) -> bool:
    """Whether a call on tensor ``t`` goes to the Triton kernels."""
    mode = os.environ.get(ENV, "auto").strip().lower()
    if mode in ("torch", "reference", "ref", "0", "off"):
        return False
    if mode == "triton":
        return True
    if mode not in ("", "auto"):
        raise ValueError(f"{ENV}={mode!r}: expected auto, torch or triton")
    return t.is_cuda and _triton_available()


def _kernels(name: str):
    return importlib.import_module(f"sglang_domino.kernels.{name}")


def rollout(z, base_logits, bonus, embed, head, pure_prefix_len=1, sampling=None, exponential=None):
    """See ``sglang_domino.rollout.rollout``."""
    if use_triton(z):
        return _kernels("rollout").rollout(z, base_logits, bonus, embed, head, pure_prefix_len, sampling, exponential)
    return _rollout_ref.rollout(z, base_logits, bonus, embed, head, pure_prefix_len, sampling, exponential)


def verify_greedy(draft, target_logits):
    """See ``sglang_domino.verify.verify_greedy``."""
    impl = _kernels("verify").verify_greedy if use_triton(target_logits) else _verify_ref.verify_greedy
    return impl(draft, target_logits)


def verify_sampled(draft, q, p, uniform, exponential):
    """See ``sglang_domino.verify.verify_sampled``."""
    impl = _kernels("verify").verify_sampled if use_triton(p) else _verify_ref.verify_sampled
    return impl(draft, q, p, uniform, exponential)


def verify_greedy_commit(draft, target_logits):
    """verify_greedy plus commit_len [b] and the committed tokens [b, n+1] (a ``Verdict``)."""
    if use_triton(target_logits):
        return _kernels("verify").verify_greedy_commit(draft, target_logits)
    return commit_reference(draft, *_verify_ref.verify_greedy(draft, target_logits))


def verify_sampled_commit(draft, q, p, uniform, exponential):
    """verify_sampled plus commit_len [b] and the committed tokens [b, n+1] (a ``Verdict``)."""
    if use_triton(p):
        return _kernels("verify").verify_sampled_commit(draft, q, p, uniform, exponential)
    return commit_reference(draft, *_verify_ref.verify_sampled(draft, q, p, uniform, exponential))
