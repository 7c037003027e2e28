"""bench/acceptance.py's statistics: the bootstrap interval of a tau ratio over prompts."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

_spec = importlib.util.spec_from_file_location("acceptance", Path(__file__).parents[1] / "bench" / "acceptance.py")
acceptance = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acceptance)


def prompts(n: int, tau: float, seed: int) -> list:
    """Per prompt (committed tokens, steps): 20-60 steps, each committing 1 + Binomial(2, (tau - 1) / 2)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        steps = rng.randint(20, 60)
        out.append((steps + sum(rng.random() < (tau - 1) / 2 for _ in range(2 * steps)), steps))
    return out


def test_the_interval_holds_the_ratio_and_narrows_with_more_prompts():
    widths = {}
    for n in (16, 80):
        num, den = prompts(n, 1.45, seed=n), prompts(n, 1.30, seed=n + 1)
        point = (sum(c for c, _ in num) / sum(s for _, s in num)) / (sum(c for c, _ in den) / sum(s for _, s in den))
        lo, hi = acceptance.tau_ratio_interval(num, den)
        assert 1.0 < lo < point < hi  # 1.45 / 1.30 = 1.115: apart from 1 at either size
        widths[n] = hi - lo
    assert widths[80] < widths[16]  # more prompts, a tighter interval
    same = prompts(40, 1.4, seed=0)
    lo, hi = acceptance.tau_ratio_interval(same, same)
    assert lo == hi == 1.0  # paired: a method against itself never differs
