"""When to draft: speculation only where it is measured to pay.

A decode step either drafts (backbone + head, then verify ``[bonus, y_1 .. y_n]``) or is a plain step
(verify ``[bonus]`` alone: one token, and the drafter's context still grows). Which is faster depends on
the drafter's acceptance, the batch size and the machine, so the ``adaptive`` policy measures it: for each
batch-size bucket (1, 2-3, 4-7, 8-15, ...) it keeps an exponential moving average of the committed tokens
per second of both kinds of step, runs the faster kind, and every ``explore_every``-th step of a bucket
runs the other kind once so that its estimate follows the traffic. Both kinds commit exactly the
target's tokens, so the policy changes speed, never output.

    SGLANG_DOMINO_DRAFT_POLICY   adaptive (default) | always
    SGLANG_DOMINO_MAX_DRAFT_BATCH  N > 0: never draft for decode batches larger than N (0 = no cap)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

POLICY_ENV = "SGLANG_DOMINO_DRAFT_POLICY"
MAX_DRAFT_BATCH_ENV = "SGLANG_DOMINO_MAX_DRAFT_BATCH"
POLICIES = ("adaptive", "always")


class PolicyError(ValueError):
    pass


def policy_from_env() -> str:
    value = os.environ.get(POLICY_ENV, "").strip().lower() or "adaptive"
    if value not in POLICIES:
        raise PolicyError(f"{POLICY_ENV}={value!r}: expected one of {', '.join(POLICIES)}")
    return value


def max_draft_batch_from_env() -> int:
    raw = os.environ.get(MAX_DRAFT_BATCH_ENV, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError as e:
        raise PolicyError(f"{MAX_DRAFT_BATCH_ENV}={raw!r}: expected an integer (0 = no cap)") from e
    if value < 0:
        raise PolicyError(f"{MAX_DRAFT_BATCH_ENV}={value}: must be >= 0 (0 = no cap)")
    return value


def policy_env(policy: str | None = None, max_batch: int | None = None) -> dict[str, str]:
    """The environment that sets a server's draft policy (what launchers pass to the server process)."""
    env = {}
    if policy is not None:
        if policy not in POLICIES:
            raise PolicyError(f"draft policy {policy!r}: expected one of {', '.join(POLICIES)}")
        env[POLICY_ENV] = policy
    if max_batch is not None:
        env[MAX_DRAFT_BATCH_ENV] = str(max_batch)
    return env


@dataclass
class _Bucket:
    rate: dict = field(default_factory=lambda: {True: 0.0, False: 0.0})  # tokens/s EMA, by "drafted"
    count: dict = field(default_factory=lambda: {True: 0, False: 0})
    steps: int = 0


class DraftPolicy:
    def __init__(self, mode: str = "adaptive", max_batch: int = 0, warmup: int = 3, explore_every: int = 40,
                 alpha: float = 0.2):
        if mode not in POLICIES:
            raise PolicyError(f"draft policy {mode!r}: expected one of {', '.join(POLICIES)}")
        self.mode, self.max_batch = mode, max_batch
        self.warmup, self.explore_every, self.alpha = warmup, explore_every, alpha
        self.buckets: dict[int, _Bucket] = {}

    @classmethod
    def from_env(cls) -> "DraftPolicy":
        return cls(policy_from_env(), max_draft_batch_from_env())

    @staticmethod
    def bucket(batch_size: int) -> int:
        return max(1, batch_size).bit_length()  # 1 | 2-3 | 4-7 | 8-15 | ...

    def should_draft(self, batch_size: int) -> bool:
        if self.max_batch and batch_size > self.max_batch:
            return False
        if self.mode == "always":
            return True
        b = self.buckets.setdefault(self.bucket(batch_size), _Bucket())
        b.steps += 1
        for kind in (True, False):  # measure drafting first, then plain steps
            if b.count[kind] < self.warmup:
                return kind
        best = b.rate[True] >= b.rate[False]
        return (not best) if b.steps % self.explore_every == 0 else best

    def record(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        """One finished decode step: ``tokens`` committed over the batch in ``seconds``."""
        if self.mode == "always" or seconds <= 0:
            return
        b = self.buckets.setdefault(self.bucket(batch_size), _Bucket())
        rate = tokens / seconds
        n = b.count[drafted]
        # the first measurements are averaged plainly, later ones exponentially
        a = max(self.alpha, 1.0 / (n + 1))
        b.rate[drafted] = rate if n == 0 else (1 - a) * b.rate[drafted] + a * rate
        b.count[drafted] = n + 1

    def describe(self) -> str:
        if self.mode == "always":
            return f"always draft (batch cap {self.max_batch or 'none'})"
        parts = []
        for k in sorted(self.buckets):
            b = self.buckets[k]
            lo, hi = 1 << (k - 1), (1 << k) - 1
            parts.append(f"bs {lo}-{hi}: draft {b.rate[True]:.1f} vs plain {b.rate[False]:.1f} tok/s")
        return "adaptive; " + ("; ".join(parts) or "no steps yet")
