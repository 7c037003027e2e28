"""``x @ weight.T`` that stays cheap for a few rows on a CPU, in whichever form this machine runs faster.

A decode step multiplies each weight by one row per request, a verify step by ``width`` rows per request.
Reading the weight from memory should dominate, but how PyTorch's CPU matmul handles the transposed weight
at so few rows depends on the machine (its CPU and the BLAS kernels PyTorch picks for it). On a 2-core AMD
EPYC host ``F.linear`` at 2-64 rows cost 2-3x one row, and ``(weight @ x.T).T`` (the weight as a plain
row-major left operand; one row as two copies of it) cost 0.4x the stock form at 1-4 rows; on a 2-core Intel
Xeon host the stock form cost the same at 2 rows as at 1 and the transposed one 2.5-2.9x more at 1-2 rows
(``bench/cpu_matmul.py``; ``bench/results/cpu-matmul.json``, ``cpu-matmul-one-row.json``,
``cpu-matmul-host-b.json``). So neither form is hard-wired: the first product of each dtype (per
thread count) times both forms on a DRAM-sized weight at 1, 2, 4, ... ``max_rows`` rows (~1 s, once per
process) and a row count then takes the transposed form only where its power-of-two bucket measured it
faster. The results agree to float rounding.
"""

from __future__ import annotations

import logging
import os
import time
import types
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

MAX_ROWS_ENV = "SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS"
DEFAULT_MAX_ROWS = 64
MEASURE_SHAPE = (16384, 1024)  # the weight timed by ``faster_rows``: 64 MB in fp32, so it streams from DRAM
_FASTER: dict[tuple[torch.dtype, int, int], frozenset[int]] = {}  # (dtype, threads, max_rows) -> buckets


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


def row_bucket(rows: int) -> int:
    """The power of two at or below ``rows`` (>= 1): the row counts that share one measurement."""
    return 1 << (max(rows, 1).bit_length() - 1)


def _median_ms(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[reps // 2] * 1e3


def faster_rows(dtype: torch.dtype, max_rows: int) -> frozenset[int]:
    """Row buckets (powers of two up to ``max_rows``) where ``transposed_linear`` beat ``F.linear`` by 5% on
    this machine for a ``MEASURE_SHAPE`` weight of ``dtype``; measured on first use per dtype and thread count."""
    key = (dtype, torch.get_num_threads(), max_rows)
    if key not in _FASTER:
        g = torch.Generator().manual_seed(0)
        w = torch.randn(MEASURE_SHAPE, generator=g).to(dtype)
        faster, report = set(), []
        bucket = 1
        while bucket <= max_rows:
            x = torch.randn(bucket, MEASURE_SHAPE[1], generator=g).to(dtype)
            stock = _median_ms(lambda: F.linear(x, w))
            transposed = _median_ms(lambda: transposed_linear(x, w))
            if transposed < 0.95 * stock:
                faster.add(bucket)
            report.append(f"{bucket}: {stock:.1f} / {transposed:.1f}")
            bucket *= 2
        _FASTER[key] = frozenset(faster)
        logger.info("sglang-domino few-row linear, %s, %d threads: ms stock / transposed at rows %s; transposed "
                    "at %s", str(dtype).removeprefix("torch."), key[1], ", ".join(report), sorted(faster) or "none")
    return _FASTER[key]


def takes_transposed(x: torch.Tensor, weight: torch.Tensor, max_rows: int,
                     faster: frozenset[int] | None = None) -> bool:
    """Whether ``x`` [..., K] against ``weight`` [N, K] should run as ``(weight @ x.T).T``: a CPU, a plain
    dense weight of x's dtype, 1 .. max_rows rows, and a row bucket in ``faster`` (default: ``faster_rows``,
    measured here)."""
    rows = x.numel() // max(x.shape[-1], 1)
    if not (x.device.type == "cpu" and 1 <= rows <= max_rows and weight.dim() == 2 and weight.is_contiguous()
            and weight.dtype == x.dtype and weight.dtype.is_floating_point):
        return False
    return row_bucket(rows) in (faster_rows(x.dtype, max_rows) if faster is None else faster)


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
    """For the duration, every ``nn.Linear`` of ``model`` computes through ``linear`` (the transposed form on a
    CPU at the row counts where it measured faster, ``F.linear`` otherwise): the Transformers backend's decode
    and verify forwards.
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
