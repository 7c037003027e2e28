"""``x @ weight.T`` that stays cheap for a few rows on a CPU.

A decode step multiplies each weight by one row per request, a verify step by ``width`` rows per request.
On a CPU, PyTorch's ``F.linear`` / ``x @ weight.T`` at 2-64 rows costs 2-3x what one row costs even though
reading the weight from memory dominates: the GEMM behind it handles the transposed weight badly at so few
rows. The same product taken the other way round, ``(weight @ x.T).T``, reads the weight as a plain
row-major left operand: SmolLM2-135M's linears at 2 and 4 rows cost 0.4x the stock form and less than one
row does, 0.6-0.75x at 8-64 rows (2 threads, ``bench/cpu_matmul.py``, ``bench/results/cpu-matmul.json``).
One float32 row, a GEMV either way, runs as that two-column product of the row repeated, which is faster
than the GEMV itself; bf16 rows, whose GEMV is fast, stay with ``F.linear``. The results agree to float
rounding.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

MAX_ROWS_ENV = "SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS"
DEFAULT_MAX_ROWS = 64


def max_rows_from_env() -> int:
    """Largest row count that takes the transposed form (0 switches it off); from ``MAX_ROWS_ENV``."""
    raw = os.environ.get(MAX_ROWS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ROWS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_ROWS_ENV}={raw!r}: expected a whole number of rows (0 switches it off)") from None
    if value < 0:
        raise ValueError(f"{MAX_ROWS_ENV}={raw!r}: expected 0 or more")
    return value


def takes_transposed(x: torch.Tensor, weight: torch.Tensor, max_rows: int) -> bool:
    """Whether ``x`` [..., K] against ``weight`` [N, K] should run as ``(weight @ x.T).T``: a CPU, a plain
    dense weight of x's dtype, and 2 .. max_rows rows, or one float32 row."""
    rows = x.numel() // max(x.shape[-1], 1)
    few = 2 <= rows <= max_rows or (rows == 1 and max_rows >= 1 and x.dtype == torch.float32)
    return (x.device.type == "cpu" and few and weight.dim() == 2 and weight.is_contiguous()
            and weight.dtype == x.dtype and weight.dtype.is_floating_point)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           max_rows: int = DEFAULT_MAX_ROWS) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] (contiguous), like ``F.linear``."""
    if not takes_transposed(x, weight, max_rows):
        return F.linear(x, weight, bias)
    return transposed_linear(x, weight, bias)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed as ``(weight @ x.T).T``, unconditionally (callers check ``takes_transposed``);
    one row as two copies of it (a two-column GEMM, not a GEMV)."""
    x2 = x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    if rows == 1:
        x2 = x2.repeat(2, 1)  # a real copy: a stride-0 expand makes the GEMM slow again
    out = torch.mm(weight, x2.t())[:, :rows].t().contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


@contextmanager
def few_row_linears(model: nn.Module, max_rows: int | None = None):
    """For the duration, every ``nn.Linear`` of ``model`` computes through ``linear`` (the transposed form at
    2..max_rows rows and at one float32 row on a CPU, ``F.linear`` otherwise): the Transformers backend's
    decode and verify forwards.
    max_rows: default ``max_rows_from_env()``; 0 leaves the model as it is."""
    max_rows = max_rows_from_env() if max_rows is None else max_rows
    patched = [m for m in model.modules() if type(m) is nn.Linear and "forward" not in vars(m)] if max_rows else []
    for m in patched:
        m.forward = types.MethodType(lambda self, x: linear(x, self.weight, self.bias, max_rows), m)
    try:
        yield model
    finally:
        for m in patched:
            del m.forward
