"""How much to draft: speculation only where, and as far as, it is measured to pay.

A decode step verifies ``[bonus, y_1 .. y_{w-1}]``: its *width* ``w`` is 1 for a plain step (no drafting; the
drafter's context still grows) and up to the drafter's block size. Wider steps can commit more tokens but cost
more (the head's rollout and the target's verify grow with ``w``, and on a CPU or at a large batch the verify is
compute-bound), so the best width depends on the drafter's acceptance, the batch size and the machine. The
``adaptive`` policy measures it: for each batch-size bucket (every size below 16, then 16-17, 18-19, ..., 30-31,
32-35, ...: at most 1/8 wide, because tokens/s grows with the batch size and widths measured at different sizes
must not be compared) it rates each candidate width by its committed tokens per step over its seconds per step.
The seconds are a moving average of the width's own steps (``alpha``: they follow the machine quickly). The
tokens come from the chain's acceptance: for each draft position k, the share of rows whose k-th draft was
accepted among those whose k-th draft was verified, so every drafting step, whatever its width, rates every
narrower width as if it had run (a row commits ``min(commit, v)`` at width v) and the wider ones through the
positions they share; a position never verified takes the last verified one's share. These shares average over
rows and steps, a step's weight decaying by ``tokens_alpha`` (3%) per step of the bucket, so that they follow the
traffic (one request the drafter follows badly, the next well), yet the past never weighs less than
``min_weight`` (4) steps: one step's outcome is all or nothing, and runs of rejections come in stretches of hard
text. Widths are measured narrowest first (``warmup`` steps each, their seconds rated by the median, so that the
one-off costs of a process's first step at a new shape do not count), stopping at the first width slower than a
narrower one; a width rated ``give_up`` (25%) below the fastest after ``give_up_after`` steps ends its warm-up
there, since a losing width's steps are what the warm-up costs. The policy runs the fastest (a wider width must
beat every narrower one by ``margin``, 3%: where widths rate alike, within the noise of a step's timing, the
narrower and cheaper one runs, plain steps at worst) and keeps it until another beats it by the margin, since a
change of width costs a step (on a 2-core CPU ~10 ms: the drafter's weights back in cache, the context rows
queued by plain steps); so that this cost does not count against a width, the first step after a change updates
the yields only. Now and then the policy probes a neighbour of the width it runs (the next narrower or wider
candidate, in turn; ``probe_steps`` = 2 steps, the second timed) so that the estimates follow the traffic: every
``explore_every`` steps while the neighbour rates within ``give_up`` of the fastest (a close call, cheap to
probe: plain steps where drafting just stopped paying), else at intervals that double while the fastest stays the
same (up to ``max_explore_every``), so a bucket where one width clearly wins spends almost nothing on
exploration. Every width commits exactly the target's tokens, so the policy changes speed, never output. The
SGLang worker keeps one policy per server; the Transformers backend one per ``speculative_generate`` call unless
the caller passes one in to carry what it measured to the next call.

    SGLANG_DOMINO_DRAFT_POLICY     adaptive (default) | always (the widest candidate at every step)
    SGLANG_DOMINO_DRAFT_WIDTHS     candidate widths, e.g. "1,4,16" (default: 1, 2, 4, 8 and the full width)
    SGLANG_DOMINO_MAX_DRAFT_BATCH  N > 0: never draft for decode batches larger than N; 0: no cap
                                   (default: 8 on a CPU, where the sweeps found drafting at batch 16 slower
                                   than plain steps; no cap on a GPU)
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

POLICY_ENV = "SGLANG_DOMINO_DRAFT_POLICY"
MAX_DRAFT_BATCH_ENV = "SGLANG_DOMINO_MAX_DRAFT_BATCH"
WIDTHS_ENV = "SGLANG_DOMINO_DRAFT_WIDTHS"
DEFAULT_WIDTHS = (1, 2, 4, 8)  # plus the full width; 2 is the cheapest probe of whether drafting pays
POLICIES = ("adaptive", "always")
CPU_MAX_DRAFT_BATCH = 8  # README, Benchmarks: on the 2-core CPU, drafting at batch 16 lost to plain steps


class PolicyError(ValueError):
    pass


def _check_mode(value: str, label: str) -> str:
    """``value`` if it names a policy; else PolicyError starting with ``label`` (where the value came from)."""
    if value not in POLICIES:
        raise PolicyError(f"{label}: expected one of {', '.join(POLICIES)}")
    return value


def policy_from_env() -> str:
    value = os.environ.get(POLICY_ENV, "").strip().lower() or "adaptive"
    return _check_mode(value, f"{POLICY_ENV}={value!r}")


def max_draft_batch_from_env(default: int = 0) -> int:
    """The batch cap set by ``MAX_DRAFT_BATCH_ENV``, else ``default`` (0 = no cap)."""
    raw = os.environ.get(MAX_DRAFT_BATCH_ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as e:
        raise PolicyError(f"{MAX_DRAFT_BATCH_ENV}={raw!r}: expected an integer (0 = no cap)") from e
    if value < 0:
        raise PolicyError(f"{MAX_DRAFT_BATCH_ENV}={value}: must be >= 0 (0 = no cap)")
    return value


def widths_from_env(full_width: int) -> tuple[int, ...]:
    """Candidate verify widths for a drafter whose full width (bonus + drafts) is ``full_width``."""
    raw = os.environ.get(WIDTHS_ENV, "").strip()
    if not raw:
        return tuple(sorted({w for w in DEFAULT_WIDTHS if w < full_width} | {full_width}))
    try:
        widths = sorted({int(w) for w in raw.split(",") if w.strip()})
    except ValueError as e:
        raise PolicyError(f"{WIDTHS_ENV}={raw!r}: expected comma-separated integers, e.g. 1,4,{full_width}") from e
    if not widths or widths[0] < 1 or widths[-1] > full_width:
        raise PolicyError(f"{WIDTHS_ENV}={raw!r}: widths must be in [1, {full_width}] (1 = plain step; "
                          f"{full_width} = bonus + all drafts of this server's --speculative-num-draft-tokens)")
    return tuple(widths)


def policy_env(policy: str | None = None, max_batch: int | None = None,
               widths: list[int] | None = None) -> dict[str, str]:
    """The environment that sets a server's draft policy (what launchers pass to the server process)."""
    env = {}
    if widths:
        env[WIDTHS_ENV] = ",".join(str(w) for w in widths)
    if policy is not None:
        env[POLICY_ENV] = _check_mode(policy, f"draft policy {policy!r}")
    if max_batch is not None:
        env[MAX_DRAFT_BATCH_ENV] = str(max_batch)
    return env


@dataclass
class _Average:
    """A weighted mean whose samples' weights decay by ``keep`` per step of the bucket since they were taken;
    the past never weighs less than ``floor`` samples (or all of them, while fewer were taken)."""
    mean: float = 0.0
    weight: float = 0.0
    n: int = 0
    step: int = 0  # the bucket's step count at the last sample

    def add(self, total: float, count: int, step: int, keep: float, floor: float) -> None:
        """``count`` samples summing to ``total``, taken at ``step``."""
        if count:
            self.weight = max(self.weight * keep ** (step - self.step), min(self.n, floor)) + count
            self.mean += (total - count * self.mean) / self.weight
            self.n, self.step = self.n + count, step


@dataclass
class _Bucket:
    accept: dict = field(default_factory=dict)  # k -> _Average: P(draft k accepted | drafts 1..k-1 were)
    rows: _Average = field(default_factory=_Average)  # rows per step
    seconds: dict = field(default_factory=dict)  # width -> seconds per step (warm-up median, then moving average)
    count: dict = field(default_factory=dict)  # width -> steps measured
    warm: dict = field(default_factory=dict)  # width -> seconds of its warm-up steps (rated by their median)
    steps: int = 0
    current: int = 0  # the width the policy runs (0: none yet)
    last: int = 0  # the width of the last step recorded
    probe: tuple = (0, 0)  # (width, steps left) of an exploration in progress
    explored: int = 0
    interval: int = 0  # steps between explorations (doubles while the fastest stays and its probe loses clearly)
    next_explore: int = 0
    last_best: int = 0
    shown: int = 0  # the fastest width when this bucket was last reported (0: never)

    def tokens(self, width: int) -> float:
        """Expected tokens a row commits in a step of ``width``: 1 + sum over k < width of P(drafts 1..k all
        accepted). A position never verified yet takes the acceptance of the last one that was."""
        tokens, chain, accept = 1.0, 1.0, 0.0
        for k in range(1, width):
            if k in self.accept:
                accept = self.accept[k].mean
            chain *= accept
            tokens += chain
        return tokens

    @property
    def rate(self) -> dict:
        """width -> committed tokens/s (rows x tokens per row / seconds per step)."""
        return {w: self.rows.mean * self.tokens(w) / self.seconds[w] for w in self.seconds}


class DraftPolicy:
    """``width(batch_size)`` before a decode step, ``record(...)`` after it."""

    def __init__(self, mode: str = "adaptive", max_batch: int = 0, widths: tuple[int, ...] = (1, 16),
                 warmup: int = 8, explore_every: int = 40, max_explore_every: int = 320, alpha: float = 0.2,
                 tokens_alpha: float = 0.03, min_weight: float = 4.0, margin: float = 0.03, give_up: float = 0.25,
                 give_up_after: int = 3, probe_steps: int = 2):
        self.mode, self.max_batch = _check_mode(mode, f"draft policy {mode!r}"), max_batch
        self.margin, self.give_up, self.give_up_after, self.probe_steps = margin, give_up, give_up_after, probe_steps
        self.widths = tuple(sorted(set(widths)))
        self.full = self.widths[-1]
        self.warmup, self.alpha, self.tokens_alpha, self.min_weight = warmup, alpha, tokens_alpha, min_weight
        self.explore_every, self.max_explore_every = explore_every, max(explore_every, max_explore_every)
        self.buckets: dict[int, _Bucket] = {}
        self._news = False

    @classmethod
    def from_env(cls, full_width: int, default_max_batch: int = 0, mode: str | None = None) -> "DraftPolicy":
        """The policy the environment sets (``mode``, when given, overrides ``SGLANG_DOMINO_DRAFT_POLICY``)."""
        mode = policy_from_env() if mode is None else mode
        return cls(mode, max_draft_batch_from_env(default_max_batch), widths_from_env(full_width))

    @staticmethod
    def _bucket_width(batch_size: int) -> int:
        """1 below 16, else the power of two that leaves 4 significant bits (same for a whole bucket)."""
        return 1 << max(0, batch_size.bit_length() - 4)

    @classmethod
    def bucket(cls, batch_size: int) -> int:
        """The smallest batch size of ``batch_size``'s bucket: itself below 16, else rounded down to 4
        significant bits (16, 18, ..., 30, 32, 36, ...)."""
        bs = max(1, batch_size)
        return bs - bs % cls._bucket_width(bs)

    @classmethod
    def bucket_range(cls, key: int) -> tuple[int, int]:
        return key, key + cls._bucket_width(key) - 1

    def width(self, batch_size: int) -> int:
        """Verify width of the next decode step (1 = plain step)."""
        if self.max_batch and batch_size > self.max_batch:
            return 1
        if self.mode == "always" or len(self.widths) == 1:
            return self.full
        b = self.buckets.setdefault(self.bucket(batch_size), _Bucket(next_explore=self.explore_every))
        b.steps += 1
        # Warm-up, narrowest (cheapest) first: go on to the next wider width only while the widest one
        # measured so far is the fastest, so a batch where drafting does not pay never runs wide steps.
        measured = [w for w in self.widths if b.count.get(w, 0) >= self.warmup]
        pending = next((w for w in self.widths if b.count.get(w, 0) < self.warmup), None)
        best = self._fastest(b)
        if pending is not None and (not measured or (pending > measured[-1] and best == measured[-1])):
            return pending
        rate = b.rate
        if b.current not in rate or rate[b.current] < (1 - self.margin) * max(rate.values()):
            b.current = best  # switch only when the width running now lost by the margin (switching costs)
        best = b.current
        if best != b.shown and b.count[best] >= self.warmup:  # a new fastest width, measured: worth a log line
            b.shown, self._news = best, True
        if b.probe[1]:
            b.probe = (b.probe[0], b.probe[1] - 1)
            return b.probe[0]
        if b.steps < b.next_explore:
            return best
        i = self.widths.index(best)
        neighbours = self.widths[max(0, i - 1):i] + self.widths[i + 1:i + 2]
        b.explored += 1
        probe = neighbours[b.explored % len(neighbours)]
        close = probe not in rate or rate[probe] >= (1 - self.give_up) * rate[best]
        b.interval = (min(2 * b.interval, self.max_explore_every) if best == b.last_best and not close
                      else self.explore_every)
        b.last_best, b.next_explore = best, b.steps + b.interval
        b.probe = (probe, self.probe_steps - 1)
        return probe

    def _fastest(self, b: _Bucket) -> int | None:
        """The narrowest width within ``margin`` of the highest rate (None before any measurement)."""
        rate = b.rate
        if not rate:
            return None
        top = max(rate.values())
        return min(w for w, r in rate.items() if r >= top * (1 - self.margin))

    def record(self, batch_size: int, width: int, commits, seconds: float) -> None:
        """One finished decode step of ``width`` that took ``seconds``; ``commits``: the tokens it committed per
        row (each 1..width). At a narrower width ``v`` a row would have committed ``min(commit, v)`` (the
        chain's first ``v`` tokens verify alike at any width), so a step rates the yield of every narrower width
        too: a width that ran long ago is known as well as the widest width run since."""
        if self.mode == "always" or seconds <= 0 or width not in self.widths:  # e.g. a plain step forced by
            return  # the request's options where the candidates lack width 1: nothing to rate
        b = self.buckets.setdefault(self.bucket(batch_size), _Bucket())
        keep, floor = 1 - self.tokens_alpha, self.min_weight * batch_size
        b.rows.add(batch_size, 1, b.steps, keep, self.min_weight)
        reached = [0] * (width + 1)  # reached[k]: rows whose draft k was verified (commit >= k)
        for c in commits:
            reached[min(c, width)] += 1
        for k in range(width - 1, 0, -1):
            reached[k] += reached[k + 1]
        for k in range(1, width):  # draft k accepted where the row committed more than k tokens
            b.accept.setdefault(k, _Average()).add(reached[k + 1], reached[k], b.steps, keep, floor)
        # seconds: the warm-up's median, then a moving average of the width's own steps that followed a step of
        # the same width (the first step after another width pays for the switch: caches, context backlog)
        n, after, b.last = b.count.get(width, 0), b.last, width
        if n < self.warmup:
            b.warm.setdefault(width, []).append(seconds)
            b.seconds[width] = statistics.median(b.warm[width])
        elif after == width:
            b.seconds[width] = (1 - self.alpha) * b.seconds[width] + self.alpha * seconds
        b.count[width] = n + 1
        if self.give_up_after <= n + 1 < self.warmup:  # in warm-up: end it where the width is clearly slower
            rate = b.rate
            others = [r for w, r in rate.items() if w != width and b.count[w] >= self.warmup]
            if others and rate[width] < (1 - self.give_up) * max(others):
                b.count[width] = self.warmup

    def pop_news(self) -> bool:
        """True once after a bucket finished its warm-up or its fastest width changed (time to log)."""
        news, self._news = self._news, False
        return news

    def describe(self) -> str:
        cap = f", batch cap {self.max_batch}" if self.max_batch else ""
        if self.mode == "always":
            return f"always draft (width {self.full}{cap})"
        parts = []
        for k in sorted(self.buckets):
            b = self.buckets[k]
            lo, hi = self.bucket_range(k)
            rate = b.rate
            rates = ", ".join(f"w{w} {rate[w]:.1f}" for w in self.widths if w in rate)
            runs = f" -> w{b.shown}" if b.shown else ""
            parts.append(f"bs {lo}{f'-{hi}' if hi > lo else ''}: {rates} tok/s{runs}")
        return f"adaptive over widths {list(self.widths)}{cap}; " + ("; ".join(parts) or "no steps yet")
