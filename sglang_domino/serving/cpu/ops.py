"""Pure-torch versions of the ``sgl_kernel`` CPU ops that SGLang's speculative paths call.

The PyPI ``sglang-kernel`` wheel is a CUDA build: its Python wrappers (``sgl_kernel.speculative``)
exist, but the ``torch.ops.sgl_kernel.*_cpu`` operators they call are only compiled into a CPU
build. We define the missing ones in a ``torch.library`` FRAGMENT of the ``sgl_kernel`` namespace
(never replacing an operator that is already there).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

_LIB: torch.library.Library | None = None


def _flat_ranges(req_pool_indices, start_offset, end_offset):
    """Rows/columns of req_to_token covered by [start_i, end_i) for each request, in request order."""
    lens = (end_offset.long() - start_offset.long()).clamp_min(0)
    total = int(lens.sum())
    rows = req_pool_indices.long().repeat_interleave(lens)
    offsets = torch.cumsum(lens, 0) - lens
    cols = (torch.arange(total, device=lens.device) - offsets.repeat_interleave(lens)
            + start_offset.long().repeat_interleave(lens))
    return rows, cols, total


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """req_to_token[pool_i, start_i:end_i] = the next (end_i - start_i) entries of out_cache_loc."""
    rows, cols, total = _flat_ranges(req_pool_indices, start_offset, end_offset)
    if total:
        req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    """out_cache_loc (packed, request order) = req_to_token[pool_i, start_i:end_i]."""
    rows, cols, total = _flat_ranges(req_pool_indices, start_offset, end_offset)
    if total:
        out_cache_loc[:total] = req_to_token[rows, cols].to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                           pool_len, topk, num_steps):
    """out_cache_loc[i] = req_to_token[pool_i, seq_i : seq_i + topk * num_steps]."""
    n = topk * num_steps
    cols = seq_lens.long()[:, None] + torch.arange(n, device=seq_lens.device)
    vals = req_to_token[req_pool_indices.long()[:, None], cols]
    out_cache_loc.view(-1)[: vals.numel()] = vals.reshape(-1).to(out_cache_loc.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer (raw base pointer + bytes per slot): slot tgt_loc[j] = slot src_loc[j].
    All sources are read before any target is written (safe when the two sets overlap)."""
    import ctypes

    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    if not pairs:
        return
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        saved = [ctypes.string_at(base + src * stride, stride) for _, src in pairs]
        for (tgt, _), data in zip(pairs, saved):
            ctypes.memmove(base + tgt * stride, data, stride)


_OPS = {
    "assign_req_to_token_pool_cpu": (
        "assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
        assign_req_to_token_pool_cpu,
    ),
    "assign_extend_cache_locs_cpu": (
        "assign_extend_cache_locs_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
        assign_extend_cache_locs_cpu,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "assign_draft_cache_locs_contiguous_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()",
        assign_draft_cache_locs_contiguous_cpu,
    ),
    "copy_all_layer_kv_cache_cpu": (
        "copy_all_layer_kv_cache_cpu(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        copy_all_layer_kv_cache_cpu,
    ),
}


def _has_op(name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"sgl_kernel::{name}", "CPU")
    except Exception:
        return False


def register() -> list[str]:
    """Define the ops that are missing. Call after ``sgl_kernel`` has been imported (if it can be),
    so a CPU build's own kernels win. Returns the names defined here."""
    global _LIB
    missing = [name for name in _OPS if not _has_op(name)]
    if not missing:
        return []
    if _LIB is None:
        _LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
    defined = []
    for name in missing:
        schema, fn = _OPS[name]
        try:
            _LIB.define(schema)
        except RuntimeError:
            pass  # schema already defined (e.g. by a CPU build without a CPU kernel): just add ours
        _LIB.impl(name, fn, "CPU")
        defined.append(name)
    logger.info("sglang-domino: pure-torch sgl_kernel ops registered: %s", ", ".join(defined))
    return defined
