"""Chain verification: greedy acceptance and the losslessness of speculative sampling."""

import pytest
import torch
from scipy.stats import chisquare

from sglang_domino.sampling import exponential_like, sample_from
from sglang_domino.verify import verify_greedy, verify_sampled

torch.set_num_threads(2)


def _logits_preferring(tokens, vocab=10):
    """Target logits whose argmax at position i is tokens[i]."""
    logits = torch.zeros(1, len(tokens), vocab)
    logits[0, torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


@pytest.mark.parametrize("draft, target, accept, bonus", [
    ([1, 2, 3], [1, 2, 3, 4], 3, 4),  # all accepted: bonus from the last position
    ([1, 2, 3], [7, 2, 3, 4], 0, 7),  # first rejected: the target's own token
    ([1, 2, 3], [1, 2, 9, 4], 2, 9),
    ([1, 5, 3], [1, 2, 3, 4], 1, 2),  # a later match after a mismatch does not count
])
def test_greedy_accept_len_and_bonus(draft, target, accept, bonus):
    a, b = verify_greedy(torch.tensor([draft]), _logits_preferring(target))
    assert (int(a), int(b)) == (accept, bonus)


def test_sampled_with_one_hot_equals_greedy():
    torch.manual_seed(0)
    logits = torch.randn(64, 5, 12)
    draft = torch.where(torch.rand(64, 4) < 0.7, logits[:, :4].argmax(-1), torch.randint(0, 12, (64, 4)))
    onehot = lambda t: torch.nn.functional.one_hot(t, 12).float()  # noqa: E731
    got = verify_sampled(draft, onehot(draft), onehot(logits.argmax(-1)), torch.rand(64, 4),
                         exponential_like((64, 12)))
    for g, e in zip(got, verify_greedy(draft, logits)):
        assert torch.equal(g, e)


def test_first_committed_token_is_distributed_as_p():
    """Whatever q is, the first committed token of a step is an exact sample of p_0."""
    n, vocab, rows = 3, 6, 400_000
    gen = torch.Generator().manual_seed(1)
    q = torch.softmax(torch.randn(1, n, vocab, generator=gen) * 2, -1).expand(rows, n, vocab)
    p = torch.softmax(torch.randn(1, n + 1, vocab, generator=gen) * 2, -1).expand(rows, n + 1, vocab)
    draft = sample_from(q, exponential_like((rows, n, vocab), gen))
    accept_len, bonus = verify_sampled(draft, q, p, torch.rand(rows, n, generator=gen),
                                       exponential_like((rows, vocab), gen))
    first = torch.where(accept_len > 0, draft[:, 0], bonus)
    observed = torch.bincount(first, minlength=vocab).double()
    assert 0 < float((accept_len == 0).double().mean()) < 1  # both paths taken
    expected = p[0, 0].double() / p[0, 0].double().sum() * rows
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3
    # Acceptance rate of the first draft is sum(min(p, q)), as theory says.
    torch.testing.assert_close(float((accept_len > 0).double().mean()),
                               float(torch.minimum(p[0, 0], q[0, 0]).sum()), atol=3e-3, rtol=0)


def test_all_accepted_bonus_comes_from_last_p():
    p = torch.softmax(torch.randn(1, 3, 8), -1).expand(50_000, 3, 8).contiguous()
    draft = torch.zeros(50_000, 2, dtype=torch.long)
    q = torch.zeros(50_000, 2, 8)
    q[..., 0] = 1.0
    p[:, :2] = q  # every draft accepted
    accept_len, bonus = verify_sampled(draft, q, p, torch.rand(50_000, 2), exponential_like((50_000, 8)))
    assert bool((accept_len == 2).all())
    freq = torch.bincount(bonus, minlength=8) / 50_000
    torch.testing.assert_close(freq, p[0, 2], atol=1e-2, rtol=0)
