"""The Domino drafter: a DFlash-style parallel backbone plus the Domino head.

Backbone: the hidden states of a few target layers at the context positions are concatenated,
projected (``fc``: K*H -> H) and normalised (``hidden_norm``); every draft layer turns them into extra
keys/values. The block ``[anchor, MASK x (B-1)]`` (target embeddings) attends bidirectionally to itself
and to the context strictly before the anchor. One pass gives ``z_0 .. z_{B-1}``; base logits are the
target's ``lm_head(z_i)``.

Head: ``prefix_gru`` (bias-free GRU over target embeddings of the prefix) and ``embed_proj``
(Linear(H+G -> E) -> SiLU -> Linear(E -> V)) add a causal correction to the base logits; see
``rollout.py`` for how proposals are drawn.

Embedding and lm_head are the target's, passed in by the caller; the checkpoint does not hold them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .config import CheckpointError, DominoConfig
from .linear import linear


class Linear(nn.Linear):
    """``nn.Linear`` through ``sglang_domino.linear`` (cheaper at a few rows on a CPU; same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half layout). x: [b, heads, T, d]; positions: [b, T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions.float()[:, None, :, None] * inv_freq  # [b, 1, T, d/2]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DominoConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = Linear(h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = Linear(h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = Linear(cfg.num_attention_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.cfg.head_dim).transpose(1, 2)  # [b, n, t, d]

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values (rotated) of x: [b, T, H] at positions [b, T] -> two [b, kvh, T, d]."""
        k = self.k_norm(self._heads(self.k_proj(x), self.cfg.num_key_value_heads))
        v = self._heads(self.v_proj(x), self.cfg.num_key_value_heads)
        return apply_rope(k, positions, self.cfg.rope_theta), v

    def forward(self, x, positions, ctx_k, ctx_v, ctx_mask=None):
        """x: [b, B, H] block; ctx_k/ctx_v: [b, kvh, T, d]; ctx_mask: [b, T] bool (True = attend)."""
        cfg = self.cfg
        q = apply_rope(self.q_norm(self._heads(self.q_proj(x), cfg.num_attention_heads)), positions, cfg.rope_theta)
        k, v = self.kv(x, positions)
        k, v = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)
        mask = None
        if ctx_mask is not None:
            block = torch.ones(x.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
            mask = torch.cat([ctx_mask, block], 1)[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))


class MLP(nn.Module):
    def __init__(self, cfg: DominoConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DominoConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, positions, ctx_k, ctx_v, ctx_mask=None):
        h = h + self.self_attn(self.input_layernorm(h), positions, ctx_k, ctx_v, ctx_mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DominoDrafter(nn.Module):
    """Parameters in the published checkpoint's names (``fc``, ``layers.N.*``, ``prefix_gru``, ...)."""

    def __init__(self, cfg: DominoConfig):
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.fc = Linear(cfg.num_context_layers * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.prefix_gru = nn.GRU(h, cfg.gru_hidden_dim, num_layers=1, bias=False, batch_first=True)
        self.embed_proj = nn.Sequential(
            Linear(h + cfg.gru_hidden_dim, cfg.emb_dim, bias=False),
            nn.SiLU(),
            Linear(cfg.emb_dim, cfg.vocab_size, bias=False),
        )

    # -- backbone ---------------------------------------------------------------------------------
    def context_kv(self, target_hidden: torch.Tensor,
                   positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context keys/values.

        target_hidden: [b, T, K*H] (target layers' hidden states, concatenated in target_layer_ids order);
        positions: [b, T]. Returns one ([b, kvh, T, d], [b, kvh, T, d]) pair per draft layer.
        """
        ctx = self.hidden_norm(self.fc(target_hidden))
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def backbone(self, block_embeds, positions, ctx_kv, ctx_mask=None) -> torch.Tensor:
        """One parallel pass over the block.

        block_embeds: [b, B, H] target embeddings of [anchor, MASK ...]; positions: [b, B];
        ctx_kv: from ``context_kv`` (context strictly before the anchor); ctx_mask: [b, T] or None.
        Returns z: [b, B, H].
        """
        h = block_embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            h = layer(h, positions, k, v, ctx_mask)
        return self.norm(h)

    # -- head ---------------------------------------------------------------------------------------
    def head_weights(self) -> "HeadWeights":
        return HeadWeights(self.prefix_gru.weight_ih_l0, self.prefix_gru.weight_hh_l0,
                           self.embed_proj[0].weight, self.embed_proj[2].weight)


def vocab_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rows of x against a vocabulary matrix (the target's lm_head, or embed_proj's output layer).

    x [..., D], weight [V, D] -> [..., V], as one 2-D matmul: ``x @ weight.T`` on a sliced 3-D x runs as a
    batched matmul that re-reads the whole matrix per row (about 3x slower on a CPU, backward included);
    a few rows on a CPU take ``sglang_domino.linear``'s transposed form.
    """
    return linear(x.reshape(-1, x.shape[-1]), weight).view(*x.shape[:-1], weight.shape[0])


DRAFT_DTYPE_ENV = "SGLANG_DOMINO_DRAFT_DTYPE"


def draft_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype of a draft's vocabulary-sized products (base logits from the target's lm_head, the head).

    A draft step mostly waits on reading those [V, D] matrices. On a CPU with bf16 matmuls (AVX512-BF16 /
    AMX) bf16 cut SmolLM2's block-16 backbone step from 26.3 to 9.5 ms
    (``bench/results/acceptance-smollm2-draft-dtype-*.json``), so ``auto`` (the default) picks bf16 there and
    ``dtype`` elsewhere.
    Only drafts change: the target verifies in its own dtype, so outputs stay exact.
    ``SGLANG_DOMINO_DRAFT_DTYPE``: auto, bfloat16, or model (= ``dtype``).
    """
    raw = os.environ.get(DRAFT_DTYPE_ENV, "auto").strip().lower()
    if raw in ("bfloat16", "bf16"):
        return torch.bfloat16
    if raw in ("model", "float32", "fp32"):
        return dtype
    if raw not in ("", "auto"):
        raise ValueError(f"{DRAFT_DTYPE_ENV}={raw!r}: expected auto, bfloat16 or model")
    if device.type == "cpu" and dtype == torch.float32 and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return dtype


GATE_TABLE_ENV = "SGLANG_DOMINO_GATE_TABLE"


class HeadWeights(NamedTuple):
    """The Domino head's tensors (GRU gates in PyTorch's r, z, n order).

    gate_table: optional [V, 3G] fp32, every token's GRU input gates ``E[v] @ w_ih^T`` computed once, so a
    rollout step gathers a row instead of reading w_ih (``with_gate_table``).
    """

    w_ih: torch.Tensor  # [3G, H]
    w_hh: torch.Tensor  # [3G, G]
    w1: torch.Tensor  # [E, H+G]
    w2: torch.Tensor  # [V, E]
    gate_table: torch.Tensor | None = None  # [V, 3G] fp32

    def correction_in(self, dtype: torch.dtype) -> "HeadWeights":
        """The correction MLP (w1, w2) in ``dtype``; the GRU runs in fp32 either way."""
        return self._replace(w1=self.w1.to(dtype), w2=self.w2.to(dtype))

    def with_gate_table(self, embed: torch.Tensor, rows: int = 8192) -> "HeadWeights":
        """Add the gate table for the embedding table ``embed`` [V, H] (fp32, V x 3G x 4 bytes: 75 MB for
        SmolLM2-135M with G = 128, 1.9 GB for Qwen3-8B with G = 1024), built ``rows`` tokens at a time."""
        with torch.no_grad():
            w_ih = self.w_ih.float()
            table = torch.empty(embed.shape[0], w_ih.shape[0], dtype=torch.float32, device=embed.device)
            for lo in range(0, embed.shape[0], rows):
                torch.matmul(embed[lo:lo + rows].float(), w_ih.t(), out=table[lo:lo + rows])
        return self._replace(gate_table=table)


def drafting_head(drafter: DominoDrafter, embed: torch.Tensor, dtype: torch.dtype) -> HeadWeights:
    """The head as a decoder drafts with it: the correction in ``dtype`` (``draft_dtype``), plus the gate
    table when ``SGLANG_DOMINO_GATE_TABLE=1`` (off by default: it trades V x 3G x 4 bytes of memory for
    the w_ih read of every rollout step; drafts are the same up to fp32 summation order)."""
    head = drafter.head_weights().correction_in(dtype)
    raw = os.environ.get(GATE_TABLE_ENV, "0").strip().lower()
    if raw not in ("0", "1", "off", "on", ""):
        raise ValueError(f"{GATE_TABLE_ENV}={raw!r}: expected 0 or 1 (off or on)")
    return head.with_gate_table(embed) if raw in ("1", "on") else head


# -- checkpoint I/O -------------------------------------------------------------------------------------
def save_drafter(model: DominoDrafter, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def load_drafter(path: str | Path, target_config=None, dtype: torch.dtype | None = None,
                 device: str | torch.device = "cpu") -> DominoDrafter:
    """Load a drafter strictly: every tensor must be present, expected and of the right shape.

    target_config: the target's HF config (checks vocab, hidden size and layer ids) or None.
    """
    cfg = DominoConfig.load(path)
    if target_config is not None:
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        cfg.check_target(text.vocab_size, text.hidden_size, text.num_hidden_layers)
    with torch.device("meta"):
        model = DominoDrafter(cfg)
    state = read_state_dict(path)
    check_state_dict(model, state)
    model = model.to_empty(device=device)
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model = model.to(dtype)
    return model.eval()


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = []
    for name in sorted(expected.keys() - state.keys()):
        problems.append(f"missing tensor {name} {list(expected[name])}")
    for name in sorted(state.keys() - expected.keys()):
        problems.append(f"unexpected tensor {name} {list(state[name].shape)}")
    for name in sorted(expected.keys() & state.keys()):
        if tuple(state[name].shape) != expected[name]:
            problems.append(f"tensor {name} has shape {list(state[name].shape)}, expected {list(expected[name])}")
    if problems:
        raise CheckpointError("malformed drafter checkpoint: " + "; ".join(problems))
