"""TARGET_VERIFY for SGLang's torch_native attention backend (it has no such path in 0.5.23).

A verify forward scores ``B`` new tokens per request at positions ``seq_len .. seq_len + B - 1``
(``forward_batch.seq_lens`` holds the committed prefix lengths, without the B tokens). Their K/V are
written to ``out_cache_loc`` first; then every query attends causally to the request's cached prefix
and to the block tokens up to itself. Requests are padded to one batched SDPA call.

Installed through SGLang's HookRegistry as an AROUND hook on ``TorchNativeAttnBackend.forward_extend``;
every other forward mode goes to the original method.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"


def _layout(backend, forward_batch, num_tokens: int):
    """(gather indices [bs, L], allowed mask [bs, B, L], query positions, key positions) of this verify
    batch, computed at its first layer and kept for the others (keyed on the batch object itself: ids
    and data pointers get reused by later batches)."""
    cached = getattr(backend, "_domino_verify_layout", None)
    if cached is not None and cached[0] is forward_batch and cached[1] == num_tokens:
        return cached[2]
    bs = forward_batch.batch_size
    block = num_tokens // bs
    device = forward_batch.seq_lens.device
    prefix = forward_batch.seq_lens.long()
    if forward_batch.seq_lens_cpu is not None:
        max_kv = int(forward_batch.seq_lens_cpu.max()) if bs else 0
        # seq_lens_cpu may already include the verify block (host upper bound); take the larger.
        max_kv = max(max_kv, int(prefix.max()) + block) if bs else 0
    else:
        max_kv = int(prefix.max()) + block
    req_to_token = backend.req_to_token_pool.req_to_token
    max_kv = min(max_kv, req_to_token.shape[1])
    arange_kv = torch.arange(max_kv, device=device)
    q_pos = prefix[:, None] + torch.arange(block, device=device)  # [bs, B]
    allowed = arange_kv[None, None, :] <= q_pos[:, :, None]  # [bs, B, L] causal incl. self
    rows = req_to_token[forward_batch.req_pool_indices.long()][:, :max_kv].long()
    valid = arange_kv[None, :] < (prefix + block)[:, None]
    idx = torch.where(valid, rows, torch.zeros_like(rows))
    layout = (idx, allowed, q_pos, arange_kv)
    backend._domino_verify_layout = (forward_batch, num_tokens, layout)
    return layout


def target_verify_forward(backend, q, k, v, layer, forward_batch, save_kv_cache=True):
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        backend.token_to_kv_pool.set_kv_buffer(
            layer, KVWriteLoc(forward_batch.out_cache_loc, backend.swa_out_cache_loc), k, v
        )
    heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
    q = q.reshape(-1, heads, layer.qk_head_dim)
    num_tokens = q.shape[0]
    bs = forward_batch.batch_size
    if bs == 0 or num_tokens == 0:
        return q.new_empty((num_tokens, heads * layer.v_head_dim))
    block = num_tokens // bs
    idx, allowed, q_pos, arange_kv = _layout(backend, forward_batch, num_tokens)
    window = getattr(layer, "sliding_window_size", None)
    if window is not None and window > -1:
        allowed = allowed & (arange_kv[None, None, :] >= q_pos[:, :, None] - window)
    k_cache = backend.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = backend.token_to_kv_pool.get_value_buffer(layer.layer_id)
    keys = k_cache[idx].to(q.dtype).permute(0, 2, 1, 3)  # [bs, kvh, L, d]
    values = v_cache[idx].to(q.dtype).permute(0, 2, 1, 3)
    query = q.view(bs, block, heads, layer.qk_head_dim).transpose(1, 2)  # [bs, H, B, d]
    out = scaled_dot_product_attention(
        query, keys, values, attn_mask=allowed[:, None], scale=layer.scaling,
        enable_gqa=heads != kv_heads,
    )
    return out.transpose(1, 2).reshape(num_tokens, heads * layer.v_head_dim)


def forward_extend_around(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    if forward_batch.forward_mode.is_target_verify() and not layer.is_cross_attention:
        return target_verify_forward(backend, q, k, v, layer, forward_batch, save_kv_cache)
    return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)


def register_hook() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, forward_extend_around, HookType.AROUND)
