"""Drafter config, checkpoint I/O (strict loading), the backbone's attention pattern and the draft dtype."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_domino.config import CheckpointError, DominoConfig, default_target_layer_ids
from sglang_domino import drafter as drafter_mod
from sglang_domino.drafter import HeadWeights, load_drafter, save_drafter
from sglang_domino.models import init_drafter, tiny_target

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def target():
    return tiny_target("qwen3", vocab_size=96, hidden_size=64, num_layers=6)


@pytest.fixture()
def checkpoint(tmp_path, target):
    drafter = init_drafter(target.config, num_layers=2, num_context_layers=3, block_size=8,
                           gru_hidden_dim=32, emb_dim=16)
    save_drafter(drafter, tmp_path, dtype=torch.float32)
    return tmp_path, drafter


def test_default_layer_ids_match_published_spread():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert default_target_layer_ids(30, 1) == [15]


def test_config_round_trip_in_published_layout(checkpoint):
    path, drafter = checkpoint
    raw = json.loads((path / "config.json").read_text())
    assert raw["architectures"] == ["DFlashDraftModel"]
    assert raw["dflash_config"]["projector_type"] == "domino"
    assert raw["dflash_config"]["shift_label"] is True
    assert DominoConfig.from_dict(raw) == drafter.config


def test_dflash_keys_accepted_at_top_level(checkpoint):
    path, drafter = checkpoint
    raw = json.loads((path / "config.json").read_text())
    raw.update(raw.pop("dflash_config"))
    assert DominoConfig.from_dict(raw) == drafter.config


def test_load_round_trip(checkpoint, target):
    path, drafter = checkpoint
    loaded = load_drafter(path, target.config)
    for (name, a), (_, b) in zip(drafter.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def _rewrite(path, edit):
    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))


@pytest.mark.parametrize("edit, needle", [
    (lambda s: s.pop("norm.weight"), "missing tensor norm.weight"),
    (lambda s: s.pop("layers.1.self_attn.k_norm.weight"), "missing tensor layers.1.self_attn.k_norm.weight"),
    (lambda s: s.update({"prefix_gru.bias_ih_l0": torch.zeros(96)}), "unexpected tensor prefix_gru.bias_ih_l0"),
    (lambda s: s.update({"prefix_gru.bias_hh_l0": torch.zeros(96)}), "unexpected tensor prefix_gru.bias_hh_l0"),
    (lambda s: s.update({"fc.weight": s["fc.weight"].t().contiguous()}), "tensor fc.weight has shape [192, 64]"),
    (lambda s: s.update({"embed_proj.2.weight": torch.zeros(100, 16)}), "tensor embed_proj.2.weight"),
])
def test_malformed_weights_refused_with_tensor_named(checkpoint, target, edit, needle):
    path, _ = checkpoint
    _rewrite(path, edit)
    with pytest.raises(CheckpointError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_drafter(path, target.config)


@pytest.mark.parametrize("field, value, needle", [
    ("vocab_size", 97, "vocab_size=97 but the target's vocab_size=96"),
    ("hidden_size", 128, "hidden_size=128 but the target's hidden_size=64"),
    ("projector_type", "mlp", "projector_type='mlp'"),
    ("target_layer_ids", [1, 9], r"target_layer_ids \[9\] out of range"),
    ("architectures", ["LlamaForCausalLM"], "architectures"),
])
def test_config_mismatch_refused_with_field_named(checkpoint, target, field, value, needle):
    path, _ = checkpoint
    raw = json.loads((path / "config.json").read_text())
    (raw["dflash_config"] if field in raw["dflash_config"] else raw)[field] = value
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=needle):
        load_drafter(path, target.config)


def test_missing_files_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_drafter(tmp_path)


def _backbone(drafter, ctx, block, anchor_pos):
    b, t, _ = ctx.shape
    kv = drafter.context_kv(ctx, torch.arange(t)[None].expand(b, t))
    pos = torch.arange(anchor_pos, anchor_pos + block.shape[1])[None].expand(b, -1)
    return drafter.backbone(block, pos, kv)


def test_block_attention_is_bidirectional_and_sees_only_context(checkpoint):
    _, drafter = checkpoint
    cfg = drafter.config
    torch.manual_seed(0)
    ctx = torch.randn(1, 10, cfg.num_context_layers * cfg.hidden_size)
    block = torch.randn(1, cfg.block_size, cfg.hidden_size)
    z = _backbone(drafter, ctx, block, 10)
    later = block.clone()
    later[:, -1] += 1.0  # the block's last position influences its first (bidirectional)
    assert not torch.allclose(_backbone(drafter, ctx, later, 10)[:, 0], z[:, 0])
    # A context mask hides positions exactly as if they were absent.
    kv = drafter.context_kv(torch.cat([ctx, torch.randn(1, 3, ctx.shape[-1])], 1), torch.arange(13)[None])
    mask = torch.arange(13)[None] < 10
    pos = torch.arange(10, 10 + cfg.block_size)[None]
    torch.testing.assert_close(drafter.backbone(block, pos, kv, mask), z, rtol=1e-5, atol=1e-5)


def test_draft_dtype_auto_env_and_errors(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv(drafter_mod.DRAFT_DTYPE_ENV, raising=False)
    bf16_matmuls = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert drafter_mod.draft_dtype(cpu, torch.float32) == (torch.bfloat16 if bf16_matmuls else torch.float32)
    assert drafter_mod.draft_dtype(cuda, torch.float32) == torch.float32  # GPUs: the model's dtype
    assert drafter_mod.draft_dtype(cpu, torch.float16) == torch.float16
    monkeypatch.setenv(drafter_mod.DRAFT_DTYPE_ENV, "model")
    assert drafter_mod.draft_dtype(cpu, torch.float32) == torch.float32
    monkeypatch.setenv(drafter_mod.DRAFT_DTYPE_ENV, "bf16")
    assert drafter_mod.draft_dtype(cuda, torch.float32) == torch.bfloat16
    monkeypatch.setenv(drafter_mod.DRAFT_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match="SGLANG_DOMINO_DRAFT_DTYPE"):
        drafter_mod.draft_dtype(cpu, torch.float32)


def test_correction_in_casts_only_the_correction():
    head = HeadWeights(*(torch.randn(6, 4) for _ in range(4)))
    cast = head.correction_in(torch.bfloat16)
    assert cast.w_ih is head.w_ih and cast.w_hh is head.w_hh
    assert cast.w1.dtype == cast.w2.dtype == torch.bfloat16
    assert torch.equal(cast.w2.float(), head.w2.bfloat16().float())
