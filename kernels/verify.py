"""Triton chain verification for a batch. The torch references (the spec) are
``sglang_domino.verify.verify_greedy`` / ``verify_sampled``, re-exported here with a ``_reference`` suffix.

Each verification is two launches:

    greedy   _argmax_partial_kernel   per (row, position, vocabulary chunk): max and first argmax
             _greedy_accept_kernel    per row: target tokens, accept length, bonus, committed tokens
    sampled  _residual_kernel         per (row, vocabulary chunk): accept length (recomputed by each
                                      program from n gathers), then over the chunk the residual
                                      max(p - q, 0) at the stopping position and both exponential races
                                      argmax(residual / E) and argmax(p / E)
             _sampled_finish_kernel   per row: bonus = the residual race, or the p race when the residual
                                      is all zero (rounding), accept length, committed tokens

Besides ``(accept_len, bonus)`` the ``*_commit`` functions return a ``Verdict`` (defined, with its torch
reference ``commit_reference``, in ``dispatch.py``): ``commit_len = accept_len + 1`` (positions of the
verified chain ``[bonus_prev, y_1 .. y_n]`` whose KV stays; the rest can be freed) and ``tokens``
[b, n+1] = the accepted drafts then the new bonus, -1 after.
The sampled path compares and divides exactly as the reference does (IEEE division), so it is
bit-identical to it for fp32 inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_domino.kernels.dispatch import Verdict, commit_reference  # noqa: F401
from sglang_domino.verify import verify_greedy as verify_greedy_reference  # noqa: F401  (the spec)
from sglang_domino.verify import verify_sampled as verify_sampled_reference  # noqa: F401

BLOCK_V = 1024  # vocabulary tile
CHUNK_TILES = 4  # tiles per program: a program scans CHUNK_TILES * BLOCK_V entries of a row
NUM_WARPS = 4


# -- kernels ------------------------------------------------------------------------------------------
@triton.jit
def _argmax_partial_kernel(
    logits_ptr, stride_b, stride_j,  # target_logits [b, n+1, V], unit stride over V
    val_ptr, idx_ptr,  # [b, n+1, n_chunks] out
    n1, V, n_chunks,
    BLOCK_V: tl.constexpr, CHUNK_TILES: tl.constexpr,
):
    row_pos = tl.program_id(0)  # row * (n + 1) + position
    chunk = tl.program_id(1)
    row, pos = row_pos // n1, row_pos % n1
    base = logits_ptr + row.to(tl.int64) * stride_b + pos.to(tl.int64) * stride_j
    best_v = float("-inf")
    best_i = 0
    start = chunk * CHUNK_TILES * BLOCK_V
    for t in range(CHUNK_TILES):
        vs = start + t * BLOCK_V + tl.arange(0, BLOCK_V)
        x = tl.load(base + vs, mask=vs < V, other=float("-inf")).to(tl.float32)
        m, i = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
        better = m > best_v
        best_i = tl.where(better, start + t * BLOCK_V + i, best_i)
        best_v = tl.where(better, m, best_v)
    tl.store(val_ptr + row_pos * n_chunks + chunk, best_v)
    tl.store(idx_ptr + row_pos * n_chunks + chunk, best_i)


@triton.jit
def _first_argmax(val, idx):
    """Per row of [R, C] partials in vocabulary order: the first index holding the maximum."""
    m = tl.max(val, 1)
    return tl.min(tl.where(val == m[:, None], idx, 2147483647), 1)


@triton.jit
def _write_commit(draft_row_ptr, draft_stride, row, a, bonus, accept_ptr, bonus_ptr, commit_ptr,
                  tokens_ptr, n, BLOCK_N1: tl.constexpr):
    js = tl.arange(0, BLOCK_N1)
    d = tl.load(draft_row_ptr + js * draft_stride, mask=js < n, other=-1)
    tok = tl.where(js < a, d, tl.where(js == a, bonus, -1))
    tl.store(tokens_ptr + row * (n + 1) + js, tok.to(tl.int64), mask=js < n + 1)
    tl.store(accept_ptr + row, a.to(tl.int64))
    tl.store(bonus_ptr + row, bonus.to(tl.int64))
    tl.store(commit_ptr + row, (a + 1).to(tl.int64))


@triton.jit
def _greedy_accept_kernel(
    draft_ptr, draft_stride_b, draft_stride_j,  # [b, n]
    val_ptr, idx_ptr,  # [b, n+1, n_chunks]
    accept_ptr, bonus_ptr, commit_ptr, tokens_ptr,
    n, n_chunks,
    BLOCK_N1: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    js = tl.arange(0, BLOCK_N1)
    cs = tl.arange(0, BLOCK_C)
    mask = (js < n + 1)[:, None] & (cs < n_chunks)[None, :]
    offs = (row * (n + 1) + js)[:, None] * n_chunks + cs[None, :]
    target = _first_argmax(tl.load(val_ptr + offs, mask=mask, other=float("-inf")),
                           tl.load(idx_ptr + offs, mask=mask, other=2147483647))
    d = tl.load(draft_ptr + row * draft_stride_b + js * draft_stride_j, mask=js < n, other=-1)
    miss = (d != target) & (js < n)
    a = tl.min(tl.where(miss, js, n), 0)
    bonus = tl.sum(tl.where(js == a, target, 0), 0)
    _write_commit(draft_ptr + row * draft_stride_b, draft_stride_j, row, a, bonus, accept_ptr, bonus_ptr,
                  commit_ptr, tokens_ptr, n, BLOCK_N1)


@triton.jit
def _accept_len(draft_ptr, draft_stride_j, q_ptr, q_stride_j, p_ptr, p_stride_j, u_ptr, u_stride_j, n,
                BLOCK_N1: tl.constexpr):
    """First j with not (u_j * q_j(y) < p_j(y)), or n. Pointers are at the row's start."""
    js = tl.arange(0, BLOCK_N1)
    ok = js < n
    y = tl.load(draft_ptr + js * draft_stride_j, mask=ok, other=0).to(tl.int64)
    q_y = tl.load(q_ptr + js.to(tl.int64) * q_stride_j + y, mask=ok, other=0.0).to(tl.float32)
    p_y = tl.load(p_ptr + js.to(tl.int64) * p_stride_j + y, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + js * u_stride_j, mask=ok, other=1.0).to(tl.float32)
    reject = ~(u * q_y < p_y) & ok
    return tl.min(tl.where(reject, js, n), 0)


@triton.jit
def _residual_kernel(
    draft_ptr, draft_stride_b, draft_stride_j,  # [b, n]
    q_ptr, q_stride_b, q_stride_j,  # [b, n, V]
    p_ptr, p_stride_b, p_stride_j,  # [b, n+1, V]
    u_ptr, u_stride_b, u_stride_j,  # [b, n]
    e_ptr, e_stride_b,  # [b, V]
    rval_ptr, ridx_ptr, rmax_ptr, pval_ptr, pidx_ptr,  # [b, n_chunks] out
    n, V, n_chunks,
    BLOCK_N1: tl.constexpr, BLOCK_V: tl.constexpr, CHUNK_TILES: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row64 = row.to(tl.int64)
    q_row = q_ptr + row64 * q_stride_b
    p_row = p_ptr + row64 * p_stride_b
    a = _accept_len(draft_ptr + row64 * draft_stride_b, draft_stride_j, q_row, q_stride_j, p_row, p_stride_j,
                    u_ptr + row64 * u_stride_b, u_stride_j, n, BLOCK_N1)
    p_stop = p_row + a.to(tl.int64) * p_stride_j
    q_stop = q_row + a.to(tl.int64) * q_stride_j  # not read when a == n (all accepted: q counts as 0)
    r_best, r_idx, r_max = float("-inf"), 0, 0.0
    p_best, p_idx = float("-inf"), 0
    start = chunk * CHUNK_TILES * BLOCK_V
    for t in range(CHUNK_TILES):
        vs = start + t * BLOCK_V + tl.arange(0, BLOCK_V)
        ok = vs < V
        pv = tl.load(p_stop + vs, mask=ok, other=0.0).to(tl.float32)
        qv = tl.load(q_stop + vs, mask=ok & (a < n), other=0.0).to(tl.float32)
        res = tl.maximum(pv - qv, 0.0)
        e = tl.maximum(tl.load(e_ptr + row64 * e_stride_b + vs, mask=ok, other=1.0).to(tl.float32), 1e-20)
        rk = tl.where(ok, tl.math.div_rn(res, e), float("-inf"))
        pk = tl.where(ok, tl.math.div_rn(pv, e), float("-inf"))
        m, i = tl.max(rk, 0, return_indices=True, return_indices_tie_break_left=True)
        better = m > r_best
        r_idx = tl.where(better, start + t * BLOCK_V + i, r_idx)
        r_best = tl.where(better, m, r_best)
        m, i = tl.max(pk, 0, return_indices=True, return_indices_tie_break_left=True)
        better = m > p_best
        p_idx = tl.where(better, start + t * BLOCK_V + i, p_idx)
        p_best = tl.where(better, m, p_best)
        r_max = tl.maximum(r_max, tl.max(res, 0))
    out = row * n_chunks + chunk
    tl.store(rval_ptr + out, r_best)
    tl.store(ridx_ptr + out, r_idx)
    tl.store(rmax_ptr + out, r_max)
    tl.store(pval_ptr + out, p_best)
    tl.store(pidx_ptr + out, p_idx)


@triton.jit
def _sampled_finish_kernel(
    draft_ptr, draft_stride_b, draft_stride_j,
    q_ptr, q_stride_b, q_stride_j,
    p_ptr, p_stride_b, p_stride_j,
    u_ptr, u_stride_b, u_stride_j,
    rval_ptr, ridx_ptr, rmax_ptr, pval_ptr, pidx_ptr,
    accept_ptr, bonus_ptr, commit_ptr, tokens_ptr,
    n, n_chunks,
    BLOCK_N1: tl.constexpr, BLOCK_C: tl.constexpr,
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    a = _accept_len(draft_ptr + row64 * draft_stride_b, draft_stride_j, q_ptr + row64 * q_stride_b, q_stride_j,
                    p_ptr + row64 * p_stride_b, p_stride_j, u_ptr + row64 * u_stride_b, u_stride_j, n, BLOCK_N1)
    cs = tl.arange(0, BLOCK_C)
    ok = cs < n_chunks
    offs = row * n_chunks + cs
    r_tok = _first_argmax(tl.load(rval_ptr + offs, mask=ok, other=float("-inf"))[None, :],
                          tl.load(ridx_ptr + offs, mask=ok, other=2147483647)[None, :])
    p_tok = _first_argmax(tl.load(pval_ptr + offs, mask=ok, other=float("-inf"))[None, :],
                          tl.load(pidx_ptr + offs, mask=ok, other=2147483647)[None, :])
    any_res = tl.max(tl.load(rmax_ptr + offs, mask=ok, other=0.0), 0) > 0.0
    bonus = tl.sum(tl.where(any_res, r_tok, p_tok), 0)  # [1] -> scalar
    _write_commit(draft_ptr + row64 * draft_stride_b, draft_stride_j, row, a, bonus, accept_ptr, bonus_ptr,
                  commit_ptr, tokens_ptr, n, BLOCK_N1)


# -- host ---------------------------------------------------------------------------------------------
def _outputs(b: int, n: int, device) -> tuple[torch.Tensor, ...]:
    return (torch.empty(b, dtype=torch.long, device=device), torch.empty(b, dtype=torch.long, device=device),
            torch.empty(b, dtype=torch.long, device=device), torch.empty(b, n + 1, dtype=torch.long, device=device))


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def verify_greedy_commit(draft: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """draft: [b, n]; target_logits: [b, n+1, V]. Returns a Verdict (see the module docstring)."""
    b, n = draft.shape
    if target_logits.dim() != 3 or target_logits.shape[:2] != (b, n + 1):
        raise ValueError(f"target_logits {tuple(target_logits.shape)} must be [b, n+1, V] for draft {(b, n)}")
    vocab = target_logits.shape[-1]
    out = _outputs(b, n, draft.device)
    if b == 0:
        return Verdict(*out)
    logits = _unit_last(target_logits)
    n_chunks = triton.cdiv(vocab, BLOCK_V * CHUNK_TILES)
    val = torch.empty(b, n + 1, n_chunks, dtype=torch.float32, device=draft.device)
    idx = torch.empty(b, n + 1, n_chunks, dtype=torch.int32, device=draft.device)
    _argmax_partial_kernel[(b * (n + 1), n_chunks)](
        logits, logits.stride(0), logits.stride(1), val, idx, n + 1, vocab, n_chunks,
        BLOCK_V=BLOCK_V, CHUNK_TILES=CHUNK_TILES, num_warps=NUM_WARPS,
    )
    _greedy_accept_kernel[(b,)](
        draft, draft.stride(0), draft.stride(1), val, idx, *out, n, n_chunks,
        BLOCK_N1=triton.next_power_of_2(n + 1), BLOCK_C=triton.next_power_of_2(n_chunks), num_warps=1,
    )
    return Verdict(*out)


def verify_sampled_commit(
    draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor, uniform: torch.Tensor, exponential: torch.Tensor
) -> Verdict:
    """draft: [b, n]; q: [b, n, V]; p: [b, n+1, V]; uniform: [b, n]; exponential: [b, V] (read as fp32).
    Returns a Verdict (see the module docstring)."""
    b, n = draft.shape
    vocab = p.shape[-1]
    if q.shape != (b, n, vocab) or p.shape != (b, n + 1, vocab) or uniform.shape != (b, n) \
            or exponential.shape != (b, vocab):
        raise ValueError(f"shapes: draft {tuple(draft.shape)}, q {tuple(q.shape)}, p {tuple(p.shape)}, "
                         f"uniform {tuple(uniform.shape)}, exponential {tuple(exponential.shape)}")
    out = _outputs(b, n, draft.device)
    if b == 0:
        return Verdict(*out)
    q, p, e = _unit_last(q), _unit_last(p), _unit_last(exponential)
    n_chunks = triton.cdiv(vocab, BLOCK_V * CHUNK_TILES)
    parts = [torch.empty(b, n_chunks, dtype=dt, device=draft.device)
             for dt in (torch.float32, torch.int32, torch.float32, torch.float32, torch.int32)]
    common = (draft, draft.stride(0), draft.stride(1), q, q.stride(0), q.stride(1), p, p.stride(0), p.stride(1),
              uniform, uniform.stride(0), uniform.stride(1))
    block_n1 = triton.next_power_of_2(n + 1)
    _residual_kernel[(b, n_chunks)](
        *common, e, e.stride(0), *parts, n, vocab, n_chunks,
        BLOCK_N1=block_n1, BLOCK_V=BLOCK_V, CHUNK_TILES=CHUNK_TILES, num_warps=NUM_WARPS,
    )
    _sampled_finish_kernel[(b,)](
        *common, *parts, *out, n, n_chunks,
        BLOCK_N1=block_n1, BLOCK_C=triton.next_power_of_2(n_chunks), num_warps=1,
    )
    return Verdict(*out)


def verify_greedy(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``sglang_domino.verify.verify_greedy``: (accept_len [b], bonus [b]) int64."""
    v = verify_greedy_commit(draft, target_logits)
    return v.accept_len, v.bonus


def verify_sampled(draft, q, p, uniform, exponential) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``sglang_domino.verify.verify_sampled``: (accept_len [b], bonus [b]) int64."""
    v = verify_sampled_commit(draft, q, p, uniform, exponential)
    return v.accept_len, v.bonus
