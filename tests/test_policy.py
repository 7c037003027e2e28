"""The serving draft policy (``serving/policy.py``): pure Python, no server needed."""

from __future__ import annotations

import pytest

from sglang_domino.serving.policy import DraftPolicy, PolicyError


def simulate(policy: DraftPolicy, rates: dict, steps: int) -> dict:
    """Run ``steps`` decode steps per batch size with fixed throughputs rates[bs] = (draft, plain) tokens/s;
    returns the fraction of drafting steps per batch size."""
    drafted = {bs: 0 for bs in rates}
    for _ in range(steps):
        for bs, (draft_rate, plain_rate) in rates.items():
            d = policy.should_draft(bs)
            drafted[bs] += d
            tokens = 3 * bs if d else bs
            policy.record(bs, d, tokens, tokens / (draft_rate if d else plain_rate))
    return {bs: n / steps for bs, n in drafted.items()}


def test_adaptive_drafts_where_it_pays_per_batch_bucket():
    frac = simulate(DraftPolicy("adaptive"), {1: (30.0, 20.0), 4: (30.0, 60.0), 16: (100.0, 200.0)}, 400)
    assert frac[1] > 0.95  # drafting is faster at batch 1
    assert 0.0 < frac[4] < 0.06 and 0.0 < frac[16] < 0.06  # plain is faster: only exploration steps draft


def test_adaptive_follows_a_change_in_acceptance():
    policy = DraftPolicy("adaptive")
    simulate(policy, {1: (30.0, 20.0)}, 200)
    b = policy.buckets[DraftPolicy.bucket(1)]
    assert b.rate[True] == pytest.approx(30.0) and b.rate[False] == pytest.approx(20.0)
    frac = simulate(policy, {1: (10.0, 20.0)}, 400)  # the traffic turned hard to draft for
    late = simulate(policy, {1: (10.0, 20.0)}, 200)
    assert frac[1] < 0.5 and late[1] < 0.06


def test_always_and_batch_cap():
    always = DraftPolicy("always", max_batch=4)
    assert all(always.should_draft(bs) for bs in (1, 2, 4))
    assert not always.should_draft(5)
    capped = simulate(DraftPolicy("adaptive", max_batch=2), {1: (30.0, 20.0), 8: (90.0, 20.0)}, 50)
    assert capped[8] == 0.0 and capped[1] > 0.9
    assert "always" in always.describe()
    described = DraftPolicy("adaptive")
    simulate(described, {1: (30.0, 20.0)}, 10)
    assert "bs 1-1: draft 30.0 vs plain 20.0 tok/s" in described.describe()


def test_env_errors_are_clear(monkeypatch):
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_POLICY", "sometimes")
    with pytest.raises(PolicyError, match="SGLANG_DOMINO_DRAFT_POLICY='sometimes'"):
        DraftPolicy.from_env()
    monkeypatch.setenv("SGLANG_DOMINO_DRAFT_POLICY", "always")
    monkeypatch.setenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", "-1")
    with pytest.raises(PolicyError, match="must be >= 0"):
        DraftPolicy.from_env()
    monkeypatch.setenv("SGLANG_DOMINO_MAX_DRAFT_BATCH", "8")
    p = DraftPolicy.from_env()
    assert p.mode == "always" and p.max_batch == 8


def test_policy_env_is_what_from_env_reads(monkeypatch):
    from sglang_domino.serving.policy import policy_env

    assert policy_env() == {}
    for key, value in policy_env("always", 3).items():
        monkeypatch.setenv(key, value)
    p = DraftPolicy.from_env()
    assert p.mode == "always" and p.max_batch == 3
    with pytest.raises(PolicyError, match="expected one of"):
        policy_env("never")
