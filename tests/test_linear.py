"""sglang_domino.linear (the few-row CPU matmul) against F.linear, the SGLang hook's routing and the HF patch."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import sglang_domino.linear as lin
from sglang_domino.linear import (MAX_ROWS_ENV, faster_rows, few_row_linears, linear, max_rows_from_env, row_bucket,
                                  takes_transposed, transposed_linear)

EVERY_BUCKET = frozenset(1 << i for i in range(7))  # 1 .. 64 rows


@pytest.fixture
def transposed_everywhere(monkeypatch):
    """As if the transposed form had measured faster at every row count."""
    monkeypatch.setattr(lin, "faster_rows", lambda dtype, max_rows: EVERY_BUCKET)


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


def test_which_products_take_the_transposed_form():
    w = torch.randn(8, 4)
    assert takes_transposed(torch.randn(1, 4), w, 64, EVERY_BUCKET)
    assert takes_transposed(torch.randn(1, 4).bfloat16(), w.bfloat16(), 64, EVERY_BUCKET)
    assert not takes_transposed(torch.randn(1, 4), w, 0, EVERY_BUCKET)  # switched off
    assert takes_transposed(torch.randn(4, 16, 4), w, 64, EVERY_BUCKET)  # 64 rows
    assert not takes_transposed(torch.randn(65, 4), w, 64, EVERY_BUCKET)
    assert not takes_transposed(torch.randn(2, 4), w.t().contiguous().t(), 64, EVERY_BUCKET)  # not row-major
    assert not takes_transposed(torch.randn(2, 4).double(), w, 64, EVERY_BUCKET)  # dtypes differ
    only_2_3 = frozenset({2})  # measured faster at 2 rows only: 2 and 3 rows share that bucket
    assert [takes_transposed(torch.randn(r, 4), w, 64, only_2_3) for r in (1, 2, 3, 4, 7)] == [
        False, True, True, False, False]


def test_row_buckets():
    assert [row_bucket(r) for r in (1, 2, 3, 4, 5, 7, 8, 63, 64)] == [1, 2, 2, 4, 4, 4, 8, 32, 64]


def test_faster_rows_is_measured_once_per_dtype(monkeypatch):
    monkeypatch.setattr(lin, "MEASURE_SHAPE", (256, 64))
    monkeypatch.setattr(lin, "_FASTER", {})
    calls = []
    real = lin.transposed_linear
    monkeypatch.setattr(lin, "transposed_linear", lambda *a: calls.append(1) or real(*a))
    got = faster_rows(torch.float32, 8)
    assert got <= {1, 2, 4, 8} and len(calls) == 4 * 6  # 4 buckets x (warm-up + 5 timed)
    assert faster_rows(torch.float32, 8) is got and len(calls) == 24  # cached
    faster_rows(torch.bfloat16, 8)
    assert len(calls) == 48
    monkeypatch.setattr(lin, "faster_rows", lambda dtype, max_rows: frozenset())  # measured slower everywhere
    assert not takes_transposed(torch.randn(2, 64), torch.randn(8, 64), 64)


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
