"""Triton Domino rollout: the head's GRU, its correction MLP, the base-logit add and the argmax / draw,
fused per step. The torch reference (the spec) is ``sglang_domino.rollout.rollout``, re-exported here as
``rollout_reference``; ``tests/test_kernels.py`` holds one to the other.

One step of the chain, for the whole batch at once, is a few launches. The matmul kernels are
weight-stationary (a program owns a tile of a weight matrix and multiplies every batch row by it, so a
weight is read once per step whatever the batch); vocabulary-wide results are combined per row:

    _zproj_kernel      split-K partials of z @ w1[:, :H]^T for all steps      grid (E tiles, K chunks, row blocks)
                       (once, before the loop; summed in torch)
    _hidden_kernel     hid = silu(zproj_i + sum of the s @ w1[:, H:]^T shares) grid (E tiles, row blocks)
    _logits_kernel     l = base_i + hid @ w2^T; per-tile max / first argmax,  grid (V tiles, row blocks)
                       for sampling also l / T -> q and per-tile sum of exp
    _row_reduce_kernel combine a row's tiles: first argmax -> tokens[:, i];    grid (rows,)
                       for sampling the row's max and sum of exp
    _sample_kernel     q = softmax(l / T) (one-hot where T = 0) -> q, and      grid (V tiles, row blocks)
                       per-tile argmax of q / E (the exponential race)
    _gates_kernel      split-K partial products E[y] @ w_ih^T, s @ w_hh^T     grid (3G tiles, K chunks, row blocks)
                       (with a gate table only s @ w_hh^T)
    _gru_kernel        s = GRUCell(E[y], s) from the summed partials (or the  grid (G tiles, row blocks)
                       gate table's row y), and this G tile's share of
                       round(s) @ w1[:, H:]^T

Greedy step: hidden, logits, row_reduce, gates, gru; the [b, V] logits never reach memory. Temperature
sampling adds row_reduce (softmax statistics) and sample before the row_reduce that draws. With top-k /
top-p the logits are written to ``q`` and turned into probabilities by the torch ``draft_probs`` in
place of the statistics pass (the rest stays fused). Partial sums are added in a fixed order, so results
are deterministic. A persistent kernel over the block would need a grid-wide barrier between steps (each
step needs the previous token, an argmax over the whole vocabulary), so the steps are separate
launches: capture them in a CUDA graph to hide the launch cost (the greedy path has no host syncs).

Numerics follow the reference: the GRU runs in fp32 on fp32-cast weights; the correction is computed the
way ``correction`` computes it in the weights' dtype (fp32 accumulation, rounded to that dtype after
each Linear and after the SiLU; ``s`` is rounded to it first), then added in fp32. Operands that are
exact in one 16-bit dtype are multiplied by native 16-bit MMAs (``NATIVE_DOT``; else as fp32 with
``input_precision="tf32"``, also exact for them); true fp32 operands use ``F32_DOT`` ("tf32x3" by
default; set ``SGLANG_DOMINO_F32_DOT=ieee`` for plain fp32 FMAs).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sglang_domino.drafter import HeadWeights
from sglang_domino.rollout import rollout as rollout_reference  # noqa: F401  (the spec)
from sglang_domino.sampling import BatchSampling, draft_probs

F32_DOT = os.environ.get("SGLANG_DOMINO_F32_DOT", "tf32x3")
NATIVE_DOT = True  # 16-bit operands: native 16-bit MMAs rather than tf32 on fp32-cast tiles (see _prec)

# Tile sizes (read at call time, so tests can shrink them to exercise multi-tile paths). K_CHUNK 1024 with
# BLOCK_N 64 was the fastest of the H200 sweeps at Qwen3-8B shapes (bench/results/kernels-cuda*.json).
BLOCK_V = 128  # vocabulary tile of the logits / sample kernels
BLOCK_T = 1024  # how many per-tile partials one step of _row_reduce_kernel reads
BLOCK_N = 64  # output tile of the GRU gate products (3G outputs)
K_CHUNK = 1024  # split-K: each _gates_kernel / _zproj_kernel program reduces this many inputs
BLOCK_G = 64  # GRU state tile of _gru_kernel
BLOCK_E = 32  # embed_proj hidden tile
BLOCK_K = 64  # reduction (K) tile of every matmul
NUM_WARPS = 4

_MODE_ARGMAX, _MODE_SOFTMAX, _MODE_RAW = 0, 1, 2


# -- device helpers -----------------------------------------------------------------------------------
@triton.jit
def _round(x, RND: tl.constexpr):
    """Round fp32 ``x`` to the head's dtype and back (RND: 0 fp32, 1 bf16, 2 fp16), nearest-even."""
    if RND == 1:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    elif RND == 2:
        x = x.to(tl.float16).to(tl.float32)
    return x


@triton.jit
def _dot(a, w, acc, PREC: tl.constexpr):
    """acc + a @ w with fp32 accumulation. PREC "native": a 16-bit MMA in w's dtype (a's values must be
    exact in it); else both sides as fp32 with that input_precision."""
    if PREC == "native":
        return tl.dot(a.to(w.dtype), w, acc)
    else:
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision=PREC)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


# -- kernels ------------------------------------------------------------------------------------------
@triton.jit
def _zproj_kernel(
    z_ptr,  # [M, H] contiguous (all b * n backbone states)
    w1_ptr,  # [E, H + G] contiguous; only its first H columns are used
    out_ptr,  # [K chunks, M, E] fp32
    M, H, G, E,
    PREC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    K_CHUNK: tl.constexpr,
):
    """The step-independent half of embed_proj's first Linear for the whole block, z @ w1[:, :H]^T, as
    split-K partials: program (e, k) covers K_CHUNK of the H inputs."""
    cols = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < M
    col_ok = cols < E
    rows64 = rows.to(tl.int64)
    acc = tl.zeros([BLOCK_B, BLOCK_E], tl.float32)
    k_hi = tl.minimum(pid_k * K_CHUNK + K_CHUNK, H)  # a chunk may be shorter than BLOCK_K
    for k0 in range(pid_k * K_CHUNK, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_hi
        x = tl.load(z_ptr + rows64[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w1_ptr + cols[None, :] * (H + G) + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _dot(x, w, acc, PREC)
    tl.store(out_ptr + (pid_k * M + rows64[:, None]) * E + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gates_kernel(
    tok_ptr, tok_stride,  # [b] tokens y
    embed_ptr, embed_stride,  # [V, H]
    s_ptr,  # [b, G] fp32 state
    w_ih_ptr, w_hh_ptr,  # [3G, H], [3G, G] contiguous
    part_ptr,  # [split_x + split_h, b, 3G] fp32 out
    B, H, G, split_x,
    X_PREC: tl.constexpr, H_PREC: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_CHUNK: tl.constexpr,
):
    """Split-K partial GRU gate products: program (n, k) computes, for K_CHUNK inputs, E[y] @ w_ih^T
    (k < split_x) or s @ w_hh^T (k >= split_x) for one tile of the 3G gate outputs."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    col_ok = cols < 3 * G
    acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    if pid_k < split_x:
        tok = tl.load(tok_ptr + rows * tok_stride, mask=row_ok, other=0).to(tl.int64)
        k_hi = tl.minimum(pid_k * K_CHUNK + K_CHUNK, H)  # a chunk may be shorter than BLOCK_K
        for k0 in range(pid_k * K_CHUNK, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < k_hi
            x = tl.load(embed_ptr + tok[:, None] * embed_stride + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ih_ptr + cols[None, :].to(tl.int64) * H + ks[:, None], mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)
            acc = _dot(x, w, acc, X_PREC)
    else:
        k_start = (pid_k - split_x) * K_CHUNK
        k_hi = tl.minimum(k_start + K_CHUNK, G)
        for k0 in range(k_start, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < k_hi
            x = tl.load(s_ptr + rows[:, None] * G + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_hh_ptr + cols[None, :] * G + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(x, w.to(tl.float32), acc, input_precision=H_PREC)
    out = (pid_k * B + rows[:, None]).to(tl.int64) * (3 * G) + cols[None, :]
    tl.store(part_ptr + out, acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _sum_parts(part_ptr, k_lo, k_hi, B, G3, offs, mask, BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr):
    acc = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
    for k in range(k_lo, k_hi):  # fixed order: deterministic
        acc += tl.load(part_ptr + (k * B).to(tl.int64) * G3 + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def _gru_kernel(
    part_ptr, split_x, split_h,  # gate partials from _gates_kernel
    tok_ptr, tok_stride, table_ptr,  # TABLE: tokens y [b] and the gate table [V, 3G] fp32
    s_in_ptr, s_out_ptr,  # [b, G] fp32
    w1_ptr,  # [E, H + G] contiguous
    hpart_ptr,  # [n_g_tiles, b, E] fp32 out: this tile's share of s_out @ w1[:, H:]^T
    B, H, G, E,
    HAS_STATE: tl.constexpr, HID_PART: tl.constexpr, TABLE: tl.constexpr, RND: tl.constexpr,
    PREC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """s_out = GRUCell(E[y], s_in) for one tile of G from the summed gate partials (s_in = 0 when not
    HAS_STATE), in fp32, the input gates E[y] @ w_ih^T read from the gate table when TABLE (then
    split_x = 0); then (HID_PART) the tile's split-K share of round(s_out) @ w1[:, H:]^T."""
    pid_g = tl.program_id(0)
    cols = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    col_ok = cols < G
    mask = row_ok[:, None] & col_ok[None, :]
    offs = rows[:, None] * (3 * G) + cols[None, :]
    if TABLE:
        tok = tl.load(tok_ptr + rows * tok_stride, mask=row_ok, other=0).to(tl.int64)
        t_offs = tok[:, None] * (3 * G) + cols[None, :]
        i_r = tl.load(table_ptr + t_offs, mask=mask, other=0.0)
        i_z = tl.load(table_ptr + t_offs + G, mask=mask, other=0.0)
        i_n = tl.load(table_ptr + t_offs + 2 * G, mask=mask, other=0.0)
    else:
        i_r = _sum_parts(part_ptr, 0, split_x, B, 3 * G, offs, mask, BLOCK_B, BLOCK_G)
        i_z = _sum_parts(part_ptr, 0, split_x, B, 3 * G, offs + G, mask, BLOCK_B, BLOCK_G)
        i_n = _sum_parts(part_ptr, 0, split_x, B, 3 * G, offs + 2 * G, mask, BLOCK_B, BLOCK_G)
    if HAS_STATE:
        k_hi = split_x + split_h
        h_r = _sum_parts(part_ptr, split_x, k_hi, B, 3 * G, offs, mask, BLOCK_B, BLOCK_G)
        h_z = _sum_parts(part_ptr, split_x, k_hi, B, 3 * G, offs + G, mask, BLOCK_B, BLOCK_G)
        h_n = _sum_parts(part_ptr, split_x, k_hi, B, 3 * G, offs + 2 * G, mask, BLOCK_B, BLOCK_G)
        h = tl.load(s_in_ptr + rows[:, None] * G + cols[None, :], mask=mask, other=0.0)
        r = tl.sigmoid(i_r + h_r)
        u = tl.sigmoid(i_z + h_z)
        s_new = (1.0 - u) * _tanh(i_n + r * h_n) + u * h
    else:  # zero state: GRUCell(x, 0)
        s_new = (1.0 - tl.sigmoid(i_z)) * _tanh(i_n)
    tl.store(s_out_ptr + rows[:, None] * G + cols[None, :], s_new, mask=mask)
    if HID_PART:
        s_r = tl.where(mask, _round(s_new, RND), 0.0)
        for e0 in range(0, E, BLOCK_E):
            es = e0 + tl.arange(0, BLOCK_E)
            e_ok = es < E
            w = tl.load(w1_ptr + es[None, :] * (H + G) + H + cols[:, None], mask=col_ok[:, None] & e_ok[None, :],
                        other=0.0)
            part = _dot(s_r, w, tl.zeros([BLOCK_B, BLOCK_E], tl.float32), PREC)
            tl.store(hpart_ptr + (pid_g * B + rows[:, None]) * E + es[None, :], part,
                     mask=row_ok[:, None] & e_ok[None, :])


@triton.jit
def _hidden_kernel(
    zp_ptr, zp_stride_b, zp_off,  # zproj[:, i] = zp_ptr + zp_off + row * zp_stride_b, [b, E] fp32
    hpart_ptr, n_parts,  # [n_parts, b, E] fp32 shares of round(s) @ w1[:, H:]^T
    hid_ptr,  # [b, E] fp32 out (values rounded to the head's dtype)
    B, E,
    RND: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """hid = silu(z_i @ w1[:, :H]^T + s @ w1[:, H:]^T), rounded like the reference's ops in the head's dtype."""
    cols = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (rows < B)[:, None] & (cols < E)[None, :]
    acc = tl.load(zp_ptr + zp_off + rows[:, None] * zp_stride_b + cols[None, :], mask=mask, other=0.0)
    for p in range(0, n_parts):
        acc += tl.load(hpart_ptr + (p * B + rows[:, None]) * E + cols[None, :], mask=mask, other=0.0)
    pre = _round(acc, RND)
    hid = _round(pre * tl.sigmoid(pre), RND)
    tl.store(hid_ptr + rows[:, None] * E + cols[None, :], hid, mask=mask)


@triton.jit
def _logits_kernel(
    base_ptr, base_stride_b, base_off,  # base_logits[:, i] = base_ptr + base_off + row * base_stride_b
    hid_ptr,  # [b, E] fp32
    w2_ptr,  # [V, E] contiguous
    temp_ptr,  # [b] fp32 temperatures (softmax mode)
    out_ptr, out_stride_b, out_off,  # q[:, i] (softmax / raw mode)
    part_val_ptr, part_idx_ptr,  # [b, n_tiles] per-tile max / first argmax
    part_max_ptr, part_sum_ptr,  # [b, n_tiles] per-tile max of l/T and sum exp(l/T - max) (softmax mode)
    B, V, E, n_tiles,
    HAS_CORR: tl.constexpr, MODE: tl.constexpr, RND: tl.constexpr, PREC: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """l = base_i + round(hid @ w2^T) for one vocabulary tile, then by MODE: 0 per-tile argmax of l;
    1 l / T -> out plus per-tile argmax, max and sum of exp; 2 l -> out."""
    pid_v = tl.program_id(0)
    vs = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    v_ok = vs < V
    mask = row_ok[:, None] & v_ok[None, :]
    rows64 = rows.to(tl.int64)
    logits = tl.load(base_ptr + base_off + rows64[:, None] * base_stride_b + vs[None, :], mask=mask,
                     other=0.0).to(tl.float32)
    if HAS_CORR:
        acc = tl.zeros([BLOCK_B, BLOCK_V], tl.float32)
        for k0 in range(0, E, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < E
            h = tl.load(hid_ptr + rows[:, None] * E + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w2_ptr + vs[None, :].to(tl.int64) * E + ks[:, None], mask=k_ok[:, None] & v_ok[None, :],
                        other=0.0)
            acc = _dot(h, w, acc, PREC)
        logits = logits + _round(acc, RND)
    out_offs = out_off + rows64[:, None] * out_stride_b + vs[None, :]
    if MODE == 2:
        tl.store(out_ptr + out_offs, logits, mask=mask)
    else:
        if MODE == 1:
            temp = tl.load(temp_ptr + rows, mask=row_ok, other=1.0)
            temp = tl.where(temp == 0.0, 1.0, temp)
            logits = tl.math.div_rn(logits, temp[:, None])
            tl.store(out_ptr + out_offs, logits, mask=mask)
        logits = tl.where(mask, logits, float("-inf"))
        m, i = tl.max(logits, 1, return_indices=True, return_indices_tie_break_left=True)
        part = rows * n_tiles + pid_v
        tl.store(part_val_ptr + part, m, mask=row_ok)
        tl.store(part_idx_ptr + part, pid_v * BLOCK_V + i, mask=row_ok)
        if MODE == 1:
            e = tl.where(logits > float("-inf"), tl.exp(logits - tl.where(m > float("-inf"), m, 0.0)[:, None]), 0.0)
            tl.store(part_max_ptr + part, m, mask=row_ok)
            tl.store(part_sum_ptr + part, tl.sum(e, 1), mask=row_ok)


@triton.jit
def _row_reduce_kernel(
    part_val_ptr, part_idx_ptr,  # [b, n_tiles] per-tile max / first argmax
    part_max_ptr, part_sum_ptr,  # [b, n_tiles] per-tile max and sum exp(x - max) (SOFTMAX)
    tok_ptr, tok_stride,  # out: the row's first argmax (int64)
    stats_ptr,  # out (SOFTMAX): [b, 2] fp32, the row's max and sum exp(x - max)
    n_tiles,
    SOFTMAX: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """Combine one row's per-tile partials (tiles in vocabulary order; ties go to the first index)."""
    row = tl.program_id(0)
    best_v, best_i = float("-inf"), 0
    big, total = float("-inf"), 0.0
    for t0 in range(0, n_tiles, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        ok = ts < n_tiles
        v = tl.load(part_val_ptr + row * n_tiles + ts, mask=ok, other=float("-inf"))
        i = tl.load(part_idx_ptr + row * n_tiles + ts, mask=ok, other=2147483647)
        cm = tl.max(v, 0)
        ci = tl.min(tl.where(v == cm, i, 2147483647), 0)
        better = cm > best_v  # an earlier chunk keeps a tie
        best_i = tl.where(better, ci, best_i)
        best_v = tl.where(better, cm, best_v)
        if SOFTMAX:
            pm = tl.load(part_max_ptr + row * n_tiles + ts, mask=ok, other=float("-inf"))
            ps = tl.load(part_sum_ptr + row * n_tiles + ts, mask=ok, other=0.0)
            new_big = tl.maximum(big, tl.max(pm, 0))
            safe = tl.where(new_big > float("-inf"), new_big, 0.0)
            total = total * tl.exp(big - safe) + tl.sum(tl.where(pm > float("-inf"), ps * tl.exp(pm - safe), 0.0), 0)
            big = new_big
    tl.store(tok_ptr + row * tok_stride, best_i.to(tl.int64))
    if SOFTMAX:
        tl.store(stats_ptr + 2 * row, big)
        tl.store(stats_ptr + 2 * row + 1, total)


@triton.jit
def _sample_kernel(
    q_ptr, q_stride_b, q_off,  # q[:, i]: l / T on entry (softmax mode) or probabilities (PROBS_GIVEN)
    exp_ptr, exp_stride_b, exp_off,  # exponential[:, i]
    temp_ptr,  # [b] fp32
    stats_ptr, top_ptr,  # [b, 2] max / sum exp of l / T, [b] argmax of l (from _row_reduce_kernel)
    race_val_ptr, race_idx_ptr,  # [b, n_tiles] out: per-tile max / first argmax of q / E
    B, V, n_tiles,
    PROBS_GIVEN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """q = softmax(l / T) (one-hot at argmax l where T = 0) for one vocabulary tile, stored; then the
    tile's part of the exponential race argmax(q / E)."""
    pid_v = tl.program_id(0)
    vs = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    v_ok = vs < V
    mask = row_ok[:, None] & v_ok[None, :]
    rows64 = rows.to(tl.int64)
    q_offs = q_off + rows64[:, None] * q_stride_b + vs[None, :]
    if PROBS_GIVEN:
        probs = tl.load(q_ptr + q_offs, mask=mask, other=0.0)
    else:
        big = tl.load(stats_ptr + 2 * rows, mask=row_ok, other=0.0)
        total = tl.load(stats_ptr + 2 * rows + 1, mask=row_ok, other=1.0)
        top = tl.load(top_ptr + rows, mask=row_ok, other=0)
        temp = tl.load(temp_ptr + rows, mask=row_ok, other=1.0)
        scaled = tl.load(q_ptr + q_offs, mask=mask, other=float("-inf"))
        total = tl.where(total > 0.0, total, 1.0)  # padding rows
        probs = tl.exp(scaled - tl.where(big > float("-inf"), big, 0.0)[:, None]) / total[:, None]
        onehot = tl.where(vs[None, :] == top[:, None], 1.0, 0.0)
        probs = tl.where((temp == 0.0)[:, None], onehot, probs)
        tl.store(q_ptr + q_offs, probs, mask=mask)
    e = tl.load(exp_ptr + exp_off + rows64[:, None] * exp_stride_b + vs[None, :], mask=mask, other=1.0)
    key = tl.math.div_rn(probs, tl.maximum(e.to(tl.float32), 1e-20))
    key = tl.where(mask, key, float("-inf"))
    m, i = tl.max(key, 1, return_indices=True, return_indices_tie_break_left=True)
    part = rows * n_tiles + pid_v
    tl.store(race_val_ptr + part, m, mask=row_ok)
    tl.store(race_idx_ptr + part, pid_v * BLOCK_V + i, mask=row_ok)


# -- host ---------------------------------------------------------------------------------------------
def _rnd_code(dtype: torch.dtype) -> int:
    return {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[dtype]


def _interpreted() -> bool:
    """Under TRITON_INTERPRET=1: Triton 3.8's interpreter gets 16-bit tl.dot wrong (garbage), so
    interpreted runs multiply as tf32 and the native MMAs are checked by the compiled (CUDA) tests."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


def _prec(*dtypes: torch.dtype) -> str:
    """Operands all of one 16-bit dtype: a native MMA in it (NATIVE_DOT) or tf32, both exact for them;
    mixed 16-bit dtypes: tf32; true fp32 operands: F32_DOT."""
    if all(d in (torch.bfloat16, torch.float16) for d in dtypes):
        native = NATIVE_DOT and len(set(dtypes)) == 1 and not _interpreted()
        return "native" if native else "tf32"
    return F32_DOT


def _needs_torch_probs(sampling: BatchSampling) -> bool:
    return bool((sampling.top_k > 0).any()) or bool((sampling.top_p < 1).any())


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def rollout(
    z: torch.Tensor,
    base_logits: torch.Tensor,
    bonus: torch.Tensor,
    embed: torch.Tensor,
    head: HeadWeights | None,
    pure_prefix_len: int = 1,
    sampling: BatchSampling | None = None,
    exponential: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Fused ``sglang_domino.rollout.rollout`` (same arguments, same results).

    z: [b, n, H]; base_logits: [b, n, V]; bonus: [b]; embed: [V, H]; head: HeadWeights or None;
    sampling: None (greedy) or BatchSampling, with exponential: [b, n, V] Exp(1) noise.
    Returns (tokens [b, n] int64, q [b, n, V] float32 or None when greedy).
    """
    if z.dim() != 3 or base_logits.dim() != 3 or base_logits.shape[:2] != z.shape[:2]:
        raise ValueError(f"z {tuple(z.shape)} and base_logits {tuple(base_logits.shape)} must be [b, n, H], [b, n, V]")
    b, n, hidden = z.shape
    vocab = base_logits.shape[-1]
    device = z.device
    if bonus.shape != (b,):
        raise ValueError(f"bonus must have shape ({b},), got {tuple(bonus.shape)}")
    if sampling is not None and (exponential is None or exponential.shape != base_logits.shape):
        raise ValueError("sampling needs exponential noise shaped like base_logits [b, n, V]")
    tokens = torch.empty(b, n, dtype=torch.long, device=device)
    q = None if sampling is None else torch.empty(b, n, vocab, dtype=torch.float32, device=device)
    if b == 0 or n == 0:
        return tokens, q

    bb = min(64, max(16, triton.next_power_of_2(b)))  # batch rows per program (all of them up to 64)
    rb = triton.cdiv(b, bb)
    warps = NUM_WARPS if bb <= 32 else 2 * NUM_WARPS
    n_tiles = triton.cdiv(vocab, BLOCK_V)
    f32 = dict(dtype=torch.float32, device=device)
    base = _unit_last(base_logits)
    part_val, part_idx = torch.empty(b, n_tiles, **f32), torch.empty(b, n_tiles, dtype=torch.int32, device=device)
    temp = part_max = part_sum = stats = exp = q_buf = part_val  # placeholders where unused
    if sampling is not None:
        temp = sampling.temperature.to(device=device, dtype=torch.float32).contiguous()
        torch_probs = _needs_torch_probs(sampling)
        exp, q_buf = _unit_last(exponential), q
        part_max, part_sum = torch.empty(b, n_tiles, **f32), torch.empty(b, n_tiles, **f32)
        stats = torch.empty(b, 2, **f32)
        race_val, race_idx = torch.empty_like(part_val), torch.empty_like(part_idx)
        top = torch.empty(b, dtype=torch.long, device=device)

    if head is not None:
        w_ih, w_hh, w1, w2 = (w.contiguous() for w in (head.w_ih, head.w_hh, head.w1, head.w2))
        gru, emb_dim = w_hh.shape[1], w1.shape[0]
        if w_ih.shape != (3 * gru, hidden) or w_hh.shape != (3 * gru, gru) or w1.shape[1] != hidden + gru \
                or w2.shape != (vocab, emb_dim):
            raise ValueError("head weights do not match z / base_logits shapes")
        if z.dtype != w1.dtype:
            raise ValueError(f"z ({z.dtype}) and the head ({w1.dtype}) must share a dtype, as in the reference")
        emb = _unit_last(embed)
        rnd, c_prec, x_prec = _rnd_code(w1.dtype), _prec(w1.dtype, w2.dtype), _prec(embed.dtype, w_ih.dtype)
        s_cur, s_next = torch.empty(b, gru, **f32), torch.empty(b, gru, **f32)
        hid = torch.empty(b, emb_dim, **f32)
        zproj = torch.empty(b * n, emb_dim, **f32)
        if n > pure_prefix_len:
            split_z = triton.cdiv(hidden, K_CHUNK)
            zparts = torch.empty(split_z, b * n, emb_dim, **f32)
            _zproj_kernel[(triton.cdiv(emb_dim, BLOCK_E), split_z, triton.cdiv(b * n, bb))](
                z.contiguous(), w1, zparts, b * n, hidden, gru, emb_dim,
                PREC=c_prec, BLOCK_B=bb, BLOCK_E=BLOCK_E, BLOCK_K=BLOCK_K, K_CHUNK=K_CHUNK, num_warps=warps,
            )
            torch.sum(zparts, 0, out=zproj)
        has_table = head.gate_table is not None
        table = head.gate_table.contiguous() if has_table else w_ih  # (a placeholder when unused)
        if has_table and (table.shape != (vocab, 3 * gru) or table.dtype != torch.float32):
            raise ValueError(f"gate table {tuple(table.shape)} {table.dtype}: expected ({vocab}, {3 * gru}) float32")
        split_x = 0 if has_table else triton.cdiv(hidden, K_CHUNK)  # the w_ih programs of _gates_kernel
        split_h = triton.cdiv(gru, K_CHUNK)
        gates = torch.empty(split_x + split_h, b, 3 * gru, **f32)
        n_g = triton.cdiv(gru, BLOCK_G)
        hpart = torch.empty(n_g, b, emb_dim, **f32)

        def gru_step(tok, has_state, hid_part):
            """s = GRUCell(E[tok], s), and the next correction's share of s @ w1[:, H:]^T."""
            split = split_x + (split_h if has_state else 0)
            if split:  # (none for the bonus step with a gate table)
                _gates_kernel[(triton.cdiv(3 * gru, BLOCK_N), split, rb)](
                    tok, tok.stride(0), emb, emb.stride(0), s_cur, w_ih, w_hh, gates, b, hidden, gru, split_x,
                    X_PREC=x_prec, H_PREC=F32_DOT, BLOCK_B=bb, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, K_CHUNK=K_CHUNK,
                    num_warps=warps,
                )
            _gru_kernel[(n_g, rb)](
                gates, split_x, split_h, tok, tok.stride(0), table, s_cur, s_next, w1, hpart, b, hidden, gru,
                emb_dim, HAS_STATE=has_state, HID_PART=hid_part, TABLE=has_table, RND=rnd,
                PREC=c_prec, BLOCK_B=bb, BLOCK_G=BLOCK_G, BLOCK_E=BLOCK_E, num_warps=warps,
            )

        gru_step(bonus, False, pure_prefix_len == 0)  # s = GRUCell(E[bonus], 0)
        s_cur, s_next = s_next, s_cur
    else:  # backbone only: draw from the base logits
        w2 = hid = base
        emb_dim, rnd, c_prec = 1, 0, F32_DOT

    def row_reduce(val, idx, out, softmax):
        _row_reduce_kernel[(b,)](val, idx, part_max, part_sum, out, out.stride(0), stats, n_tiles,
                                 SOFTMAX=softmax, BLOCK_T=BLOCK_T, num_warps=NUM_WARPS)

    vgrid = (n_tiles, rb)
    for i in range(n):
        corr = head is not None and i >= pure_prefix_len
        if corr:
            _hidden_kernel[(triton.cdiv(emb_dim, BLOCK_E), rb)](
                zproj, n * emb_dim, i * emb_dim, hpart, n_g, hid, b, emb_dim,
                RND=rnd, BLOCK_B=bb, BLOCK_E=BLOCK_E, num_warps=warps,
            )
        mode = _MODE_ARGMAX if sampling is None else (_MODE_RAW if torch_probs else _MODE_SOFTMAX)
        _logits_kernel[vgrid](
            base, base.stride(0), i * base.stride(1), hid, w2, temp, q_buf, q_buf.stride(0), i * q_buf.stride(1),
            part_val, part_idx, part_max, part_sum, b, vocab, emb_dim, n_tiles,
            HAS_CORR=corr, MODE=mode, RND=rnd, PREC=c_prec,
            BLOCK_B=bb, BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K, num_warps=warps,
        )
        if sampling is None:
            row_reduce(part_val, part_idx, tokens[:, i], False)  # y = argmax
        else:
            if torch_probs:
                q[:, i] = draft_probs(q[:, i], sampling)
            else:
                row_reduce(part_val, part_idx, top, True)  # softmax max / sum, and argmax for T = 0 rows
            _sample_kernel[vgrid](
                q, q.stride(0), i * q.stride(1), exp, exp.stride(0), i * exp.stride(1), temp, stats, top,
                race_val, race_idx, b, vocab, n_tiles,
                PROBS_GIVEN=torch_probs, BLOCK_B=bb, BLOCK_V=BLOCK_V, num_warps=warps,
            )
            row_reduce(race_val, race_idx, tokens[:, i], False)  # y = argmax q / E
        if head is not None and i + 1 < n:
            gru_step(tokens[:, i], True, i + 1 >= pure_prefix_len)
            s_cur, s_next = s_next, s_cur
    return tokens, q
