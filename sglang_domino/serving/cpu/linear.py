"""Few-row matmuls of SGLang's CPU engine through ``sglang_domino.linear``, in the form this machine runs faster.

AROUND hooks on the two places a dense model's weights are multiplied: ``UnquantizedLinearMethod.apply``
(every linear layer) and ``LogitsProcessor._compute_lm_head`` (its plain-weight branch). Decode steps and
verify steps of speculative decoding are 1-64-row products, where PyTorch's stock form can cost 2-3x what
``(W @ x.T).T`` costs, or the reverse, depending on the host; the first products of each kind time both
forms (``sglang_domino.linear.faster_linear``, each verdict logged) and the rest take the faster.
Prefill-sized products, quantized, AMX-packed, LoRA and fp32-lm-head cases go to the original method.
Every CPU server gets it (plain decoding too, so a baseline is not handicapped);
``SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS=0`` switches it off.
"""

from __future__ import annotations

import logging

from ...linear import DEFAULT_MAX_ROWS, faster_linear, max_rows_from_env

logger = logging.getLogger(__name__)

LINEAR_TARGET = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
LM_HEAD_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"

_MAX_ROWS = DEFAULT_MAX_ROWS  # set from SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS by register_hooks()


def linear_apply_around(original, method, layer, x, bias=None):
    if getattr(layer, "use_intel_amx_backend", False):
        return original(method, layer, x, bias)
    return faster_linear(x, layer.weight, bias, lambda: original(method, layer, x, bias), _MAX_ROWS)


def compute_lm_head_around(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    """The plain-weight branch of ``_compute_lm_head`` (``hidden @ lm_head.weight.T``, no bias) when it applies."""
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    weight = getattr(lm_head, "weight", None)
    if (weight is None or hasattr(lm_head, "set_lora")
            or should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
            or getattr(processor, "use_fp32_lm_head", False)
            or getattr(processor, "rl_on_policy_target", None) is not None
            or getattr(lm_head, "use_intel_amx_backend", False)):
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return faster_linear(hidden_states, weight, None,
                         lambda: original(processor, hidden_states, lm_head, embedding_bias, **kwargs), _MAX_ROWS)


def register_hooks() -> None:
    """CPU serving only (called by the plugin); a bad SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS raises, naming it."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    global _MAX_ROWS
    _MAX_ROWS = max_rows_from_env()
    if _MAX_ROWS < 1:
        logger.info("sglang-domino: CPU few-row linear off (SGLANG_DOMINO_CPU_LINEAR_MAX_ROWS=%d)", _MAX_ROWS)
        return
    HookRegistry.register(LINEAR_TARGET, linear_apply_around, HookType.AROUND)
    HookRegistry.register(LM_HEAD_TARGET, compute_lm_head_around, HookType.AROUND)
