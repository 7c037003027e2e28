"""The serving worker's lazily written drafter context (``serving/context.py``): pure torch, no server."""

from __future__ import annotations

import pytest
import torch

from sglang_domino.models import init_drafter, tiny_target
from sglang_domino.serving.context import ContextPool

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def drafter():
    target = tiny_target("llama", vocab_size=96, hidden_size=64, num_layers=6)
    torch.manual_seed(0)
    return init_drafter(target.config, num_layers=2, num_context_layers=3, block_size=8, gru_hidden_dim=32,
                        emb_dim=16).eval()


def writes(drafter, seed: int = 0):
    """Prefill, decode and verify-like writes that reuse slots (a finished request's slots 3..5 go to
    another one; a verify's rejected tail at 9..10 is rewritten by the next step)."""
    g = torch.Generator().manual_seed(seed)
    width = drafter.config.num_context_layers * drafter.config.hidden_size
    plan = [([0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]), ([6, 7], [6, 7]), ([3, 4, 5], [0, 1, 2]),
            ([8, 9, 10], [8, 9, 10]), ([9, 10, 11], [9, 10, 11]), ([12], [3])]
    return [(torch.randn(len(slots), width, generator=g), torch.tensor(pos), torch.tensor(slots))
            for slots, pos in plan]


def eager(drafter, num_slots, plan):
    """What writing each step's K/V at once stores."""
    cfg = drafter.config
    k = torch.zeros(cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, cfg.head_dim)
    v = torch.zeros_like(k)
    for hidden, positions, slots in plan:
        for layer, (kl, vl) in enumerate(drafter.context_kv(hidden[None], positions[None])):
            k[layer, slots], v[layer, slots] = kl[0].transpose(0, 1), vl[0].transpose(0, 1)
    return k, v


@pytest.mark.parametrize("max_pending", [1, 5, 4096])  # flushed at every write, now and then, only on gather
def test_lazy_writes_store_what_eager_writes_store(drafter, max_pending):
    plan = writes(drafter)
    pool = ContextPool(drafter, 16, torch.float32, "cpu", max_pending=max_pending)
    for hidden, positions, slots in plan:
        pool.write(hidden, positions, slots)
    assert (pool._pending == 0) == (max_pending == 1)
    slot_rows = torch.tensor([[3, 4, 5, 12, 0], [0, 1, 2, 6, 7]])
    ctx, mask = pool.gather(slot_rows, torch.tensor([4, 5]))
    k, v = eager(drafter, 16, plan)
    torch.testing.assert_close(pool.k, k, rtol=1e-5, atol=1e-6)  # the later write of a slot won
    torch.testing.assert_close(pool.v, v, rtol=1e-5, atol=1e-6)
    assert mask.tolist() == [[True] * 4 + [False], [True] * 5]
    for layer, (kl, vl) in enumerate(ctx):  # [b, kvh, T, d], padding positions read slot 0
        torch.testing.assert_close(kl[0, :, :4], k[layer, [3, 4, 5, 12]].transpose(0, 1))
        torch.testing.assert_close(vl[1], v[layer, [0, 1, 2, 6, 7]].transpose(0, 1))


def test_queued_states_are_copies(drafter):
    hidden, positions, slots = writes(drafter)[0]
    pool = ContextPool(drafter, 16, torch.float32, "cpu")
    pool.write(hidden, positions, slots)
    k, v = eager(drafter, 16, [(hidden.clone(), positions.clone(), slots.clone())])
    hidden.zero_(), positions.zero_(), slots.fill_(15)  # the caller reuses its buffers after the step
    pool.flush()
    torch.testing.assert_close(pool.k, k, rtol=1e-5, atol=1e-6)
    assert pool.k[:, 15].abs().sum() == 0


def test_backlog_seconds_charges_a_step_only_for_its_own_rows(drafter, monkeypatch):
    import sglang_domino.serving.context as context

    clock = iter(range(100))  # every perf_counter call advances 1 s: each flush takes 1 s
    monkeypatch.setattr(context, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(clock))}))
    pool = ContextPool(drafter, 16, torch.float32, "cpu")
    plan = writes(drafter)
    for hidden, positions, slots in plan[:4]:  # a prefill and plain steps queue 14 rows, then a draft flushes
        pool.write(hidden, positions, slots)
    pool.flush()
    assert pool.backlog_seconds(own_rows=2) == pytest.approx(12 / 14)  # all but this step's 2 rows
    assert pool.backlog_seconds(own_rows=2) == 0.0  # counted once
    pool.write(*plan[4])  # drafting every step: each flush holds one step's rows, no backlog
    pool.flush()
    assert pool.backlog_seconds(own_rows=3) == 0.0
    pool.flush()  # nothing queued: no time counted
    assert pool.backlog_seconds(own_rows=0) == 0.0
