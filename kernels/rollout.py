"""Triton Domino rollout: the head's GRU, its correction MLP, the base-logit add and the argmax / draw,
fused per step. The torch reference (the spec) is ``sglang_domino.rollout.rollout``, re-exported here as
``rollout_reference``; ``tests/test_kernels.py`` holds one to the other.

One step of the chain, for the whole batch at once, is three (greedy) or four (sampling) launches, each
weight-stationary (a program owns a tile of a weight matrix and multiplies every batch row by it, so a
weight is read once per step whatever the batch):

    _hidden_kernel   hid = silu([z_i ; s] @ w1^T)                       grid (E tiles, row blocks)
    _logits_kernel   l = base_i + hid @ w2^T; per-tile argmax, or      grid (V tiles, row blocks)
                     per-tile (max, sum exp) of l / T and l / T -> q
    _sample_kernel   q = softmax (one-hot where T = 0); per-tile       grid (V tiles, row blocks)
                     argmax of q / E (the exponential race)
    _gru_kernel      y = argmax over the tiles' partials -> tokens;   grid (G tiles, row blocks)
                     s = GRUCell(E[y], s)

The [b, V] logits of a greedy step never reach memory. With top-k / top-p the logits are written to
``q`` and turned into probabilities by the torch ``sampling_probs`` between ``_logits_kernel`` and
``_sample_kernel`` (the rest stays fused). A persistent kernel over the block would need a grid-wide
barrier between steps (every step needs all of the previous token's vocabulary), so the steps are
separate launches; capture them in a CUDA graph to hide the launch cost.

Numerics follow the reference: the GRU runs in fp32 on fp32-cast weights; the correction is computed the
way ``correction`` computes it in the weights' dtype (fp32 accumulation, rounded to that dtype after
each Linear and after the SiLU; ``s`` is rounded to it first), then added in fp32. Operands that come
from 16-bit tensors are multiplied as fp32 with ``input_precision="tf32"``, which is exact for them
(their mantissas fit in tf32's); true fp32 operands use ``F32_DOT`` ("tf32x3" by default; set
``SGLANG_DOMINO_F32_DOT=ieee`` for plain fp32 FMAs).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sglang_domino.drafter import HeadWeights
from sglang_domino.rollout import rollout as rollout_reference  # noqa: F401  (the spec)
from sglang_domino.sampling import BatchSampling, sampling_probs

F32_DOT = os.environ.get("SGLANG_DOMINO_F32_DOT", "tf32x3")

# Tile sizes (read at call time, so tests can shrink them to exercise multi-tile paths).
BLOCK_V = 128  # vocabulary tile of the logits / sample kernels
BLOCK_T = 128  # how many per-tile partials one reduction step reads
BLOCK_G = 16  # GRU output tile
BLOCK_E = 16  # correction hidden tile
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
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _reduce_argmax(val_ptr, idx_ptr, rows, row_ok, n_tiles, BLOCK_B: tl.constexpr, BLOCK_T: tl.constexpr):
    """Combine per-tile (max, first argmax) partials [rows, n_tiles] -> first argmax per row (int32)."""
    best_v = tl.full([BLOCK_B], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK_B], tl.int32)
    for t0 in range(0, n_tiles, BLOCK_T):
        ts = t0 + tl.arange(0, BLOCK_T)
        mask = row_ok[:, None] & (ts < n_tiles)[None, :]
        offs = rows[:, None] * n_tiles + ts[None, :]
        v = tl.load(val_ptr + offs, mask=mask, other=float("-inf"))
        i = tl.load(idx_ptr + offs, mask=mask, other=2147483647)
        cm = tl.max(v, 1)
        ci = tl.min(tl.where(v == cm[:, None], i, 2147483647), 1)
        better = cm > best_v  # chunks come in vocabulary order: on a tie the earlier index stays
        best_i = tl.where(better, ci, best_i)
        best_v = tl.where(better, cm, best_v)
    return best_i


# -- kernels ------------------------------------------------------------------------------------------
@triton.jit
def _gru_kernel(
    tok_ptr, tok_stride,  # [b] tokens to read when not FROM_PARTIALS
    part_val_ptr, part_idx_ptr, n_tiles,  # [b, n_tiles] argmax partials of the step just drawn
    out_tok_ptr, out_tok_stride,  # where the drawn token goes (tokens[:, i])
    embed_ptr, embed_stride,  # [V, H]
    w_ih_ptr, w_hh_ptr,  # [3G, H], [3G, G] contiguous, gates (r, z, n)
    s_in_ptr, s_out_ptr,  # [b, G] fp32
    B, H, G,
    FROM_PARTIALS: tl.constexpr, HAS_STATE: tl.constexpr, DO_GRU: tl.constexpr,
    X_PREC: tl.constexpr, H_PREC: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """y = argmax of the partials (written to out_tok by the first G tile); s_out = GRUCell(E[y], s_in)."""
    pid_g = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    if FROM_PARTIALS:
        tok = _reduce_argmax(part_val_ptr, part_idx_ptr, rows, row_ok, n_tiles, BLOCK_B, BLOCK_T).to(tl.int64)
        if pid_g == 0:
            tl.store(out_tok_ptr + rows * out_tok_stride, tok, mask=row_ok)
    else:
        tok = tl.load(tok_ptr + rows * tok_stride, mask=row_ok, other=0).to(tl.int64)
    if DO_GRU:
        cols = pid_g * BLOCK_G + tl.arange(0, BLOCK_G)
        col_ok = cols < G
        i_r = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
        i_z = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
        i_n = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            x = tl.load(embed_ptr + tok[:, None] * embed_stride + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            w_offs = cols[None, :] * H + ks[:, None]  # [BLOCK_K, BLOCK_G] view of w_ih^T
            w_mask = k_ok[:, None] & col_ok[None, :]
            w_r = tl.load(w_ih_ptr + w_offs, mask=w_mask, other=0.0).to(tl.float32)
            w_z = tl.load(w_ih_ptr + G * H + w_offs, mask=w_mask, other=0.0).to(tl.float32)
            w_n = tl.load(w_ih_ptr + 2 * G * H + w_offs, mask=w_mask, other=0.0).to(tl.float32)
            i_r = tl.dot(x, w_r, i_r, input_precision=X_PREC)
            i_z = tl.dot(x, w_z, i_z, input_precision=X_PREC)
            i_n = tl.dot(x, w_n, i_n, input_precision=X_PREC)
        if HAS_STATE:
            h_r = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
            h_z = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
            h_n = tl.zeros([BLOCK_B, BLOCK_G], tl.float32)
            for k0 in range(0, G, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < G
                s = tl.load(s_in_ptr + rows[:, None] * G + ks[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w_offs = cols[None, :] * G + ks[:, None]
                w_mask = k_ok[:, None] & col_ok[None, :]
                w_r = tl.load(w_hh_ptr + w_offs, mask=w_mask, other=0.0).to(tl.float32)
                w_z = tl.load(w_hh_ptr + G * G + w_offs, mask=w_mask, other=0.0).to(tl.float32)
                w_n = tl.load(w_hh_ptr + 2 * G * G + w_offs, mask=w_mask, other=0.0).to(tl.float32)
                h_r = tl.dot(s, w_r, h_r, input_precision=H_PREC)
                h_z = tl.dot(s, w_z, h_z, input_precision=H_PREC)
                h_n = tl.dot(s, w_n, h_n, input_precision=H_PREC)
            h = tl.load(s_in_ptr + rows[:, None] * G + cols[None, :],
                        mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            r = tl.sigmoid(i_r + h_r)
            u = tl.sigmoid(i_z + h_z)
            new = _tanh(i_n + r * h_n)
            s_new = (1.0 - u) * new + u * h
        else:  # zero state: GRUCell(x, 0)
            u = tl.sigmoid(i_z)
            s_new = (1.0 - u) * _tanh(i_n)
        tl.store(s_out_ptr + rows[:, None] * G + cols[None, :], s_new, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _zproj_kernel(
    z_ptr,  # [M, H] contiguous (all b * n backbone states)
    w1_ptr,  # [E, H + G] contiguous; only its first H columns are used
    out_ptr,  # [M, E] fp32
    M, H, G, E,
    PREC: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The step-independent half of embed_proj's first Linear for the whole block: z @ w1[:, :H]^T."""
    cols = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < M
    col_ok = cols < E
    rows64 = rows.to(tl.int64)
    acc = tl.zeros([BLOCK_B, BLOCK_E], tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        x = tl.load(z_ptr + rows64[:, None] * H + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w1_ptr + cols[None, :] * (H + G) + ks[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision=PREC)
    tl.store(out_ptr + rows64[:, None] * E + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _hidden_kernel(
    zp_ptr, zp_stride_b, zp_off,  # zproj[:, i] = zp_ptr + zp_off + row * zp_stride_b, [b, E] fp32
    s_ptr,  # [b, G] fp32
    w1_ptr,  # [E, H + G] contiguous
    hid_ptr,  # [b, E] fp32 out (values rounded to the head's dtype)
    B, H, G, E,
    RND: tl.constexpr, PREC: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """hid = silu(z_i @ w1[:, :H]^T + s @ w1[:, H:]^T), rounded like the reference's ops in the head's dtype."""
    cols = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    col_ok = cols < E
    acc = tl.load(zp_ptr + zp_off + rows[:, None] * zp_stride_b + cols[None, :],
                  mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    for k0 in range(0, G, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < G
        s = tl.load(s_ptr + rows[:, None] * G + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w1_ptr + cols[None, :] * (H + G) + H + ks[:, None], mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        acc = tl.dot(_round(s, RND), w.to(tl.float32), acc, input_precision=PREC)
    pre = _round(acc, RND)
    hid = _round(pre * tl.sigmoid(pre), RND)
    tl.store(hid_ptr + rows[:, None] * E + cols[None, :], hid, mask=row_ok[:, None] & col_ok[None, :])


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
            acc = tl.dot(h, w.to(tl.float32), acc, input_precision=PREC)
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
def _sample_kernel(
    q_ptr, q_stride_b, q_off,  # q[:, i]: l / T on entry (softmax mode) or probabilities (PROBS_GIVEN)
    exp_ptr, exp_stride_b, exp_off,  # exponential[:, i]
    temp_ptr,  # [b] fp32
    part_val_ptr, part_idx_ptr, part_max_ptr, part_sum_ptr,  # partials from _logits_kernel
    race_val_ptr, race_idx_ptr,  # [b, n_tiles] out: per-tile max / argmax of q / E
    B, V, n_tiles,
    PROBS_GIVEN: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr,
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
        big = tl.full([BLOCK_B], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_B], tl.float32)
        for t0 in range(0, n_tiles, BLOCK_T):  # online (max, sum) over the tiles' partials
            ts = t0 + tl.arange(0, BLOCK_T)
            pmask = row_ok[:, None] & (ts < n_tiles)[None, :]
            offs = rows[:, None] * n_tiles + ts[None, :]
            pm = tl.load(part_max_ptr + offs, mask=pmask, other=float("-inf"))
            ps = tl.load(part_sum_ptr + offs, mask=pmask, other=0.0)
            new_big = tl.maximum(big, tl.max(pm, 1))
            safe = tl.where(new_big > float("-inf"), new_big, 0.0)
            total = total * tl.exp(big - safe) + tl.sum(tl.where(pm > float("-inf"), ps * tl.exp(pm - safe[:, None]), 0.0), 1)
            big = new_big
        scaled = tl.load(q_ptr + q_offs, mask=mask, other=float("-inf"))
        total = tl.where(total > 0.0, total, 1.0)  # padding rows
        probs = tl.exp(scaled - tl.where(big > float("-inf"), big, 0.0)[:, None]) / total[:, None]
        temp = tl.load(temp_ptr + rows, mask=row_ok, other=1.0)
        top = _reduce_argmax(part_val_ptr, part_idx_ptr, rows, row_ok, n_tiles, BLOCK_B, BLOCK_T)
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


def _prec(*dtypes: torch.dtype) -> str:
    """tf32 is exact for operands cast from 16-bit floats; true fp32 operands need F32_DOT."""
    return "tf32" if all(d in (torch.bfloat16, torch.float16) for d in dtypes) else F32_DOT


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
    block_t = min(BLOCK_T, max(16, 4096 // bb))
    n_tiles = triton.cdiv(vocab, BLOCK_V)
    f32 = dict(dtype=torch.float32, device=device)
    base = _unit_last(base_logits)
    part_val, part_idx = torch.empty(b, n_tiles, **f32), torch.empty(b, n_tiles, dtype=torch.int32, device=device)
    race_val, race_idx = part_val, part_idx
    temp = part_max = part_sum = exp = q_buf = part_val  # placeholders where unused
    if sampling is not None:
        temp = sampling.temperature.to(device=device, dtype=torch.float32).contiguous()
        torch_probs = _needs_torch_probs(sampling)
        exp, q_buf = _unit_last(exponential), q
        part_max, part_sum = torch.empty(b, n_tiles, **f32), torch.empty(b, n_tiles, **f32)
        race_val, race_idx = torch.empty_like(part_val), torch.empty_like(part_idx)

    if head is not None:
        w_ih, w_hh, w1, w2 = (w.contiguous() for w in head)
        gru, emb_dim = w_hh.shape[1], w1.shape[0]
        if w_ih.shape != (3 * gru, hidden) or w_hh.shape != (3 * gru, gru) or w1.shape[1] != hidden + gru \
                or w2.shape != (vocab, emb_dim):
            raise ValueError("head weights do not match z / base_logits shapes")
        if z.dtype != w1.dtype:
            raise ValueError(f"z ({z.dtype}) and the head ({w1.dtype}) must share a dtype, as in the reference")
        emb = _unit_last(embed)
        rnd, c_prec, x_prec = _rnd_code(w1.dtype), _prec(w1.dtype), _prec(embed.dtype, w_ih.dtype)
        s_cur, s_next = torch.empty(b, gru, **f32), torch.empty(b, gru, **f32)
        hid = torch.empty(b, emb_dim, **f32)
        zproj = torch.empty(b, n, emb_dim, **f32)
        if n > pure_prefix_len:
            _zproj_kernel[(triton.cdiv(emb_dim, BLOCK_E), triton.cdiv(b * n, bb))](
                z.contiguous(), w1, zproj, b * n, hidden, gru, emb_dim,
                PREC=c_prec, BLOCK_B=bb, BLOCK_E=BLOCK_E, BLOCK_K=BLOCK_K, num_warps=warps,
            )
    else:  # backbone only: draw from the base logits, no GRU
        w_ih = w_hh = w2 = emb = hid = s_cur = s_next = base
        gru, emb_dim, rnd, c_prec, x_prec = 1, 1, 0, F32_DOT, F32_DOT

    def gru_step(tok, from_partials, has_state, do_gru, sel_val, sel_idx, out_tok):
        grid = (triton.cdiv(gru, BLOCK_G) if do_gru else 1, rb)
        _gru_kernel[grid](
            tok, tok.stride(0), sel_val, sel_idx, n_tiles, out_tok, tokens.stride(0), emb, emb.stride(0),
            w_ih, w_hh, s_cur, s_next, b, hidden, gru,
            FROM_PARTIALS=from_partials, HAS_STATE=has_state, DO_GRU=do_gru, X_PREC=x_prec, H_PREC=F32_DOT,
            BLOCK_B=bb, BLOCK_G=BLOCK_G, BLOCK_K=BLOCK_K, BLOCK_T=block_t, num_warps=warps,
        )

    if head is not None:  # s = GRUCell(E[bonus], 0)
        gru_step(bonus, False, False, True, part_val, part_idx, tokens)
        s_cur, s_next = s_next, s_cur
    vgrid = (n_tiles, rb)
    for i in range(n):
        corr = head is not None and i >= pure_prefix_len
        if corr:
            _hidden_kernel[(triton.cdiv(emb_dim, BLOCK_E), rb)](
                zproj, zproj.stride(0), i * emb_dim, s_cur, w1, hid, b, hidden, gru, emb_dim,
                RND=rnd, PREC=c_prec, BLOCK_B=bb, BLOCK_E=BLOCK_E, BLOCK_K=BLOCK_K, num_warps=warps,
            )
        mode = _MODE_ARGMAX if sampling is None else (_MODE_RAW if torch_probs else _MODE_SOFTMAX)
        _logits_kernel[vgrid](
            base, base.stride(0), i * base.stride(1), hid, w2, temp, q_buf, q_buf.stride(0), i * q_buf.stride(1),
            part_val, part_idx, part_max, part_sum, b, vocab, emb_dim, n_tiles,
            HAS_CORR=corr, MODE=mode, RND=rnd, PREC=c_prec,
            BLOCK_B=bb, BLOCK_V=BLOCK_V, BLOCK_K=BLOCK_K, num_warps=warps,
        )
        if sampling is not None:
            if torch_probs:
                q[:, i] = sampling_probs(q[:, i], sampling)
            _sample_kernel[vgrid](
                q, q.stride(0), i * q.stride(1), exp, exp.stride(0), i * exp.stride(1), temp,
                part_val, part_idx, part_max, part_sum, race_val, race_idx, b, vocab, n_tiles,
                PROBS_GIVEN=torch_probs, BLOCK_B=bb, BLOCK_V=BLOCK_V, BLOCK_T=block_t, num_warps=warps,
            )
        # y_{i+1} = argmax over the tiles -> tokens[:, i]; then s = GRUCell(E[y_{i+1}], s) unless last
        step_gru = head is not None and i + 1 < n
        gru_step(tokens, True, True, step_gru, race_val, race_idx, tokens[:, i:])
        if step_gru:
            s_cur, s_next = s_next, s_cur
    return tokens, q
