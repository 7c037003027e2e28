"""The drafter's context K/V, kept per target KV slot and written lazily.

Every target forward (prefill, plain decode step, verify) captures the hidden states of the drafter's
context layers for the slots it wrote. Turning them into the drafter's K/V (``fc``, norm and the K/V
projections of every draft layer) is a few small matmuls per step, pure overhead while the draft policy
runs plain steps. So captured states are queued and turned into K/V in one pass (many rows, cheaper per
row) when the next draft reads the pool, or when the queue holds ``max_pending`` rows. A draft after a run of
plain steps (or after a prefill) thus flushes their rows too; ``backlog_seconds`` tells the draft policy how
much of a step's time that backlog took, so the policy rates a width by what it costs in steady state.

The pool is indexed by the target's KV slot ids, so SGLang's allocator, radix cache and request lifecycle
manage it implicitly. A slot is reused once its request is done; the flush applies queued writes in their
order, so the latest write of a slot wins, as it would have written eagerly. No SGLang import here.
"""

from __future__ import annotations

import time

import torch


class ContextPool:
    """K/V pools ``[layers, num_slots, kvh, d]`` plus a queue of captured states not yet projected."""

    def __init__(self, drafter, num_slots: int, dtype: torch.dtype, device, max_pending: int = 4096):
        cfg = drafter.config
        shape = (cfg.num_hidden_layers, num_slots, cfg.num_key_value_heads, cfg.head_dim)
        self.drafter, self.dtype, self.max_pending = drafter, dtype, max_pending
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._queue: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending = 0
        self._flushed_rows, self._flush_seconds = 0, 0.0  # since the last ``backlog_seconds``

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write(self, hidden: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Queue captured target states. hidden: [N, K*H]; positions, slots: [N] (unique within a call)."""
        if hidden.shape[0] == 0:
            return
        # copies: the caller's tensors may be SGLang's, updated in place after this step
        self._queue.append((hidden.to(self.dtype, copy=True), positions.to(torch.long, copy=True),
                            slots.to(torch.long, copy=True)))
        self._pending += hidden.shape[0]
        if self._pending >= self.max_pending:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        """Project every queued state to K/V (one pass) and store it, in queue order."""
        if not self._queue:
            return
        t = time.perf_counter()
        queue, self._queue, self._pending = self._queue, [], 0
        hidden = torch.cat([h for h, _, _ in queue])[None]
        positions = torch.cat([p for _, p, _ in queue])[None]
        kv = self.drafter.context_kv(hidden, positions)  # per layer ([1, kvh, N, d], [1, kvh, N, d])
        start = 0
        for _, _, slots in queue:  # in order: a slot written twice keeps its later value
            end = start + slots.shape[0]
            for layer, (k, v) in enumerate(kv):
                self.k[layer, slots] = k[0, :, start:end].transpose(0, 1)  # [kvh, n, d] -> [n, kvh, d]
                self.v[layer, slots] = v[0, :, start:end].transpose(0, 1)
            start = end
        self._flushed_rows += start
        self._flush_seconds += time.perf_counter() - t

    def backlog_seconds(self, own_rows: int) -> float:
        """Of the flush time since the last call, the share of the rows beyond ``own_rows`` (the rows one
        step adds while drafting every step); then start counting afresh. Host time: on a GPU the flush only
        launches kernels, so this is ~0 there."""
        rows, seconds = self._flushed_rows, self._flush_seconds
        self._flushed_rows, self._flush_seconds = 0, 0.0
        return seconds * max(0, rows - own_rows) / rows if rows else 0.0

    def gather(self, slot_rows: torch.Tensor, lengths: torch.Tensor):
        """Context K/V of a batch, after a flush.

        slot_rows: [b, T] slot ids of each request's positions 0..T-1; lengths: [b] valid positions.
        Returns (one ([b, kvh, T, d], [b, kvh, T, d]) pair per draft layer, mask [b, T] or None if all valid).
        """
        self.flush()
        valid = torch.arange(slot_rows.shape[1], device=slot_rows.device)[None, :] < lengths[:, None]
        idx = torch.where(valid, slot_rows.long(), torch.zeros_like(slot_rows, dtype=torch.long))
        ctx = [(self.k[layer][idx].transpose(1, 2), self.v[layer][idx].transpose(1, 2))
               for layer in range(self.k.shape[0])]
        return ctx, (None if bool(valid.all()) else valid)
