"""Warm start: draft layers copied from the target layers that follow the last context layer.

With ``target_layer_ids = [.., l_K]`` the deepest context feature is the output of target layer ``l_K``,
i.e. the input of layer ``l_K + 1``. Draft layer ``j`` starts as a copy of target layer ``l_K + 1 + j``
(attention, MLP, norms), ``fc`` starts by passing that deepest feature through (identity on its slot,
zero elsewhere) and ``hidden_norm`` as that layer's input norm, so the context keys/values of draft layer 0
are at first exactly the ones target layer ``l_K + 1`` computes. The per-head ``q_norm``/``k_norm`` (which
a Llama target lacks) are set to the mean RMS of the target's query/key heads on ``calib_ids``, so
attention starts about as sharp as the target's. The block tokens still enter as embeddings: training
has to learn that part.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def copy_target_layers(drafter, target, calib_ids: list[torch.Tensor] | None = None) -> list[int]:
    """Initialise ``drafter`` (in place) from ``target``; returns the target layer indices copied.

    calib_ids: a few 1-D token tensors for the q/k scale (none: scale 1).
    """
    cfg = drafter.config
    layers = getattr(target, "model", target).layers
    first = max(cfg.target_layer_ids) + 1
    copied = list(range(first, first + cfg.num_hidden_layers))
    if copied[-1] >= len(layers):
        raise ValueError(f"cannot copy target layers {copied}: the target has {len(layers)} layers "
                         f"(deepest context layer {first - 1})")
    for j, t in enumerate(copied):
        src, dst = layers[t], drafter.layers[j]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(dst.self_attn, name).weight.copy_(getattr(src.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(dst.mlp, name).weight.copy_(getattr(src.mlp, name).weight)
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
        for norm in ("q_norm", "k_norm"):  # Qwen3-style targets have them; Llama-style: calibrated below
            if hasattr(src.self_attn, norm):
                getattr(dst.self_attn, norm).weight.copy_(getattr(src.self_attn, norm).weight)
    h = cfg.hidden_size
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, (cfg.num_context_layers - 1) * h:].copy_(torch.eye(h))
    drafter.hidden_norm.weight.copy_(layers[first].input_layernorm.weight)
    if calib_ids and not hasattr(layers[first].self_attn, "q_norm"):
        _calibrate_qk_norms(drafter, target, layers, copied, calib_ids)
    return copied


def _calibrate_qk_norms(drafter, target, layers, copied, calib_ids) -> None:
    cfg = drafter.config
    sums = torch.zeros(len(copied), 2)
    for ids in calib_ids:
        out = target(input_ids=ids[None].to(next(target.parameters()).device), output_hidden_states=True,
                     use_cache=False)
        for j, t in enumerate(copied):
            x = layers[t].input_layernorm(out.hidden_states[t][0].float())
            q = layers[t].self_attn.q_proj(x).view(-1, cfg.num_attention_heads, cfg.head_dim)
            k = layers[t].self_attn.k_proj(x).view(-1, cfg.num_key_value_heads, cfg.head_dim)
            sums[j, 0] += q.pow(2).mean(-1).sqrt().mean().cpu()
            sums[j, 1] += k.pow(2).mean(-1).sqrt().mean().cpu()
    scale = sums / len(calib_ids)
    for j in range(len(copied)):
        drafter.layers[j].self_attn.q_norm.weight.fill_(float(scale[j, 0]))
        drafter.layers[j].self_attn.k_norm.weight.fill_(float(scale[j, 1]))
