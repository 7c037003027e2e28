"""``x @ weight.T`` that stays cheap for a few rows on a CPU, in whichever form this machine runs faster.

A decode step multiplies each weight by one row per request, a verify step by ``width`` rows per request.
Reading the weight from memory should dominate, but how PyTorch's CPU matmul handles the transposed weight
at so few rows depends on the machine (its CPU and the BLAS kernels PyTorch picks for it). On a 2-core AMD
EPYC host ``F.linear`` at 2-64 rows cost 2-3x one row, and ``(weight @ x.T).T`` (the weight as a plain
row-major left operand; one row as two copies of it) cost 0.4x the stock form at 1-4 rows; on a 2-core Intel
Xeon host the stock form cost the same at 2 rows as at 1 and the transposed one 2.5-2.9x more at 1-2 rows
(``bench/cpu_matmul.py``; ``bench/results/cpu-matmul.json``, ``cpu-matmul-one-row.json``,
``cpu-matmul-host-b.json``), and a stand-in weight timed alone misled: on the Intel host it chose the
transposed form at 8-32 rows, which SmolLM2's own layers ran 1.1-2.2x slower at 8-15 rows
(``throughput-cpu-timed-linear.json``). So neither form is hard-wired: the first ``TRIALS`` real
products of each (dtype, weight shape, power-of-two row bucket, thread count) alternate the two forms and
are timed; from then on that kind of product takes the form with the lower median (the transposed one only
when it wins by 5%). The results agree to float rounding.
"""

from __future__ import annotations

import logging
import os
import time
import types
from contextlib import contextmanager
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

MAX_ROWS_ENV = "SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS"
DEFAULT_MAX_ROWS = 64
TRIALS = 8  # timed calls per form before a kind of product settles on one
_SAMPLES: dict[tuple, tuple[list[float], list[float]]] = {}  # key -> (stock seconds, transposed seconds)
_DECIDED: dict[tuple, bool] = {}  # key -> takes the transposed form
_TRIAL_CALLS = 0  # products run as timed trials so far in this process


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


def trial_calls() -> int:
    """How many products have run as timed trials in this process: a decode step during which this grew
    paid for trials (half of them in the slower form), so its time says little about its width."""
    return _TRIAL_CALLS


def few_row_key(x: torch.Tensor, weight: torch.Tensor, max_rows: int) -> tuple | None:
    """For ``x`` [..., K] against ``weight`` [N, K]: the kind of product, (dtype, N, K, row bucket, threads),
    when it may take the transposed form (a CPU, a plain dense weight of x's dtype, 1 .. max_rows rows), else
    None."""
    rows = x.numel() // max(x.shape[-1], 1)
    if not (x.device.type == "cpu" and 1 <= rows <= max_rows and weight.dim() == 2 and weight.is_contiguous()
            and weight.dtype == x.dtype and weight.dtype.is_floating_point):
        return None
    return (x.dtype, *weight.shape, row_bucket(rows), torch.get_num_threads())


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def faster_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stock: Callable[[], torch.Tensor],
                  max_rows: int) -> torch.Tensor:
    """``x @ weight.T + bias`` in the faster form: ``stock()`` (the caller's own way) or ``transposed_linear``,
    trying both on the first ``TRIALS`` products of each kind (``few_row_key``)."""
    key = few_row_key(x, weight, max_rows)
    if key is None:
        return stock()
    choice = _DECIDED.get(key)
    if choice is not None:
        return transposed_linear(x, weight, bias) if choice else stock()
    global _TRIAL_CALLS
    _TRIAL_CALLS += 1
    stock_s, transposed_s = _SAMPLES.setdefault(key, ([], []))
    use_transposed = len(transposed_s) <= len(stock_s)
    t = time.perf_counter()
    out = transposed_linear(x, weight, bias) if use_transposed else stock()
    (transposed_s if use_transposed else stock_s).append(time.perf_counter() - t)
    if len(stock_s) >= TRIALS and len(transposed_s) >= TRIALS:
        stock_ms, transposed_ms = _median(stock_s) * 1e3, _median(transposed_s) * 1e3
        _DECIDED[key] = transposed_ms < 0.95 * stock_ms
        dtype, n, k, bucket, threads = key
        logger.info("sglang-domino few-row linear: %s [%d x %d] at %d-%d rows, %d threads: stock %.2f ms, "
                    "transposed %.2f ms -> %s", str(dtype).removeprefix("torch."), n, k, bucket, 2 * bucket - 1,
                    threads, stock_ms, transposed_ms, "transposed" if _DECIDED[key] else "stock")
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           max_rows: int = DEFAULT_MAX_ROWS) -> torch.Tensor:
    """x [..., K], weight [N, K], bias [N] or None -> [..., N], like ``F.linear``, in the faster form."""
    return faster_linear(x, weight, bias, lambda: F.linear(x, weight, bias), max_rows)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` computed as ``(weight @ x.T).T`` (contiguous), unconditionally; one row as two copies of it
    (a two-column GEMM, not a GEMV)."""
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
    """For the duration, every ``nn.Linear`` of ``model`` computes through ``linear`` (on a CPU, the faster of
    ``F.linear`` and the transposed form at 1..max_rows rows): the Transformers backend's decode and verify
    forwards.
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
