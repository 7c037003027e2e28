"""Drafter configuration in the published checkpoint format (``config.json``).

A Domino checkpoint is a DFlash checkpoint (``architectures: ["DFlashDraftModel"]``) whose
``dflash_config`` has ``projector_type: "domino"``. The draft layers use a Qwen3-style text config.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

ARCHITECTURE = "DFlashDraftModel"
# Keys of ``dflash_config``; the published checkpoints also accept them at the top level.
DFLASH_KEYS = (
    "block_size",
    "target_layer_ids",
    "mask_token_id",
    "projector_type",
    "shift_label",
    "pure_draft_prefix_len",
    "gru_hidden_dim",
    "emb_dim",
)


class CheckpointError(ValueError):
    """A drafter checkpoint that does not fit its format or its target."""


@dataclasses.dataclass
class DominoConfig:
    # Draft layers (Qwen3-style).
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    # dflash_config.
    block_size: int = 16
    target_layer_ids: list[int] = dataclasses.field(default_factory=lambda: [1])
    mask_token_id: int = 0
    projector_type: str = "domino"
    shift_label: bool = True
    pure_draft_prefix_len: int = 1
    gru_hidden_dim: int = 256
    emb_dim: int = 128

    def __post_init__(self):
        if self.projector_type != "domino":
            raise CheckpointError(
                f"dflash_config.projector_type={self.projector_type!r}: only 'domino' drafters are supported"
            )
        if not self.shift_label:
            raise CheckpointError("dflash_config.shift_label=false is not supported (published Domino uses true)")
        if self.block_size < 2:
            raise CheckpointError(f"dflash_config.block_size={self.block_size}: must be >= 2")
        if not 1 <= self.pure_draft_prefix_len < self.block_size:
            raise CheckpointError(
                f"dflash_config.pure_draft_prefix_len={self.pure_draft_prefix_len}: must be in [1, block_size)"
            )
        if not self.target_layer_ids:
            raise CheckpointError("dflash_config.target_layer_ids is empty")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def num_context_layers(self) -> int:
        return len(self.target_layer_ids)

    def to_dict(self) -> dict:
        """The published ``config.json`` layout."""
        d = dataclasses.asdict(self)
        dflash = {k: d.pop(k) for k in DFLASH_KEYS}
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            **d,
            "dflash_config": dflash,
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "DominoConfig":
        archs = raw.get("architectures") or []
        if ARCHITECTURE not in archs:
            raise CheckpointError(f"config.json architectures={archs}: expected [{ARCHITECTURE!r}]")
        dflash = dict(raw.get("dflash_config") or {})
        for key in DFLASH_KEYS:
            if key not in dflash and key in raw:
                dflash[key] = raw[key]
        if "projector_type" not in dflash:
            raise CheckpointError("config.json has no dflash_config.projector_type (not a Domino drafter)")
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in fields and k not in DFLASH_KEYS}
        kwargs.update({k: v for k, v in dflash.items() if k in fields})
        if "head_dim" not in kwargs and "hidden_size" in kwargs and "num_attention_heads" in kwargs:
            kwargs["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in kwargs]
        if missing:
            raise CheckpointError(f"config.json lacks required field(s): {', '.join(missing)}")
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | Path) -> "DominoConfig":
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        if not file.exists():
            raise CheckpointError(f"{file}: no config.json")
        return cls.from_dict(json.loads(file.read_text()))

    def check_target(self, vocab_size: int, hidden_size: int, num_layers: int) -> None:
        """Refuse a drafter built for another target."""
        if self.vocab_size != vocab_size:
            raise CheckpointError(f"vocab_size={self.vocab_size} but the target's vocab_size={vocab_size}")
        if self.hidden_size != hidden_size:
            raise CheckpointError(f"hidden_size={self.hidden_size} but the target's hidden_size={hidden_size}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < num_layers - 1]
        if bad:
            raise CheckpointError(
                f"dflash_config.target_layer_ids {bad} out of range for a {num_layers}-layer target "
                f"(ids are 0..{num_layers - 2})"
            )
        if not 0 <= self.mask_token_id < vocab_size:
            raise CheckpointError(f"dflash_config.mask_token_id={self.mask_token_id} outside the vocabulary")


def default_target_layer_ids(num_target_layers: int, num_context_layers: int) -> list[int]:
    """Spread ``num_context_layers`` ids from layer 1 to layer L-3 (Qwen3-8B, 5 -> [1, 9, 17, 25, 33])."""
    if num_context_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, max(1, num_target_layers - 3)
    span = end - start
    return [start + round(i * span / (num_context_layers - 1)) for i in range(num_context_layers)]
