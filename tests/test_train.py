"""Trainer tests: curriculum loss and schedules by hand, block isolation, features, a short run,
exact resume, export (load_drafter + SGLang's own config parser), data helpers. Tiny models only."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from sglang_domino.drafter import load_drafter
from sglang_domino.models import init_drafter, tiny_target
from sglang_domino.rollout import rollout
from sglang_domino.train.anchors import IGNORE, build_blocks, sample_anchors
from sglang_domino.train.curriculum import (Frozen, block_logits, curriculum_loss, default_gamma, lambda_at,
                                            lr_factor, position_weights, weighted_ce)
from sglang_domino.train.features import FeatureExtractor
from sglang_domino.train.trainer import TrainConfig, Trainer

torch.set_num_threads(1)
V, H, L = 64, 64, 6


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=V, hidden_size=H, num_layers=L, seed=0)


def make_examples(n=24, length=40, prompt_len=8, seed=0):
    """Learnable synthetic data: arithmetic progressions mod 60."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        start, step = int(torch.randint(0, 60, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
        ids = torch.tensor([(start + step * k) % 60 for k in range(length)], dtype=torch.int32)
        out.append({"id": str(i), "input_ids": ids, "prompt_len": prompt_len, "sampled": i % 4 == 3})
    return out


def small_cfg(tmp_path, **kw):
    base = dict(run_dir=str(tmp_path / "run"), out=str(tmp_path / "out"), block_size=8, num_layers=1,
                num_context_layers=2, gru_hidden_dim=16, emb_dim=16, batch_seqs=4, anchors_per_seq=6, lr=3e-3,
                max_steps=12, eval_every=0, ckpt_every=0, ckpt_minutes=0, progress=False, val_examples=4,
                feature_dtype="float32")
    base.update(kw)
    return TrainConfig(**base)


def random_head_drafter(target, block_size=8, seed=1):
    d = init_drafter(target.config, num_layers=1, num_context_layers=2, block_size=block_size, gru_hidden_dim=16,
                     emb_dim=16, seed=seed, init_std=0.2)
    return d.float().eval()


# -- schedules and loss by hand ---------------------------------------------------------------------
def test_gamma_and_position_weights():
    assert default_gamma(16) == 7 and default_gamma(10) == 5 and default_gamma(8) == 4
    w = position_weights(16, 7.0)
    assert w.shape == (15,)
    assert w[0].item() == 1.0
    assert w[7].item() == pytest.approx(math.exp(-1.0))
    assert w[14].item() == pytest.approx(math.exp(-2.0))


def test_lambda_schedule():
    assert lambda_at(0, 100, 0.5) == 1.0
    assert lambda_at(25, 100, 0.5) == pytest.approx(0.5)
    assert lambda_at(40, 100, 0.5) == pytest.approx(0.2)
    assert lambda_at(50, 100, 0.5) == 0.0 and lambda_at(99, 100, 0.5) == 0.0
    assert lambda_at(50, 100, 1.0) == pytest.approx(0.5)
    assert lambda_at(77, 100, 0.5, lambda_const=1.0) == 1.0  # plain DFlash
    assert lambda_at(77, 100, 0.5, lambda_const=0.0) == 0.0


def test_lr_schedule():
    assert lr_factor(0, 100, 4) == pytest.approx(0.25)
    assert lr_factor(3, 100, 4) == pytest.approx(1.0)
    assert lr_factor(4, 100, 4) == pytest.approx(1.0)
    assert lr_factor(52, 100, 4) == pytest.approx(0.5)
    assert lr_factor(100, 100, 4, min_ratio=0.1) == pytest.approx(0.1)


def test_weighted_ce_by_hand():
    # 1 row, 2 predictions, vocabulary of 3.
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    labels = torch.tensor([[0, 2]])
    w = torch.tensor([1.0, math.exp(-1 / 7)])
    ce0 = -math.log(math.exp(2) / (math.exp(2) + 2))
    ce1 = -math.log(1 / (math.e + 2))
    expect = (ce0 * 1 + ce1 * w[1].item()) / (1 + w[1].item())
    assert weighted_ce(logits, labels, w).item() == pytest.approx(expect, rel=1e-6)
    # ignored labels drop out of numerator and denominator
    assert weighted_ce(logits, torch.tensor([[0, IGNORE]]), w).item() == pytest.approx(ce0, rel=1e-6)
    loss, hits = weighted_ce(logits, labels, w, with_correct=True)
    assert hits.tolist() == [[True, False]]


def test_curriculum_loss_mixes_base_and_final():
    torch.manual_seed(0)
    base, final = torch.randn(3, 4, 10), torch.randn(3, 4, 10)
    labels = torch.randint(0, 10, (3, 4))
    labels[1, 2:] = IGNORE
    w = position_weights(5, 4.0)
    cb, cf = weighted_ce(base, labels, w).item(), weighted_ce(final, labels, w).item()
    for lam in (1.0, 0.7, 0.0):
        loss, stats = curriculum_loss(base, final, labels, w, lam)
        assert loss.item() == pytest.approx((1 - lam) * cf + lam * cb, rel=1e-6)
    loss, stats = curriculum_loss(base, None, labels, w, 0.3)  # backbone only: base CE
    assert loss.item() == pytest.approx(cb, rel=1e-6)


# -- blocks ----------------------------------------------------------------------------------------
def test_sample_anchors_range():
    g = torch.Generator().manual_seed(0)
    a = sample_anchors(5, 30, 8, g)
    assert len(a) == 8 and len(set(a.tolist())) == 8
    assert a.min() >= 5 and a.max() <= 28 and torch.all(a[1:] > a[:-1])
    assert sample_anchors(5, 9, 8, g).tolist() == [5, 6, 7]
    assert sample_anchors(5, 6, 8, g).numel() == 0


def test_build_blocks_layout():
    seq = torch.arange(10, 30)  # x_t = 10 + t, length 20
    b = build_blocks([seq], [torch.tensor([4, 15])], block_size=8, mask_token_id=99)
    assert b.block_ids[0].tolist() == [14] + [99] * 7
    assert b.positions[0].tolist() == list(range(4, 12))
    assert b.labels[0].tolist() == list(range(15, 22))  # x_{a+1} .. x_{a+7}
    assert b.gru_ids[0].tolist() == list(range(14, 21))  # x_a .. x_{a+6}
    assert b.labels[1].tolist() == [26, 27, 28, 29] + [IGNORE] * 3  # past the end
    assert b.ctx_len == 15
    assert b.ctx_mask[0].tolist() == [True] * 4 + [False] * 11
    assert b.ctx_mask[1].all()


def test_build_blocks_relabelled_keep_labels_while_on_the_chain():
    """A relabelled sequence: labels are the target's greedy tokens, until the sequence leaves that chain."""
    seq = torch.arange(10, 30)  # x_t = 10 + t
    g = seq.roll(-1).clone()  # the target agrees with the text everywhere ...
    g[6] = 5  # ... except after x_6: the chain from anchor 4 leaves the text at x_7
    b = build_blocks([seq, seq], [torch.tensor([4]), torch.tensor([7])], block_size=8, mask_token_id=99,
                     targets=[g, None])
    # anchor 4: x_5, x_6 follow the chain, so labels g_4, g_5, g_6 are the chain's tokens; x_7 != g_6 ends it
    assert b.labels[0].tolist() == [15, 16, 5] + [IGNORE] * 4
    assert b.gru_ids[0].tolist() == list(range(14, 21))  # the GRU still reads the text
    assert b.labels[1].tolist() == list(range(18, 25))  # no targets: the text is the chain
    off = build_blocks([seq], [torch.tensor([6])], block_size=8, mask_token_id=99, targets=[g])
    assert off.labels[0].tolist() == [5] + [IGNORE] * 6  # the first label is always exact


def _features(target, seqs, layer_ids):
    return FeatureExtractor(target, layer_ids, store_dtype=torch.float32).compute(seqs)


def _pad(feats):
    T = max(f.shape[0] for f in feats)
    out = feats[0].new_zeros(len(feats), T, feats[0].shape[1])
    for j, f in enumerate(feats):
        out[j, :f.shape[0]] = f
    return out


@torch.no_grad()
def test_blocks_see_only_their_own_past(target):
    """Perturbing context at/after an anchor, or tokens after a prediction, leaves that prediction alone."""
    drafter = random_head_drafter(target)
    frozen = Frozen.from_target(target)
    ids = [e["input_ids"].long() for e in make_examples(2, length=36)]
    anchors = [torch.tensor([9, 20]), torch.tensor([12])]
    layers = drafter.config.target_layer_ids
    feats = _pad(_features(target, ids, layers))
    batch = build_blocks(ids, anchors, 8, drafter.config.mask_token_id)
    base, final = block_logits(drafter, frozen, batch, feats)

    # 1) features of seq 0 at positions >= 9 replaced: row 0 (anchor 9) and seq 1's row unchanged.
    f2 = feats.clone()
    f2[0, 9:] = torch.randn_like(f2[0, 9:]) * 10
    b2, fi2 = block_logits(drafter, frozen, batch, f2)
    for r in (0, 2):
        assert torch.equal(base[r], b2[r]) and torch.equal(final[r], fi2[r])
    assert not torch.allclose(base[1], b2[1])  # anchor 20 does see positions 9..19

    # 2) tokens after x_{a+k} changed: predictions 0..k of that row unchanged (causal GRU), later ones move.
    k = 3
    ids2 = [t.clone() for t in ids]
    ids2[0][9 + k + 1:] = (ids2[0][9 + k + 1:] + 7) % 60
    batch2 = build_blocks(ids2, anchors, 8, drafter.config.mask_token_id)
    b3, fi3 = block_logits(drafter, frozen, batch2, feats)  # same features: only the GRU inputs moved
    assert torch.equal(base[0], b3[0])
    assert torch.equal(final[0, :k + 1], fi3[0, :k + 1])
    assert not torch.allclose(final[0, k + 1:], fi3[0, k + 1:])

    # 3) rows are independent of which other rows share the batch.
    solo = build_blocks([ids[1]], [anchors[1]], 8, drafter.config.mask_token_id)
    b4, fi4 = block_logits(drafter, frozen, solo, feats[1:, :solo.ctx_len])
    torch.testing.assert_close(fi4[0], final[2], rtol=1e-5, atol=1e-5)

    # 4) the first prediction (pure_draft_prefix_len = 1) has no correction.
    assert torch.equal(final[:, 0], base[:, 0])


@torch.no_grad()
def test_teacher_forcing_matches_rollout(target):
    """Along the drafted chain, teacher-forced final logits pick exactly the rollout's tokens."""
    drafter = random_head_drafter(target, seed=3)
    frozen = Frozen.from_target(target)
    layers = drafter.config.target_layer_ids
    prefix = make_examples(1, length=20)[0]["input_ids"].long()
    a = prefix.numel() - 1  # anchor = last token
    feats = _pad(_features(target, [prefix], layers))[:, :a]
    ctx = drafter.context_kv(feats, torch.arange(a)[None])
    block = torch.full((1, 8), drafter.config.mask_token_id)
    block[0, 0] = prefix[a]
    z = drafter.backbone(F.embedding(block, frozen.embed), torch.arange(a, a + 8)[None], ctx)
    zp = z[:, :-1]
    tokens, _ = rollout(zp, zp @ frozen.lm_head.t(), prefix[a:a + 1], frozen.embed, drafter.head_weights(), 1)
    seq = torch.cat([prefix, tokens[0]])
    batch = build_blocks([seq], [torch.tensor([a])], 8, drafter.config.mask_token_id)
    _, final = block_logits(drafter, frozen, batch, torch.cat([feats, feats.new_zeros(1, 8, feats.shape[2])], 1))
    assert final[0].argmax(-1).tolist() == tokens[0].tolist()


def test_features_are_layer_outputs_and_cached(target, tmp_path):
    ids = make_examples(2)[0]["input_ids"]
    ext = FeatureExtractor(target, [1, 3], cache_dir=tmp_path / "f", compute_dtype=torch.float32)
    (f,) = ext([ids])
    with torch.no_grad():
        hs = target.model(input_ids=ids.long()[None], output_hidden_states=True).hidden_states
    expect = torch.cat([hs[2][0], hs[4][0]], -1).to(torch.bfloat16)
    assert f.shape == (len(ids), 2 * H) and torch.equal(f, expect)
    again = FeatureExtractor(target, [1, 3], cache_dir=tmp_path / "f", compute_dtype=torch.float32)
    assert len(list((tmp_path / "f").glob("*.pt"))) == 1
    assert torch.equal(again([ids])[0], f)


@torch.no_grad()
def test_labelled_gives_argmax_and_caches_the_same_features(target, tmp_path):
    ids = make_examples(2)[1]["input_ids"]
    ext = FeatureExtractor(target, [1, 3], cache_dir=tmp_path / "f", compute_dtype=torch.float32)
    labels = ext.labelled(ids)
    assert labels.dtype == torch.int32
    assert labels.tolist() == target(input_ids=ids.long()[None]).logits[0].argmax(-1).tolist()
    assert ext.cached(ids) and torch.equal(ext([ids])[0], ext.compute([ids])[0])


@torch.no_grad()
def test_loss_vocab_is_a_column_subset(target):
    """Restricting the softmax to the data's tokens gives exactly those columns of the full logits."""
    drafter = random_head_drafter(target, seed=4)
    seqs = [e["input_ids"].long() for e in make_examples(2, length=30)]
    vocab = torch.unique(torch.cat(seqs))
    full, sub = Frozen.from_target(target), Frozen.from_target(target, vocab[torch.randperm(len(vocab))])
    assert torch.equal(sub.vocab, vocab) and sub.full().vocab is None
    batch = build_blocks(seqs, [torch.tensor([10, 20]), torch.tensor([12])], 8, drafter.config.mask_token_id)
    feats = _pad(_features(target, seqs, drafter.config.target_layer_ids))
    base_f, final_f = block_logits(drafter, full, batch, feats)
    base_s, final_s = block_logits(drafter, sub, batch, feats)
    torch.testing.assert_close(base_s, base_f[..., vocab])
    torch.testing.assert_close(final_s, final_f[..., vocab])
    labels = sub.to_loss_vocab(batch.labels)
    valid = batch.labels != IGNORE
    assert torch.equal(vocab[labels[valid]], batch.labels[valid]) and bool((labels[~valid] == IGNORE).all())
    outside = torch.tensor([[int(vocab.max()) + 1]])
    if outside.item() < V:
        with pytest.raises(ValueError, match="outside the loss vocabulary"):
            sub.to_loss_vocab(outside)


@torch.no_grad()
def test_negatives_are_extra_columns(target):
    """Sampled negatives: columns = data vocabulary then tokens outside it, logits = those full columns,
    labels keep their positions, the same draw for the same generator seed."""
    drafter = random_head_drafter(target, seed=4)
    seqs = [e["input_ids"].long() for e in make_examples(2, length=30)]
    vocab = torch.unique(torch.cat(seqs))
    sub = Frozen.from_target(target, vocab)
    neg = sub.with_negatives(5, torch.Generator().manual_seed(0))
    again = sub.with_negatives(5, torch.Generator().manual_seed(0))
    cols = neg.columns()
    assert torch.equal(cols, again.columns()) and torch.equal(cols[:len(vocab)], vocab)
    assert len(cols) == len(vocab) + 5 and not bool(torch.isin(cols[len(vocab):], vocab).any())
    batch = build_blocks(seqs, [torch.tensor([10, 20]), torch.tensor([12])], 8, drafter.config.mask_token_id)
    feats = _pad(_features(target, seqs, drafter.config.target_layer_ids))
    base_f, final_f = block_logits(drafter, Frozen.from_target(target), batch, feats)
    base_n, final_n = block_logits(drafter, neg, batch, feats)
    torch.testing.assert_close(base_n, base_f[..., cols])
    torch.testing.assert_close(final_n, final_f[..., cols])
    assert torch.equal(neg.to_loss_vocab(batch.labels), sub.to_loss_vocab(batch.labels))
    assert Frozen.from_target(target).with_negatives(5, torch.Generator()).columns() is None  # full: unchanged


@torch.no_grad()
def test_warm_start_copies_the_next_target_layer(target):
    """--init-layers target: draft layer 0 = target layer (deepest context layer + 1), and the context
    keys/values it starts from are exactly that target layer's."""
    from sglang_domino.train.warm_start import copy_target_layers

    drafter = random_head_drafter(target)
    ids = make_examples(1, length=20)[0]["input_ids"].long()
    copied = copy_target_layers(drafter, target, [ids])
    t = max(drafter.config.target_layer_ids) + 1
    assert copied == [t]
    src = target.model.layers[t]
    assert torch.equal(drafter.layers[0].mlp.down_proj.weight, src.mlp.down_proj.weight)
    assert torch.equal(drafter.layers[0].self_attn.q_proj.weight, src.self_attn.q_proj.weight)
    feats = _features(target, [ids], drafter.config.target_layer_ids)[0].float()
    hs = target(input_ids=ids[None], output_hidden_states=True).hidden_states
    ctx = drafter.hidden_norm(drafter.fc(feats))
    torch.testing.assert_close(ctx, src.input_layernorm(hs[t][0]), rtol=2e-2, atol=2e-2)  # features are bf16
    assert float(drafter.layers[0].self_attn.q_norm.weight[0]) > 0
    deep = random_head_drafter(target)
    deep.config.target_layer_ids = [1, L - 1]
    with pytest.raises(ValueError, match="cannot copy target layers"):
        copy_target_layers(deep, target)


def test_features_precomputed_once_and_shared(target, tmp_path, monkeypatch):
    exs = make_examples(12)
    shared = tmp_path / "features"
    first = Trainer(small_cfg(tmp_path / "a", features_dir=str(shared), stop_after_steps=0), target=target,
                    examples=exs)
    first.run()
    assert len(list(shared.glob("*.pt"))) == len({tuple(e["input_ids"].tolist()) for e in exs})  # one per sequence
    assert not (tmp_path / "a" / "run" / "features").exists()
    second = Trainer(small_cfg(tmp_path / "b", features_dir=str(shared), max_steps=2), target=target, examples=exs)
    monkeypatch.setattr(FeatureExtractor, "compute", lambda *a, **k: pytest.fail("features recomputed"))
    second.run()
    assert second.step == 2


def test_more_data_folders_keep_the_split_and_use_each_prompt_once(target, tmp_path):
    def folder(name, exs):
        (tmp_path / name / "shards").mkdir(parents=True)
        torch.save(exs, tmp_path / name / "shards" / "shard_00000.pt")
        return str(tmp_path / name)

    first = make_examples(20, seed=0)
    second = [dict(e, id=f"b{e['id']}") for e in make_examples(16, prompt_len=9, seed=5)]  # other prompts
    repeat = dict(first[3], input_ids=first[3]["input_ids"].clone(), id="again")
    repeat["input_ids"][-1] = 59  # same prompt, another answer: used once (the first folder's)
    one = Trainer(small_cfg(tmp_path / "one", data=folder("a", first)), target=target)
    both = Trainer(small_cfg(tmp_path / "two", data=[folder("a2", first), folder("b", second + [repeat])]),
                   target=target)
    assert [e["id"] for e in both.val] == [e["id"] for e in one.val]  # held-out split from the first folder
    train_ids = [e["id"] for e in both.train_set]
    assert train_ids[:len(one.train_set)] == [e["id"] for e in one.train_set]
    assert len(train_ids) == len(one.train_set) + len(second) and "again" not in train_ids
    assert both.data_fingerprint != one.data_fingerprint
    # the card says which folder holds later turns (relabel-data --later-turns records it in meta.json)
    assert "Data: ShareGPT first-turn prompts (never MT-Bench)" in one.model_card()
    (tmp_path / "b" / "meta.json").write_text(json.dumps({"config": {"later_turns": True}}))
    assert f"in {tmp_path / 'b'}, later exchanges with the conversation before them" in both.model_card()


def test_heldout_split_does_not_depend_on_the_seed(target, tmp_path):
    """A later stage run with another --seed keeps the held-out conversations out of its training set."""
    exs = make_examples(40)
    a = Trainer(small_cfg(tmp_path / "a", seed=0), target=target, examples=exs)
    b = Trainer(small_cfg(tmp_path / "b", seed=1), target=target, examples=exs)
    assert [e["id"] for e in a.val] == [e["id"] for e in b.val]
    assert not {e["id"] for e in b.val} & {e["id"] for e in b.train_set}
    ids = [[e["id"] for e in t.batch_for_step(0)[0]] for t in (a, b)]
    assert ids[0] != ids[1]  # the seed still changes the data order


def test_relabelled_examples_train_with_their_labels(target, tmp_path):
    """Relabelled examples: their label tokens join the loss vocabulary and training runs on them."""
    exs = make_examples(12)
    relabelled = [dict(e, id=f"r{e['id']}", labels=torch.full_like(e["input_ids"], 61), prompt_len=9) for e in exs]
    tr = Trainer(small_cfg(tmp_path, loss_vocab="data", loss_negatives=0, max_steps=3), target=target,
                 examples=exs + relabelled)
    assert 61 in tr.frozen.vocab.tolist() and any("labels" in e for e in tr.train_set)
    tr.run()
    assert tr.step == 3
    n = sum("labels" in e for e in tr.train_set)
    assert n > 0 and f"{n} of them ShareGPT's own answers relabelled" in (tmp_path / "out" / "README.md").read_text()


# -- training --------------------------------------------------------------------------------------
def test_short_run_lowers_loss(target, tmp_path):
    exs = make_examples(40, length=40)
    tr = Trainer(small_cfg(tmp_path, max_steps=40, decay_ratio=0.5, eval_every=20, init_layers="random"), target=target,
                 examples=exs)
    before = tr.evaluate()
    tr.run()
    after = tr.evaluate()
    assert after["val_ce_final"] < before["val_ce_final"] - 0.2
    assert after["val_ce_base"] < before["val_ce_base"]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    assert steps[0]["lambda"] > 0.5 and steps[-1]["lambda"] == 0.0
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert tr.best_val is not None and load_drafter(tmp_path / "run" / "best", target.config) is not None


def test_resume_is_exact(target, tmp_path):
    exs = make_examples(24)
    # loss_vocab="data" (softmax over the data's tokens) here; the other trainer tests use the full vocabulary
    full = Trainer(small_cfg(tmp_path / "a", max_steps=10, loss_vocab="data"), target=target, examples=exs)
    assert full.frozen.vocab is not None
    full.run()
    part = Trainer(small_cfg(tmp_path / "b", max_steps=10, stop_after_steps=4, loss_vocab="data"), target=target,
                   examples=exs)
    part.run()
    assert part.step == 4
    rest = Trainer(small_cfg(tmp_path / "b", max_steps=10, loss_vocab="data"), target=target, examples=exs)
    assert rest.step == 4
    rest.run()
    a, b = full.drafter.state_dict(), rest.drafter.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    oa, ob = full.optimizer.state_dict()["state"], rest.optimizer.state_dict()["state"]
    for i in oa:
        assert torch.equal(oa[i]["exp_avg_sq"], ob[i]["exp_avg_sq"])
    assert full.scheduler.get_last_lr() == rest.scheduler.get_last_lr()


def test_resume_refuses_other_schedule(target, tmp_path):
    exs = make_examples(24)
    Trainer(small_cfg(tmp_path, max_steps=4, stop_after_steps=2), target=target, examples=exs).run()
    with pytest.raises(ValueError, match="total steps"):
        Trainer(small_cfg(tmp_path, max_steps=6), target=target, examples=exs)
    with pytest.raises(ValueError, match="other training data"):
        Trainer(small_cfg(tmp_path, max_steps=4), target=target, examples=exs[:-1])


def test_export_loads_and_sglang_parses(target, tmp_path):
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    tr = Trainer(small_cfg(tmp_path, max_steps=3), target=target, examples=make_examples(24))
    tr.run()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = load_drafter(out, target.config)
    for k, v in tr.drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.to(torch.bfloat16)), k
    assert not any("bias" in k for k in loaded.state_dict())
    raw = json.loads((out / "config.json").read_text())
    assert raw["torch_dtype"] == "bfloat16"
    parsed = parse_dflash_draft_config(draft_hf_config=raw)
    assert parsed.projector_type == "domino"
    assert parsed.block_size == 8
    assert parsed.target_layer_ids == loaded.config.target_layer_ids
    assert parsed.mask_token_id == loaded.config.mask_token_id
    assert parsed.gru_hidden_dim == 16 and parsed.emb_dim == 16
    assert parsed.pure_draft_prefix_len == 1 and parsed.shift_label is True
    assert "step 3 / 3" in (out / "README.md").read_text()


def test_init_from_continues_an_export_and_quotes_its_card(target, tmp_path):
    first = Trainer(small_cfg(tmp_path / "a", max_steps=3), target=target, examples=make_examples(24))
    first.run()
    second = Trainer(small_cfg(tmp_path / "b", max_steps=2, init_from=str(tmp_path / "a" / "out")), target=target,
                     examples=make_examples(24))
    for k, v in first.drafter.state_dict().items():
        assert torch.equal(second.drafter.state_dict()[k], v.to(torch.bfloat16).float()), k
    second.run()
    card = (tmp_path / "b" / "out" / "README.md").read_text()
    assert "step 2 / 2" in card and "> - Status: **complete**: step 3 / 3" in card


def test_lambda_one_is_plain_dflash(target, tmp_path):
    tr = Trainer(small_cfg(tmp_path, max_steps=4, lambda_const=1.0), target=target, examples=make_examples(24))
    tr.run()
    assert torch.count_nonzero(tr.drafter.embed_proj[2].weight) == 0  # correction stays exactly zero
    assert "DFlash baseline" in (tmp_path / "out" / "README.md").read_text()


# -- data --------------------------------------------------------------------------------------------
def test_sharegpt_recovers_complete_records(tmp_path):
    from sglang_domino.train.data import first_human_turn, iter_sharegpt_records

    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
            for i in range(3)]
    text = json.dumps(recs, indent=2)
    cut = text[: text.rfind('"gpt"')]  # mid-record, like the packaged file
    (tmp_path / "s.json").write_text(cut)
    got = list(iter_sharegpt_records(tmp_path / "s.json"))
    assert [r["id"] for r in got] == ["r0", "r1"]
    assert first_human_turn(got[1]) == "q1"
    assert first_human_turn({"conversations": [{"from": "gpt", "value": "x"}]}) is None


def test_heldout_prompts_skip_every_training_folder(tmp_path, monkeypatch):
    import sglang_domino.prompts as prompts

    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(6)]
    (tmp_path / "s.json").write_text(json.dumps(recs))
    monkeypatch.setattr(prompts, "sharegpt_path", lambda: tmp_path / "s.json")
    gen, relabelled = tmp_path / "data" / "gen", tmp_path / "data" / "relabelled"
    gen.mkdir(parents=True)
    (gen / "prompts.jsonl").write_text(json.dumps({"id": "r5"}) + "\n")  # gen-data: the prompts it chose
    (relabelled / "shards").mkdir(parents=True)  # relabel-data: ids only in its examples
    torch.save([{"id": "r3", "prompt_len": 1, "input_ids": torch.tensor([1, 2])}],
               relabelled / "shards" / "shard_00000.pt")
    assert prompts.training_record_ids([gen, relabelled]) == {"r5", "r3"}
    assert prompts.sharegpt_heldout(3, []) == ["question 5", "question 4", "question 3"]
    assert prompts.sharegpt_heldout(3, [gen, relabelled]) == ["question 4", "question 2", "question 1"]
    monkeypatch.chdir(tmp_path)  # default: every folder under ./data
    assert prompts.sharegpt_heldout(3) == ["question 4", "question 2", "question 1"]


def test_generate_batch_stores_prompt_and_response(target):
    from sglang_domino.train.data import GenConfig, generate_batch

    cfg = GenConfig(target="unused", max_new_tokens=6)
    batch = [{"id": "a", "prompt_ids": [5, 6, 7], "sampled": False}, {"id": "b", "prompt_ids": [8, 9], "sampled": False}]
    out = generate_batch(target, batch, cfg, pad_id=0, eos_ids=[V - 1], seed=0)
    assert out[0]["input_ids"][:3].tolist() == [5, 6, 7] and out[0]["prompt_len"] == 3
    assert out[1]["input_ids"][:2].tolist() == [8, 9] and out[1]["prompt_len"] == 2
    for ex in out:
        resp = ex["input_ids"][ex["prompt_len"]:]
        assert 1 <= len(resp) <= 6
    # greedy: the unpadded single-prompt generation gives the same response
    solo = generate_batch(target, batch[1:], cfg, pad_id=0, eos_ids=[V - 1], seed=0)
    assert torch.equal(solo[0]["input_ids"], out[1]["input_ids"])


def _smollm2_dir():
    from pathlib import Path

    from sglang_domino.models import DEFAULT_MODEL_DIR

    path = Path(__file__).resolve().parent.parent / DEFAULT_MODEL_DIR
    if not (path / "config.json").exists():
        pytest.fail(f"{path} missing: run `sglang-domino install-model` first")
    return path


def test_relabel_data_labels_each_position_with_the_target(tmp_path):
    """relabel-data on SmolLM2: prompt + ShareGPT's answer, labels = the target's argmax, features cached, resumable."""
    from sglang_domino.hf.target import load_target
    from sglang_domino.train.data import load_examples
    from sglang_domino.train.relabel import RelabelConfig, relabel_dataset

    model_dir = _smollm2_dir()
    def record(rid, *turns):
        return {"id": rid, "conversations": [{"from": who, "value": text} for who, text in turns]}

    recs = [record("a", ("human", "Name a colour."), ("gpt", "Blue.")), record("b", ("gpt", "no question")),
            record("c", ("human", "Count to five."), ("gpt", "1, 2, 3, 4, 5. " * 20))]
    (tmp_path / "s.json").write_text(json.dumps(recs))
    cfg = RelabelConfig(target=str(model_dir), num_conversations=5, max_response_tokens=24, shard_size=1)
    out = relabel_dataset(cfg, tmp_path / "d", features_dir=tmp_path / "f", target_layer_ids=[1, 10],
                          source=tmp_path / "s.json", progress=False)
    exs = sorted(load_examples(out), key=lambda e: e["id"])
    assert [e["id"] for e in exs] == ["a", "c"]  # record b has no human turn
    short, long = exs
    assert short["finished"] and not long["finished"] and len(long["input_ids"]) - long["prompt_len"] == 24
    target, tok = load_target(str(model_dir), torch.float32)
    assert tok.decode(short["input_ids"][short["prompt_len"]:]).startswith("Blue.")
    with torch.no_grad():
        logits = target(input_ids=long["input_ids"].long()[None]).logits[0]
    assert long["labels"].tolist() == logits.argmax(-1).tolist()
    cache = FeatureExtractor(target, [1, 10], cache_dir=tmp_path / "f", compute_dtype=torch.float32)
    assert cache.cached(long["input_ids"])
    assert json.loads((out / "meta.json").read_text())["status"] == "complete"
    with pytest.MonkeyPatch.context() as mp:  # a rerun keeps the finished shards and never loads the target
        mp.setattr("transformers.AutoModelForCausalLM.from_pretrained", lambda *a, **k: pytest.fail("loaded"))
        relabel_dataset(cfg, out, source=tmp_path / "s.json", progress=False)
    assert sorted(e["id"] for e in load_examples(out)) == ["a", "c"]
    with pytest.raises(ValueError, match="other settings"):
        relabel_dataset(RelabelConfig(target=str(model_dir), num_conversations=5), out, source=tmp_path / "s.json")
    recs.append(record("d", ("human", "Say hi."), ("gpt", "Hi!")))
    (tmp_path / "s.json").write_text(json.dumps(recs))
    more = relabel_dataset(RelabelConfig(target=str(model_dir), num_conversations=5, exclude=[str(out)]),
                           tmp_path / "d2", source=tmp_path / "s.json", progress=False)
    assert [e["id"] for e in load_examples(more)] == ["d"]  # a and c are in the excluded folder
    recs.append(record("e", ("human", "Pick a number."), ("gpt", "Seven."), ("human", "Double it."), ("gpt", "14."),
                       ("human", "Halve that."), ("gpt", "7."), ("human", "")))
    (tmp_path / "s.json").write_text(json.dumps(recs))
    later = relabel_dataset(RelabelConfig(target=str(model_dir), num_conversations=5, later_turns=True),
                            tmp_path / "d3", source=tmp_path / "s.json", progress=False)
    turns = sorted(load_examples(later), key=lambda e: e["prompt_len"])  # only record e has a second exchange
    assert [e["id"] for e in turns] == ["e", "e"]
    prompt, answer = (tok.decode(turns[1]["input_ids"][:turns[1]["prompt_len"]]),
                      tok.decode(turns[1]["input_ids"][turns[1]["prompt_len"]:]))
    assert prompt.count("Seven.") == prompt.count("14.") == 1 and prompt.rstrip().endswith("assistant")
    assert answer.startswith("7.") and "Halve that." in prompt
    with torch.no_grad():
        logits = target(input_ids=turns[1]["input_ids"].long()[None]).logits[0]
    assert turns[1]["labels"].tolist() == logits.argmax(-1).tolist()


def test_cli_parsers():
    import argparse

    from sglang_domino.train.cli import add_parsers
    from sglang_domino.train.trainer import config_from_args

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", "--lambda-const", "1.0", "--max-steps", "5", "--no-resume"])
    cfg = config_from_args(args)
    assert cfg.lambda_const == 1.0 and cfg.max_steps == 5 and cfg.resume is False and cfg.block_size == 16
    args = parser.parse_args(["gen-data", "--num-prompts", "10"])
    assert args.num_prompts == 10 and callable(args.func)
    args = parser.parse_args(["relabel-data", "--num-conversations", "7"])
    assert args.num_conversations == 7 and args.max_response_tokens == 384 and callable(args.func)
