"""The draft policy (``sglang_domino/policy.py``): pure Python, no server needed."""

from __future__ import annotations

import pytest

from sglang_domino.policy import DraftPolicy, PolicyError, widths_from_env


def simulate(policy: DraftPolicy, rates: dict, steps: int) -> dict:
    """Run ``steps`` decode steps per batch size with fixed throughputs rates[bs] = {width: tokens/s};
    returns, per batch size, the fraction of steps run at each width."""
    runs = {bs: {} for bs in rates}
    for _ in range(steps):
        for bs, by_width in rates.items():
            w = policy.width(bs)
            runs[bs][w] = runs[bs].get(w, 0) + 1
            tokens = bs * (1 + (w > 1))
            policy.record(bs, w, [1 + (w > 1)] * bs, tokens / by_width[w])
    return {bs: {w: n / steps for w, n in r.items()} for bs, r in runs.items()}


def test_adaptive_picks_the_fastest_width_per_batch_bucket():
    policy = DraftPolicy("adaptive", widths=(1, 4, 16))
    frac = simulate(policy, {1: {1: 20.0, 4: 30.0, 16: 25.0}, 4: {1: 60.0, 4: 50.0, 16: 30.0},
                             16: {1: 200.0, 4: 100.0, 16: 50.0}}, 800)
    assert frac[1][4] > 0.9  # width 4 is fastest at batch 1
    assert frac[4][1] > 0.9 and frac[16][1] > 0.9  # plain steps win at larger batches
    # the fastest's neighbours now and then: 2 steps in 40 while within 25% of the fastest (+ warm-up)
    for bs, neighbours in ((1, (1, 16)), (4, (4,)), (16, (4,))):
        assert all(0.0 < frac[bs].get(w, 0.0) < 0.07 for w in neighbours)
    assert 16 not in frac[16]  # width 4 lost at warm-up, so 16 (not a neighbour of 1) is never run


def test_exploration_backs_off_while_the_fastest_stays():
    policy = DraftPolicy("adaptive", widths=(1, 4, 16), explore_every=40, max_explore_every=320)
    frac = simulate(policy, {16: {1: 200.0, 4: 100.0, 16: 50.0}}, 4000)
    b = policy.buckets[DraftPolicy.bucket(16)]
    assert b.interval == 320 and frac[16].get(4, 0) < 0.009  # 2 steps per 320 after the back-off, + 8 warm-up


def test_warm_up_goes_wider_only_while_wider_is_faster():
    policy = DraftPolicy("adaptive", widths=(1, 4, 8, 16))
    early = simulate(policy, {16: {1: 200.0, 4: 100.0, 8: 80.0, 16: 50.0}, 1: {1: 20.0, 4: 30.0, 8: 35.0, 16: 25.0}},
                     5 * policy.warmup)
    assert 8 not in early[16] and 16 not in early[16]  # width 4 lost to plain steps: 8 and 16 are not tried
    assert early[1].get(16, 0) > 0  # at batch 1 each wider width won until 16
    assert max(early[1], key=early[1].get) == 8


def test_a_wider_width_must_win_by_the_margin():
    policy = DraftPolicy("adaptive", widths=(1, 2, 4), margin=0.03)
    frac = simulate(policy, {16: {1: 100.0, 2: 102.0, 4: 80.0}, 1: {1: 10.0, 2: 11.0, 4: 10.5}}, 800)
    assert frac[16][1] > 0.92  # width 2 is 2% faster: within the margin, the plain step runs
    assert 4 not in frac[16]  # and the warm-up stopped at width 2
    assert frac[1][2] > 0.92  # 10% faster: drafting runs
    frac = simulate(DraftPolicy("adaptive", widths=(1, 2, 4), margin=0.0), {16: {1: 100.0, 2: 102.0, 4: 80.0}}, 800)
    assert frac[16][2] > 0.92


def test_adaptive_follows_a_change_in_acceptance():
    policy = DraftPolicy("adaptive", widths=(1, 16))
    simulate(policy, {1: {16: 30.0, 1: 20.0}}, 200)
    b = policy.buckets[DraftPolicy.bucket(1)]
    assert b.rate[16] == pytest.approx(30.0) and b.rate[1] == pytest.approx(20.0)
    frac = simulate(policy, {1: {16: 10.0, 1: 20.0}}, 400)  # the traffic turned hard to draft for
    late = simulate(policy, {1: {16: 10.0, 1: 20.0}}, 200)
    assert frac[1].get(16, 0) < 0.5 and late[1].get(16, 0) < 0.06


def test_always_and_batch_cap():
    always = DraftPolicy("always", max_batch=4, widths=(1, 4, 16))
    assert all(always.width(bs) == 16 for bs in (1, 2, 4))
    assert always.width(5) == 1
    capped = simulate(DraftPolicy("adaptive", max_batch=2, widths=(1, 16)),
                      {1: {16: 30.0, 1: 20.0}, 8: {16: 90.0, 1: 20.0}}, 200)
    assert capped[8] == {1: 1.0} and capped[1][16] > 0.9
    assert "always" in always.describe()
    described = DraftPolicy("adaptive", widths=(1, 16))
    simulate(described, {1: {16: 30.0, 1: 20.0}}, 10)
    assert "bs 1: w1 20.0, w16 30.0 tok/s" in described.describe()


def test_widths_from_env(monkeypatch):
    monkeypatch.delenv("SGLANG_DOMINO_DRAFT_WIDTHS", raising=False)
    assert widths_from_env(16) == (1, 2, 4, 8, 16) and widths_from_env(6) == (1, 2, 4, 6)
    assert widths_from_env(2) == (1, 2)
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_WIDTHS", "16, 1,4")
    assert widths_from_env(16) == (1, 4, 16)
    for bad, match in (("1,17", r"must be in \[1, 16\]"), ("0,4", r"must be in"), ("a,b", "comma-separated")):
        monkeypatch.setenv("SGLANG_DOMINO_DRAFT_WIDTHS", bad)
        with pytest.raises(PolicyError, match=match):
            widths_from_env(16)


def test_env_errors_are_clear(monkeypatch):
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_POLICY", "sometimes")
    with pytest.raises(PolicyError, match="SGLANG_DOMINO_DRAFT_POLICY='sometimes'"):
        DraftPolicy.from_env(16)
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_POLICY", "always")
    monkeypatch.setenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", "-1")
    with pytest.raises(PolicyError, match="must be >= 0"):
        DraftPolicy.from_env(16)
    monkeypatch.setenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", "8")
    p = DraftPolicy.from_env(16)
    assert p.mode == "always" and p.max_batch == 8


def test_the_batch_cap_defaults_to_the_callers_and_0_lifts_it(monkeypatch):
    monkeypatch.delenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", raising=False)
    assert DraftPolicy.from_env(16).max_batch == 0
    policy = DraftPolicy.from_env(16, default_max_batch=8)
    assert policy.max_batch == 8 and "batch cap 8" in policy.describe()
    assert policy.width(9) == 1  # above the cap: plain steps, whatever the rates
    monkeypatch.setenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", "0")
    assert DraftPolicy.from_env(16, default_max_batch=8).max_batch == 0


def test_policy_env_is_what_from_env_reads(monkeypatch):
    from sglang_domino.policy import policy_env

    assert policy_env() == {}
    for key, value in policy_env("always", 3, [1, 8]).items():
        monkeypatch.setenv(key, value)
    p = DraftPolicy.from_env(16)
    assert p.mode == "always" and p.max_batch == 3 and p.widths == (1, 8)
    with pytest.raises(PolicyError, match="expected one of"):
        policy_env("never")


def test_news_when_a_bucket_settles_or_its_fastest_changes():
    policy = DraftPolicy("adaptive", widths=(1, 4))
    simulate(policy, {1: {1: 20.0, 4: 30.0}}, 2 * policy.warmup)  # warm-up: its steps of each width
    assert not policy.pop_news()
    simulate(policy, {1: {1: 20.0, 4: 30.0}}, 1)
    assert policy.pop_news() and not policy.pop_news()  # settled on width 4: reported once
    assert "w4 30.0 tok/s -> w4" in policy.describe()
    simulate(policy, {1: {1: 20.0, 4: 30.0}}, 100)
    assert not policy.pop_news()  # the fastest stayed
    simulate(policy, {1: {1: 20.0, 4: 5.0}}, 400)  # acceptance fell: width 1 takes over
    assert policy.pop_news() and "-> w1" in policy.describe()


def test_a_first_step_outlier_does_not_misrank_a_width():
    """A process's first step at a new shape pays one-off costs (here 1 s, 13x a step): the warm-up rates a
    width by the median of its steps, so width 2 still wins at once (a mean ranked it below plain steps
    until its next exploration, 40 steps later)."""
    policy, seen, runs = DraftPolicy("adaptive", widths=(1, 2)), set(), []
    for _ in range(60):
        w = policy.width(1)
        tokens = 1 + (w == 2)
        policy.record(1, w, [tokens], 1.0 if w not in seen else tokens / {1: 20.0, 2: 26.0}[w])
        seen.add(w)
        runs.append(w)
    assert runs[16:].count(2) > 0.9 * len(runs[16:])
    assert policy.buckets[1].rate[2] == pytest.approx(26.0)


def test_a_clearly_losing_width_ends_its_warm_up_early():
    policy = DraftPolicy("adaptive", widths=(1, 2, 4), give_up=0.25, give_up_after=3)
    frac = simulate(policy, {1: {1: 20.0, 2: 26.0, 4: 12.0}, 2: {1: 40.0, 2: 38.0, 4: 20.0}}, 100)
    # warm-up steps + explorations (2 steps at 40 and at 80, each probing one of the fastest's neighbours in turn)
    assert 0.03 <= frac[1][4] <= 0.05  # 3 warm-up steps: 40% below width 2
    assert 0.08 <= frac[2][2] <= 0.12  # within 25% of plain steps: the full 8
    assert max(frac[1], key=frac[1].get) == 2 and max(frac[2], key=frac[2].get) == 1


def test_widths_are_compared_at_about_the_same_batch_size():
    """tokens/s grows with the batch size: width 1 measured at batch 8 must not lose to width 2 measured at
    batch 15 when width 1 is the faster at both (with octave-wide buckets, 8-15, it did)."""
    rates = {8: {1: 20.0, 2: 15.0}, 15: {1: 37.0, 2: 30.0}}
    policy = DraftPolicy("adaptive", widths=(1, 2))
    for bs in [8] * 3 + [15] * 20:
        w = policy.width(bs)
        tokens = bs * (1 + (w > 1))
        policy.record(bs, w, [1 + (w > 1)] * bs, tokens / rates[bs][w])
    assert policy.width(15) == 1 and policy.buckets[DraftPolicy.bucket(15)].rate[2] == pytest.approx(30.0)
    assert DraftPolicy.bucket(8) != DraftPolicy.bucket(15)
    assert [DraftPolicy.bucket(b) for b in (15, 16, 17, 18, 31, 32, 35, 36)] == [15, 16, 16, 18, 30, 32, 32, 36]
    for bs in range(1, 600):  # buckets tile the batch sizes, at most 1/8 wide
        lo, hi = DraftPolicy.bucket_range(DraftPolicy.bucket(bs))
        assert lo <= bs <= hi and (hi - lo + 1) <= max(1, lo // 8)


def run_all_or_nothing(policy: DraftPolicy, steps: int, seed: int = 0) -> float:
    """Batch 1, widths 1 and 2 costing about the same (80 / 82 ms), a width-2 draft accepted 40% of the time in
    stretches of easy (70%) and hard (10%) text that last ~10 steps: width 2 commits 1.37x the tokens/s, but
    one step commits 1 or 2 tokens. Returns the fraction of steps run at width 2."""
    import random

    rng, easy, wide = random.Random(seed), True, 0
    for _ in range(steps):
        easy = easy if rng.random() < 0.9 else not easy
        w = policy.width(1)
        tokens = 1 + (w == 2 and rng.random() < (0.7 if easy else 0.1))
        policy.record(1, w, [tokens], 0.080 if w == 1 else 0.082)
        wide += w == 2
    return wide / steps


def test_all_or_nothing_yields_do_not_mislead_the_policy():
    """Rated on a fast average of tokens/s (a former way), stretches of rejections made width 2 look no better
    than plain steps and the policy fell back to them (4-19% of the steps at width 2)."""
    assert min(run_all_or_nothing(DraftPolicy("adaptive", widths=(1, 2)), 3000, seed) for seed in range(5)) > 0.9


COST = {1: 0.066, 2: 0.076, 4: 0.100, 8: 0.130, 16: 0.25}  # seconds per step at batch 1 (about this CPU's)


def run_chains(policy, accept, steps: int, seed: int = 0, switch: float = 0.0) -> tuple[list, float]:
    """Batch 1, each draft accepted with probability ``accept(step, rng)`` until the first rejection, step
    times COST[width] +-7%, + ``switch`` seconds where the width differs from the step before. Returns (the
    width of each step, committed tokens/s); ``policy`` may be a width."""
    import random

    rng, widths, tokens, seconds = random.Random(seed), [], 0, 0.0
    for t in range(steps):
        w = policy if isinstance(policy, int) else policy.width(1)
        p, c = accept(t, rng), 1
        while c < w and rng.random() < p:
            c += 1
        s = COST[w] * rng.uniform(0.93, 1.07) + (switch if widths and w != widths[-1] else 0.0)
        if not isinstance(policy, int):
            policy.record(1, w, [c], s)
        widths, tokens, seconds = widths + [w], tokens + c, seconds + s
    return widths, tokens / seconds


def test_a_wide_step_rates_every_narrower_width():
    """At width v a row commits min(commit, v) of what a wider step committed: one step of width 8 rates
    widths 2 and 4 exactly as if they had run."""
    import random

    rng = random.Random(0)
    for _ in range(20):
        policy = DraftPolicy("adaptive", widths=(1, 2, 4, 8))
        commits = [rng.randint(1, 8) for _ in range(rng.randint(1, 12))]
        policy.record(len(commits), 8, commits, 0.1)
        b = policy.buckets[DraftPolicy.bucket(len(commits))]
        for v in (1, 2, 4, 8):
            assert b.tokens(v) == pytest.approx(sum(min(c, v) for c in commits) / len(commits))


def test_hard_requests_do_not_hold_the_policy_on_plain_steps():
    """A request the drafter can hardly follow (5% acceptance) sends the policy to plain steps; when easier
    text follows (50%), it drafts again within a few explorations. Rating width 2 on a slow average of its
    own steps only and exploring ever more rarely, the former policy often kept plain steps to the end."""
    for seed in range(5):  # the former policy: 2 of these 5 seeds ran plain steps to the end (or nearly)
        widths, _ = run_chains(DraftPolicy("adaptive", widths=tuple(COST)), lambda t, rng: 0.05 if t < 300 else 0.5,
                               900, seed)
        assert widths[200:300].count(1) > 90  # plain steps while drafts fail
        assert widths[600:].count(1) < 15  # drafting again once they pay (plain steps: explorations only)


def test_adaptive_keeps_up_with_the_best_fixed_width():
    """Requests of 128 steps, each with its own acceptance, in stretches of easier and harder text (x1.3 /
    x0.7, ~10 steps): the adaptive policy commits at least 95% of the tokens/s of the best fixed width (90%
    for a drafter accepted 70% of the time, where the best width changes with every stretch)."""
    def traffic(levels):
        state = {}

        def accept(t, rng):
            if t % 128 == 0:
                state.update(level=rng.choice(levels), easy=True)
            if rng.random() < 0.1:
                state["easy"] = not state["easy"]
            return min(0.95, state["level"] * (1.3 if state["easy"] else 0.7))
        return accept

    for levels, share in (((0.15, 0.3, 0.45, 0.6), 0.95), ((0.37,), 0.95), ((0.7,), 0.85)):
        best = max(run_chains(w, traffic(levels), 2048)[1] for w in COST)
        for seed in range(3):
            _, rate = run_chains(DraftPolicy("adaptive", widths=tuple(COST)), traffic(levels), 2048, seed)
            assert rate >= share * best, (levels, seed, rate / best)


def test_the_cost_of_switching_widths_is_not_charged_to_the_width():
    """The first step after a change of width pays for the change (on this CPU ~10 ms: the drafter's weights
    back in cache, the context rows queued by plain steps). Charged to the width, it made each probe of width 2
    look slow while plain steps ran, so after a stretch of text the drafter could not follow the policy kept
    plain steps. Width 2 here costs 1.18x a plain step and commits 1.3 tokens (10% more tokens/s), as at c = 1."""
    policy, widths = DraftPolicy("adaptive", widths=(1, 2)), []
    for t in range(1500):
        w = policy.width(1)
        hard = 100 <= t < 300  # no draft accepted
        commit = 2 if w == 2 and not hard and t % 10 in (0, 3, 6) else 1
        seconds = {1: 0.0794, 2: 0.094}[w] + (0.010 if widths and w != widths[-1] else 0.0)
        policy.record(1, w, [commit], seconds)
        widths.append(w)
    assert widths[250:300].count(1) > 40  # plain steps while no draft is accepted
    assert widths[700:].count(2) > 0.9 * len(widths[700:])  # and drafting again once drafts pay
    assert policy.buckets[1].seconds[2] == pytest.approx(0.094)
