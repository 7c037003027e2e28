"""Loading a Hugging Face target and turning a chat message into its input ids."""

from __future__ import annotations

import torch


def load_target(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """-> (model in eval mode with frozen weights, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(path)


def chat_input_ids(tokenizer, message: str, device: str = "cpu") -> torch.Tensor:
    """One user turn through the chat template (generation prompt added) -> [1, T] int64."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    return ids.to(device)


def stop_token_ids(model, tokenizer) -> list[int]:
    """EOS ids of the generation config and the tokenizer: where plain decoding stops."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
