"""sglang_domino.linear (the few-row CPU matmul) against F.linear, the SGLang hook's routing and the HF patch."""

import importlib.util
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sglang_domino.linear as lin
from sglang_domino.linear import (MAX_ROWS_ENV, faster_linear, few_row_key, few_row_linears, linear,
                                  max_rows_from_env, row_bucket, transposed_linear)

_spec = importlib.util.spec_from_file_location("throughput", Path(__file__).parents[1] / "bench" / "throughput.py")
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)


class _Every(dict):
    """A verdict table that gives ``value`` for every kind of product."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def get(self, key, default=None):
        return self.value


@pytest.fixture
def transposed_everywhere(monkeypatch):
    """As if the transposed form had been timed faster for every kind of product."""
    monkeypatch.setattr(lin, "_DECIDED", _Every(True))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 64, 65])
@pytest.mark.parametrize("k,n", [(64, 96), (576, 1000), (33, 7)])
def test_matches_f_linear(rows, k, n, dtype, tol):
    g = torch.Generator().manual_seed(rows * 1000 + k)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    for bias in (None, b):
        want = F.linear(x, w, bias)
        for got in (transposed_linear(x, w, bias), linear(x, w, bias)):
            assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_leading_dims_and_grad(transposed_everywhere):
    x = torch.randn(2, 3, 16, requires_grad=True)
    w = torch.randn(10, 16, requires_grad=True)
    y = linear(x, w)
    assert y.shape == (2, 3, 10)
    y.square().sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    F.linear(x2, w2).square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_which_products_may_take_the_transposed_form():
    w = torch.randn(8, 4)
    threads = torch.get_num_threads()
    assert few_row_key(torch.randn(1, 4), w, 64) == (torch.float32, 8, 4, 1, threads)
    assert few_row_key(torch.randn(3, 4).bfloat16(), w.bfloat16(), 64) == (torch.bfloat16, 8, 4, 2, threads)
    assert few_row_key(torch.randn(4, 16, 4), w, 64)[3] == 64  # 64 rows
    assert few_row_key(torch.randn(1, 4), w, 0) is None  # switched off
    assert few_row_key(torch.randn(65, 4), w, 64) is None
    assert few_row_key(torch.randn(2, 4), w.t().contiguous().t(), 64) is None  # not row-major
    assert few_row_key(torch.randn(2, 4).double(), w, 64) is None  # dtypes differ


def test_row_buckets():
    assert [row_bucket(r) for r in (1, 2, 3, 4, 5, 7, 8, 63, 64)] == [1, 2, 2, 4, 4, 4, 8, 32, 64]


@pytest.mark.parametrize("slow", ["stock", "transposed"])
def test_each_kind_of_product_settles_on_the_form_timed_faster(monkeypatch, caplog, tmp_path, slow):
    caplog.set_level(logging.INFO, logger=lin.__name__)
    monkeypatch.setattr(lin, "_SAMPLES", {})
    monkeypatch.setattr(lin, "_DECIDED", {})
    real, calls = lin.transposed_linear, []

    def transposed(*a):
        calls.append("transposed")
        if slow == "transposed":
            time.sleep(0.002)
        return real(*a)

    def stock():
        calls.append("stock")
        if slow == "stock":
            time.sleep(0.002)
        return F.linear(x, w)

    monkeypatch.setattr(lin, "transposed_linear", transposed)
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    for _ in range(2 * lin.TRIALS + 5):
        torch.testing.assert_close(faster_linear(x, w, None, stock, 64), F.linear(x, w))
    trials = calls[:2 * lin.TRIALS]
    assert trials.count("stock") == trials.count("transposed") == lin.TRIALS  # alternating
    fast = "transposed" if slow == "stock" else "stock"
    assert calls[2 * lin.TRIALS:] == [fast] * 5
    assert lin._DECIDED == {few_row_key(x, w, 64): fast == "transposed"}
    faster_linear(torch.randn(5, 16), w, None, lambda: F.linear(torch.randn(5, 16), w), 64)  # another bucket
    assert len(lin._SAMPLES) == 2 and len(lin._DECIDED) == 1
    log = tmp_path / "server.log"  # the verdict as bench/throughput.py reads it back from a server log
    log.write_text("\n".join(f"[time] {r.getMessage()}" for r in caplog.records) + "\n")
    (verdict,) = throughput.linear_verdicts(str(log))
    assert verdict.startswith("float32 [8 x 16] at 2-3 rows") and verdict.endswith(f"-> {fast}")


def test_env(monkeypatch):
    monkeypatch.delenv(MAX_ROWS_ENV, raising=False)
    assert max_rows_from_env() == 64
    monkeypatch.setenv(MAX_ROWS_ENV, "0")
    assert max_rows_from_env() == 0
    for bad in ("x", "-1"):
        monkeypatch.setenv(MAX_ROWS_ENV, bad)
        with pytest.raises(ValueError, match=MAX_ROWS_ENV):
            max_rows_from_env()


def test_sglang_linear_hook_routes_by_rows(transposed_everywhere):
    from sglang_domino.serving.cpu.linear import linear_apply_around

    calls = []

    def original(method, layer, x, bias=None):
        calls.append(x.shape[0])
        return F.linear(x, layer.weight, bias)

    layer = SimpleNamespace(weight=torch.randn(12, 8))
    for rows in (1, 5, 64, 65):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(linear_apply_around(original, None, layer, x), F.linear(x, layer.weight))
    assert calls == [65]
    amx = SimpleNamespace(weight=layer.weight, use_intel_amx_backend=True)
    linear_apply_around(original, None, amx, torch.randn(3, 8))
    assert calls == [65, 3]


def test_few_row_linears_patches_for_the_duration_only(monkeypatch, transposed_everywhere):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8, bias=False))
    x = torch.randn(3, 16)
    want = model(x)
    calls = []
    real = lin.transposed_linear
    monkeypatch.setattr(lin, "transposed_linear", lambda *a: calls.append(1) or real(*a))
    with few_row_linears(model, max_rows=64):
        torch.testing.assert_close(model(x), want)
        assert len(calls) == 2  # both layers, 3 rows: the transposed form
    with few_row_linears(model, max_rows=0):
        model(x)
    model(x)
    assert len(calls) == 2 and not any("forward" in vars(m) for m in model)


def test_trial_calls_count_only_timed_trials(monkeypatch):
    monkeypatch.setattr(lin, "_SAMPLES", {})
    monkeypatch.setattr(lin, "_DECIDED", {})
    x, w = torch.randn(2, 16), torch.randn(8, 16)
    before = lin.trial_calls()
    for _ in range(2 * lin.TRIALS + 3):
        linear(x, w)
    assert lin.trial_calls() - before == 2 * lin.TRIALS  # settled after the trials: no more counted
    linear(torch.randn(100, 16), w)  # more rows than max_rows: the stock form, untimed
    assert lin.trial_calls() - before == 2 * lin.TRIALS
