"""``--speculative-algorithm DOMINO``: SGLang spec class, server-argument defaults and validation."""

from __future__ import annotations

import logging
import os

import torch

from ..config import CheckpointError, DominoConfig
from ..policy import PolicyError, max_draft_batch_from_env, policy_from_env, widths_from_env

logger = logging.getLogger(__name__)

ALGORITHM = "DOMINO"


class DominoArgumentError(ValueError):
    pass


def _is_cpu(cfg) -> bool:
    return getattr(cfg, "device", None) == "cpu" or os.environ.get("SGLANG_USE_CPU_ENGINE", "") in ("1", "true")


def _target_text_config(model_path: str, trust_remote_code: bool = False):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_checkpoint(draft_path: str, target_model_path: str | None = None, trust_remote_code: bool = False
                     ) -> DominoConfig:
    """Strict startup check of a Domino checkpoint without reading its weights (shapes come from the
    safetensors headers): config format, fit to the target, every tensor present/expected/right shape."""
    from safetensors import safe_open

    from ..drafter import DominoDrafter, check_state_dict

    if not draft_path or not os.path.exists(draft_path):
        raise CheckpointError(f"--speculative-draft-model-path {draft_path!r} does not exist")
    cfg = DominoConfig.load(draft_path)
    if target_model_path is not None:
        text = _target_text_config(target_model_path, trust_remote_code)
        cfg.check_target(text.vocab_size, text.hidden_size, text.num_hidden_layers)
    files = sorted(f for f in os.listdir(draft_path) if f.endswith(".safetensors")) if os.path.isdir(draft_path) else []
    if not files:
        raise CheckpointError(f"{draft_path}: no *.safetensors weights")
    shapes = {}
    for name in files:
        with safe_open(os.path.join(draft_path, name), framework="pt") as f:
            for key in f.keys():
                shapes[key] = torch.empty(f.get_slice(key).get_shape(), device="meta")
    with torch.device("meta"):
        model = DominoDrafter(cfg)
    check_state_dict(model, shapes)
    return cfg


def validate_server_args(server_args) -> None:
    """Registered with SpeculativeAlgorithm.register: runs in the launcher before anything loads."""
    cfg = server_args
    path = cfg.speculative_draft_model_path
    if not path:
        raise DominoArgumentError(
            "--speculative-algorithm DOMINO needs --speculative-draft-model-path (a Domino drafter checkpoint "
            "folder: config.json with dflash_config.projector_type='domino' + *.safetensors)")
    try:
        dcfg = check_checkpoint(path, cfg.model_path, bool(getattr(cfg, "trust_remote_code", False)))
    except CheckpointError as e:
        raise DominoArgumentError(f"DOMINO draft checkpoint {path} refused: {e}") from e
    problems = []
    if (getattr(cfg, "tp_size", 1) or 1) > 1:
        problems.append("tensor parallelism (--tp-size > 1)")
    if (getattr(cfg, "pp_size", 1) or 1) > 1:
        problems.append("pipeline parallelism (--pp-size > 1)")
    if (getattr(cfg, "dp_size", 1) or 1) > 1 or getattr(cfg, "enable_dp_attention", False):
        problems.append("data parallelism / DP attention")
    if (getattr(cfg, "speculative_eagle_topk", None) or 1) > 1:
        problems.append("--speculative-eagle-topk > 1 (Domino verifies a single chain)")
    if getattr(cfg, "speculative_adaptive", False):
        problems.append("--speculative-adaptive")
    if getattr(cfg, "speculative_use_block_verification", False):
        problems.append("--speculative-use-block-verification")
    if getattr(cfg, "enable_lora", False) or getattr(cfg, "lora_paths", None):
        problems.append("LoRA")
    if getattr(cfg, "disaggregation_mode", "null") not in (None, "null"):
        problems.append("prefill/decode disaggregation")
    if problems:
        raise DominoArgumentError("--speculative-algorithm DOMINO does not support: " + ", ".join(problems))
    n = getattr(cfg, "speculative_num_draft_tokens", None)
    if n is not None and not 2 <= int(n) <= dcfg.block_size:
        raise DominoArgumentError(
            f"--speculative-num-draft-tokens {n}: must be in [2, {dcfg.block_size}] for this drafter "
            f"(its block size is {dcfg.block_size}; the verify chain is [bonus, {dcfg.block_size - 1} drafts])")
    try:  # the draft policy's environment variables (see policy.py)
        policy_from_env()
        max_draft_batch_from_env()
        widths_from_env(int(n) if n is not None else dcfg.block_size)
    except PolicyError as e:
        raise DominoArgumentError(str(e)) from e


def handle_server_args(server_args) -> None:
    """Fill what SGLang's own _handle_dflash would set; SGLang calls this for a plugin algorithm."""
    cfg = server_args
    dcfg = DominoConfig.load(cfg.speculative_draft_model_path)
    if cfg.speculative_num_draft_tokens is None:
        server_args.speculative_num_draft_tokens = dcfg.block_size
    num_draft_tokens = server_args.speculative_num_draft_tokens
    server_args.speculative_num_steps = 1
    server_args.speculative_eagle_topk = 1
    server_args.enable_mixed_chunk = False
    if not cfg.disable_overlap_schedule:
        # The Domino worker runs synchronously (drafting needs the committed tokens of the last step).
        server_args.disable_overlap_schedule = True
        logger.warning("DOMINO: overlap scheduling is turned off (the Domino worker runs synchronously).")
    if _is_cpu(cfg):
        # Our TARGET_VERIFY path is for torch_native; the CPU graph runner does not run speculation.
        if cfg.attention_backend not in (None, "torch_native"):
            raise DominoArgumentError(
                f"--attention-backend {cfg.attention_backend}: DOMINO on CPU runs with torch_native attention")
        server_args.attention_backend = "torch_native"
        server_args.disable_cuda_graph = True
    elif not cfg.disable_cuda_graph:
        # Not yet validated on a GPU: SGLang's graph capture builds dummy verify inputs only for its
        # built-in algorithms. Run the target eagerly rather than risk a wrong capture.
        server_args.disable_cuda_graph = True
        logger.warning("DOMINO: CUDA graphs are turned off (target verify runs eagerly).")
    if cfg.max_running_requests is None:
        server_args.max_running_requests = 48
    logger.info("DOMINO: block size %d (checkpoint %d), %d draft tokens per verify chain",
                num_draft_tokens, dcfg.block_size, num_draft_tokens - 1)


def make_spec_class():
    """A CustomSpecAlgo subclass that fills what SGLang 0.5.23's CustomSpecAlgo lacks."""
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    class DominoSpecAlgo(CustomSpecAlgo):
        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self):
            return None

        def has_draft_kv(self) -> bool:
            # The drafter's context K/V live in the worker's own slot-indexed pool, not in SGLang's.
            return False

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                              needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def handle_server_args(self, server_args) -> None:
            handle_server_args(server_args)

    return DominoSpecAlgo
