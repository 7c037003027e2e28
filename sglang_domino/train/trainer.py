"""Training loop: AdamW, warmup + cosine, grad clip, exact resume, export.

A run lives in ``run_dir`` (``checkpoint.pt``: drafter, optimizer, scheduler, RNG, step; ``metrics.jsonl``;
``features/``: cached target features; ``best/``: the export with the lowest validation loss) and exports the drafter to ``out`` in the published checkpoint
format (bfloat16) with a model card, at every checkpoint, so partial progress is usable.

Data order is a pure function of (seed, step): epoch ``e`` visits the training examples in a permutation
seeded by (seed, e) and the anchors of example ``i`` in epoch ``e`` are seeded by (seed, e, i). A resumed
run therefore sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..drafter import DominoDrafter, save_drafter
from ..hf.target import load_target
from ..models import init_drafter
from .anchors import IGNORE, build_blocks, sample_anchors
from .curriculum import (Frozen, block_logits, block_metrics, curriculum_loss, default_gamma, hit_metrics, lambda_at,
                         lr_factor, position_weights, weighted_ce)
from .data import atomic_save
from .features import FeatureExtractor
from .warm_start import copy_target_layers

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
SPLIT_SEED = 0  # the held-out split's seed, the same for every run (seed 0 runs drew it from their own seed)


@dataclass
class TrainConfig:
    target: str = "models/SmolLM2-135M-Instruct"
    data: str | list[str] = "data/sharegpt-smollm2"  # gen-data folder(s); validation comes from the first
    out: str = "drafters/smollm2-domino-b16"
    run_dir: str = "runs/smollm2-domino-b16"
    # drafter
    block_size: int = 16
    num_layers: int = 1
    num_context_layers: int = 4
    target_layer_ids: list[int] | None = None
    gru_hidden_dim: int = 128
    emb_dim: int = 64
    init_from: str | None = None
    init_layers: str = "target"  # copy the target layers after the deepest context layer (warm_start.py); or "random"
    # curriculum
    gamma: float | None = None
    decay_ratio: float = 0.5
    lambda_const: float | None = None
    loss_vocab: str = "full"  # "full": softmax over all V; "data": over the tokens of the training data
    loss_negatives: int = 4096  # with loss_vocab "data": other tokens sampled into each step's softmax
    # optimisation
    epochs: float = 4.0
    max_steps: int | None = None
    batch_seqs: int = 4
    anchors_per_seq: int = 16
    lr: float = 1e-3  # published recipe: 6e-4 for much longer runs
    min_lr_ratio: float = 0.05
    warmup_ratio: float = 0.04
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_seq_len: int = 1024
    val_examples: int = 24
    seed: int = 0
    # runtime
    device: str = "auto"
    dtype: str = "auto"
    feature_dtype: str = "auto"  # target compute dtype for features (stored as bf16 either way)
    cache_features: bool = True
    features_dir: str | None = None  # default: run_dir/features; runs with the same target layers can share one
    log_every: int = 10
    eval_every: int = 100
    ckpt_every: int = 50
    ckpt_minutes: float = 10.0
    stop_after_steps: int | None = None  # stop early (schedule unchanged), e.g. to test resume
    resume: bool = True
    progress: bool = True
    extra: dict = field(default_factory=dict)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16 (bf16 matmuls several times faster than fp32 on such CPUs)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16()):
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16}[name]


def _seeded(*parts: int) -> torch.Generator:
    g = torch.Generator()
    seed = 0
    for p in parts:
        seed = (seed * 1_000_003 + int(p) + 7) % (2 ** 62)
    g.manual_seed(seed)
    return g


def _fingerprint(examples: list[dict]) -> str:
    import hashlib

    h = hashlib.sha1()
    for e in examples:
        h.update(f"{e.get('id')}:{e['prompt_len']}:".encode())
        h.update(e["input_ids"].to(torch.int32).numpy().tobytes())
    return h.hexdigest()


def build_drafter(cfg: TrainConfig, target, calib_ids: list[torch.Tensor] | None = None) -> DominoDrafter:
    """A fresh drafter (or ``cfg.init_from``); calib_ids: a few sequences for ``--init-layers target``."""
    if cfg.init_from:
        from ..drafter import load_drafter

        drafter = load_drafter(cfg.init_from, target.config, dtype=torch.float32)
        return drafter.train()
    drafter = init_drafter(target.config, num_layers=cfg.num_layers, num_context_layers=cfg.num_context_layers,
                           block_size=cfg.block_size, gru_hidden_dim=cfg.gru_hidden_dim, emb_dim=cfg.emb_dim,
                           seed=cfg.seed)
    if cfg.target_layer_ids is not None:
        if len(cfg.target_layer_ids) != cfg.num_context_layers:
            raise ValueError("--target-layer-ids must have --num-context-layers entries")
        drafter.config.target_layer_ids = list(cfg.target_layer_ids)
    if cfg.init_layers == "target":
        copy_target_layers(drafter, target, calib_ids)
    elif cfg.init_layers != "random":
        raise ValueError(f"init_layers={cfg.init_layers!r}: expected 'random' or 'target'")
    with torch.no_grad():
        # The correction starts at exactly zero: final logits = base logits at step 0.
        drafter.embed_proj[2].weight.zero_()
        # z feeds the target's lm_head: start from the scale the target's final norm gives it.
        norm = getattr(getattr(target, "model", target), "norm", None)
        if norm is not None and getattr(norm, "weight", None) is not None \
                and norm.weight.shape == drafter.norm.weight.shape:
            drafter.norm.weight.copy_(norm.weight.float())
    return drafter.train()


class Trainer:
    def __init__(self, cfg: TrainConfig, target=None, examples: list[dict] | None = None):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.target = load_target(cfg.target, torch.float32, self.device)[0] if target is None else target.to(self.device).eval()
        for p in self.target.parameters():
            p.requires_grad_(False)
        from .data import load_examples, load_more_examples

        self.data_dirs = [cfg.data] if isinstance(cfg.data, str) else list(cfg.data)
        if examples is None:  # given examples stand for the first folder
            examples = load_examples(self.data_dirs[0])
        examples = self._usable(examples)
        if not examples:
            raise ValueError("no usable training examples")
        # The held-out split depends on the first folder only, never on --seed: adding folders or continuing a
        # drafter with another seed keeps it (so it never leaks into training).
        order = torch.randperm(len(examples), generator=_seeded(SPLIT_SEED, 999)).tolist()
        n_val = min(cfg.val_examples, len(examples) // 10)
        self.val = [examples[i] for i in order[:n_val]]
        more = self._usable(load_more_examples(self.data_dirs[1:], seen=examples))
        self.train_set = [examples[i] for i in order[n_val:]] + more
        self.data_fingerprint = _fingerprint(examples + more)
        self.drafter = build_drafter(cfg, self.target, [e["input_ids"] for e in self.train_set[:8]]).to(self.device)
        dcfg = self.drafter.config
        self.block_size = dcfg.block_size
        self.gamma = cfg.gamma if cfg.gamma is not None else default_gamma(self.block_size)
        self.weights = position_weights(self.block_size, self.gamma, self.device)
        vocab = None
        if cfg.loss_vocab == "data":
            vocab = torch.unique(torch.cat([t for e in self.train_set for t in (e["input_ids"], e.get("labels"))
                                            if t is not None]).long())
        elif cfg.loss_vocab != "full":
            raise ValueError(f"loss_vocab={cfg.loss_vocab!r}: expected 'data' or 'full'")
        self.frozen = Frozen.from_target(self.target, vocab)
        self.feature_dtype = resolve_dtype(cfg.feature_dtype, self.device)
        self.features = FeatureExtractor(self.target, dcfg.target_layer_ids,
                                         cache_dir=(cfg.features_dir or self.run_dir / "features")
                                         if cfg.cache_features else None,
                                         compute_dtype=self.feature_dtype)
        self.steps_per_epoch = math.ceil(len(self.train_set) / cfg.batch_seqs)
        self.total_steps = cfg.max_steps or max(1, int(round(cfg.epochs * self.steps_per_epoch)))
        self.warmup_steps = int(round(cfg.warmup_ratio * self.total_steps))
        self.optimizer = torch.optim.AdamW(self.drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95),
                                           weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, self.total_steps, self.warmup_steps, cfg.min_lr_ratio))
        self.step = 0
        self.elapsed = 0.0
        self.best_val: float | None = None
        self._perm_cache: dict[int, list[int]] = {}
        if cfg.resume and (self.run_dir / CHECKPOINT).exists():
            self.load_checkpoint(self.run_dir / CHECKPOINT)

    # -- data ---------------------------------------------------------------------------------------
    def _usable(self, examples: list[dict]) -> list[dict]:
        """Cut to max_seq_len; drop examples left with fewer than 2 response tokens."""
        n = self.cfg.max_seq_len
        kept = [e for e in examples if min(len(e["input_ids"]), n) - e["prompt_len"] >= 2]
        return [{**e, **{k: e[k][:n] for k in ("input_ids", "labels") if k in e}} for e in kept]

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perm_cache:
            self._perm_cache = {epoch: torch.randperm(len(self.train_set), generator=_seeded(self.cfg.seed, epoch)).tolist()}
        return self._perm_cache[epoch]

    def batch_for_step(self, step: int):
        epoch, offset = divmod(step, self.steps_per_epoch)
        idx = self._perm(epoch)[offset * self.cfg.batch_seqs:(offset + 1) * self.cfg.batch_seqs]
        exs = [self.train_set[i] for i in idx]
        anchors = [sample_anchors(e["prompt_len"], len(e["input_ids"]), self.cfg.anchors_per_seq,
                                  _seeded(self.cfg.seed, epoch, i)) for e, i in zip(exs, idx)]
        return exs, anchors

    def _forward(self, exs, anchors, with_head: bool, frozen: Frozen):
        seqs = [e["input_ids"] for e in exs]
        feats = self.features(seqs)
        T = max(f.shape[0] for f in feats)
        padded = feats[0].new_zeros(len(feats), T, feats[0].shape[1])
        for j, f in enumerate(feats):
            padded[j, :f.shape[0]] = f
        batch = build_blocks(seqs, anchors, self.block_size, self.drafter.config.mask_token_id,
                             targets=[e.get("labels") for e in exs]).to(self.device)
        padded = padded.to(self.device)
        autocast = torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)
        with autocast:
            base, final = block_logits(self.drafter, frozen, batch, padded, with_head=with_head)
        return base, final, batch

    def precompute_features(self) -> None:
        """Fill the feature cache for every example up front (one target forward each), with a progress bar."""
        from tqdm import tqdm

        examples = self.train_set + self.val
        missing = [e["input_ids"] for e in examples if not self.features.cached(e["input_ids"])]
        for ids in tqdm(missing, desc="target features", disable=not self.cfg.progress or not missing,
                        dynamic_ncols=True):
            self.features([ids])

    # -- loop ---------------------------------------------------------------------------------------
    def lam(self, step: int) -> float:
        return lambda_at(step, self.total_steps, self.cfg.decay_ratio, self.cfg.lambda_const)

    def train_step(self) -> dict:
        cfg = self.cfg
        lam = self.lam(self.step)
        exs, anchors = self.batch_for_step(self.step)
        with_head = lam < 1.0
        frozen = self.frozen.with_negatives(cfg.loss_negatives, _seeded(cfg.seed, 77, self.step))
        base, final, batch = self._forward(exs, anchors, with_head, frozen)
        labels = frozen.to_loss_vocab(batch.labels)
        loss, stats = curriculum_loss(base, final, labels, self.weights, lam)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        # Metrics of what the loss saw: the final logits once lambda < 1, the base logits while lambda = 1.
        c_final, c_base = stats.pop("correct_final", None), stats.pop("correct_base", None)
        m = hit_metrics(c_final if c_final is not None else c_base, labels)
        if c_base is not None and c_final is not None:
            m["acc_base"] = hit_metrics(c_base, labels)["acc"]
        self.step += 1
        return {"step": self.step, "loss": float(loss.detach()), "lambda": lam,
                "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": float(gnorm), **stats, **m}

    def _heldout_batches(self, per_seq: int):
        """For each batch of held-out conversations: (index of its first, base, final, blocks, greedy): the logits
        over the full vocabulary at ``per_seq`` anchors a conversation, fixed whatever ``--seed``, and greedy,
        the [R] bool mask of the blocks whose conversation the target answered greedily."""
        for k in range(0, len(self.val), self.cfg.batch_seqs):
            exs = self.val[k:k + self.cfg.batch_seqs]
            anchors = [sample_anchors(e["prompt_len"], len(e["input_ids"]), per_seq,
                                      _seeded(SPLIT_SEED, 10 ** 6, k + j)) for j, e in enumerate(exs)]
            base, final, batch = self._forward(exs, anchors, True, self.frozen.full())
            greedy = torch.tensor([not exs[j].get("sampled", False) for j in batch.row_seq.tolist()],
                                  dtype=torch.bool, device=batch.labels.device)
            yield k, base, final, batch, greedy

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Validation over the full vocabulary at fixed anchors (the same for every seed): final-logit metrics
        (the head, as used at inference) and base-only."""
        if not self.val:
            return {}
        self.drafter.eval()
        tot = {"ce_final": 0.0, "ce_base": 0.0, "acc": 0.0, "acc_base": 0.0, "accept": 0.0, "accept_base": 0.0,
               "accept_greedy": 0.0}
        n_tok = n_rows = n_greedy = 0
        for _, base, final, batch, greedy_rows in self._heldout_batches(self.cfg.anchors_per_seq):
            mf, mb = block_metrics(final, batch.labels), block_metrics(base, batch.labels)
            r = mf["n_rows"]
            tot["ce_final"] += float(weighted_ce(final, batch.labels, self.weights)) * r
            tot["ce_base"] += float(weighted_ce(base, batch.labels, self.weights)) * r
            tot["acc"] += mf["acc"] * mf["n_tok"]
            tot["acc_base"] += mb["acc"] * mb["n_tok"]
            tot["accept"] += mf["accept"] * r
            tot["accept_base"] += mb["accept"] * r
            if greedy_rows.any():
                g = block_metrics(final[greedy_rows], batch.labels[greedy_rows])
                tot["accept_greedy"] += g["accept"] * g["n_rows"]
                n_greedy += g["n_rows"]
            n_tok += mf["n_tok"]
            n_rows += r
        self.drafter.train()
        out = {k: v / max(1, n_rows) for k, v in tot.items() if k not in ("acc", "acc_base", "accept_greedy")}
        out["acc"] = tot["acc"] / max(1, n_tok)
        out["acc_base"] = tot["acc_base"] / max(1, n_tok)
        out["accept_greedy"] = tot["accept_greedy"] / max(1, n_greedy)
        return {"val_" + k: round(v, 4) for k, v in out.items()}

    @torch.no_grad()
    def heldout_hits(self, anchors_per_seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced top-1 hits of the final logits (full vocabulary) on the held-out conversations, at
        anchors drawn independently of ``--seed`` (the same blocks for every drafter on the same data).

        Returns (correct [R, B-1] bool, valid [R, B-1] bool, conversation [R] index into ``self.val``, offset [R]
        the anchor's position in the answer); only the blocks of greedy conversations, whose leading hits are
        what greedy verification would commit.
        """
        self.drafter.eval()
        out = []
        for k, _, final, batch, greedy in self._heldout_batches(anchors_per_seq):
            labels = batch.labels[greedy]
            valid = labels != IGNORE
            conv = batch.row_seq[greedy] + k
            prompt_len = torch.tensor([self.val[j]["prompt_len"] for j in conv.tolist()], device=conv.device)
            out.append(((final[greedy].argmax(-1) == labels) & valid, valid, conv,
                        batch.anchors[greedy] - prompt_len))
        self.drafter.train()
        return tuple(torch.cat([o[i] for o in out]).cpu() for i in range(4))

    def _log(self, record: dict) -> None:
        with open(self.run_dir / METRICS, "a") as f:
            f.write(json.dumps(record) + "\n")

    def run(self) -> dict:
        from tqdm import tqdm

        cfg = self.cfg
        end = self.total_steps if cfg.stop_after_steps is None else min(self.total_steps, cfg.stop_after_steps)
        if self.step == 0:
            self._log({"event": "start", "config": asdict(cfg), "train_examples": len(self.train_set),
                       "val_examples": len(self.val), "total_steps": self.total_steps,
                       "steps_per_epoch": self.steps_per_epoch, "gamma": self.gamma,
                       "drafter_params": sum(p.numel() for p in self.drafter.parameters())})
        if self.cfg.cache_features:
            self.precompute_features()
        bar = tqdm(total=end, initial=self.step, desc="train", disable=not cfg.progress, dynamic_ncols=True)
        last_ckpt = time.time()
        t0 = time.time()
        base_elapsed = self.elapsed
        window: list[dict] = []
        last = {}
        while self.step < end:
            rec = self.train_step()
            self.elapsed = base_elapsed + time.time() - t0
            window.append(rec)
            last = rec
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", lam=f"{rec['lambda']:.2f}", acc=f"{rec['acc']:.3f}",
                            accept=f"{rec['accept']:.2f}")
            if self.step % cfg.log_every == 0 or self.step == end:
                avg = {k: sum(r[k] for r in window if k in r) / max(1, sum(k in r for r in window))
                       for k in ("loss", "ce_base", "ce_final", "acc", "acc_base", "accept", "grad_norm")
                       if any(k in r for r in window)}
                self._log({"step": self.step, "lambda": rec["lambda"], "lr": rec["lr"],
                           "elapsed_s": round(self.elapsed, 1), **{k: round(v, 4) for k, v in avg.items()}})
                window = []
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == self.total_steps):
                ev = self.evaluate()
                self._log({"step": self.step, "elapsed_s": round(self.elapsed, 1), **ev})
                bar.write(f"step {self.step}: " + " ".join(f"{k}={v}" for k, v in ev.items()))
                score = ev.get("val_ce_final")
                if score is not None and (self.best_val is None or score < self.best_val):
                    # Small data overfits: keep the export with the best held-out loss as well.
                    self.best_val = score
                    self.export(self.run_dir / "best")
            due = (cfg.ckpt_every and self.step % cfg.ckpt_every == 0) or \
                (cfg.ckpt_minutes and time.time() - last_ckpt > 60 * cfg.ckpt_minutes)
            if due or self.step == end:
                self.save_checkpoint()
                self.export()
                last_ckpt = time.time()
        bar.close()
        return {"step": self.step, "total_steps": self.total_steps, "elapsed_s": round(self.elapsed, 1), **last}

    # -- state --------------------------------------------------------------------------------------
    def save_checkpoint(self, path: Path | None = None) -> Path:
        path = path or self.run_dir / CHECKPOINT
        state = {
            "drafter": self.drafter.state_dict(), "drafter_config": self.drafter.config.to_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "step": self.step, "total_steps": self.total_steps, "elapsed": self.elapsed, "best_val": self.best_val,
            "epoch": self.step // self.steps_per_epoch, "offset": self.step % self.steps_per_epoch,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
            "train_config": asdict(self.cfg), "data_fingerprint": self.data_fingerprint,
        }
        atomic_save(state, path)
        return path

    def load_checkpoint(self, path: Path) -> None:
        state = torch.load(path, weights_only=False, map_location=self.device)
        if state["total_steps"] != self.total_steps:
            raise ValueError(f"{path}: made for {state['total_steps']} total steps, this run has {self.total_steps} "
                             f"(same data and settings are needed to resume; use another --run-dir)")
        if state.get("data_fingerprint", self.data_fingerprint) != self.data_fingerprint:
            raise ValueError(f"{path}: made with other training data (the dataset changed since, e.g. gen-data "
                             f"added shards); resuming would not repeat the run: use another --run-dir")
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.elapsed = state.get("elapsed", 0.0)
        self.best_val = state.get("best_val")
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"].get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])

    def export(self, out: str | Path | None = None) -> Path:
        """Published format (bfloat16) + model card, written so a reader never sees a half file."""
        out = Path(out or self.cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / ".export-tmp"
        save_drafter(self.drafter, tmp, dtype=torch.bfloat16)
        for name in ("config.json", "model.safetensors"):
            os.chmod(tmp / name, 0o644)
            os.replace(tmp / name, out / name)
        tmp.rmdir()
        (out / "README.md").write_text(self.model_card())
        return out

    def _init_description(self) -> str:
        if self.cfg.init_from:
            return self.cfg.init_from
        layers = "random draft layers" if self.cfg.init_layers == "random" else \
            f"draft layers copied from target layer(s) after {max(self.drafter.config.target_layer_ids)} " \
            f"(`--init-layers target`)"
        return f"{layers}; embed_proj output layer zero; final norm = the target's"

    def model_card(self) -> str:
        from .data import dataset_stats

        cfg, d = self.cfg, self.drafter.config
        n_params = sum(p.numel() for p in self.drafter.parameters())
        stats = dataset_stats(self.train_set)
        last_eval = {}
        mfile = self.run_dir / METRICS
        if mfile.exists():
            for line in mfile.read_text().splitlines():
                rec = json.loads(line)
                if any(k.startswith("val_") for k in rec):
                    last_eval = rec
        kind = "DFlash baseline (lambda = 1: base logits only; correction weights zero)" \
            if cfg.lambda_const == 1.0 else "Domino (base-anchored curriculum)"
        lam = f"constant {cfg.lambda_const}" if cfg.lambda_const is not None else \
            f"1 -> 0 linearly over the first {cfg.decay_ratio:g} of the steps"
        loss_vocab = "the full vocabulary" if self.frozen.vocab is None else \
            f"the {len(self.frozen.vocab)} tokens of the training data plus {cfg.loss_negatives} other tokens drawn " \
            f"afresh each step (validation: full vocabulary)"
        if self.step >= self.total_steps:
            status = "complete"
        elif cfg.stop_after_steps is not None and self.step >= cfg.stop_after_steps:
            status = (f"stopped by --stop-after-steps {cfg.stop_after_steps} (lambda and learning rate follow the "
                      f"{self.total_steps}-step schedule)")
        else:
            status = "PARTIAL (training in progress or interrupted)"
        return f"""# {Path(cfg.out).name}

Draft model for speculative decoding of `{Path(cfg.target).name}`: {kind}, made by `sglang_domino.train`.
Published DFlash/Domino checkpoint format (`config.json` with `dflash_config.projector_type = "domino"`,
bfloat16 safetensors; the target's embeddings and lm_head are not included).

- Status: **{status}**: step {self.step} / {self.total_steps}, wall time {self.elapsed / 60:.1f} min of training
- Drafter: {d.num_hidden_layers} draft layer(s), hidden {d.hidden_size}, block size {d.block_size},
  target_layer_ids {d.target_layer_ids}, GRU {d.gru_hidden_dim}, emb_dim {d.emb_dim}, mask token {d.mask_token_id};
  {n_params / 1e6:.2f} M parameters
- Data: {self._data_description()} (never MT-Bench)
  ({", ".join(self.data_dirs)}): {stats['examples']} training conversations, {stats['response_tokens']} response tokens
  (mean {stats['mean_response_tokens']}); {stats['relabelled']} of them ShareGPT's own answers relabelled with the
  target's greedy next tokens (relabel-data), the rest answered by the target, {stats['sampled_fraction']:.0%} of all
  by sampling, the rest greedy; {len(self.val)} conversations held out for validation
- Initialised from: {self._init_description()}
- Recipe: loss (1 - lambda) CE(final) + lambda CE(base), position weights exp(-k/{self.gamma:g}); lambda {lam};
  softmax over {loss_vocab};
  AdamW lr {cfg.lr:g} (warmup {cfg.warmup_ratio:g}, cosine to {cfg.min_lr_ratio:g} x), grad clip {cfg.grad_clip:g},
  {cfg.batch_seqs} conversations x up to {cfg.anchors_per_seq} anchors per step, {self.total_steps} steps
  ({self.total_steps / self.steps_per_epoch:.1f} epochs of {self.steps_per_epoch} steps), seed {cfg.seed},
  compute dtype {str(self.dtype).removeprefix('torch.')}, target features computed in {str(self.feature_dtype).removeprefix('torch.')}
- Command: `{_command_line()}` (rerun to resume from `{cfg.run_dir}/{CHECKPOINT}`)
- Last validation (teacher-forced; `val_accept_greedy` = mean tokens per step greedy verification would commit on
  greedy held-out data, bonus included): {json.dumps(last_eval)}
""" + self._init_card()

    def _data_description(self) -> str:
        """What the prompts are: first turns, and where ``relabel-data --later-turns`` made them, later ones."""
        from .data import META

        later = [d for d in self.data_dirs if (Path(d) / META).exists()
                 and json.loads((Path(d) / META).read_text()).get("config", {}).get("later_turns")]
        if not later:
            return "ShareGPT first-turn prompts"
        return (f"ShareGPT first-turn prompts and, in {', '.join(later)}, later exchanges with the conversation "
                f"before them as the prompt")

    def _init_card(self) -> str:
        """The card of the drafter this run started from (``--init-from``), quoted, so the card tells all stages."""
        card = Path(self.cfg.init_from) / "README.md" if self.cfg.init_from else None
        if card is None or not card.exists():
            return ""
        quoted = "".join(f"> {line}".rstrip() + "\n" for line in card.read_text().splitlines())
        return f"\n## Initialised from `{self.cfg.init_from}`, whose card reads\n\n{quoted}"


def _command_line() -> str:
    """This process's command, with ``python -m`` entry points shown as typed (argv[0] is then a file path)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):
        pkg = Path(argv[0]).resolve().parent
        parts = [pkg.name]
        while (pkg.parent / "__init__.py").exists():
            pkg = pkg.parent
            parts.insert(0, pkg.name)
        argv[0] = "python -m " + ".".join(parts)
    return " ".join([argv[0]] + [shlex.quote(a) for a in argv[1:]]) if argv else ""


# -- CLI ------------------------------------------------------------------------------------------------
def add_train_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    g = p.add_argument_group("paths")
    g.add_argument("--target", default=d.target)
    g.add_argument("--data", default=[d.data], nargs="+",
                   help="folder(s) made by gen-data; validation is held out of the first, a prompt in several is used once")
    g.add_argument("--out", default=d.out, help="exported drafter (published format, bf16)")
    g.add_argument("--run-dir", default=d.run_dir, help="checkpoint, metrics, feature cache")
    g = p.add_argument_group("drafter")
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--num-layers", type=int, default=d.num_layers)
    g.add_argument("--num-context-layers", type=int, default=d.num_context_layers)
    g.add_argument("--target-layer-ids", type=int, nargs="+", default=None)
    g.add_argument("--gru-hidden-dim", type=int, default=d.gru_hidden_dim)
    g.add_argument("--emb-dim", type=int, default=d.emb_dim)
    g.add_argument("--init-from", default=None, help="start from an exported drafter")
    g.add_argument("--init-layers", default=d.init_layers, choices=["random", "target"],
                   help="draft layers random, or copied from the target layers after the deepest context layer "
                        "(fc passes that layer's features through; see sglang_domino/train/warm_start.py)")
    g = p.add_argument_group("curriculum")
    g.add_argument("--gamma", type=float, default=None, help="position decay (default 7/5/4 for B=16/10/8)")
    g.add_argument("--decay-ratio", type=float, default=d.decay_ratio,
                   help="lambda goes 1 -> 0 over this fraction of the steps")
    g.add_argument("--lambda-const", type=float, default=None,
                   help="fixed lambda; 1.0 = plain DFlash training (the baseline)")
    g.add_argument("--loss-vocab", default=d.loss_vocab, choices=["data", "full"],
                   help="softmax of the training loss over the whole vocabulary, or over the tokens that occur in the "
                        "training data plus --loss-negatives others drawn each step (about 2.5x cheaper for SmolLM2; "
                        "validation always uses the full vocabulary)")
    g.add_argument("--loss-negatives", type=int, default=d.loss_negatives,
                   help="with --loss-vocab data: tokens outside the data drawn into each step's softmax (0: none; then "
                        "nothing holds their logits down and the held-out loss can rise once lambda reaches 0)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=float, default=d.epochs)
    g.add_argument("--max-steps", type=int, default=None, help="overrides --epochs")
    g.add_argument("--batch-seqs", type=int, default=d.batch_seqs, help="conversations per step")
    g.add_argument("--anchors-per-seq", type=int, default=d.anchors_per_seq)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio)
    g.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g.add_argument("--grad-clip", type=float, default=d.grad_clip)
    g.add_argument("--max-seq-len", type=int, default=d.max_seq_len)
    g.add_argument("--val-examples", type=int, default=d.val_examples)
    g.add_argument("--seed", type=int, default=d.seed,
                   help="initialisation, data order, anchors and negatives (never the held-out split)")
    g = p.add_argument_group("runtime")
    g.add_argument("--device", default=d.device, help="auto, cpu, cuda")
    g.add_argument("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16"],
                   help="compute dtype (autocast; master weights fp32). auto: bf16 on CUDA and on CPUs with AMX/AVX512-BF16, "
                        "else fp32")
    g.add_argument("--feature-dtype", default=d.feature_dtype, choices=["auto", "float32", "bfloat16"],
                   help="target compute dtype for context features (auto: as --dtype)")
    g.add_argument("--no-feature-cache", action="store_true")
    g.add_argument("--features-dir", default=None,
                   help="feature cache folder (default RUN_DIR/features); runs with the same target and layers may share one")
    g.add_argument("--log-every", type=int, default=d.log_every)
    g.add_argument("--eval-every", type=int, default=d.eval_every)
    g.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    g.add_argument("--ckpt-minutes", type=float, default=d.ckpt_minutes)
    g.add_argument("--stop-after-steps", type=int, default=None, help="stop at this step (schedule unchanged)")
    g.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint in --run-dir")
    g.add_argument("--threads", type=int, default=None, help="torch threads")
    g.add_argument("--no-progress", action="store_true")


def config_from_args(args) -> TrainConfig:
    fields = {f for f in TrainConfig.__dataclass_fields__}
    kw = {k: v for k, v in vars(args).items() if k in fields}
    kw["cache_features"] = not args.no_feature_cache
    kw["resume"] = not args.no_resume
    kw["progress"] = not args.no_progress
    return TrainConfig(**kw)


def train(cfg: TrainConfig, target=None, examples=None) -> dict:
    trainer = Trainer(cfg, target=target, examples=examples)
    return trainer.run()


def train_from_args(args) -> None:
    result = train(config_from_args(args))
    print(json.dumps(result))
